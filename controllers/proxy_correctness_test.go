package controllers

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

const domainUUID = "00000000-0000-4000-8000-000000000001"

// hostsProvider is a kvm provider in miniature: domains live on named hosts,
// Create defines (or starts) one on m.Host, Get and Delete look only on
// m.Host, and a Machine without a host is a permanent error, as in the real
// provider.
type hostsProvider struct {
	mu      sync.Mutex
	domains map[string]map[string]provider.State // host → "<ns>.<name>" → state
	calls   []string
}

func newHostsProvider() *hostsProvider {
	return &hostsProvider{domains: map[string]map[string]provider.State{}}
}

func (h *hostsProvider) Name() string { return string(crawlv1.ProviderKVM) }

func (h *hostsProvider) inst(m *provider.Machine, st provider.State) *provider.Instance {
	return &provider.Instance{ProviderID: provider.FormatKVMProviderID(m.Host, domainUUID), Host: m.Host, State: st,
		Address: "10.0.0.5", AddressSource: provider.AddressSourceAgent}
}

func (h *hostsProvider) Create(_ context.Context, m *provider.Machine) (*provider.Instance, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, "Create "+m.Host)
	if m.Host == "" {
		return nil, provider.Permanentf("no host")
	}
	if h.domains[m.Host] == nil {
		h.domains[m.Host] = map[string]provider.State{}
	}
	h.domains[m.Host][m.Namespace+"."+m.Name] = provider.StateRunning
	return h.inst(m, provider.StateRunning), nil
}

func (h *hostsProvider) Get(_ context.Context, m *provider.Machine) (*provider.Instance, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, "Get "+m.Host)
	if m.Host == "" {
		return nil, provider.Permanentf("no host")
	}
	st, ok := h.domains[m.Host][m.Namespace+"."+m.Name]
	if !ok {
		return nil, provider.NotFoundf("domain %s.%s not on %s", m.Namespace, m.Name, m.Host)
	}
	return h.inst(m, st), nil
}

func (h *hostsProvider) Delete(_ context.Context, m *provider.Machine) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, "Delete "+m.Host)
	if m.Host == "" {
		return provider.Permanentf("spec.placement.host: no host to delete on")
	}
	delete(h.domains[m.Host], m.Namespace+"."+m.Name)
	return nil
}

func (h *hostsProvider) ListByTag(context.Context, string) ([]provider.Instance, error) {
	return nil, nil
}
func (h *hostsProvider) Check(context.Context) error { return nil }

func (h *hostsProvider) setState(host, dom string, st provider.State) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.domains[host][dom] = st
}

// domainCount is how many domains of dom exist on all hosts.
func (h *hostsProvider) domainCount(dom string) (n int, hosts []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for host, doms := range h.domains {
		if _, ok := doms[dom]; ok {
			n++
			hosts = append(hosts, host)
		}
	}
	return n, hosts
}

func (h *hostsProvider) takeCalls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.calls
	h.calls = nil
	return c
}

// switchProber answers OK until down is set.
type switchProber struct {
	requiresAuth
	down atomic.Bool
}

func (s *switchProber) Probe(context.Context, proxyprobe.Target) proxyprobe.Result {
	if s.down.Load() {
		return proxyprobe.Result{Through: true, Err: errors.New("connection refused"), Latency: time.Millisecond}
	}
	return proxyprobe.Result{OK: true, Through: true, Latency: time.Millisecond}
}

func kvmProxy(placement crawlv1.ProxyPlacement) *crawlv1.Proxy {
	return &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1"},
		Spec:       crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Port: 3128, Placement: placement},
	}
}

func kvmImage(name string) *crawlv1.KVMImage {
	return &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: crawlv1.KVMImageSpec{URL: "http://127.0.0.1:1/img.raw", Checksum: sumA, Format: crawlv1.ImageFormatRaw}}
}

func reconcileProxy(t *testing.T, r *ProxyReconciler, key client.ObjectKey) (ctrl.Result, error) {
	t.Helper()
	r.MarkDirty(key) // as a provider event would: re-read the instance
	return r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key})
}

func mustReconcile(t *testing.T, r *ProxyReconciler, key client.ObjectKey) {
	t.Helper()
	if _, err := reconcileProxy(t, r, key); err != nil {
		t.Fatal(err)
	}
}

func storedProxy(t *testing.T, r *ProxyReconciler, key client.ObjectKey) *crawlv1.Proxy {
	t.Helper()
	p := &crawlv1.Proxy{}
	if err := r.Client.Get(context.Background(), key, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadyProxyStaysReadyWhenItsKVMImageAndKVMHostObjectsGo(t *testing.T) {
	p := kvmProxy(crawlv1.ProxyPlacement{Host: "hv1", Image: "debian"})
	r := testReconciler(t, nil, nil, p, readyKVMHost("hv1"), kvmImage("debian"))
	hp := newHostsProvider()
	r.Registry.Add(hp)
	key := client.ObjectKeyFromObject(p)
	mustReconcile(t, r, key) // records the placement
	mustReconcile(t, r, key)
	if got := storedProxy(t, r, key); !conditions.IsTrue(got, crawlv1.ReadyCondition) {
		t.Fatalf("not Ready after create: %+v", conditions.Get(got, crawlv1.ReadyCondition))
	}
	hp.takeCalls()

	for _, obj := range []client.Object{kvmImage("debian"), readyKVMHost("hv1")} {
		if err := r.Client.Delete(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
	}
	mustReconcile(t, r, key)
	got := storedProxy(t, r, key)
	if !conditions.IsTrue(got, crawlv1.ReadyCondition) || got.Status.Phase != crawlv1.ProxyReady {
		t.Fatalf("a running instance lost Ready with its KVMImage/KVMHost objects: phase %s, %+v", got.Status.Phase, conditions.Get(got, crawlv1.ReadyCondition))
	}
	if calls := hp.takeCalls(); len(calls) != 1 || calls[0] != "Get hv1" {
		t.Fatalf("provider calls %v, want only Get hv1", calls)
	}
}

func TestUnplacedHostSelectorProxyIsDeletedAtOnce(t *testing.T) {
	p := kvmProxy(crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "a"}}, Image: "debian"})
	r := testReconciler(t, nil, nil, p) // no KVMHost matches: never placed
	hp := newHostsProvider()
	r.Registry.Add(hp)
	key := client.ObjectKeyFromObject(p)
	mustReconcile(t, r, key)
	if got := storedProxy(t, r, key); got.Status.Host != "" || got.Status.Phase != crawlv1.ProxyPending {
		t.Fatalf("setup: host %q phase %s", got.Status.Host, got.Status.Phase)
	}
	if err := r.Client.Delete(context.Background(), storedProxy(t, r, key)); err != nil {
		t.Fatal(err)
	}
	if _, err := reconcileProxy(t, r, key); err != nil {
		t.Fatal(err)
	}
	if err := r.Client.Get(context.Background(), key, &crawlv1.Proxy{}); !apierrors.IsNotFound(err) {
		got := storedProxy(t, r, key)
		t.Fatalf("never-placed Proxy not released: %+v", conditions.Get(got, crawlv1.DeletionBlockedCondition))
	}
	if calls := hp.takeCalls(); len(calls) != 0 {
		t.Fatalf("provider calls %v for a Proxy that never had an instance", calls)
	}
}

func TestInstanceFoundStoppedTurnsReadyFalseAtOnce(t *testing.T) {
	p := kvmProxy(crawlv1.ProxyPlacement{Host: "hv1", Image: "debian"})
	prober := &switchProber{}
	r := testReconciler(t, prober, nil, p, readyKVMHost("hv1"), kvmImage("debian"))
	hp := newHostsProvider()
	r.Registry.Add(hp)
	key := client.ObjectKeyFromObject(p)
	mustReconcile(t, r, key) // records the placement
	mustReconcile(t, r, key)
	if got := storedProxy(t, r, key); !conditions.IsTrue(got, crawlv1.ReadyCondition) {
		t.Fatalf("not Ready after create: %+v", conditions.Get(got, crawlv1.ReadyCondition))
	}

	// virsh destroy: the operator sees it stopped and says so before it
	// does anything else; the next reconcile starts it again, and squid is
	// not up yet.
	hp.setState("hv1", "ns.p", provider.StateStopped)
	prober.down.Store(true)
	hp.takeCalls()
	mustReconcile(t, r, key)
	got := storedProxy(t, r, key)
	if calls := hp.takeCalls(); !slices.Equal(calls, []string{"Get hv1"}) {
		t.Fatalf("provider calls %v, want only the Get that found it stopped", calls)
	}
	if conditions.IsTrue(got, crawlv1.ReadyCondition) || conditions.IsTrue(got, crawlv1.ProxyHealthyCondition) {
		t.Fatalf("an instance found stopped is still Ready: %+v / %+v",
			conditions.Get(got, crawlv1.ReadyCondition), conditions.Get(got, crawlv1.ProxyHealthyCondition))
	}
	mustReconcile(t, r, key)
	got = storedProxy(t, r, key)
	if calls := hp.takeCalls(); len(calls) < 2 || calls[1] != "Create hv1" {
		t.Fatalf("provider calls %v, want the stopped instance started", calls)
	}
	if conditions.IsTrue(got, crawlv1.ReadyCondition) || conditions.IsTrue(got, crawlv1.ProxyHealthyCondition) {
		t.Fatalf("a (re)started instance whose proxy refuses is still Ready: %+v / %+v",
			conditions.Get(got, crawlv1.ReadyCondition), conditions.Get(got, crawlv1.ProxyHealthyCondition))
	}

	// Once the proxy answers again it is Ready at once.
	prober.down.Store(false)
	mustReconcile(t, r, key)
	if got := storedProxy(t, r, key); !conditions.IsTrue(got, crawlv1.ReadyCondition) {
		t.Fatalf("not Ready after the proxy answers: %+v", conditions.Get(got, crawlv1.ReadyCondition))
	}
}

func TestStalePlacementReadsEndWithOneDomain(t *testing.T) {
	s := runtime.NewScheme()
	if err := crawlv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "a"}}
	p := kvmProxy(crawlv1.ProxyPlacement{HostSelector: sel, Image: "http://127.0.0.1:1/img.raw", ImageChecksum: sumA})
	h1, h2 := readyKVMHost("hv1"), readyKVMHost("hv2")
	h1.Labels, h2.Labels = sel.MatchLabels, sel.MatchLabels

	// stale, when set, is what the next Get of the Proxy returns: a cache
	// that has not seen the latest writes.
	var mu sync.Mutex
	var stale *crawlv1.Proxy
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(p, h1, h2).
		WithStatusSubresource(&crawlv1.Proxy{}, &crawlv1.KVMHost{}).
		WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			mu.Lock()
			defer mu.Unlock()
			if sp, ok := obj.(*crawlv1.Proxy); ok && stale != nil {
				stale.DeepCopyInto(sp)
				stale = nil
				return nil
			}
			return cl.Get(ctx, key, obj, opts...)
		}}).Build()
	r := &ProxyReconciler{Client: c, APIReader: c, Recorder: record.NewFakeRecorder(100), Registry: provider.NewRegistry(), Plugins: Plugins(),
		Prober: okProber{}, Tag: "unit", Clock: clocktesting.NewFakePassiveClock(time.Unix(1000, 0))}
	if err := r.complete(); err != nil {
		t.Fatal(err)
	}
	hp := newHostsProvider()
	r.Registry.Add(hp)
	key := client.ObjectKeyFromObject(p)

	// Place, create, then one reconcile that reads the Proxy as it was
	// before placement (a cache behind the writes), then fresh ones.
	mustReconcile(t, r, key) // adds the finalizer, places
	unplaced := storedProxy(t, r, key)
	unplaced.Status = crawlv1.ProxyStatus{} // as read before placement
	for i := 0; i < 6; i++ {
		if i == 2 {
			mu.Lock()
			stale = unplaced.DeepCopy()
			mu.Unlock()
		}
		_, _ = reconcileProxy(t, r, key) // a stale write may be refused: that is the point
	}
	mustReconcile(t, r, key)
	if n, hosts := hp.domainCount("ns.p"); n != 1 {
		t.Fatalf("%d domains for one Proxy, on %v", n, hosts)
	}
	got := storedProxy(t, r, key)
	idHost, _, err := provider.ParseKVMProviderID(got.Status.ProviderID)
	if err != nil || idHost != got.Status.Host {
		t.Fatalf("status.host %q disagrees with providerID %q (%v)", got.Status.Host, got.Status.ProviderID, err)
	}
	if !conditions.IsTrue(got, crawlv1.ReadyCondition) {
		t.Fatalf("not Ready: %+v", conditions.Get(got, crawlv1.ReadyCondition))
	}
}

// blockingProvider's calls hang until their context ends, as a provider
// behind a wedged libvirtd does.
type blockingProvider struct{ name string }

func (b blockingProvider) Name() string { return b.name }
func (b blockingProvider) block(ctx context.Context) error {
	<-ctx.Done()
	return provider.Transient(ctx.Err())
}
func (b blockingProvider) Create(ctx context.Context, _ *provider.Machine) (*provider.Instance, error) {
	return nil, b.block(ctx)
}
func (b blockingProvider) Get(ctx context.Context, _ *provider.Machine) (*provider.Instance, error) {
	return nil, b.block(ctx)
}
func (b blockingProvider) Delete(ctx context.Context, _ *provider.Machine) error { return b.block(ctx) }
func (b blockingProvider) ListByTag(context.Context, string) ([]provider.Instance, error) {
	return nil, nil
}
func (b blockingProvider) Check(context.Context) error { return nil }

func TestBlockedProviderCallsEndAtTheirDeadline(t *testing.T) {
	stuck := []*crawlv1.Proxy{}
	var objs []client.Object
	for _, name := range []string{"a", "b", "c"} {
		p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
			Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderGCP, Port: 3128}}
		stuck = append(stuck, p)
		objs = append(objs, p)
	}
	healthy := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ok", UID: "uid-ok"},
		Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Port: 3128}}
	objs = append(objs, healthy)
	r := testReconciler(t, nil, nil, objs...)
	r.ProviderCallTimeout = 100 * time.Millisecond
	r.Registry.Add(blockingProvider{name: string(crawlv1.ProviderGCP)})
	r.Registry.Add(&scriptedProvider{name: string(crawlv1.ProviderKubernetes), create: running(stateAddress), get: running(stateAddress)})

	// As many stuck reconciles as workers: each must give its worker back.
	done := make(chan error, len(stuck))
	for _, p := range stuck {
		go func() {
			_, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)})
			done <- err
		}()
	}
	for range stuck {
		select {
		case err := <-done:
			if provider.Class(err) != provider.ClassTransient {
				t.Fatalf("a call past its deadline returned %v, want a transient error", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a reconcile of a Proxy on a blocked provider never returned")
		}
	}
	for _, p := range stuck {
		got := storedProxy(t, r, client.ObjectKeyFromObject(p))
		if c := conditions.Get(got, crawlv1.InstanceProvisionedCondition); c == nil || c.Reason != crawlv1.ProxyTransientErrorReason {
			t.Fatalf("%s: InstanceProvisioned %+v, want TransientError", p.Name, c)
		}
	}
	mustReconcile(t, r, client.ObjectKeyFromObject(healthy))
	if got := storedProxy(t, r, client.ObjectKeyFromObject(healthy)); !conditions.IsTrue(got, crawlv1.ReadyCondition) {
		t.Fatalf("the other provider's Proxy: %+v", conditions.Get(got, crawlv1.ReadyCondition))
	}
}
