package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// steadyProxy is a Ready kvm Proxy as a steady fleet's cache holds it.
func steadyProxy() *crawlv1.Proxy {
	at := metav1.NewTime(time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC))
	p := &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-abcde", Namespace: "crawl", ResourceVersion: "4711", Generation: 1,
			Labels:     map[string]string{crawlv1.PoolNameLabel: "pool"},
			Finalizers: []string{crawlv1.ProxyFinalizer}},
		Spec: crawlv1.ProxySpec{Provider: "kvm", Port: 3128},
		Status: crawlv1.ProxyStatus{
			Phase: crawlv1.ProxyReady, Address: "192.0.2.7", EgressAddress: "203.0.113.7",
			EgressSource: crawlv1.EgressSourceEcho, EgressMeasuredAt: &at, ProviderID: "kvm://hv1/5b1f", Host: "hv1", Endpoint: "192.0.2.7:3128",
			Probe: &crawlv1.ProxyProbeStatus{LastProbeTime: &at},
		},
	}
	for _, c := range []metav1.Condition{
		{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyProbeSucceededReason, Message: "a request through the proxy succeeded"},
		{Type: crawlv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: "Ready", Message: "serving"},
	} {
		c.LastTransitionTime = at
		conditions.Set(p, c)
	}
	return p
}

// TestChanges: the typed shortcut answers as the comparison of what would
// be written, for changes and for the differences that are none.
func TestChanges(t *testing.T) {
	cases := []struct {
		name         string
		change       func(*crawlv1.Proxy)
		meta, status bool
	}{
		{name: "nothing"},
		{name: "only the resourceVersion (the reconcile's own write)", change: func(p *crawlv1.Proxy) { p.ResourceVersion = "4712" }},
		{name: "a time within the same second", change: func(p *crawlv1.Proxy) {
			p.Status.Probe.LastProbeTime = &metav1.Time{Time: p.Status.Probe.LastProbeTime.Add(300 * time.Millisecond)}
		}},
		{name: "an empty list for none", change: func(p *crawlv1.Proxy) { p.OwnerReferences = []metav1.OwnerReference{} }},
		{name: "a finalizer gone", change: func(p *crawlv1.Proxy) { p.Finalizers = nil }, meta: true},
		{name: "a label", change: func(p *crawlv1.Proxy) { p.Labels["x"] = "y" }, meta: true},
		{name: "the address", change: func(p *crawlv1.Proxy) { p.Status.Address = "192.0.2.8" }, status: true},
		{name: "a probe time a second later", change: func(p *crawlv1.Proxy) {
			p.Status.Probe.LastProbeTime = &metav1.Time{Time: p.Status.Probe.LastProbeTime.Add(time.Second)}
		}, status: true},
		{name: "a condition's message", change: func(p *crawlv1.Proxy) {
			conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue,
				Reason: crawlv1.ProxyProbeSucceededReason, Message: "other"})
		}, status: true},
		{name: "both", change: func(p *crawlv1.Proxy) { p.Labels["x"] = "y"; p.Status.Phase = crawlv1.ProxyFailed }, meta: true, status: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, after := steadyProxy(), steadyProxy()
			if tc.change != nil {
				tc.change(after)
			}
			meta, status, err := changes(before, after)
			if err != nil {
				t.Fatal(err)
			}
			if meta != tc.meta || status != tc.status {
				t.Errorf("changes = meta %v, status %v; want %v, %v", meta, status, tc.meta, tc.status)
			}
			wm, ws, err := changesAsWritten(before, after)
			if err != nil || wm != meta || ws != status {
				t.Errorf("changesAsWritten = %v, %v (%v); the shortcut said %v, %v", wm, ws, err, meta, status)
			}
		})
	}
}

// BenchmarkChanges: a steady reconcile's comparison (nothing changed), with
// the typed shortcut and without.
func BenchmarkChanges(b *testing.B) {
	before, after := steadyProxy(), steadyProxy()
	for _, bc := range []struct {
		name string
		fn   func(before, after *crawlv1.Proxy) (bool, bool, error)
	}{
		{"shortcut", func(x, y *crawlv1.Proxy) (bool, bool, error) { return changes(x, y) }},
		{"as-written", func(x, y *crawlv1.Proxy) (bool, bool, error) { return changesAsWritten(x, y) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if m, s, err := bc.fn(before, after); err != nil || m || s {
					b.Fatal(m, s, err)
				}
			}
		})
	}
}
