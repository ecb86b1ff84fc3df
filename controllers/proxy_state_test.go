package controllers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/portwatch"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

// scriptedProvider answers each method from its script and records every
// call. A nil script answers as the real providers do for "nothing there":
// NotFound for Get, success for Delete.
type scriptedProvider struct {
	name   string
	create func(m *provider.Machine) (*provider.Instance, error)
	get    func(m *provider.Machine) (*provider.Instance, error)
	delete func(m *provider.Machine) error

	mu    sync.Mutex
	calls []string
}

func (s *scriptedProvider) record(call string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call)
}

func (s *scriptedProvider) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

func (s *scriptedProvider) Name() string { return s.name }

func (s *scriptedProvider) Create(ctx context.Context, m *provider.Machine) (*provider.Instance, error) {
	s.record("Create")
	if s.create == nil {
		return nil, provider.Permanentf("no Create scripted")
	}
	return s.create(m)
}

func (s *scriptedProvider) Get(ctx context.Context, m *provider.Machine) (*provider.Instance, error) {
	s.record("Get")
	if s.get == nil {
		return nil, provider.NotFoundf("no instance")
	}
	return s.get(m)
}

func (s *scriptedProvider) Delete(ctx context.Context, m *provider.Machine) error {
	s.record("Delete")
	if s.delete == nil {
		return nil
	}
	return s.delete(m)
}

func (s *scriptedProvider) ListByTag(context.Context, string) ([]provider.Instance, error) {
	return nil, nil
}

func (s *scriptedProvider) Check(context.Context) error { return nil }

const (
	stateProviderID = "kubernetes://ns/p"
	stateAddress    = "10.0.0.5"
	stateEndpoint   = "http://10.0.0.5:3128"
)

func running(addr string) func(*provider.Machine) (*provider.Instance, error) {
	return func(*provider.Machine) (*provider.Instance, error) {
		return &provider.Instance{ProviderID: stateProviderID, Host: "node1", State: provider.StateRunning, Address: addr, AddressSource: provider.AddressSourcePod}, nil
	}
}

func stopped(*provider.Machine) (*provider.Instance, error) {
	return &provider.Instance{ProviderID: stateProviderID, Host: "node1", State: provider.StateStopped}, nil
}

// errNotAnswering is the kvm provider's refusal to call a host whose health
// check got no answer.
var errNotAnswering = fmt.Errorf("get: %w", &provider.UnavailableError{Place: `KVM host "hv1"`, Reason: "no answer to its health checks since 2026-12-05T05:47:11Z"})

// errBusy is the kvm provider's refusal at its per-host call limit.
var errBusy = provider.Transient(fmt.Errorf("host %q %w: 4 calls in flight", "hv1", provider.ErrBusy))

func failWith(err error) func(*provider.Machine) (*provider.Instance, error) {
	return func(*provider.Machine) (*provider.Instance, error) { return nil, err }
}

// firstThen answers the first k calls with first and every later one with
// then: a provider whose answer changes after a repair or a retry.
func firstThen(k int, first, then func(*provider.Machine) (*provider.Instance, error)) func(*provider.Machine) (*provider.Instance, error) {
	n := 0
	return func(m *provider.Machine) (*provider.Instance, error) {
		if n++; n <= k {
			return first(m)
		}
		return then(m)
	}
}

// okProber: every proxy answers, and refuses a request without
// credentials.
type okProber struct{ requiresAuth }

func (okProber) Probe(context.Context, proxyprobe.Target) proxyprobe.Result {
	return proxyprobe.Result{OK: true, Through: true, Latency: time.Millisecond}
}

// requiresAuth answers the check without credentials as squid with Basic
// auth does: 407.
type requiresAuth struct{}

func (requiresAuth) ProbeWithoutCredentials(context.Context, proxyprobe.Target) proxyprobe.Result {
	return proxyprobe.Result{OK: true, Through: true, StatusCode: http.StatusProxyAuthRequired, Latency: time.Millisecond}
}

// testReconciler is a ProxyReconciler completed as SetupWithManager does,
// with a fake client, a fake recorder and an empty registry unless set.
func testReconciler(t *testing.T, prober proxyprobe.Prober, clk *clocktesting.FakePassiveClock, objs ...client.Object) *ProxyReconciler {
	t.Helper()
	s := runtime.NewScheme()
	if err := crawlv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if prober == nil {
		prober = okProber{}
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
		WithStatusSubresource(&crawlv1.Proxy{}, &crawlv1.KVMHost{}, &crawlv1.KVMImage{}).Build()
	r := &ProxyReconciler{
		Client:    c,
		APIReader: c,
		Recorder:  record.NewFakeRecorder(100),
		Registry:  provider.NewRegistry(),
		Plugins:   Plugins(),
		Prober:    prober,
		Tag:       "unit",
	}
	if clk != nil {
		r.Clock = clk
	}
	if err := r.complete(); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestReconcilersRejectMissingDependencies: a reconciler missing a
// dependency refuses to start and names every one missing.
func TestReconcilersRejectMissingDependencies(t *testing.T) {
	for _, tc := range []struct {
		name     string
		complete func() error
		want     string
	}{
		{"Proxy", (&ProxyReconciler{Registry: provider.NewRegistry()}).complete, "ProxyReconciler: missing APIReader, Client, Plugins, Prober, Recorder"},
		{"ProxyPool", (&ProxyPoolReconciler{}).complete, "ProxyPoolReconciler: missing Client, Plugins, Publisher, Recorder, Scheme"},
		{"KVMImage", (&KVMImageReconciler{JobContext: context.Background()}).complete, "KVMImageReconciler: missing Cacher, Client, Recorder"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.complete(); err == nil || err.Error() != tc.want {
				t.Fatalf("complete() = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestProxyStateMachine drives Reconcile step by step against a scripted
// provider and checks, after each step, the conditions, the phase, the
// requeue and the provider calls made.
func TestProxyStateMachine(t *testing.T) {
	type step struct {
		advance    time.Duration // fake clock moves before the step
		wantCalls  []string
		wantPhase  crawlv1.ProxyPhase
		wantReady  metav1.ConditionStatus
		wantReason string // Ready's reason
		wantMsg    string // in Ready's message
		// wantRequeue: 0 none, >0 RequeueAfter exactly, -1 any RequeueAfter > 0.
		wantRequeue time.Duration
		wantErr     bool
		wantGone    bool // the Proxy was released and is gone
	}
	const resync = 7 * time.Minute
	deleting := func(p *crawlv1.Proxy) {
		p.Finalizers = []string{crawlv1.ProxyFinalizer}
		p.DeletionTimestamp = &metav1.Time{Time: time.Unix(900, 0)}
	}
	recorded := func(p *crawlv1.Proxy) { p.Status.ProviderID = stateProviderID }
	cases := []struct {
		name     string
		setup    func(p *crawlv1.Proxy)
		prov     *scriptedProvider // nil: provider not enabled
		steps    []step
		wantCond map[string]string // condition type → reason after the last step
		// wantCondMsg: condition type → text its message contains after the last step.
		wantCondMsg map[string]string
		// wantNoCond: condition types absent after the last step.
		wantNoCond []string
	}{{
		name: "no instance recorded: Create then Get, Ready",
		prov: &scriptedProvider{create: running(stateAddress), get: running(stateAddress)},
		steps: []step{{wantCalls: []string{"Create", "Get"}, wantPhase: crawlv1.ProxyReady, wantReady: metav1.ConditionTrue,
			wantReason: crawlv1.ProxyReadyReason, wantMsg: "serving at " + stateEndpoint, wantRequeue: time.Second}},
		wantCond: map[string]string{crawlv1.InstanceProvisionedCondition: crawlv1.ProxyReadyReason, crawlv1.ProxyHealthyCondition: crawlv1.ProxyProbeSucceededReason},
	}, {
		name:  "instance recorded and running: Get only",
		setup: recorded,
		prov:  &scriptedProvider{get: running(stateAddress)},
		steps: []step{{wantCalls: []string{"Get"}, wantPhase: crawlv1.ProxyReady, wantReady: metav1.ConditionTrue,
			wantReason: crawlv1.ProxyReadyReason, wantMsg: "serving at", wantRequeue: time.Second}},
	}, {
		name:  "running instance with a provider remark: Ready, the remark in InstanceProvisioned",
		setup: recorded,
		prov: &scriptedProvider{get: func(m *provider.Machine) (*provider.Instance, error) {
			inst, _ := running(stateAddress)(m)
			inst.Message = "guest agent reports 10.96.0.1, DHCP lease says " + stateAddress
			return inst, nil
		}},
		steps: []step{{wantCalls: []string{"Get"}, wantPhase: crawlv1.ProxyReady, wantReady: metav1.ConditionTrue,
			wantReason: crawlv1.ProxyReadyReason, wantMsg: "serving at", wantRequeue: time.Second}},
		wantCondMsg: map[string]string{crawlv1.InstanceProvisionedCondition: "address " + stateAddress + " from pod; guest agent reports 10.96.0.1, DHCP lease says " + stateAddress},
	}, {
		name:  "instance recorded but stopped: Get, Create starts it, Get",
		setup: recorded,
		prov:  &scriptedProvider{create: running(stateAddress), get: firstThen(1, stopped, running(stateAddress))},
		steps: []step{{wantCalls: []string{"Get", "Create", "Get"}, wantPhase: crawlv1.ProxyReady, wantReady: metav1.ConditionTrue,
			wantReason: crawlv1.ProxyReadyReason, wantRequeue: time.Second}},
	}, {
		// The outage is published before the repair: Ready=False is
		// written by a reconcile that returns at once, and the next one
		// starts the instance (fault 1: Ready stayed True through the
		// start and a probe to an address nothing answered yet).
		name: "Ready instance found stopped: Ready=False written first, started by the next reconcile",
		setup: func(p *crawlv1.Proxy) {
			recorded(p)
			p.Status.Address, p.Status.Endpoint = stateAddress, stateEndpoint
			p.Status.Probe = &crawlv1.ProxyProbeStatus{}
			conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason})
			conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyProbeSucceededReason})
			conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason})
		},
		prov: &scriptedProvider{create: running(stateAddress), get: firstThen(2, stopped, running(stateAddress))},
		steps: []step{
			{wantCalls: []string{"Get"}, wantPhase: crawlv1.ProxyProvisioning, wantReady: metav1.ConditionFalse,
				wantReason: crawlv1.ProxyInstanceNotRunningReason, wantMsg: "instance was found Stopped; starting it", wantRequeue: time.Millisecond},
			{wantCalls: []string{"Get", "Create", "Get"}, wantPhase: crawlv1.ProxyReady, wantReady: metav1.ConditionTrue,
				wantReason: crawlv1.ProxyReadyReason, wantRequeue: time.Second},
		},
	}, {
		name:  "recorded instance NotFound: forgotten and rebuilt",
		setup: recorded,
		prov:  &scriptedProvider{create: running(stateAddress), get: firstThen(1, failWith(provider.NotFoundf("pod gone")), running(stateAddress))},
		steps: []step{
			{wantCalls: []string{"Get"}, wantPhase: crawlv1.ProxyPending, wantReady: metav1.ConditionFalse,
				wantReason: crawlv1.ProxyInstanceMissingReason, wantMsg: "rebuilding", wantRequeue: -1},
			{wantCalls: []string{"Create", "Get"}, wantPhase: crawlv1.ProxyReady, wantReady: metav1.ConditionTrue,
				wantReason: crawlv1.ProxyReadyReason, wantRequeue: time.Second},
		},
	}, {
		name: "Ready proxy whose provider cannot be asked: stays Ready, probed, no Create",
		setup: func(p *crawlv1.Proxy) {
			recorded(p)
			p.Status.Address, p.Status.Endpoint = stateAddress, stateEndpoint
			conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason})
			conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyProbeSucceededReason})
		},
		prov: &scriptedProvider{get: failWith(provider.Transientf(`host "hv1" busy: 4 calls in flight`))},
		steps: []step{{wantCalls: []string{"Get"}, wantPhase: crawlv1.ProxyReady, wantReady: metav1.ConditionTrue,
			wantReason: crawlv1.ProxyReadyReason, wantMsg: "serving at " + stateEndpoint, wantRequeue: 200 * time.Millisecond}},
		wantCond: map[string]string{crawlv1.InstanceProvisionedCondition: crawlv1.ProxyReadyReason},
	}, {
		// Issue 31: a host whose health check got no answer is not called;
		// what is known of the instance stays, the proxy is still probed.
		name: "Ready proxy on a host that does not answer: stays Ready and probed, HostUnavailable, no Create",
		setup: func(p *crawlv1.Proxy) {
			recorded(p)
			p.Status.Address, p.Status.Endpoint = stateAddress, stateEndpoint
			conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason, Message: "running on node1"})
			conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyProbeSucceededReason})
		},
		prov: &scriptedProvider{get: failWith(errNotAnswering)},
		steps: []step{{wantCalls: []string{"Get"}, wantPhase: crawlv1.ProxyReady, wantReady: metav1.ConditionTrue,
			wantReason: crawlv1.ProxyReadyReason, wantMsg: "serving at " + stateEndpoint, wantRequeue: time.Second}},
		wantCond:    map[string]string{crawlv1.InstanceProvisionedCondition: crawlv1.ProxyReadyReason, crawlv1.HostUnavailableCondition: crawlv1.ProxyHostNotAnsweringReason},
		wantCondMsg: map[string]string{crawlv1.InstanceProvisionedCondition: "running on node1", crawlv1.HostUnavailableCondition: `KVM host "hv1" is not answering`},
	}, {
		name: "no instance yet on a host that does not answer: waits without an error, created once it answers",
		prov: &scriptedProvider{get: running(stateAddress), create: firstThen(1, failWith(errNotAnswering), running(stateAddress))},
		steps: []step{
			{wantCalls: []string{"Create"}, wantPhase: crawlv1.ProxyPending, wantReady: metav1.ConditionFalse,
				wantReason: crawlv1.ProxyHostNotAnsweringReason, wantMsg: `KVM host "hv1" is not answering`, wantRequeue: dependencyPoll},
			{wantCalls: []string{"Create", "Get"}, wantPhase: crawlv1.ProxyReady, wantReady: metav1.ConditionTrue,
				wantReason: crawlv1.ProxyReadyReason, wantRequeue: time.Second},
		},
		wantNoCond: []string{crawlv1.HostUnavailableCondition},
	}, {
		name:  "provisioning proxy on a host that does not answer: keeps its instance, waits, no Create",
		setup: recorded,
		prov:  &scriptedProvider{get: failWith(errNotAnswering)},
		steps: []step{{wantCalls: []string{"Get"}, wantPhase: crawlv1.ProxyProvisioning, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyHostNotAnsweringReason, wantMsg: "not called until it answers", wantRequeue: dependencyPoll}},
		wantCond: map[string]string{crawlv1.HostUnavailableCondition: crawlv1.ProxyHostNotAnsweringReason},
	}, {
		name: "transient Create error: retried with backoff, not Failed",
		prov: &scriptedProvider{create: failWith(provider.Transientf("apiserver timeout"))},
		steps: []step{{wantCalls: []string{"Create"}, wantPhase: crawlv1.ProxyPending, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyTransientErrorReason, wantMsg: "apiserver timeout", wantErr: true}},
	}, {
		// A host at its call limit is flow control: no error (no backoff
		// doubling at each refusal, no error log), status as it was; the
		// provider wakes the Proxy when a slot frees.
		name: "provider busy on Create: waits without an error, status untouched, created once it takes the call",
		prov: &scriptedProvider{get: running(stateAddress), create: firstThen(1, failWith(errBusy), running(stateAddress))},
		steps: []step{
			{wantCalls: []string{"Create"}, wantPhase: crawlv1.ProxyPending, wantReady: metav1.ConditionFalse,
				wantReason: conditions.NotYetReportedReason, wantRequeue: busyRetry},
			{wantCalls: []string{"Create", "Get"}, wantPhase: crawlv1.ProxyReady, wantReady: metav1.ConditionTrue,
				wantReason: crawlv1.ProxyReadyReason, wantRequeue: time.Second},
		},
		wantCond: map[string]string{crawlv1.InstanceProvisionedCondition: crawlv1.ProxyReadyReason},
	}, {
		name: "waiting for its address, provider busy on Get: keeps WaitingForAddress, no Create, no error",
		setup: func(p *crawlv1.Proxy) {
			recorded(p)
			conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionFalse, Reason: crawlv1.ProxyWaitingForAddressReason, Message: "running, no routable IPv4 address yet"})
		},
		prov: &scriptedProvider{get: failWith(errBusy)},
		steps: []step{{wantCalls: []string{"Get"}, wantPhase: crawlv1.ProxyProvisioning, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyWaitingForAddressReason, wantMsg: "no routable IPv4 address yet", wantRequeue: busyRetry}},
		wantCond: map[string]string{crawlv1.InstanceProvisionedCondition: crawlv1.ProxyWaitingForAddressReason},
	}, {
		name: "no capacity where the instance goes: retried, and said so (a pool tries its other zones first)",
		prov: &scriptedProvider{create: failWith(provider.NoCapacity(errors.New("ZONE_RESOURCE_POOL_EXHAUSTED in us-central1-a")))},
		steps: []step{{wantCalls: []string{"Create"}, wantPhase: crawlv1.ProxyPending, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyInsufficientCapacityReason, wantMsg: "ZONE_RESOURCE_POOL_EXHAUSTED", wantErr: true}},
		wantCond: map[string]string{crawlv1.InstanceProvisionedCondition: crawlv1.ProxyInsufficientCapacityReason},
	}, {
		name: "permanent Create error: Failed, waits a resync, no hot loop",
		prov: &scriptedProvider{create: failWith(provider.Permanentf("quota exceeded"))},
		steps: []step{
			{wantCalls: []string{"Create"}, wantPhase: crawlv1.ProxyFailed, wantReady: metav1.ConditionFalse,
				wantReason: crawlv1.ProxyPermanentErrorReason, wantMsg: "quota exceeded", wantRequeue: resync},
			{wantCalls: []string{"Create"}, wantPhase: crawlv1.ProxyFailed, wantReady: metav1.ConditionFalse,
				wantReason: crawlv1.ProxyPermanentErrorReason, wantRequeue: resync},
		},
	}, {
		name: "foreign instance on Create: Failed ForeignInstance",
		prov: &scriptedProvider{create: failWith(&provider.IdentityError{Kind: "pod", Name: "ns.p", Mismatch: "uid x != y"})},
		steps: []step{{wantCalls: []string{"Create"}, wantPhase: crawlv1.ProxyFailed, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyForeignInstanceReason, wantMsg: "not this Proxy's", wantRequeue: resync}},
	}, {
		name: "provider not enabled: Failed without provider calls",
		steps: []step{{wantCalls: nil, wantPhase: crawlv1.ProxyFailed, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyProviderDisabledReason, wantMsg: "not enabled", wantRequeue: resync}},
	}, {
		name: "running without an address: Provisioning, then Failed after the address timeout",
		prov: &scriptedProvider{create: running(""), get: func(m *provider.Machine) (*provider.Instance, error) {
			inst, _ := running("")(m)
			inst.Message = "no DHCP lease"
			return inst, nil
		}},
		steps: []step{
			{wantCalls: []string{"Create", "Get"}, wantPhase: crawlv1.ProxyProvisioning, wantReady: metav1.ConditionFalse,
				wantReason: crawlv1.ProxyWaitingForAddressReason, wantMsg: "no DHCP lease", wantRequeue: 200 * time.Millisecond},
			{advance: 6 * time.Minute, wantCalls: []string{"Get"}, wantPhase: crawlv1.ProxyFailed, wantReady: metav1.ConditionFalse,
				wantReason: crawlv1.ProxyAddressTimeoutReason, wantMsg: "no address after 6m0s: running, no routable IPv4 address yet: no DHCP lease", wantRequeue: time.Minute},
		},
	}, {
		name:  "delete: Deleting, Delete, finalizer released",
		setup: func(p *crawlv1.Proxy) { recorded(p); deleting(p) },
		prov:  &scriptedProvider{},
		steps: []step{{wantCalls: []string{"Delete"}, wantGone: true}},
	}, {
		name:  "transient Delete error: Deleting, retried",
		setup: func(p *crawlv1.Proxy) { recorded(p); deleting(p) },
		prov:  &scriptedProvider{delete: func(*provider.Machine) error { return provider.Transientf("connection reset") }},
		steps: []step{{wantCalls: []string{"Delete"}, wantPhase: crawlv1.ProxyDeleting, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyDeletingReason, wantMsg: "deleting instance " + stateProviderID, wantErr: true}},
		wantCond: map[string]string{crawlv1.DeletionBlockedCondition: crawlv1.ProxyTransientErrorReason},
	}, {
		name:  "delete on a busy provider: Deleting, waits without an error, nothing blocked",
		setup: func(p *crawlv1.Proxy) { recorded(p); deleting(p) },
		prov:  &scriptedProvider{delete: func(*provider.Machine) error { return errBusy }},
		steps: []step{{wantCalls: []string{"Delete"}, wantPhase: crawlv1.ProxyDeleting, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyDeletingReason, wantMsg: "deleting instance " + stateProviderID, wantRequeue: busyRetry}},
		wantNoCond: []string{crawlv1.DeletionBlockedCondition},
	}, {
		name:  "delete on a host that does not answer: DeletionBlocked HostNotAnswering, no error to back off from",
		setup: func(p *crawlv1.Proxy) { recorded(p); deleting(p) },
		prov:  &scriptedProvider{delete: func(*provider.Machine) error { return errNotAnswering }},
		steps: []step{{wantCalls: []string{"Delete"}, wantPhase: crawlv1.ProxyDeleting, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyDeletingReason, wantRequeue: dependencyPoll}},
		wantCond:    map[string]string{crawlv1.DeletionBlockedCondition: crawlv1.ProxyHostNotAnsweringReason, crawlv1.HostUnavailableCondition: crawlv1.ProxyHostNotAnsweringReason},
		wantCondMsg: map[string]string{crawlv1.DeletionBlockedCondition: `KVM host "hv1" is not answering (no answer to its health checks since 2026-12-05T05:47:11Z); not called until it answers; deletion waits for it, or set annotation ` + crawlv1.SkipCleanupAnnotation + "=true"},
	}, {
		name:  "delete on a host that does not answer: DeletionBlocked, waits without an error, released once it answers",
		setup: func(p *crawlv1.Proxy) { recorded(p); deleting(p) },
		prov: &scriptedProvider{delete: func() func(*provider.Machine) error {
			n := 0
			return func(*provider.Machine) error {
				if n++; n == 1 {
					return errNotAnswering
				}
				return nil
			}
		}()},
		steps: []step{
			{wantCalls: []string{"Delete"}, wantPhase: crawlv1.ProxyDeleting, wantReady: metav1.ConditionFalse,
				wantReason: crawlv1.ProxyDeletingReason, wantRequeue: dependencyPoll},
			{wantCalls: []string{"Delete"}, wantGone: true},
		},
	}, {
		name:  "IdentityError on Delete: DeletionBlocked, finalizer kept, no hot loop",
		setup: func(p *crawlv1.Proxy) { recorded(p); deleting(p) },
		prov: &scriptedProvider{delete: func(*provider.Machine) error {
			return &provider.IdentityError{Kind: "pod", Name: "ns.p", Mismatch: "uid x != y"}
		}},
		steps: []step{{wantCalls: []string{"Delete"}, wantPhase: crawlv1.ProxyDeleting, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyDeletingReason, wantRequeue: resync}},
		wantCond: map[string]string{crawlv1.DeletionBlockedCondition: crawlv1.ProxyForeignInstanceReason},
	}, {
		name: "skip-cleanup: released without provider calls",
		setup: func(p *crawlv1.Proxy) {
			recorded(p)
			deleting(p)
			p.Annotations = map[string]string{crawlv1.SkipCleanupAnnotation: "true"}
		},
		prov:  &scriptedProvider{},
		steps: []step{{wantCalls: nil, wantGone: true}},
	}, {
		name:  "provider not enabled on delete: DeletionBlocked until skip-cleanup",
		setup: func(p *crawlv1.Proxy) { recorded(p); deleting(p) },
		steps: []step{{wantCalls: nil, wantPhase: crawlv1.ProxyDeleting, wantReady: metav1.ConditionFalse,
			wantReason: crawlv1.ProxyDeletingReason, wantRequeue: time.Minute}},
		wantCond: map[string]string{crawlv1.DeletionBlockedCondition: crawlv1.ProxyProviderDisabledReason},
	}}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &crawlv1.Proxy{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1"},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Port: 3128,
					Placement: crawlv1.ProxyPlacement{Image: "registry.example/squid:6"}},
			}
			if tc.setup != nil {
				tc.setup(p)
			}
			clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
			r := testReconciler(t, nil, clk, p)
			r.ProbeInterval, r.ProvisionPollInterval, r.ResyncInterval, r.AddressTimeout = time.Second, 200*time.Millisecond, resync, 5*time.Minute
			if tc.prov != nil {
				tc.prov.name = string(crawlv1.ProviderKubernetes)
				r.Registry.Add(tc.prov)
			}
			key := client.ObjectKeyFromObject(p)
			for i, st := range tc.steps {
				clk.SetTime(clk.Now().Add(st.advance))
				var before int
				if tc.prov != nil {
					before = len(tc.prov.Calls())
				}
				// Each step re-reads the Proxy: the provider's state is
				// all that carries over, as between real reconciles.
				r.MarkDirty(key)
				res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key})
				if (err != nil) != st.wantErr {
					t.Fatalf("step %d: err = %v, want error %v", i, err, st.wantErr)
				}
				var calls []string
				if tc.prov != nil {
					calls = tc.prov.Calls()[before:]
				}
				if !slices.Equal(calls, st.wantCalls) {
					t.Fatalf("step %d: provider calls %v, want %v", i, calls, st.wantCalls)
				}
				switch {
				case st.wantRequeue == -1 && res.RequeueAfter <= 0,
					st.wantRequeue >= 0 && res.RequeueAfter != st.wantRequeue:
					t.Fatalf("step %d: RequeueAfter %v, want %v", i, res.RequeueAfter, st.wantRequeue)
				}
				got := &crawlv1.Proxy{}
				err = r.Client.Get(context.Background(), key, got)
				if st.wantGone {
					if !apierrors.IsNotFound(err) {
						t.Fatalf("step %d: Proxy still there (err %v, finalizers %v)", i, err, got.Finalizers)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if !controllerutil.ContainsFinalizer(got, crawlv1.ProxyFinalizer) {
					t.Fatalf("step %d: finalizer missing", i)
				}
				ready := conditions.Get(got, crawlv1.ReadyCondition)
				if ready == nil || ready.Status != st.wantReady || ready.Reason != st.wantReason || !strings.Contains(ready.Message, st.wantMsg) {
					t.Fatalf("step %d: Ready = %+v, want %s %s containing %q", i, ready, st.wantReady, st.wantReason, st.wantMsg)
				}
				if got.Status.Phase != st.wantPhase {
					t.Fatalf("step %d: phase %s, want %s", i, got.Status.Phase, st.wantPhase)
				}
			}
			got := &crawlv1.Proxy{}
			if err := r.Client.Get(context.Background(), key, got); err != nil {
				t.Fatal(err)
			}
			for typ, reason := range tc.wantCond {
				if c := conditions.Get(got, typ); c == nil || c.Reason != reason {
					t.Fatalf("%s = %+v, want reason %s", typ, c, reason)
				}
			}
			for _, typ := range tc.wantNoCond {
				if c := conditions.Get(got, typ); c != nil {
					t.Fatalf("%s = %+v, want it gone", typ, c)
				}
			}
			for typ, msg := range tc.wantCondMsg {
				if c := conditions.Get(got, typ); c == nil || !strings.Contains(c.Message, msg) {
					t.Fatalf("%s = %+v, want a message containing %q", typ, c, msg)
				}
			}
		})
	}
}

func TestProxyPhaseFollowsConditions(t *testing.T) {
	cond := func(typ string, ok bool, reason string) metav1.Condition {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		return metav1.Condition{Type: typ, Status: s, Reason: reason}
	}
	cases := []struct {
		name  string
		id    string
		conds []metav1.Condition
		want  crawlv1.ProxyPhase
	}{
		{"nothing yet", "", nil, crawlv1.ProxyPending},
		{"waiting for a host", "", []metav1.Condition{cond(crawlv1.InstanceProvisionedCondition, false, crawlv1.ProxyWaitingForHostReason)}, crawlv1.ProxyPending},
		{"booting", "x", []metav1.Condition{cond(crawlv1.InstanceProvisionedCondition, false, crawlv1.ProxyWaitingForAddressReason)}, crawlv1.ProxyProvisioning},
		{"probe failing", "x", []metav1.Condition{cond(crawlv1.InstanceProvisionedCondition, true, crawlv1.ProxyReadyReason), cond(crawlv1.ProxyHealthyCondition, false, crawlv1.ProxyProbeFailedReason)}, crawlv1.ProxyProvisioning},
		{"serving", "x", []metav1.Condition{cond(crawlv1.InstanceProvisionedCondition, true, crawlv1.ProxyReadyReason), cond(crawlv1.ProxyHealthyCondition, true, crawlv1.ProxyProbeSucceededReason)}, crawlv1.ProxyReady},
		{"permanent error", "", []metav1.Condition{cond(crawlv1.InstanceProvisionedCondition, false, crawlv1.ProxyPermanentErrorReason)}, crawlv1.ProxyFailed},
		{"address timeout", "x", []metav1.Condition{cond(crawlv1.InstanceProvisionedCondition, false, crawlv1.ProxyAddressTimeoutReason)}, crawlv1.ProxyFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &crawlv1.Proxy{Status: crawlv1.ProxyStatus{ProviderID: tc.id, Endpoint: stateEndpoint, Conditions: tc.conds}}
			summarize(p)
			if p.Status.Phase != tc.want {
				t.Fatalf("phase %s, want %s (Ready %+v)", p.Status.Phase, tc.want, conditions.Get(p, crawlv1.ReadyCondition))
			}
			if (tc.want == crawlv1.ProxyReady) != conditions.IsTrue(p, crawlv1.ReadyCondition) {
				t.Fatalf("Ready %+v disagrees with phase %s", conditions.Get(p, crawlv1.ReadyCondition), p.Status.Phase)
			}
		})
	}
}

// TestFirstProbeBacksOff: until a Proxy is first healthy its probe is
// retried after 500ms, doubling up to ProvisionPollInterval; once healthy it
// probes every ProbeInterval, and a healthy Proxy's failures keep the
// threshold and the poll interval. A restarted manager (nothing in memory)
// tells the two apart by the conditions: a Proxy not Ready since it was
// provisioned is booting.
func TestFirstProbeBacksOff(t *testing.T) {
	ok := proxyprobe.Result{OK: true, Through: true, Latency: time.Millisecond}
	closed := proxyprobe.Result{Err: errors.New("connection refused"), Latency: time.Millisecond}
	const poll, probe = 5 * time.Second, 30 * time.Second
	ms := time.Millisecond
	cases := []struct {
		name   string
		script []proxyprobe.Result
		// forgetAfter: forget the Proxy (deleted and created again, status
		// empty) after this many probes; 0 = never.
		forgetAfter int
		want        []time.Duration
		// restartAfter: the manager restarts (memory lost, status kept)
		// after this many probes; 0 = never.
		restartAfter int
		// downAfter: the instance is found stopped (and started again)
		// after this many probes; 0 = never.
		downAfter int
	}{
		{"port opens late", []proxyprobe.Result{closed, closed, closed, closed, closed, closed, ok, ok},
			0, []time.Duration{500 * ms, time.Second, 2 * time.Second, 4 * time.Second, poll, poll, probe, probe}, 0, 0},
		{"a healthy proxy's failure keeps the poll interval", []proxyprobe.Result{closed, ok, closed, closed, closed, closed},
			0, []time.Duration{500 * ms, probe, poll, poll, poll, poll}, 0, 0},
		{"forget restarts the backoff", []proxyprobe.Result{closed, closed, closed, closed},
			2, []time.Duration{500 * ms, time.Second, 500 * ms, time.Second}, 0, 0},
		// Fault 6 on the real hypervisor: the restarted manager polled a
		// booting Proxy at the full interval.
		{"a restarted manager backs off a booting proxy", []proxyprobe.Result{closed, closed, closed, closed},
			0, []time.Duration{500 * ms, time.Second, 500 * ms, time.Second}, 2, 0},
		{"a restarted manager keeps the poll interval for a proxy that was Ready", []proxyprobe.Result{closed, ok, closed, closed, closed, closed, closed},
			0, []time.Duration{500 * ms, probe, poll, poll, poll, poll, poll}, 5, 0},
		// Fault 1 on the real hypervisor: a domain destroyed and started
		// again boots like a new one (lag 6 s at the poll interval).
		{"an instance found stopped and started again backs off as it boots", []proxyprobe.Result{closed, ok, closed, closed, closed},
			0, []time.Duration{500 * ms, probe, 500 * ms, time.Second, 2 * time.Second}, 0, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := testReconciler(t, &scriptedProber{results: tc.script}, clocktesting.NewFakePassiveClock(time.Unix(1000, 0)))
			r.ProvisionPollInterval, r.ProbeInterval = poll, probe
			newProxy := func() *crawlv1.Proxy {
				p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
					Spec: crawlv1.ProxySpec{Port: 3128}, Status: crawlv1.ProxyStatus{Address: "192.0.2.1", Endpoint: "http://192.0.2.1:3128"}}
				// Not Ready since its creation, provisioned a minute ago.
				conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: crawlv1.ProxyProvisioningReason,
					LastTransitionTime: metav1.NewTime(time.Now().Add(-2 * time.Minute))})
				conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason,
					LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Minute))})
				return p
			}
			p := newProxy()
			var got []time.Duration
			for i := range tc.script {
				if tc.forgetAfter != 0 && i == tc.forgetAfter {
					r.forget(client.ObjectKeyFromObject(p))
					p = newProxy()
				}
				if tc.restartAfter != 0 && i == tc.restartAfter {
					r.forget(client.ObjectKeyFromObject(p))
				}
				if tc.downAfter != 0 && i == tc.downAfter {
					r.instanceDown(p, provider.StateStopped)
					summarize(p)
				}
				res, err := r.reconcileHealth(context.Background(), newProxyScope(context.Background(), r.Client, p))
				if err != nil {
					t.Fatal(err)
				}
				summarize(p) // as the deferred patch does
				got = append(got, res.RequeueAfter)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("requeues %v, want %v", got, tc.want)
			}
		})
	}
}

// downProber: the proxy does not answer (a squid still booting).
type downProber struct{ requiresAuth }

func (downProber) Probe(context.Context, proxyprobe.Target) proxyprobe.Result {
	return proxyprobe.Result{Err: errors.New("connection refused"), Latency: time.Millisecond}
}

// Health is a verdict on one instance at one address. A Ready proxy whose
// instance is rebuilt, or whose address changes, has not been probed there
// yet: it must not stay Ready on the old instance's record while the
// failure threshold counts (fault 2 on the real hypervisor: Ready 4 s
// before the rebuilt guest served anything).
func TestHealthDoesNotCarryOverToANewInstanceOrAddress(t *testing.T) {
	const newAddress = "10.0.0.9"
	cases := []struct {
		name  string
		prov  *scriptedProvider
		steps int
	}{
		{name: "instance rebuilt", steps: 2, prov: &scriptedProvider{create: running(newAddress), get: func() func(*provider.Machine) (*provider.Instance, error) {
			n := 0
			return func(m *provider.Machine) (*provider.Instance, error) {
				if n++; n == 1 {
					return nil, provider.NotFoundf("domain gone")
				}
				return running(newAddress)(m)
			}
		}()}},
		{name: "same instance, new address", steps: 1, prov: &scriptedProvider{get: running(newAddress)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &crawlv1.Proxy{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1", Finalizers: []string{crawlv1.ProxyFinalizer}},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Port: 3128,
					Placement: crawlv1.ProxyPlacement{Image: "registry.example/squid:6"}},
			}
			p.Status.ProviderID, p.Status.Address, p.Status.Endpoint = stateProviderID, stateAddress, stateEndpoint
			p.Status.Probe = &crawlv1.ProxyProbeStatus{}
			conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason})
			conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyProbeSucceededReason})
			conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason})
			r := testReconciler(t, downProber{}, clocktesting.NewFakePassiveClock(time.Unix(1000, 0)), p)
			tc.prov.name = string(crawlv1.ProviderKubernetes)
			r.Registry.Add(tc.prov)
			key := client.ObjectKeyFromObject(p)
			for i := range tc.steps {
				r.MarkDirty(key)
				if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key}); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			got := &crawlv1.Proxy{}
			if err := r.Client.Get(context.Background(), key, got); err != nil {
				t.Fatal(err)
			}
			if got.Status.Address != newAddress {
				t.Fatalf("address %q, want %q", got.Status.Address, newAddress)
			}
			if conditions.IsTrue(got, crawlv1.ReadyCondition) || conditions.IsTrue(got, crawlv1.ProxyHealthyCondition) {
				t.Fatalf("Ready %+v, ProxyHealthy %+v: want both False until a probe succeeds at %s",
					conditions.Get(got, crawlv1.ReadyCondition), conditions.Get(got, crawlv1.ProxyHealthyCondition), newAddress)
			}
		})
	}
}

// TestBootingProxyPortIsWatched: a Proxy in its first-probe backoff gets
// one port watch, dialing the address and port the probe uses; it ends when
// the probe succeeds or the address changes, and a Proxy that was healthy
// gets none (a broken proxy is the poll's).
func TestBootingProxyPortIsWatched(t *testing.T) {
	ok := proxyprobe.Result{OK: true, Through: true, Latency: time.Millisecond}
	closed := proxyprobe.Result{Err: errors.New("connection refused"), Latency: time.Millisecond}
	cases := []struct {
		name   string
		script []proxyprobe.Result
		// newAddress: the instance is re-read with another address after
		// the script.
		newAddress bool
		// wantRunning after the script: watches still dialing.
		wantRunning int
	}{
		{name: "booting, port closed", script: []proxyprobe.Result{closed, closed, closed}, wantRunning: 1},
		{name: "probe succeeded", script: []proxyprobe.Result{closed, closed, ok}, wantRunning: 0},
		{name: "address changed", script: []proxyprobe.Result{closed}, newAddress: true, wantRunning: 0},
		{name: "was healthy, now failing", script: []proxyprobe.Result{ok, closed, closed, closed, closed, closed}, wantRunning: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			dialed := map[string]int{}
			refuse := func(_ context.Context, _, addr string) (net.Conn, error) {
				mu.Lock()
				defer mu.Unlock()
				dialed[addr]++
				return nil, errors.New("connection refused")
			}
			r := testReconciler(t, &scriptedProber{results: tc.script}, clocktesting.NewFakePassiveClock(time.Unix(1000, 0)))
			r.PortWatch, r.PortOpen = newPortWatch(ctx, portwatch.Options{Interval: time.Millisecond, Dial: refuse}, r.notePortOpened)
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
				Spec: crawlv1.ProxySpec{Port: 3128}, Status: crawlv1.ProxyStatus{Address: "192.0.2.1", Endpoint: "http://192.0.2.1:3128"}}
			conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason,
				LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Minute))})
			for range tc.script {
				if _, err := r.reconcileHealth(ctx, newProxyScope(ctx, r.Client, p)); err != nil {
					t.Fatal(err)
				}
				summarize(p)
				if n := r.PortWatch.Running(); n > 1 {
					t.Fatalf("%d watches for one Proxy", n)
				}
			}
			if tc.newAddress {
				r.recordInstance(p, &provider.Instance{ProviderID: "id", State: provider.StateRunning, Address: "192.0.2.2"})
			}
			testutil.WaitFor(t, func() bool { return r.PortWatch.Running() == tc.wantRunning })
			if tc.wantRunning == 1 {
				testutil.WaitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return dialed["192.0.2.1:3128"] > 0 })
				mu.Lock()
				defer mu.Unlock()
				if len(dialed) != 1 {
					t.Fatalf("dialed %v, want only the probe's 192.0.2.1:3128", dialed)
				}
			}
		})
	}
}

// TestBootingProxyIsProbedWithoutRereads: a booting Proxy whose address is
// known is only probed, without reading its instance again, for
// bootingResync after the last read, and for ResyncInterval once its port
// has opened at its recorded address. On the real hypervisor each read asked
// the guest agent (up to 2 s while the guest boots), and the reconcile woken
// by the port opening waited behind one, holding Ready 1.2-2.7 s behind the
// first request served. A report about another address, a provider event,
// an older read, or a Proxy that served before (broken, not booting) read
// the instance again.
func TestBootingProxyIsProbedWithoutRereads(t *testing.T) {
	const resync = 10 * time.Minute
	cases := []struct {
		name string
		// wasReady: the Proxy served before and broke (not booting).
		wasReady bool
		// source: status.addressSource (default: the pod's).
		source string
		// backingOff: this manager began its first-probe backoff (an
		// instance found stopped and started again, whose conditions no
		// longer say so once a probe failed).
		backingOff bool
		// opened: where the port watch saw the port accept ("" no report).
		opened string
		// event: a provider event for the Proxy came after its last read.
		event bool
		// since: time since the instance was last read.
		since     time.Duration
		wantCalls []string
	}{
		{name: "booting, read 10s ago", since: 10 * time.Second, wantCalls: nil},
		{name: "booting, read a minute ago", since: time.Minute, wantCalls: []string{"Get"}},
		{name: "port opened at the recorded address", opened: stateAddress + ":3128", wantCalls: nil},
		{name: "port opened, read a minute ago", opened: stateAddress + ":3128", since: time.Minute, wantCalls: nil},
		{name: "port opened, read longer ago than the resync", opened: stateAddress + ":3128", since: resync, wantCalls: []string{"Get"}},
		{name: "port opened at an address since replaced, read a minute ago", opened: "10.0.0.4:3128", since: time.Minute, wantCalls: []string{"Get"}},
		{name: "port opened, then a provider event", opened: stateAddress + ":3128", event: true, wantCalls: []string{"Get"}},
		{name: "booting, then a provider event", event: true, wantCalls: []string{"Get"}},
		{name: "served before, now failing", wasReady: true, since: 10 * time.Second, wantCalls: []string{"Get"}},
		// Fault 2 in a CI run: the agent's address was read 0.1 s before
		// the lease appeared, and the Proxy turned Ready still showing
		// addressSource agent, which kvm replaces with the lease.
		{name: "booting, address from the guest agent", source: provider.AddressSourceAgent, since: 10 * time.Second, wantCalls: []string{"Get"}},
		{name: "booting, address from the lease", source: provider.AddressSourceLease, since: 10 * time.Second, wantCalls: nil},
		{name: "port opened, address from the guest agent", source: provider.AddressSourceAgent, opened: stateAddress + ":3128", wantCalls: []string{"Get"}},
		// Fault 1 on the real hypervisor: every backoff step read the
		// instance, the last one 2.6 s long as squid started.
		{name: "started again, booting by the backoff", wasReady: true, backingOff: true, since: 10 * time.Second, wantCalls: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			p := &crawlv1.Proxy{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1", Finalizers: []string{crawlv1.ProxyFinalizer}},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Port: 3128,
					Placement: crawlv1.ProxyPlacement{Image: "registry.example/squid:6"}},
			}
			p.Status.ProviderID, p.Status.Address, p.Status.Endpoint = stateProviderID, stateAddress, stateEndpoint
			p.Status.AddressSource = provider.AddressSourcePod
			if tc.source != "" {
				p.Status.AddressSource = tc.source
			}
			p.Status.Probe = &crawlv1.ProxyProbeStatus{ConsecutiveFailures: 3}
			readyChanged := now.Add(-2 * time.Minute) // not Ready since before it was provisioned
			if tc.wasReady {
				readyChanged = now.Add(-time.Second)
			}
			conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason,
				LastTransitionTime: metav1.NewTime(now.Add(-time.Minute))})
			conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionFalse, Reason: crawlv1.ProxyPortClosedReason,
				LastTransitionTime: metav1.NewTime(readyChanged)})
			conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: crawlv1.ProxyPortClosedReason,
				LastTransitionTime: metav1.NewTime(readyChanged)})
			conditions.Set(p, metav1.Condition{Type: crawlv1.SecureCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyAuthRequiredReason})
			prov := &scriptedProvider{name: string(crawlv1.ProviderKubernetes), get: running(stateAddress)}
			clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
			r := testReconciler(t, nil, clk, p)
			r.ResyncInterval = resync
			r.Registry.Add(prov)
			key := client.ObjectKeyFromObject(p)
			r.mem.markSynced(key, r.Clock.Now())
			if tc.backingOff {
				r.mem.nextProbeBackoff(key, true, r.ProvisionPollInterval)
			}
			clk.SetTime(clk.Now().Add(tc.since))
			if tc.opened != "" {
				r.notePortOpened(key, tc.opened)
			}
			if tc.event {
				r.MarkDirty(key)
			}
			if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key}); err != nil {
				t.Fatal(err)
			}
			if calls := prov.Calls(); !slices.Equal(calls, tc.wantCalls) {
				t.Fatalf("provider calls %v, want %v", calls, tc.wantCalls)
			}
			got := &crawlv1.Proxy{}
			if err := r.Client.Get(context.Background(), key, got); err != nil {
				t.Fatal(err)
			}
			if !conditions.IsTrue(got, crawlv1.ReadyCondition) {
				t.Fatalf("Ready %+v, want True after the probe succeeded", conditions.Get(got, crawlv1.ReadyCondition))
			}
		})
	}
}

// hungProber: the proxy accepts the probe and never answers (a guest being
// destroyed under it), until the probe's context ends. started is closed
// when the first probe is under way.
type hungProber struct {
	requiresAuth
	started chan struct{}
	once    sync.Once
}

func (h *hungProber) Probe(ctx context.Context, _ proxyprobe.Target) proxyprobe.Result {
	h.once.Do(func() { close(h.started) })
	select {
	case <-ctx.Done():
		return proxyprobe.Result{Through: true, Err: ctx.Err()}
	case <-time.After(time.Minute):
		return proxyprobe.Result{Through: true, Err: errors.New("no answer in a minute")}
	}
}

// TestProviderEventInterruptsTheProbe: a libvirt event for a Proxy whose
// probe is under way ends that probe at once and leaves its health verdict
// as it was; the event's reconcile re-reads the instance. Before, the
// probe ran its timeout first (fault 2 on the real hypervisor: Ready=False
// came up to 4.7 s after the domain's stopped event).
func TestProviderEventInterruptsTheProbe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prober := &hungProber{started: make(chan struct{})}
	r := testReconciler(t, prober, clocktesting.NewFakePassiveClock(time.Unix(1000, 0)))
	src := make(chan kvm.DomainEvent)
	requeued := BridgeKVMEvents(ctx, src, r)
	p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
		Spec: crawlv1.ProxySpec{Port: 3128}, Status: crawlv1.ProxyStatus{Address: "192.0.2.1", Endpoint: "http://192.0.2.1:3128",
			Probe: &crawlv1.ProxyProbeStatus{}}}
	conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason})
	conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyProbeSucceededReason})
	key := client.ObjectKeyFromObject(p)
	r.mem.markSynced(key, r.Clock.Now())

	type outcome struct {
		res ctrl.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := r.reconcileHealth(ctx, newProxyScope(ctx, r.Client, p))
		done <- outcome{res, err}
	}()
	<-prober.started
	src <- kvm.DomainEvent{Host: "hv1", Namespace: "ns", Name: "p", Event: libvirt.DomainEventStopped}
	var got outcome
	select {
	case got = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the probe was not interrupted by the domain's stopped event")
	}
	if got.err != nil || got.res.RequeueAfter <= 0 || got.res.RequeueAfter > time.Second {
		t.Fatalf("result %+v, %v: want a prompt requeue", got.res, got.err)
	}
	if !conditions.IsTrue(p, crawlv1.ProxyHealthyCondition) || p.Status.Probe.ConsecutiveFailures != 0 || p.Status.Probe.LastError != "" {
		t.Fatalf("ProxyHealthy %+v, probe %+v: an interrupted probe is no verdict", conditions.Get(p, crawlv1.ProxyHealthyCondition), p.Status.Probe)
	}
	if r.mem.readWithin(key, r.ResyncInterval, r.Clock.Now()) {
		t.Fatal("the event did not mark the instance for a re-read")
	}
	if ev := <-requeued; ev.Object.GetName() != "p" {
		t.Fatalf("requeued %s, want p", ev.Object.GetName())
	}
	// A probe after the event is not interrupted by it.
	prober2 := &scriptedProber{results: []proxyprobe.Result{{OK: true, Through: true, Latency: time.Millisecond}}}
	r.Prober = prober2
	if res, err := r.reconcileHealth(ctx, newProxyScope(ctx, r.Client, p)); err != nil || res.RequeueAfter != r.ProbeInterval {
		t.Fatalf("next probe: %+v, %v; want the probe interval", res, err)
	}
}
