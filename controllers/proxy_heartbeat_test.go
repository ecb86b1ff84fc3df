package controllers

import (
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/cluster-api/util/conditions"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

// TestHoldHeartbeat: a probe's time, and an egress measurement's that
// found the same address, are written with any other change of status, or
// once a written one is a heartbeat old; else the written ones stay and
// status is unchanged.
func TestHoldHeartbeat(t *testing.T) {
	const heartbeat = time.Hour
	written := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	steady := func() *crawlv1.Proxy {
		p := &crawlv1.Proxy{Status: crawlv1.ProxyStatus{
			Address: "192.0.2.1", EgressAddress: "203.0.113.1", Phase: crawlv1.ProxyReady,
			EgressSource: crawlv1.EgressSourceEcho, EgressMeasuredAt: &metav1.Time{Time: written},
			Probe: &crawlv1.ProxyProbeStatus{LastProbeTime: &metav1.Time{Time: written}},
		}}
		conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue,
			Reason: crawlv1.ProxyProbeSucceededReason, Message: "a request through the proxy succeeded"})
		return p
	}
	cases := []struct {
		name    string
		before  func(*crawlv1.Proxy)
		after   func(*crawlv1.Proxy)
		probed  time.Duration // after written
		written bool          // the probe's time is written
		// measured, when set: an echo measured the same address then
		// (after written), and it is written along with the probe's time.
		measured time.Duration
	}{
		{name: "nothing new", probed: 30 * time.Second},
		{name: "nothing new, just under a heartbeat", probed: heartbeat - time.Second},
		{name: "nothing new, a heartbeat old", probed: heartbeat, written: true},
		{name: "nothing new, older", probed: 3 * heartbeat, written: true},
		{name: "first probe", before: func(p *crawlv1.Proxy) { p.Status.Probe = nil }, probed: time.Second, written: true},
		{name: "no time written yet", before: func(p *crawlv1.Proxy) { p.Status.Probe.LastProbeTime = nil }, probed: time.Second, written: true},
		{name: "a failure counted", after: func(p *crawlv1.Proxy) {
			p.Status.Probe.ConsecutiveFailures, p.Status.Probe.LastError = 1, "connection refused"
		}, probed: time.Second, written: true},
		{name: "failures reset", before: func(p *crawlv1.Proxy) {
			p.Status.Probe.ConsecutiveFailures, p.Status.Probe.LastError = 2, "connection refused"
		}, after: func(p *crawlv1.Proxy) {
			p.Status.Probe.ConsecutiveFailures, p.Status.Probe.LastError = 0, ""
		}, probed: time.Second, written: true},
		{name: "outcome changed", after: func(p *crawlv1.Proxy) {
			conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionFalse,
				Reason: crawlv1.ProxyProbeFailedReason, Message: "3 consecutive probe failures"})
		}, probed: time.Second, written: true},
		{name: "egress changed", after: func(p *crawlv1.Proxy) { p.Status.EgressAddress = "198.51.100.2" }, probed: time.Second, written: true},
		{name: "address changed", after: func(p *crawlv1.Proxy) { p.Status.Address = "192.0.2.2" }, probed: time.Second, written: true},
		{name: "observed generation", after: func(p *crawlv1.Proxy) { p.Status.ObservedGeneration = 2 }, probed: time.Second, written: true},
		{name: "metadata only", after: func(p *crawlv1.Proxy) { p.Finalizers = nil }, probed: time.Second},
		{name: "egress measured again", probed: 10 * time.Minute, measured: 10 * time.Minute},
		{name: "egress measured again, a heartbeat old", probed: heartbeat, measured: heartbeat, written: true},
		{name: "egress measured again, probe heartbeat due", probed: heartbeat + time.Minute, measured: 50 * time.Minute, written: true},
		{name: "egress measured again, its heartbeat due", probed: 30 * time.Second, measured: heartbeat, written: true},
		{name: "egress measured again, with a change", after: func(p *crawlv1.Proxy) { p.Status.Probe.ConsecutiveFailures = 1 }, probed: time.Minute, measured: time.Minute, written: true},
		{name: "egress first measured", before: func(p *crawlv1.Proxy) { p.Status.EgressMeasuredAt = nil }, probed: time.Second, measured: time.Second, written: true},
		{name: "egress gone stale", after: func(p *crawlv1.Proxy) {
			p.Status.EgressAddress, p.Status.EgressSource, p.Status.EgressMeasuredAt = "", crawlv1.EgressSourceUnknown, nil
		}, probed: time.Minute, written: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := steady()
			if tc.before != nil {
				tc.before(before)
			}
			after := before.DeepCopy()
			if after.Status.Probe == nil {
				after.Status.Probe = &crawlv1.ProxyProbeStatus{}
			}
			probed := metav1.NewTime(written.Add(tc.probed))
			after.Status.Probe.LastProbeTime = &probed
			measured := metav1.NewTime(written.Add(tc.measured))
			if tc.measured != 0 {
				after.Status.EgressMeasuredAt = &measured
			}
			if tc.after != nil {
				tc.after(after)
			}
			holdHeartbeat(before, after, heartbeat)
			got := after.Status.Probe.LastProbeTime
			if tc.written != got.Equal(&probed) {
				t.Fatalf("lastProbeTime %v, want the probe's %v written: %t", got, probed, tc.written)
			}
			if got := after.Status.EgressMeasuredAt; tc.measured != 0 && tc.written != got.Equal(&measured) {
				t.Fatalf("egressMeasuredAt %v, want the measurement's %v written: %t", got, measured, tc.written)
			}
			if _, changed, err := changes(before, after); err != nil || changed != tc.written {
				t.Fatalf("status changed %t (%v), want %t", changed, err, tc.written)
			}
		})
	}
}

// TestSteadyProbesWriteNothing: probes of a Ready Proxy that find nothing
// new leave it unwritten (same resourceVersion) and count in the metrics;
// the heartbeat writes the time once it is due, and a failure past the
// threshold is written at the probe that finds it.
func TestSteadyProbesWriteNothing(t *testing.T) {
	healthy := true
	prober := &answerProber{probe: func(proxyprobe.Target) proxyprobe.Result {
		if healthy {
			return proxyprobe.Result{OK: true, Through: true, StatusCode: 204, Latency: time.Duration(time.Now().Nanosecond()%50) * time.Millisecond}
		}
		return proxyprobe.Result{Through: true, Err: errors.New("connection refused"), Latency: time.Millisecond}
	}}
	e := newSecureEnv(t, secureProxy(managedAccess()), prober)
	e.r.ProbeHeartbeat = 10 * time.Minute
	clk := e.r.Clock.(*clocktesting.FakePassiveClock)
	// The metrics are the process's: other tests probe a Proxy of this
	// name too.
	forgetProbeMetrics(e.key)
	defer forgetProbeMetrics(e.key)
	probes := func(outcome string) float64 {
		v, _ := probeMetric(t, "proxy_operator_proxy_probes_total", e.key, "outcome", outcome)
		return v
	}

	e.reconcile()
	p := e.reconcileFast()
	if p.Status.Phase != crawlv1.ProxyReady {
		t.Fatalf("phase %s, want Ready", p.Status.Phase)
	}
	rv, written := p.ResourceVersion, p.Status.Probe.LastProbeTime.Time
	ok0 := probes("ok")
	for range 20 {
		clk.SetTime(clk.Now().Add(e.r.ProbeInterval))
		p = e.reconcileFast()
	}
	if p.ResourceVersion != rv {
		t.Fatalf("20 steady probes moved resourceVersion %s -> %s: status written", rv, p.ResourceVersion)
	}
	if got := probes("ok") - ok0; got != 20 {
		t.Fatalf("probes_total{outcome=ok} grew by %v, want 20", got)
	}
	if got, _ := probeMetric(t, "proxy_operator_proxy_last_probe_timestamp_seconds", e.key); got != float64(clk.Now().Unix()) {
		t.Fatalf("last probe timestamp %v, want %d", got, clk.Now().Unix())
	}

	// A heartbeat on: the next probe writes its time, once.
	clk.SetTime(written.Add(e.r.ProbeHeartbeat))
	p = e.reconcileFast()
	if p.ResourceVersion == rv || !p.Status.Probe.LastProbeTime.Time.Equal(clk.Now()) {
		t.Fatalf("at the heartbeat: resourceVersion %s (was %s), lastProbeTime %v; want written at %v", p.ResourceVersion, rv, p.Status.Probe.LastProbeTime, clk.Now())
	}
	rv = p.ResourceVersion
	clk.SetTime(clk.Now().Add(e.r.ProbeInterval))
	if p = e.reconcileFast(); p.ResourceVersion != rv {
		t.Fatalf("the probe after the heartbeat wrote status again")
	}

	// Failing: each failure is counted in status at once, and the
	// threshold's turns the Proxy unhealthy.
	healthy = false
	for i := range e.r.ProbeFailureThreshold {
		clk.SetTime(clk.Now().Add(time.Second))
		p = e.reconcileFast()
		if p.ResourceVersion == rv || p.Status.Probe.ConsecutiveFailures != i+1 || !p.Status.Probe.LastProbeTime.Time.Equal(clk.Now()) {
			t.Fatalf("failure %d: resourceVersion %s (was %s), %d failures, lastProbeTime %v; want written", i+1, p.ResourceVersion, rv, p.Status.Probe.ConsecutiveFailures, p.Status.Probe.LastProbeTime)
		}
		rv = p.ResourceVersion
	}
	if conditions.IsTrue(p, crawlv1.ProxyHealthyCondition) || p.Status.Phase == crawlv1.ProxyReady {
		t.Fatalf("after %d failures: ProxyHealthy %q, phase %s; want unhealthy", e.r.ProbeFailureThreshold, conditions.GetReason(p, crawlv1.ProxyHealthyCondition), p.Status.Phase)
	}
	if got := probes("failed"); got != float64(e.r.ProbeFailureThreshold) {
		t.Fatalf("probes_total{outcome=failed} %v, want %d", got, e.r.ProbeFailureThreshold)
	}

	// Gone: its series go with it.
	e.r.forget(e.key)
	for _, name := range []string{"proxy_operator_proxy_probes_total", "proxy_operator_proxy_last_probe_timestamp_seconds", "proxy_operator_proxy_probe_latency_seconds"} {
		if _, n := probeMetric(t, name, e.key); n != 0 {
			t.Fatalf("%d series of %s left after the Proxy went", n, name)
		}
	}
}

// TestSteadyEgressWritesOnlyTheHeartbeat: measurements that find the same
// egress address, by the echo URL every interval or by a probe that echoes,
// write status no more often than the heartbeat, while the egress never
// goes stale; a new address is written at the measurement that finds it.
func TestSteadyEgressWritesOnlyTheHeartbeat(t *testing.T) {
	for _, byProbe := range []bool{false, true} {
		t.Run(map[bool]string{false: "echo URL", true: "probe echoes"}[byProbe], func(t *testing.T) {
			echo := &fakeEchoer{addr: "203.0.113.7"}
			egress := func() string {
				echo.mu.Lock()
				defer echo.mu.Unlock()
				return echo.addr
			}
			prober := &answerProber{probe: func(proxyprobe.Target) proxyprobe.Result {
				res := proxyprobe.Result{OK: true, Through: true, StatusCode: 204, Latency: time.Millisecond}
				if byProbe {
					res.EgressAddress = egress()
				}
				return res
			}}
			e := newSecureEnv(t, secureProxy(managedAccess()), prober)
			e.r.Echoer = echo
			e.r.Egress = EgressOptions{Interval: 10 * time.Minute, StaleAfter: 30 * time.Minute}
			if !byProbe {
				e.r.Egress.EchoURL = "http://echo.example/ip"
			}
			e.r.ProbeInterval, e.r.ProbeHeartbeat = 30*time.Second, time.Hour
			clk := e.r.Clock.(*clocktesting.FakePassiveClock)

			e.reconcile()
			p := e.reconcileFast()
			if p.Status.Phase != crawlv1.ProxyReady || p.Status.EgressAddress != "203.0.113.7" || p.Status.EgressSource != crawlv1.EgressSourceEcho {
				t.Fatalf("phase %s, egress %q (%s); want Ready, 203.0.113.7 (echo)", p.Status.Phase, p.Status.EgressAddress, p.Status.EgressSource)
			}
			e.drainEvents()
			rv, writes := p.ResourceVersion, 0
			for range 2 * time.Hour / e.r.ProbeInterval {
				clk.SetTime(clk.Now().Add(e.r.ProbeInterval))
				p = e.reconcileFast()
				if p.Status.EgressAddress != "203.0.113.7" || p.Status.EgressSource != crawlv1.EgressSourceEcho {
					t.Fatalf("at %v: egress %q (%s), want 203.0.113.7 (echo) throughout", clk.Now(), p.Status.EgressAddress, p.Status.EgressSource)
				}
				if p.ResourceVersion != rv {
					writes, rv = writes+1, p.ResourceVersion
				}
			}
			if writes != 2 {
				t.Fatalf("2 h of steady probes and measurements wrote status %d times, want 2 (the hourly heartbeat)", writes)
			}
			if want := 13; !byProbe && echo.calls() != want {
				t.Fatalf("%d echoes in 2 h, want %d (the first and one every 10 min)", echo.calls(), want)
			}
			if evs := e.drainEvents(); len(evs) != 0 {
				t.Fatalf("events %q while nothing changed", evs)
			}

			echo.mu.Lock()
			echo.addr = "198.51.100.9"
			echo.mu.Unlock()
			for range e.r.Egress.Interval / e.r.ProbeInterval {
				clk.SetTime(clk.Now().Add(e.r.ProbeInterval))
				if p = e.reconcileFast(); p.Status.EgressAddress != "203.0.113.7" {
					break
				}
			}
			if p.Status.EgressAddress != "198.51.100.9" || p.ResourceVersion == rv || !p.Status.EgressMeasuredAt.Time.Equal(clk.Now()) {
				t.Fatalf("after the address moved: egress %q measured at %v (now %v), resourceVersion %s (was %s); want the new one written when measured",
					p.Status.EgressAddress, p.Status.EgressMeasuredAt, clk.Now(), p.ResourceVersion, rv)
			}
		})
	}
}
