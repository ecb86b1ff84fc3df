package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
)

// TestRunPhasesStopsAtTheFirstThatEnds: phases run in order; an error or a
// requeue ends the reconcile with it, a zero Result hands on.
func TestRunPhasesStopsAtTheFirstThatEnds(t *testing.T) {
	type outcome struct {
		res ctrl.Result
		err error
	}
	boom := errors.New("boom")
	requeue := ctrl.Result{RequeueAfter: time.Second}
	cases := []struct {
		name     string
		outcomes []outcome
		wantRan  int
		want     outcome
	}{
		{"all hand on", []outcome{{}, {}, {}}, 3, outcome{}},
		{"a requeue ends it", []outcome{{}, {res: requeue}, {}}, 2, outcome{res: requeue}},
		{"an error ends it", []outcome{{}, {err: boom}, {}}, 2, outcome{err: boom}},
		{"an error with a requeue ends it", []outcome{{res: requeue, err: boom}, {}}, 1, outcome{res: requeue, err: boom}},
		{"the last phase's requeue", []outcome{{}, {}, {res: requeue}}, 3, outcome{res: requeue}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ran []int
			phases := make([]reconcilePhase, len(tc.outcomes))
			for i, o := range tc.outcomes {
				phases[i] = func(context.Context, *proxyScope) (ctrl.Result, error) {
					ran = append(ran, i)
					return o.res, o.err
				}
			}
			res, err := runPhases(context.Background(), &proxyScope{}, phases...)
			if res != tc.want.res || !errors.Is(err, tc.want.err) || (err == nil) != (tc.want.err == nil) {
				t.Fatalf("runPhases = %+v, %v; want %+v, %v", res, err, tc.want.res, tc.want.err)
			}
			if len(ran) != tc.wantRan {
				t.Fatalf("ran phases %v, want the first %d", ran, tc.wantRan)
			}
			for i, n := range ran {
				if n != i {
					t.Fatalf("ran phases %v, not in order", ran)
				}
			}
		})
	}
}

// TestReconcileResyncDecidesProbeOnly: the resync phase lets a Proxy skip
// reading its instance only when it was read recently enough for its
// state (Ready: ResyncInterval; booting at a settled address:
// bootingResync, or ResyncInterval once its port opened there) and no
// provider event came since. A port watch's report counts for one
// reconcile.
func TestReconcileResyncDecidesProbeOnly(t *testing.T) {
	const resync = 10 * time.Minute
	type proxyState int
	const (
		ready        proxyState = iota // served, Ready
		booting                        // provisioned, not Ready since
		broken                         // provisioned, was Ready, now failing
		noAddress                      // not provisioned yet
		agentAddress                   // booting, address from the guest agent
	)
	cases := []struct {
		name  string
		state proxyState
		// read: when the instance was last read before the reconcile; 0
		// never.
		read       time.Duration
		event      bool   // a provider event since the read
		opened     string // the port watch's report
		backingOff bool   // this manager's first-probe backoff began
		want       bool
		// wantAgain: probeOnly of a second reconcile right after
		// (the port watch's report is gone by then).
		wantAgain bool
	}{
		{name: "Ready, read a minute ago", state: ready, read: time.Minute, want: true, wantAgain: true},
		{name: "Ready, read longer ago than the resync", state: ready, read: resync},
		{name: "Ready, never read by this manager", state: ready},
		{name: "Ready, then a provider event", state: ready, read: time.Minute, event: true},
		{name: "booting, read 10s ago", state: booting, read: 10 * time.Second, want: true, wantAgain: true},
		{name: "booting, read a minute ago", state: booting, read: time.Minute},
		{name: "booting, port opened at its address, read a minute ago", state: booting, read: time.Minute, opened: stateAddress + ":3128", want: true},
		{name: "booting, port opened at another address", state: booting, read: time.Minute, opened: "10.0.0.4:3128"},
		{name: "booting, address from the guest agent", state: agentAddress, read: 10 * time.Second},
		{name: "broken, read 10s ago", state: broken, read: 10 * time.Second},
		{name: "broken but backing off, read 10s ago", state: broken, read: 10 * time.Second, backingOff: true, want: true, wantAgain: true},
		{name: "no address yet, read 1s ago", state: noAddress, read: time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: crawlv1.ProxySpec{Port: 3128}}
			p.Status.Address, p.Status.AddressSource = stateAddress, provider.AddressSourcePod
			provisioned := metav1.NewTime(now.Add(-time.Minute))
			readyStatus, readyChanged := metav1.ConditionFalse, metav1.NewTime(now.Add(-2*time.Minute))
			switch tc.state {
			case ready:
				readyStatus = metav1.ConditionTrue
				p.Status.Probe = &crawlv1.ProxyProbeStatus{}
			case broken:
				readyChanged = metav1.NewTime(now)
				p.Status.Probe = &crawlv1.ProxyProbeStatus{ConsecutiveFailures: 3}
			case noAddress:
				p.Status.Address, p.Status.AddressSource = "", ""
			case agentAddress:
				p.Status.AddressSource = provider.AddressSourceAgent
			}
			conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue,
				Reason: crawlv1.ProxyReadyReason, LastTransitionTime: provisioned})
			conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: readyStatus,
				Reason: crawlv1.ProxyReadyReason, LastTransitionTime: readyChanged})
			if tc.state == noAddress {
				conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionFalse,
					Reason: crawlv1.ProxyWaitingForAddressReason})
			}

			clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
			r := testReconciler(t, nil, clk)
			r.ResyncInterval = resync
			s := newProxyScope(context.Background(), r.Client, p)
			if tc.read > 0 {
				r.mem.markSynced(s.key, clk.Now().Add(-tc.read))
			}
			if tc.event {
				r.MarkDirty(s.key)
			}
			if tc.opened != "" {
				r.notePortOpened(s.key, tc.opened)
			}
			if tc.backingOff {
				r.mem.nextProbeBackoff(s.key, true, r.ProvisionPollInterval)
			}
			for i, want := range []bool{tc.want, tc.wantAgain} {
				s := newProxyScope(context.Background(), r.Client, p)
				res, err := r.reconcileResync(context.Background(), s)
				if err != nil || !res.IsZero() {
					t.Fatalf("reconcile %d: %+v, %v; the resync phase always hands on", i, res, err)
				}
				if s.probeOnly != want {
					t.Fatalf("reconcile %d: probeOnly = %v, want %v", i, s.probeOnly, want)
				}
			}
		})
	}
}
