package virt

import (
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// PrometheusObserver exports libvirt RPC latency and errors:
//
//	proxy_operator_libvirt_rpc_duration_seconds{rpc}   histogram, every RPC
//	proxy_operator_libvirt_rpc_errors_total{rpc,code}  counter, failed RPCs
//
// code is ErrorCodeName: a libvirt code name such as "ErrNoDomain", or
// "Transport", "Canceled", "DeadlineExceeded". Its cardinality is bounded by
// libvirt's error enumeration times the RPC names.
type PrometheusObserver struct {
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

// NewPrometheusObserver registers the collectors with reg. Registering twice
// on the same registry (e.g. two hosts' clients, or tests) reuses the
// collectors already there.
func NewPrometheusObserver(reg prometheus.Registerer) (*PrometheusObserver, error) {
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "proxy_operator_libvirt_rpc_duration_seconds",
		Help: "Duration of libvirt RPCs as seen by the caller, by libvirt API name.",
		// 1ms .. ~4.4min: lookups take milliseconds over SSH, uploads minutes.
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}, []string{"rpc"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_libvirt_rpc_errors_total",
		Help: "Failed libvirt RPCs by libvirt API name and error code.",
	}, []string{"rpc", "code"})

	var err error
	if duration, err = register(reg, duration); err != nil {
		return nil, err
	}
	if errs, err = register(reg, errs); err != nil {
		return nil, err
	}
	return &PrometheusObserver{duration: duration, errors: errs}, nil
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// ObserveRPC implements Observer.
func (p *PrometheusObserver) ObserveRPC(rpc string, d time.Duration, err error) {
	p.duration.WithLabelValues(rpc).Observe(d.Seconds())
	if err != nil {
		p.errors.WithLabelValues(rpc, ErrorCodeName(err)).Inc()
	}
}

// RPCCounter counts RPCs and failures by name. It is an Observer for
// benchmarks and tests ("how many RPCs does reconciling 200 proxies cost").
// The zero value is ready to use.
type RPCCounter struct {
	mu     sync.Mutex
	calls  map[string]int
	errors map[string]int
	total  int
}

// ObserveRPC implements Observer.
func (c *RPCCounter) ObserveRPC(rpc string, _ time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls, c.errors = map[string]int{}, map[string]int{}
	}
	c.calls[rpc]++
	c.total++
	if err != nil {
		c.errors[rpc]++
	}
}

// Count returns how many rpc calls were observed.
func (c *RPCCounter) Count(rpc string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[rpc]
}

// Errors returns how many rpc calls failed.
func (c *RPCCounter) Errors(rpc string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errors[rpc]
}

// Total returns the number of calls observed.
func (c *RPCCounter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// Snapshot returns a copy of the per-RPC call counts.
func (c *RPCCounter) Snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.calls)
}

// Reset zeroes all counts.
func (c *RPCCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls, c.errors, c.total = nil, nil, 0
}
