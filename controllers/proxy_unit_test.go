package controllers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/cluster-api/util/conditions"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

// scriptedProber returns the queued results in order.
type scriptedProber struct {
	requiresAuth
	results []proxyprobe.Result
}

func (s *scriptedProber) Probe(context.Context, proxyprobe.Target) proxyprobe.Result {
	r := s.results[0]
	s.results = s.results[1:]
	return r
}

func TestProbeThresholdDoesNotFlap(t *testing.T) {
	ok := proxyprobe.Result{OK: true, Through: true, Latency: 3 * time.Millisecond}
	bad := proxyprobe.Result{Through: true, Err: errors.New("GET http://probe/ through 192.0.2.1:3128: status 503, want 204"), Latency: time.Millisecond}
	cases := []struct {
		name        string
		script      []proxyprobe.Result
		wantHealthy []bool // ProxyHealthy after each probe
		wantReason  string // final ProxyHealthy reason
	}{
		{"healthy stays healthy", []proxyprobe.Result{ok, ok}, []bool{true, true}, crawlv1.ProxyProbeSucceededReason},
		{"one failure does not flap", []proxyprobe.Result{ok, bad, ok}, []bool{true, true, true}, crawlv1.ProxyProbeSucceededReason},
		{"threshold failures turn it unhealthy", []proxyprobe.Result{ok, bad, bad, bad}, []bool{true, true, true, false}, crawlv1.ProxyProbeFailedReason},
		{"never healthy fails at once", []proxyprobe.Result{bad}, []bool{false}, crawlv1.ProxyProbeFailedReason},
		{"recovers", []proxyprobe.Result{bad, ok}, []bool{false, true}, crawlv1.ProxyProbeSucceededReason},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := testReconciler(t, &scriptedProber{results: tc.script}, clocktesting.NewFakePassiveClock(time.Unix(1000, 0)))
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
				Spec: crawlv1.ProxySpec{Port: 3128}, Status: crawlv1.ProxyStatus{Address: "192.0.2.1", Endpoint: "http://192.0.2.1:3128"}}
			conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason})
			for i, want := range tc.wantHealthy {
				if _, err := r.reconcileHealth(context.Background(), newProxyScope(context.Background(), r.Client, p)); err != nil {
					t.Fatal(err)
				}
				summarize(p)
				if got := conditions.IsTrue(p, crawlv1.ProxyHealthyCondition); got != want {
					t.Fatalf("after probe %d: healthy=%v, want %v (%s)", i, got, want, conditions.GetMessage(p, crawlv1.ProxyHealthyCondition))
				}
				if want != conditions.IsTrue(p, crawlv1.ReadyCondition) {
					t.Fatalf("after probe %d: Ready disagrees with ProxyHealthy", i)
				}
			}
			if got := conditions.GetReason(p, crawlv1.ProxyHealthyCondition); got != tc.wantReason {
				t.Fatalf("reason %q, want %q", got, tc.wantReason)
			}
			if tc.wantReason == crawlv1.ProxyProbeFailedReason && !strings.Contains(p.Status.Probe.LastError, "503") {
				t.Fatalf("last error not recorded: %+v", p.Status.Probe)
			}
		})
	}
}

func TestTCPProbeSaysTheProxyWasNotProbed(t *testing.T) {
	r := testReconciler(t, &scriptedProber{results: []proxyprobe.Result{{OK: true}}}, nil)
	p := &crawlv1.Proxy{Spec: crawlv1.ProxySpec{Port: 3128}, Status: crawlv1.ProxyStatus{Address: "192.0.2.1"}}
	if _, err := r.reconcileHealth(context.Background(), newProxyScope(context.Background(), r.Client, p)); err != nil {
		t.Fatal(err)
	}
	c := conditions.Get(p, crawlv1.ProxyHealthyCondition)
	if c == nil || c.Reason != crawlv1.ProxyNotProbedReason || !strings.Contains(c.Message, "not probed") {
		t.Fatalf("ProxyHealthy = %+v", c)
	}
}

func TestAddressTimeoutNamesWhatIsMissing(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	r := testReconciler(t, nil, clk)
	r.AddressTimeout = 5 * time.Minute
	p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Status: crawlv1.ProxyStatus{ProviderID: "kvm://hv1/ns.p"}}
	inst := &provider.Instance{State: provider.StateRunning, Message: "guest agent not connected; no DHCP lease; no ARP entry"}

	if _, err := r.waitForAddress(p, inst); err != nil {
		t.Fatal(err)
	}
	summarize(p)
	if p.Status.Phase != crawlv1.ProxyProvisioning || conditions.GetReason(p, crawlv1.ReadyCondition) != crawlv1.ProxyWaitingForAddressReason {
		t.Fatalf("before the timeout: phase %s reason %s", p.Status.Phase, conditions.GetReason(p, crawlv1.ReadyCondition))
	}
	clk.SetTime(clk.Now().Add(6 * time.Minute))
	res, err := r.waitForAddress(p, inst)
	if err != nil {
		t.Fatal(err)
	}
	summarize(p)
	msg := conditions.GetMessage(p, crawlv1.ReadyCondition)
	if p.Status.Phase != crawlv1.ProxyFailed || conditions.GetReason(p, crawlv1.ReadyCondition) != crawlv1.ProxyAddressTimeoutReason ||
		!strings.Contains(msg, "guest agent not connected") || res.RequeueAfter == 0 {
		t.Fatalf("after the timeout: phase %s, %q, requeue %v", p.Status.Phase, msg, res.RequeueAfter)
	}
}
