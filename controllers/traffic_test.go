package controllers

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/squid"
)

func TestCountsSince(t *testing.T) {
	prev := squid.Counters{Requests: 100, Denied: 10, BytesIn: 4096, BytesOut: 8192}
	for _, tc := range []struct {
		name      string
		cur, want squid.Counters
		restarted bool
	}{
		{"growth", squid.Counters{Requests: 150, Denied: 12, BytesIn: 5120, BytesOut: 8192}, squid.Counters{Requests: 50, Denied: 2, BytesIn: 1024}, false},
		{"nothing", prev, squid.Counters{}, false},
		{"restarted: everything since counts", squid.Counters{Requests: 7, Denied: 1, BytesIn: 1024, BytesOut: 2048}, squid.Counters{Requests: 7, Denied: 1, BytesIn: 1024, BytesOut: 2048}, true},
		// One counter lower is a restart even when another grew past its
		// old value: deltas of a new squid against the old would be wrong.
		{"restarted, requests past the old count", squid.Counters{Requests: 120, Denied: 3, BytesIn: 9000, BytesOut: 9000}, squid.Counters{Requests: 120, Denied: 3, BytesIn: 9000, BytesOut: 9000}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, restarted := countsSince(prev, tc.cur)
			if got != tc.want || restarted != tc.restarted {
				t.Fatalf("got %+v restarted %v, want %+v restarted %v", got, restarted, tc.want, tc.restarted)
			}
		})
	}
}

func TestWithoutOwn(t *testing.T) {
	for _, tc := range []struct {
		name         string
		d, own, want squid.Counters
	}{
		{"the operator's probes and checks left out", squid.Counters{Requests: 10, Denied: 3, BytesOut: 1024}, squid.Counters{Requests: 4, Denied: 1}, squid.Counters{Requests: 6, Denied: 2, BytesOut: 1024}},
		{"after a restart fewer than sent: zero", squid.Counters{Requests: 2}, squid.Counters{Requests: 4, Denied: 1}, squid.Counters{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := withoutOwn(tc.d, tc.own); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestRateOf(t *testing.T) {
	for _, tc := range []struct {
		name    string
		d       squid.Counters
		elapsed time.Duration
		want    Rate
	}{
		{"per second and per minute", squid.Counters{Requests: 300, Denied: 15}, 30 * time.Second, Rate{RequestsPerSecond: 10, DeniedPerMinute: 30}},
		{"no time passed", squid.Counters{Requests: 300}, 0, Rate{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rateOf(tc.d, tc.elapsed); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestMaterially(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, cur Rate
		oldN     int32
		curN     int32
		want     bool
	}{
		{"unchanged", Rate{10, 5, 0, 0}, Rate{10, 5, 0, 0}, 2, 2, false},
		{"5% more requests", Rate{10, 5, 0, 0}, Rate{10.5, 5, 0, 0}, 2, 2, false},
		{"20% more requests", Rate{10, 5, 0, 0}, Rate{12, 5, 0, 0}, 2, 2, true},
		{"a tenth but under the floor", Rate{1, 0, 0, 0}, Rate{1.4, 0, 0, 0}, 1, 1, false},
		{"from zero, over the floor", Rate{0, 0, 0, 0}, Rate{0.6, 0, 0, 0}, 1, 1, true},
		{"denials doubled but under one per minute", Rate{10, 0.4, 0, 0}, Rate{10, 0.8, 0, 0}, 1, 1, false},
		{"denials up by 3 per minute", Rate{10, 2, 0, 0}, Rate{10, 5, 0, 0}, 1, 1, true},
		{"a replica more reporting", Rate{10, 5, 0, 0}, Rate{10, 5, 0, 0}, 2, 3, true},
		{"ban signals up by 3 per minute", Rate{10, 5, 2, 1}, Rate{10, 5, 5, 1}, 1, 1, true},
		{"ban signals up under one per minute", Rate{10, 5, 0.2, 1}, Rate{10, 5, 0.9, 1}, 1, 1, false},
		{"ban signals known now", Rate{10, 5, 0, 0}, Rate{10, 5, 0, 1}, 1, 1, true},
		{"ban signals unknown now", Rate{10, 5, 0, 2}, Rate{10, 5, 0, 0}, 2, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := materially(tc.old, tc.cur, tc.oldN, tc.curN); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTrafficFeedsCountersAndPools(t *testing.T) {
	tr := newTraffic(90 * time.Second)
	t0 := time.Unix(1_000_000, 0)
	a := types.NamespacedName{Namespace: "traffic-unit", Name: "pool-a"}
	b := types.NamespacedName{Namespace: "traffic-unit", Name: "pool-b"}
	pool := types.NamespacedName{Namespace: "traffic-unit", Name: "pool"}
	requests := func(key types.NamespacedName) float64 {
		return counterValue(t, proxyRequests.WithLabelValues(key.Namespace, pool.Name, key.Name))
	}
	denied := func(key types.NamespacedName) float64 {
		return counterValue(t, proxyDenied.WithLabelValues(key.Namespace, pool.Name, key.Name))
	}
	woken := func() int {
		n := 0
		for {
			select {
			case <-tr.events:
				n++
			default:
				return n
			}
		}
	}

	// The first reading is a base: what squid counted before is not
	// this manager's to report.
	tr.Observe(a, pool.Name, squid.Counters{Requests: 1000, Denied: 50}, statsReads, t0)
	if got := requests(a); got != 0 {
		t.Fatalf("after the base reading: %v requests, want 0", got)
	}
	if n := woken(); n != 1 {
		t.Fatalf("first reading woke the pool %d times, want 1", n)
	}

	// 30 s later: 300 more, of which the operator's probe, its 407 check
	// and the two reads of the base.
	tr.Sent(a, pool.Name, false, 0)
	tr.Sent(a, pool.Name, true, 0)
	tr.Observe(a, pool.Name, squid.Counters{Requests: 1300, Denied: 80, BytesOut: 2048}, statsReads, t0.Add(30*time.Second))
	if got, want := requests(a), 300.0-4; got != want {
		t.Errorf("requests %v, want %v", got, want)
	}
	if got, want := denied(a), 30.0-1; got != want {
		t.Errorf("denied %v, want %v", got, want)
	}
	if got := counterValue(t, proxyBytesOut.WithLabelValues(a.Namespace, pool.Name, a.Name)); got != 2048 {
		t.Errorf("bytes out %v, want 2048", got)
	}

	// squid restarted: the counter keeps growing by what the new one counted.
	tr.Observe(a, pool.Name, squid.Counters{Requests: 40, Denied: 2}, statsReads, t0.Add(60*time.Second))
	if got, want := requests(a), 296.0+40-2; got != want {
		t.Errorf("after a restart: requests %v, want %v", got, want)
	}

	tr.Observe(b, pool.Name, squid.Counters{Requests: 10}, statsReads, t0.Add(60*time.Second))
	tr.Observe(b, pool.Name, squid.Counters{Requests: 312}, statsReads, t0.Add(90*time.Second))
	rate, n := tr.Pool(pool, t0.Add(90*time.Second))
	// a: 38 in 30 s; b: 300 in 30 s.
	if n != 2 || math.Abs(rate.RequestsPerSecond-(38.0/30+10)) > 1e-9 || rate.DeniedPerMinute != 4 {
		t.Errorf("pool: %+v from %d replicas, want %v rps and 4 denied/min from 2", rate, n, 38.0/30+10)
	}
	if woken() == 0 {
		t.Error("b's traffic did not wake the pool")
	}
	// A small change wakes nobody.
	tr.Observe(b, pool.Name, squid.Counters{Requests: 614}, statsReads, t0.Add(120*time.Second))
	if n := woken(); n != 0 {
		t.Errorf("an unchanged rate woke the pool %d times", n)
	}

	// a is read no more: past StaleAfter it stops counting.
	rate, n = tr.Pool(pool, t0.Add(200*time.Second))
	if n != 1 || rate.RequestsPerSecond != 10 {
		t.Errorf("with a stale: %+v from %d, want 10 rps from 1", rate, n)
	}

	// A Proxy gone takes its series with it.
	tr.Forget(a)
	if got := seriesOf(proxyRequests); got != 1 {
		t.Errorf("%d request series after a was forgotten, want b's alone", got)
	}
	tr.Forget(b)
	if got := seriesOf(proxyRequests); got != 0 {
		t.Errorf("%d request series after both were forgotten", got)
	}
}

// statusFixture is the pool name of traffic-unit and its replica
// name-x, read by a Traffic of their own that forgets the replica at the
// end.
func statusFixture(t *testing.T, name string) (*Traffic, *ProxyPoolReconciler, *crawlv1.ProxyPool, types.NamespacedName) {
	tr := newTraffic(time.Hour)
	pool := &crawlv1.ProxyPool{}
	pool.Namespace, pool.Name = "traffic-unit", name
	replica := types.NamespacedName{Namespace: pool.Namespace, Name: name + "-x"}
	t.Cleanup(func() { tr.Forget(replica) })
	return tr, &ProxyPoolReconciler{Traffic: tr}, pool, replica
}

func TestSetTrafficWritesOnlyMaterialChanges(t *testing.T) {
	tr, r, pool, replica := statusFixture(t, "status")
	t0 := time.Unix(2_000_000, 0)

	r.setTraffic(pool, t0)
	if pool.Status.Traffic != nil {
		t.Fatalf("nothing read, yet status %+v", pool.Status.Traffic)
	}
	tr.Observe(replica, pool.Name, squid.Counters{}, 0, t0)
	tr.Observe(replica, pool.Name, squid.Counters{Requests: 1500, Denied: 60}, 0, t0.Add(time.Minute))
	r.setTraffic(pool, t0.Add(time.Minute))
	want := crawlv1.ProxyPoolTraffic{RequestsPerSecond: resource.MustParse("25"), DeniedPerMinute: resource.MustParse("60"), ReplicasReporting: 1}
	if got := pool.Status.Traffic; got == nil || got.RequestsPerSecond.Cmp(want.RequestsPerSecond) != 0 || got.DeniedPerMinute.Cmp(want.DeniedPerMinute) != 0 || got.ReplicasReporting != 1 {
		t.Fatalf("status %+v, want %+v", got, want)
	}
	// 26 rps: 4% more, not written.
	tr.Observe(replica, pool.Name, squid.Counters{Requests: 1500 + 1560, Denied: 120}, 0, t0.Add(2*time.Minute))
	r.setTraffic(pool, t0.Add(2*time.Minute))
	if got := pool.Status.Traffic.RequestsPerSecond; got.Cmp(resource.MustParse("25")) != 0 {
		t.Errorf("a 4%% change was written: %s", got.String())
	}
	// 12.5 rps: written, to the thousandth.
	tr.Observe(replica, pool.Name, squid.Counters{Requests: 3060 + 750, Denied: 120}, 0, t0.Add(3*time.Minute))
	r.setTraffic(pool, t0.Add(3*time.Minute))
	if got := pool.Status.Traffic; got.RequestsPerSecond.String() != "12500m" || !got.DeniedPerMinute.IsZero() {
		t.Errorf("status %s rps, %s denied/min; want 12500m and 0", got.RequestsPerSecond.String(), got.DeniedPerMinute.String())
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// seriesOf counts c's series of the traffic-unit namespace (other tests'
// Proxies may have their own).
func seriesOf(c *prometheus.CounterVec) int {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for m := range ch {
		var d dto.Metric
		_ = m.Write(&d)
		for _, l := range d.GetLabel() {
			if l.GetName() == "namespace" && l.GetValue() == "traffic-unit" {
				n++
			}
		}
	}
	return n
}

func TestUpstreamSince(t *testing.T) {
	counts := func(u ...uint64) *squid.UpstreamCounts {
		var c squid.UpstreamCounts
		copy(c[:], u)
		return &c
	}
	prev := counts(100, 10, 20, 5, 8, 2)
	for _, tc := range []struct {
		name      string
		prev, cur *squid.UpstreamCounts
		want      squid.UpstreamCounts
		ok        bool
	}{
		{"growth", prev, counts(150, 10, 26, 6, 11, 3), *counts(50, 0, 6, 1, 3, 1), true},
		{"nothing", prev, prev, squid.UpstreamCounts{}, true},
		{"the counter started again (a reconfigure): everything since counts", prev, counts(120, 11, 3, 9, 1, 2), *counts(120, 11, 3, 9, 1, 2), true},
		{"first reading: a base", nil, prev, squid.UpstreamCounts{}, false},
		{"no counter answered", prev, nil, squid.UpstreamCounts{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := upstreamSince(tc.prev, tc.cur)
			if ok != tc.ok || (ok && got != tc.want) {
				t.Fatalf("got %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
	if got := upstreamWithoutOwn(*counts(5, 1, 0, 0, 0, 0), *counts(2, 3, 0, 0, 0, 0)); got != *counts(3) {
		t.Errorf("without own: %v, want 3 2xx and never below zero", got)
	}
}

// The target sites' answers by class: the first reading a base, the
// operator's own probes left out per class, a restarted counter counted
// from zero, an instance without a counter unknown rather than zero, and
// the series gone with the Proxy.
func TestTrafficCountsUpstreamAnswers(t *testing.T) {
	tr := newTraffic(90 * time.Second)
	t0 := time.Unix(3_000_000, 0)
	pool := types.NamespacedName{Namespace: "traffic-unit", Name: "bans"}
	a := types.NamespacedName{Namespace: pool.Namespace, Name: "bans-a"}
	b := types.NamespacedName{Namespace: pool.Namespace, Name: "bans-b"}
	class := func(key types.NamespacedName, c string) float64 {
		return counterValue(t, proxyUpstream.WithLabelValues(key.Namespace, pool.Name, key.Name, c))
	}
	reading := func(u ...uint64) squid.Counters {
		var c squid.UpstreamCounts
		copy(c[:], u)
		return squid.Counters{Upstream: &c}
	}

	tr.Observe(a, pool.Name, reading(500, 0, 40, 0, 30, 10), statsReads+upstreamReads, t0)
	// The operator's probe (the origin's 200), its 407 check (squid's own).
	tr.Sent(a, pool.Name, false, http.StatusOK)
	tr.Sent(a, pool.Name, true, 0)
	tr.Observe(a, pool.Name, reading(601, 2, 52, 3, 38, 2+10), statsReads+upstreamReads, t0.Add(time.Minute))
	want := map[string]float64{"2xx": 100, "3xx": 2, "4xx": 12, "5xx": 3, "403": 8, "429": 2}
	for c, n := range want {
		if got := class(a, c); got != n {
			t.Errorf("class %s: %v, want %v", c, got, n)
		}
	}
	rate, _ := tr.Pool(pool, t0.Add(time.Minute))
	if rate.BanSignalsPerMinute != 10 || rate.BanSignalsKnown != 1 {
		t.Errorf("pool: %+v, want 10 ban signals per minute from 1 replica", rate)
	}

	// squid reconfigured: its counter starts from zero.
	tr.Observe(a, pool.Name, reading(7, 0, 1, 0, 1, 0), statsReads+upstreamReads, t0.Add(2*time.Minute))
	if got := class(a, "2xx"); got != 107 {
		t.Errorf("after the counter started again: 2xx %v, want 107", got)
	}
	if got := class(a, "403"); got != 9 {
		t.Errorf("after the counter started again: 403 %v, want 9", got)
	}

	// b has no counter: its requests count, its classes are unknown.
	tr.Observe(b, pool.Name, squid.Counters{Requests: 10}, statsReads, t0.Add(time.Minute))
	tr.Observe(b, pool.Name, squid.Counters{Requests: 70}, statsReads, t0.Add(2*time.Minute))
	rate, n := tr.Pool(pool, t0.Add(2*time.Minute))
	if n != 2 || rate.BanSignalsKnown != 1 || rate.BanSignalsPerMinute != 1 {
		t.Errorf("pool: %+v from %d, want 1 ban signal per minute known from a alone", rate, n)
	}

	tr.Forget(a)
	tr.Forget(b)
	if got := seriesOf(proxyUpstream); got != 0 {
		t.Errorf("%d upstream series after both were forgotten", got)
	}
}

func TestSetTrafficWritesBanSignals(t *testing.T) {
	tr, r, pool, replica := statusFixture(t, "bans-status")
	t0 := time.Unix(4_000_000, 0)
	at := func(minute int, requests uint64, u *squid.UpstreamCounts) {
		tr.Observe(replica, pool.Name, squid.Counters{Requests: requests, Upstream: u}, 0, t0.Add(time.Duration(minute)*time.Minute))
		r.setTraffic(pool, t0.Add(time.Duration(minute)*time.Minute))
	}

	// No counter: no ban signals in status, not a zero.
	at(0, 0, nil)
	at(1, 600, nil)
	if got := pool.Status.Traffic; got == nil || got.BanSignalsPerMinute != nil {
		t.Fatalf("without a counter: %+v, want traffic without ban signals", got)
	}
	// The counter appears (a new instance): a base, then 30 per minute.
	at(2, 1200, &squid.UpstreamCounts{})
	at(3, 1800, &squid.UpstreamCounts{2: 30, 4: 20, 5: 10})
	if got := pool.Status.Traffic.BanSignalsPerMinute; got == nil || got.String() != "30" {
		t.Fatalf("ban signals %v, want 30 per minute", got)
	}
	// 31: not material.
	at(4, 2400, &squid.UpstreamCounts{2: 61, 4: 41, 5: 20})
	if got := pool.Status.Traffic.BanSignalsPerMinute; got.String() != "30" {
		t.Errorf("a 3%% change was written: %s", got.String())
	}
	// None: written.
	at(5, 3000, &squid.UpstreamCounts{2: 61, 4: 41, 5: 20})
	if got := pool.Status.Traffic.BanSignalsPerMinute; got == nil || !got.IsZero() {
		t.Errorf("ban signals %v, want 0", got)
	}
}
