package harness

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// Prober stands in for the probe of the proxy port (Deps.Prober) and its
// Dial for the port watch's (ProxyOptions.PortWatch.Dial): envtest pods and
// fake instances have addresses nobody listens on, and are never dialed
// for real. Every address serves, and refuses a request without
// credentials as squid with Basic auth does, unless SetDown; ListenAt
// sends an address to a real loopback listener.
type Prober struct {
	mu     sync.Mutex
	probes map[string]int
	down   map[string]bool
	// listener: an address whose port is a real loopback address (a spec's
	// "squid"): probe and port watch both dial it and see what it does.
	listener map[string]string
	// egress: what an address-echo URL answers through the proxy at an
	// address, or at any other ("*"); none: no egress address.
	egress map[string]string
	// stats answers ReadStats; nil: squid refuses (as one without the
	// operator's counter credential does). statsUsers: who read them.
	stats      func(addr string) squid.Counters
	statsUsers map[string]string
	// upstream answers ReadUpstream; nil: no counter answers (as on an
	// instance made before it).
	upstream func(addr string) squid.UpstreamCounts
}

var (
	_ proxyprobe.Prober      = (*Prober)(nil)
	_ proxyprobe.StatsReader = (*Prober)(nil)
)

// ReadStats answers with what SetStats gives for the address, or 403.
func (p *Prober) ReadStats(_ context.Context, t proxyprobe.Target) (squid.Counters, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stats == nil || p.down[t.Address] {
		return squid.Counters{}, errors.New("status 403, want 200")
	}
	if p.statsUsers == nil {
		p.statsUsers = map[string]string{}
	}
	p.statsUsers[t.Address] = t.Username + ":" + t.Password
	return p.stats(t.Address), nil
}

// SetStats makes every address's squid answer ReadStats with
// counters(address); nil: refuse, as by default.
func (p *Prober) SetStats(counters func(addr string) squid.Counters) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats = counters
}

// ReadUpstream answers with what SetUpstream gives for the address, or
// 403 as squid gives when no counter is there.
func (p *Prober) ReadUpstream(_ context.Context, t proxyprobe.Target) (squid.UpstreamCounts, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.upstream == nil || p.stats == nil || p.down[t.Address] {
		return squid.UpstreamCounts{}, errors.New("status 403, want 200")
	}
	return p.upstream(t.Address), nil
}

// SetUpstream makes every address's counter answer ReadUpstream with
// counts(address); nil: none answers, as by default.
func (p *Prober) SetUpstream(counts func(addr string) squid.UpstreamCounts) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.upstream = counts
}

// StatsUser is the "user:password" that last read addr's counters.
func (p *Prober) StatsUser(addr string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statsUsers[addr]
}

func NewProber() *Prober {
	return &Prober{probes: map[string]int{}, down: map[string]bool{}, listener: map[string]string{}}
}

func (p *Prober) Probe(ctx context.Context, t proxyprobe.Target) proxyprobe.Result {
	p.mu.Lock()
	p.probes[t.Address]++
	to, listening := p.listener[t.Address]
	down := p.down[t.Address]
	p.mu.Unlock()
	if listening {
		host, port, _ := net.SplitHostPort(to) // checked by ListenAt
		n, _ := strconv.Atoi(port)
		return proxyprobe.TCP{Timeout: time.Second}.Probe(ctx, proxyprobe.Target{Address: host, Port: int32(n)})
	}
	if down {
		return proxyprobe.Result{Err: errors.New("connection refused"), Latency: time.Millisecond}
	}
	p.mu.Lock()
	egress, ok := p.egress[t.Address]
	if !ok {
		egress = p.egress["*"]
	}
	p.mu.Unlock()
	return proxyprobe.Result{OK: true, Latency: time.Millisecond, EgressAddress: egress}
}

// SetEgress makes the probe through addr ("*": any address without its
// own) see egress as its source address (empty: nothing).
func (p *Prober) SetEgress(addr, egress string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.egress == nil {
		p.egress = map[string]string{}
	}
	p.egress[addr] = egress
}

// ProbeWithoutCredentials answers as squid with Basic auth does: 407.
func (p *Prober) ProbeWithoutCredentials(context.Context, proxyprobe.Target) proxyprobe.Result {
	return proxyprobe.Result{OK: true, Through: true, StatusCode: http.StatusProxyAuthRequired, Latency: time.Millisecond}
}

// Dial is the port watch's dialer, agreeing with Probe.
func (p *Prober) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	to, listening := p.listener[host]
	down := p.down[host]
	p.mu.Unlock()
	if listening {
		return (&net.Dialer{}).DialContext(ctx, network, to)
	}
	if down {
		return nil, errors.New("connection refused")
	}
	c, other := net.Pipe()
	_ = other.Close()
	return c, nil
}

// SetDown makes probes of addr fail as a closed (or firewalled) port does,
// or serve again.
func (p *Prober) SetDown(addr string, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down[addr] = down
}

// ListenAt makes addr's proxy port the loopback address to (host:port)
// until the spec ends.
func (p *Prober) ListenAt(addr, to string) {
	_, port, err := net.SplitHostPort(to)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	_, err = strconv.Atoi(port)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listener[addr] = to
	ginkgo.DeferCleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.listener, addr)
	})
}

// Probes counts the probes of addr so far.
func (p *Prober) Probes(addr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.probes[addr]
}
