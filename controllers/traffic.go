package controllers

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// Per-Proxy traffic read from each managed squid's own counters
// (docs/pools.md, "Traffic"). Labels namespace, pool and proxy: one series
// of each per Proxy, removed when the Proxy goes; pool is empty for a
// Proxy of no pool.
var (
	trafficLabels   = []string{"namespace", "pool", "proxy"}
	proxyRequests   = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_proxy_requests_total", Help: "Client requests the Proxy's squid answered, refused ones included; the operator's own probes and reads are left out."}, trafficLabels)
	proxyDenied     = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_proxy_denied_requests_total", Help: "Client requests the Proxy's squid refused (407 without a valid credential, 403 by its access rules); the operator's own are left out."}, trafficLabels)
	proxyBytesIn    = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_proxy_client_received_bytes_total", Help: "Bytes the Proxy's squid received from its clients (whole KiB)."}, trafficLabels)
	proxyBytesOut   = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_proxy_client_sent_bytes_total", Help: "Bytes the Proxy's squid sent to its clients (whole KiB)."}, trafficLabels)
	trafficCounters = []*prometheus.CounterVec{proxyRequests, proxyDenied, proxyBytesIn, proxyBytesOut}
	// proxyUpstream has one series more per Proxy for each class in
	// squid.UpstreamClasses, a fixed set.
	proxyUpstream = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_proxy_upstream_responses_total", Help: "Target sites' answers through the Proxy's squid by class (2xx, 3xx, 4xx, 5xx; 403 and 429, the usual ban signals, also in 4xx), plain HTTP only: answers inside an HTTPS tunnel never reach squid. The operator's own probes are left out."}, append(slices.Clone(trafficLabels), "class"))
)

func init() {
	metrics.Registry.MustRegister(proxyRequests, proxyDenied, proxyBytesIn, proxyBytesOut, proxyUpstream)
}

// countsSince is what a squid counted between two readings of its
// counters. They only grow while it runs; any of them lower than before
// means it started again (restarted, or its instance was replaced), and
// then everything it counted is new. Prometheus counters see only these
// increments, so a restart never makes them go down.
func countsSince(prev, cur squid.Counters) (d squid.Counters, restarted bool) {
	if cur.Requests < prev.Requests || cur.Denied < prev.Denied || cur.BytesIn < prev.BytesIn || cur.BytesOut < prev.BytesOut {
		return cur, true
	}
	return squid.Counters{Requests: cur.Requests - prev.Requests, Denied: cur.Denied - prev.Denied,
		BytesIn: cur.BytesIn - prev.BytesIn, BytesOut: cur.BytesOut - prev.BytesOut}, false
}

// upstreamSince is what the counter beside a squid counted between two
// readings; ok is false without both. The counter starts at zero whenever
// squid starts it, on a reconfigure too (when squid's own counters go
// on): any count lower than before means it started again, and
// everything it counted is new.
func upstreamSince(prev, cur *squid.UpstreamCounts) (d squid.UpstreamCounts, ok bool) {
	if prev == nil || cur == nil {
		return d, false
	}
	for i := range cur {
		if cur[i] < prev[i] {
			return *cur, true
		}
		d[i] = cur[i] - prev[i]
	}
	return d, true
}

// upstreamWithoutOwn removes the operator's own answers from d, per class
// and never below zero.
func upstreamWithoutOwn(d, own squid.UpstreamCounts) squid.UpstreamCounts {
	for i := range d {
		d[i] -= min(d[i], own[i])
	}
	return d
}

// withoutOwn removes the operator's own requests (probes, checks without
// credentials, echoes, reads of the counters) from d, never below zero:
// after a restart d may hold fewer than were sent.
func withoutOwn(d, own squid.Counters) squid.Counters {
	sub := func(a, b uint64) uint64 {
		if b > a {
			return 0
		}
		return a - b
	}
	return squid.Counters{Requests: sub(d.Requests, own.Requests), Denied: sub(d.Denied, own.Denied), BytesIn: d.BytesIn, BytesOut: d.BytesOut}
}

// Rate is a Proxy's or a pool's traffic per unit of time.
type Rate struct {
	RequestsPerSecond float64
	DeniedPerMinute   float64
	// BanSignalsPerMinute are upstream 403 and 429 answers; counted by
	// BanSignalsKnown replicas (none: unknown, not zero).
	BanSignalsPerMinute float64
	BanSignalsKnown     int32
}

func rateOf(d squid.Counters, elapsed time.Duration) Rate {
	if elapsed <= 0 {
		return Rate{}
	}
	s := elapsed.Seconds()
	return Rate{RequestsPerSecond: float64(d.Requests) / s, DeniedPerMinute: float64(d.Denied) * 60 / s}
}

func (a Rate) add(b Rate) Rate {
	return Rate{RequestsPerSecond: a.RequestsPerSecond + b.RequestsPerSecond, DeniedPerMinute: a.DeniedPerMinute + b.DeniedPerMinute,
		BanSignalsPerMinute: a.BanSignalsPerMinute + b.BanSignalsPerMinute, BanSignalsKnown: a.BanSignalsKnown + b.BanSignalsKnown}
}

// Changes below these are noise, not news: a pool's status is rewritten
// only when its traffic moves by at least a tenth and at least the floor.
const (
	materialFraction        = 0.1
	materialRequestsPerSec  = 0.5
	materialDeniedPerMinute = 1
	materialBansPerMinute   = 1
)

// materially reports whether a pool's traffic moved enough to write.
func materially(old, cur Rate, oldReporting, curReporting int32) bool {
	moved := func(a, b, floor float64) bool {
		d := math.Abs(a - b)
		return d >= floor && d >= materialFraction*math.Max(a, b)
	}
	return oldReporting != curReporting || (old.BanSignalsKnown > 0) != (cur.BanSignalsKnown > 0) ||
		moved(old.RequestsPerSecond, cur.RequestsPerSecond, materialRequestsPerSec) ||
		moved(old.DeniedPerMinute, cur.DeniedPerMinute, materialDeniedPerMinute) ||
		moved(old.BanSignalsPerMinute, cur.BanSignalsPerMinute, materialBansPerMinute)
}

// proxyTraffic is what the operator remembers of one Proxy's counters.
type proxyTraffic struct {
	pool string
	// last reading and when it was taken; zero before the first.
	last squid.Counters
	at   time.Time
	rate Rate
	// own are the operator's requests through the proxy since the last
	// reading (they are in the next one), ownUpstream their answers from
	// the origin.
	own         squid.Counters
	ownUpstream squid.UpstreamCounts
}

// Traffic keeps each Proxy's last counters, feeds the Prometheus counters
// and sums a pool's rates for its status; it wakes the pool's reconcile
// when they move materially. The Proxy controller feeds it, the ProxyPool
// controller reads it.
type Traffic struct {
	// StaleAfter: a Proxy read longer ago no longer counts in its pool's
	// rates (its probe fails, or it has no Stats credential).
	StaleAfter time.Duration

	mu      sync.Mutex
	proxies map[types.NamespacedName]*proxyTraffic
	// woke is each pool's summary when its reconcile was last woken.
	woke   map[types.NamespacedName]poolTraffic
	events chan event.GenericEvent
}

type poolTraffic struct {
	rate      Rate
	reporting int32
}

func newTraffic(staleAfter time.Duration) *Traffic {
	return &Traffic{StaleAfter: staleAfter, proxies: map[types.NamespacedName]*proxyTraffic{},
		woke: map[types.NamespacedName]poolTraffic{}, events: make(chan event.GenericEvent, 1024)}
}

func (t *Traffic) entry(key types.NamespacedName, pool string) *proxyTraffic {
	e := t.proxies[key]
	if e == nil {
		e = &proxyTraffic{pool: pool}
		t.proxies[key] = e
	}
	return e
}

// Sent records one request the operator sent through the proxy of key,
// denied when squid refused it (407 or 403), with upstream the status of
// the origin's answer squid forwarded (0: none), so that it is not
// counted as a client's.
func (t *Traffic) Sent(key types.NamespacedName, pool string, denied bool, upstream int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(key, pool)
	e.own.Requests++
	if denied {
		e.own.Denied++
	}
	e.ownUpstream.Add(upstream)
}

// Observe records a reading of key's counters taken at now (reads is how
// many requests the reading itself took: they count in the next one). The
// first reading is only a base.
func (t *Traffic) Observe(key types.NamespacedName, pool string, c squid.Counters, reads int, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(key, pool)
	if e.pool != pool {
		t.forgetLocked(key)
		e = t.entry(key, pool)
	}
	if !e.at.IsZero() {
		d, _ := countsSince(e.last, c)
		d = withoutOwn(d, e.own)
		labels := []string{key.Namespace, pool, key.Name}
		proxyRequests.WithLabelValues(labels...).Add(float64(d.Requests))
		proxyDenied.WithLabelValues(labels...).Add(float64(d.Denied))
		proxyBytesIn.WithLabelValues(labels...).Add(float64(d.BytesIn))
		proxyBytesOut.WithLabelValues(labels...).Add(float64(d.BytesOut))
		e.rate = rateOf(d, now.Sub(e.at))
		if u, ok := upstreamSince(e.last.Upstream, c.Upstream); ok {
			u = upstreamWithoutOwn(u, e.ownUpstream)
			for i, class := range squid.UpstreamClasses {
				proxyUpstream.WithLabelValues(key.Namespace, pool, key.Name, class).Add(float64(u[i]))
			}
			if s := now.Sub(e.at).Seconds(); s > 0 {
				e.rate.BanSignalsPerMinute, e.rate.BanSignalsKnown = float64(u.BanSignals())*60/s, 1
			}
		}
	}
	e.last, e.at = c, now
	// The counter's reads are not in its counts.
	e.own, e.ownUpstream = squid.Counters{Requests: uint64(reads)}, squid.UpstreamCounts{}
	t.wakeLocked(key.Namespace, pool, now)
}

// Forget drops key's series and memory (the Proxy is gone, or its
// instance is, whose counters start again elsewhere).
func (t *Traffic) Forget(key types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forgetLocked(key)
}

func (t *Traffic) forgetLocked(key types.NamespacedName) {
	e := t.proxies[key]
	if e == nil {
		return
	}
	delete(t.proxies, key)
	for _, c := range trafficCounters {
		c.DeleteLabelValues(key.Namespace, e.pool, key.Name)
	}
	for _, class := range squid.UpstreamClasses {
		proxyUpstream.DeleteLabelValues(key.Namespace, e.pool, key.Name, class)
	}
	pool := types.NamespacedName{Namespace: key.Namespace, Name: e.pool}
	for _, other := range t.proxies {
		if other.pool == e.pool {
			t.wakeLocked(key.Namespace, e.pool, time.Now())
			return
		}
	}
	delete(t.woke, pool)
}

// wakeLocked queues the pool's reconcile when its summary moved
// materially since the last wake.
func (t *Traffic) wakeLocked(namespace, pool string, now time.Time) {
	if pool == "" {
		return
	}
	key := types.NamespacedName{Namespace: namespace, Name: pool}
	cur := t.poolLocked(key, now)
	if old, ok := t.woke[key]; ok && !materially(old.rate, cur.rate, old.reporting, cur.reporting) {
		return
	}
	select {
	case t.events <- event.GenericEvent{Object: &crawlv1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: pool}}}:
		t.woke[key] = cur
	default:
		// Full: the pool is woken by a later reading.
	}
}

func (t *Traffic) poolLocked(pool types.NamespacedName, now time.Time) poolTraffic {
	var sum poolTraffic
	for key, e := range t.proxies {
		if key.Namespace != pool.Namespace || e.pool != pool.Name || e.at.IsZero() || now.Sub(e.at) > t.StaleAfter {
			continue
		}
		sum.reporting++
		sum.rate = sum.rate.add(e.rate)
	}
	return sum
}

// Pool sums the rates of pool's replicas read within StaleAfter, and
// says how many those are.
func (t *Traffic) Pool(pool types.NamespacedName, now time.Time) (Rate, int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.poolLocked(pool, now)
	return s.rate, s.reporting
}

// setTraffic writes the replicas' traffic into pool's status when it moved
// materially since what status holds, so steady traffic writes nothing.
func (r *ProxyPoolReconciler) setTraffic(pool *crawlv1.ProxyPool, now time.Time) {
	if r.Traffic == nil {
		return
	}
	rate, reporting := r.Traffic.Pool(types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name}, now)
	if pool.Status.Traffic == nil && reporting == 0 {
		// Nothing read yet (or never: squids the operator does not
		// manage): no summary rather than a zero one.
		return
	}
	if old := pool.Status.Traffic; old != nil {
		was := Rate{RequestsPerSecond: old.RequestsPerSecond.AsApproximateFloat64(), DeniedPerMinute: old.DeniedPerMinute.AsApproximateFloat64()}
		if old.BanSignalsPerMinute != nil {
			was.BanSignalsPerMinute, was.BanSignalsKnown = old.BanSignalsPerMinute.AsApproximateFloat64(), 1
		}
		if !materially(was, rate, old.ReplicasReporting, reporting) {
			return
		}
	}
	pool.Status.Traffic = &crawlv1.ProxyPoolTraffic{
		RequestsPerSecond: milli(rate.RequestsPerSecond),
		DeniedPerMinute:   milli(rate.DeniedPerMinute),
		ReplicasReporting: reporting,
	}
	if rate.BanSignalsKnown > 0 {
		pool.Status.Traffic.BanSignalsPerMinute = ptr.To(milli(rate.BanSignalsPerMinute))
	}
}

// milli is v as a Quantity to a thousandth ("2500m", "12").
func milli(v float64) resource.Quantity {
	return *resource.NewMilliQuantity(int64(math.Round(v*1000)), resource.DecimalSI)
}
