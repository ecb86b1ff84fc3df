package controllers

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

// fakeEchoer answers each echo with addr, or err; it records what it was
// asked.
type fakeEchoer struct {
	mu    sync.Mutex
	addr  string
	err   error
	asked []string // url
	creds []string // username of the target
}

func (f *fakeEchoer) Echo(_ context.Context, url string, t proxyprobe.Target) (netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, url)
	f.creds = append(f.creds, t.Username)
	if f.err != nil {
		return netip.Addr{}, f.err
	}
	return netip.MustParseAddr(f.addr), nil
}

func (f *fakeEchoer) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.asked)
}

// TestEgressEcho: the echo URL measures the egress through the proxy with
// its credential at the first healthy probe, then once per interval and
// at once when the instance changes; a failed echo is retried sooner and
// leaves the last measurement until it is stale.
func TestEgressEcho(t *testing.T) {
	echo := &fakeEchoer{addr: "203.0.113.7"}
	e := newSecureEnv(t, secureProxy(managedAccess()), nil)
	e.r.Echoer = echo
	e.r.Egress = EgressOptions{EchoURL: "http://echo.example/ip", Interval: 10 * time.Minute, StaleAfter: 30 * time.Minute}
	clk := e.r.Clock.(*clocktesting.FakePassiveClock)
	step := func(d time.Duration) *crawlv1.Proxy {
		t.Helper()
		clk.SetTime(clk.Now().Add(d))
		return e.reconcileFast()
	}

	p := step(0)
	if echo.calls() != 1 || p.Status.EgressAddress != "203.0.113.7" || p.Status.EgressSource != crawlv1.EgressSourceEcho || p.Status.EgressMeasuredAt == nil {
		t.Fatalf("after the first healthy probe: %d echoes, egress %q (%s) at %v; want one echo, 203.0.113.7 (echo)", echo.calls(), p.Status.EgressAddress, p.Status.EgressSource, p.Status.EgressMeasuredAt)
	}
	if echo.asked[0] != "http://echo.example/ip" || echo.creds[0] == "" {
		t.Fatalf("echo asked %q as %q, want the flag's URL with the proxy's credential", echo.asked[0], echo.creds[0])
	}
	if evs := e.drainEvents(); !strings.Contains(strings.Join(evs, "\n"), "EgressAddressChanged") {
		t.Fatalf("events %q, want EgressAddressChanged", evs)
	}

	step(5 * time.Minute)
	if echo.calls() != 1 {
		t.Fatalf("%d echoes within the interval, want 1", echo.calls())
	}
	echo.addr = "203.0.113.8"
	p = step(5 * time.Minute)
	if echo.calls() != 2 || p.Status.EgressAddress != "203.0.113.8" {
		t.Fatalf("after the interval: %d echoes, egress %q; want 2, 203.0.113.8", echo.calls(), p.Status.EgressAddress)
	}
	if evs := e.drainEvents(); !strings.Contains(strings.Join(evs, "\n"), "egress address 203.0.113.7 -> 203.0.113.8") {
		t.Fatalf("events %q, want the change", evs)
	}

	// The instance changes (a new provider id): measured at once.
	p.Status.ProviderID = "kubernetes://ns/p-2"
	if err := e.r.Client.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	step(time.Second)
	if echo.calls() != 3 {
		t.Fatalf("%d echoes after the instance changed, want 3", echo.calls())
	}

	// Echoes fail: retried a tenth of the interval later, the measurement
	// stands until stale, then unknown.
	echo.err = errors.New("connection refused")
	measured := e.proxy().Status.EgressMeasuredAt.Time
	step(10 * time.Minute)
	p = step(time.Minute)
	if echo.calls() != 5 || p.Status.EgressAddress != "203.0.113.8" || p.Status.EgressSource != crawlv1.EgressSourceEcho {
		t.Fatalf("failing: %d echoes, egress %q (%s); want 5 (due after the interval, retried a minute later), the last measurement", echo.calls(), p.Status.EgressAddress, p.Status.EgressSource)
	}
	clk.SetTime(measured.Add(30 * time.Minute))
	p = e.reconcileFast()
	if p.Status.EgressAddress != "" || p.Status.EgressSource != crawlv1.EgressSourceUnknown || p.Status.EgressMeasuredAt != nil {
		t.Fatalf("stale: egress %q (%s) at %v, want unknown", p.Status.EgressAddress, p.Status.EgressSource, p.Status.EgressMeasuredAt)
	}
}

// TestEgressEchoURLOfThePool: a replica is measured with its pool's
// spec.egress.echoURL, not the manager's flag; a Proxy outside a pool with
// the flag's.
func TestEgressEchoURLOfThePool(t *testing.T) {
	pool := &crawlv1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pool", UID: "pool-uid"},
		Spec: crawlv1.ProxyPoolSpec{Egress: crawlv1.ProxyPoolEgress{EchoURL: "https://pool-echo.example/json"}}}
	p := secureProxy(managedAccess())
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: crawlv1.GroupVersion.String(), Kind: "ProxyPool", Name: "pool", UID: "pool-uid", Controller: ptr.To(true)}}
	echo := &fakeEchoer{addr: "198.51.100.3"}
	e := newSecureEnv(t, p, nil, pool)
	e.r.Echoer = echo
	e.r.Egress.EchoURL = "http://flag-echo.example/ip"
	e.reconcileFast()
	if echo.calls() != 1 || echo.asked[0] != "https://pool-echo.example/json" {
		t.Fatalf("echo asked %q, want the pool's URL once", echo.asked)
	}
}

// TestNoEchoURLNoMeasurement: without an echo URL, and a probe that does
// not echo, the egress is unknown and nothing is asked.
func TestNoEchoURLNoMeasurement(t *testing.T) {
	echo := &fakeEchoer{addr: "198.51.100.3"}
	e := newSecureEnv(t, secureProxy(managedAccess()), nil)
	e.r.Echoer = echo
	p := e.reconcileFast()
	if echo.calls() != 0 || p.Status.EgressAddress != "" || p.Status.EgressSource != crawlv1.EgressSourceUnknown {
		t.Fatalf("%d echoes, egress %q (%s); want none, unknown", echo.calls(), p.Status.EgressAddress, p.Status.EgressSource)
	}
}

// TestEgressSurvivesALostStatusWrite: the write of a measurement meets a
// conflict (another writer got there first); the next reconcile writes
// the remembered measurement instead of leaving the egress unknown until
// the next echo is due (the e2e saw a Ready NAT replica unmeasured for
// five minutes after its EgressAddressChanged event).
func TestEgressSurvivesALostStatusWrite(t *testing.T) {
	echo := &fakeEchoer{addr: "203.0.113.7"}
	e := newSecureEnv(t, secureProxy(managedAccess()), nil)
	e.r.Echoer = echo
	e.r.Egress = EgressOptions{EchoURL: "http://echo.example/ip", Interval: 10 * time.Minute, StaleAfter: 30 * time.Minute}
	clk := e.r.Clock.(*clocktesting.FakePassiveClock)
	e.reconcileFast() // Ready, measured
	if echo.calls() != 1 || e.proxy().Status.EgressAddress != "203.0.113.7" {
		t.Fatalf("setup: %d echoes, egress %q", echo.calls(), e.proxy().Status.EgressAddress)
	}
	// As if that write had been lost: the stored status has no egress.
	p := e.proxy()
	p.Status.EgressAddress, p.Status.EgressSource, p.Status.EgressMeasuredAt = "", crawlv1.EgressSourceUnknown, nil
	if err := e.r.Client.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	// The real thing, once: the next probe's write conflicts.
	stored, conflicts := e.r.Client, 0
	e.r.Client = interceptor.NewClient(stored.(client.WithWatch), interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if conflicts == 0 {
				conflicts++
				return apierrors.NewConflict(crawlv1.GroupVersion.WithResource("proxies").GroupResource(), obj.GetName(), errors.New("the object has been modified"))
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	echo.addr = "203.0.113.9"
	clk.SetTime(clk.Now().Add(10 * time.Minute)) // an echo is due
	// A conflict is retried soon (conflictRetry), not returned.
	if _, err := e.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: e.key}); err != nil || conflicts != 1 {
		t.Fatalf("Reconcile = %v after %d conflicts, want one conflict", err, conflicts)
	}
	if echo.calls() != 2 || e.proxy().Status.EgressAddress != "" {
		t.Fatalf("%d echoes, stored egress %q; want the second echo's write lost", echo.calls(), e.proxy().Status.EgressAddress)
	}
	clk.SetTime(clk.Now().Add(2 * time.Second)) // the next probe, no echo due
	p = e.reconcileFast()
	if echo.calls() != 2 || p.Status.EgressAddress != "203.0.113.9" || p.Status.EgressSource != crawlv1.EgressSourceEcho || p.Status.EgressMeasuredAt == nil {
		t.Fatalf("after the lost write: %d echoes, egress %q (%s) at %v; want 2 echoes, 203.0.113.9 (echo) written from memory",
			echo.calls(), p.Status.EgressAddress, p.Status.EgressSource, p.Status.EgressMeasuredAt)
	}
}
