package controllers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

// laggingClient serves List from a frozen snapshot while frozen: an
// informer cache that has not seen the latest writes yet.
type laggingClient struct {
	client.Client
	frozen []crawlv1.Proxy
	lag    bool
	clock  *clocktesting.FakeClock

	mu  sync.Mutex // the pool creates concurrently
	seq int
	// failCreate, if set, fails the n-th replica create (1-based).
	failCreate func(n int) error
}

func (c *laggingClient) freeze(t *testing.T) {
	t.Helper()
	list := &crawlv1.ProxyList{}
	if err := c.Client.List(context.Background(), list); err != nil {
		t.Fatal(err)
	}
	c.frozen, c.lag = list.Items, true
}

// Create stamps a UID and creation time as the API server does (the fake
// client leaves both empty, and the pool keys what it wrote by UID). seq
// and failCreate count replica creates only, not the published objects.
func (c *laggingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*crawlv1.Proxy); !ok {
		return c.Client.Create(ctx, obj, opts...)
	}
	c.mu.Lock()
	c.seq++
	n := c.seq
	c.mu.Unlock()
	if c.failCreate != nil {
		if err := c.failCreate(n); err != nil {
			return err
		}
	}
	obj.SetUID(types.UID(fmt.Sprintf("uid-%d", n)))
	if ts := obj.GetCreationTimestamp(); ts.IsZero() && c.clock != nil {
		obj.SetCreationTimestamp(metav1.NewTime(c.clock.Now()))
	}
	return c.Client.Create(ctx, obj, opts...)
}

func (c *laggingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if pl, ok := list.(*crawlv1.ProxyList); ok && c.lag {
		pl.Items = nil
		for _, p := range c.frozen {
			pl.Items = append(pl.Items, *p.DeepCopy())
		}
		return nil
	}
	return c.Client.List(ctx, list, opts...)
}

type poolUnit struct {
	t     *testing.T
	c     *laggingClient
	r     *ProxyPoolReconciler
	clock *clocktesting.FakeClock
	pool  types.NamespacedName
	pubs  [][]string
}

func newPoolUnit(t *testing.T, replicas int32, tune ...func(*crawlv1.ProxyPool)) *poolUnit {
	sch := envtestutil.Scheme()
	pool := &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "pool-uid", Generation: 1},
		Spec: crawlv1.ProxyPoolSpec{
			Replicas: ptr.To(replicas),
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "p"}},
			Template: crawlv1.ProxyTemplate{Metadata: crawlv1.ProxyTemplateMeta{Labels: map[string]string{"app": "p"}},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: "hv1", Image: "debian"}}},
			Rollout: crawlv1.ProxyPoolRollout{DrainSeconds: ptr.To(int32(30))},
			// One host takes every replica here: its create concurrency
			// is not what these specs are about (the placement tests').
			Placement: crawlv1.ProxyPoolPlacement{MaxConcurrentCreates: 1 << 10},
		},
	}
	for _, f := range tune {
		f(pool)
	}
	// The template's host, Ready and roomy: replicas are placed only on
	// Ready hosts with room.
	base := fake.NewClientBuilder().WithScheme(sch).WithObjects(pool, sizedHost("hv1", 64*giB)).
		WithStatusSubresource(&crawlv1.ProxyPool{}, &crawlv1.Proxy{}, &crawlv1.KVMHost{}).
		WithIndex(&crawlv1.Proxy{}, PoolOwnerIndex, poolOwnerOf).WithIndex(&crawlv1.ProxyBan{}, BanPoolIndex, banPoolOf).Build()
	u := &poolUnit{t: t, c: &laggingClient{Client: base}, clock: clocktesting.NewFakeClock(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)),
		pool: client.ObjectKeyFromObject(pool)}
	u.c.clock = u.clock
	u.r = &ProxyPoolReconciler{Client: u.c, Plugins: Plugins(), Scheme: sch, Recorder: record.NewFakeRecorder(1000), Publisher: &Publisher{Client: u.c},
		Clock: u.clock, Rand: rand.New(rand.NewPCG(1, 2)),
		OnPublished: func(_ types.NamespacedName, rs []crawlv1.Proxy) { u.pubs = append(u.pubs, proxyNames(rs)) }}
	if err := u.r.complete(); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u *poolUnit) reconcile() ctrl.Result {
	u.t.Helper()
	res, err := u.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: u.pool})
	if err != nil {
		u.t.Fatalf("reconcile: %v", err)
	}
	return res
}

func (u *poolUnit) getPool() *crawlv1.ProxyPool {
	u.t.Helper()
	p := &crawlv1.ProxyPool{}
	if err := u.c.Client.Get(context.Background(), u.pool, p); err != nil {
		u.t.Fatal(err)
	}
	return p
}

func (u *poolUnit) update(f func(*crawlv1.ProxyPool)) {
	u.t.Helper()
	p := u.getPool()
	f(p)
	p.Generation++
	if err := u.c.Client.Update(context.Background(), p); err != nil {
		u.t.Fatal(err)
	}
}

// replicas are the Proxies in the API (not the lagging view), by name.
func (u *poolUnit) replicas() []crawlv1.Proxy {
	u.t.Helper()
	list := &crawlv1.ProxyList{}
	if err := u.c.Client.List(context.Background(), list); err != nil {
		u.t.Fatal(err)
	}
	slices.SortFunc(list.Items, func(a, b crawlv1.Proxy) int { return strings.Compare(a.Name, b.Name) })
	return list.Items
}

// readyAll makes every replica Ready since the fake clock's now minus ago
// (what the Proxy controller would write), with a creation time before it.
func (u *poolUnit) readyAll(ago time.Duration) {
	u.t.Helper()
	for i, p := range u.replicas() {
		if conditions.IsTrue(&p, crawlv1.ReadyCondition) {
			continue
		}
		p.CreationTimestamp = metav1.NewTime(u.clock.Now().Add(-ago - time.Minute))
		if err := u.c.Client.Update(context.Background(), &p); err != nil {
			u.t.Fatal(err)
		}
		p.Status.Conditions = []metav1.Condition{{Type: crawlv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: "Ready",
			LastTransitionTime: metav1.NewTime(u.clock.Now().Add(-ago))}}
		// A Ready Proxy has an endpoint; the pool publishes nothing else.
		p.Status.Address = fmt.Sprintf("192.0.2.%d", 10+i)
		p.Status.Endpoint = "http://" + p.Status.Address + ":3128"
		if err := u.c.Client.Status().Update(context.Background(), &p); err != nil {
			u.t.Fatal(err)
		}
	}
}

func TestPoolReconcileDoesNotActTwiceOnAStaleCache(t *testing.T) {
	u := newPoolUnit(t, 3)
	u.reconcile()
	if n := len(u.replicas()); n != 3 {
		t.Fatalf("%d replicas after the first reconcile, want 3", n)
	}
	for _, p := range u.replicas() {
		if !strings.HasPrefix(p.Name, "p-") || len(p.Name) != len("p-")+5 {
			t.Errorf("replica name %q, want p-<5 characters>", p.Name)
		}
		if !metav1.IsControlledBy(&p, u.getPool()) || p.Labels[crawlv1.PoolNameLabel] != "p" || p.Labels["app"] != "p" || p.Labels[crawlv1.TemplateHashLabel] == "" {
			t.Errorf("replica %s: owner %v labels %v", p.Name, p.OwnerReferences, p.Labels)
		}
	}

	// The cache has not seen the creates: expectations stand in for them.
	u.c.frozen, u.c.lag = nil, true
	u.reconcile()
	if n := len(u.replicas()); n != 3 {
		t.Fatalf("%d replicas after a reconcile on a cache without the creates, want still 3", n)
	}
	if got := u.getPool().Status.Replicas; got != 3 {
		t.Errorf("status.replicas %d, want the 3 made", got)
	}
	u.c.lag = false

	u.readyAll(time.Hour)
	u.reconcile()
	if got := u.pubs[len(u.pubs)-1]; len(got) != 3 {
		t.Fatalf("published %v, want the 3 Ready replicas", got)
	}
	calls := len(u.pubs)
	u.reconcile()
	if len(u.pubs) != calls {
		t.Errorf("an unchanged list was published again")
	}

	// Scale down by one: drained (annotated, unpublished), not deleted.
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(2)) })
	u.c.freeze(t)
	u.c.lag = false
	u.reconcile()
	var draining []string
	for _, p := range u.replicas() {
		if _, ok := p.Annotations[crawlv1.DrainingAnnotation]; ok {
			draining = append(draining, p.Name)
		}
	}
	if len(draining) != 1 || len(u.replicas()) != 3 {
		t.Fatalf("draining %v of %d replicas, want 1 of 3", draining, len(u.replicas()))
	}
	if last := u.pubs[len(u.pubs)-1]; len(last) != 2 || slices.Contains(last, draining[0]) {
		t.Fatalf("published %v after draining %s", last, draining[0])
	}
	// Again, later, on the cache from before the drain: nothing more is
	// drained, the drain time does not restart, and the drained replica
	// stays unpublished.
	since := u.replicas()[slices.IndexFunc(u.replicas(), func(p crawlv1.Proxy) bool { return p.Name == draining[0] })].Annotations[crawlv1.DrainingAnnotation]
	u.clock.Step(10 * time.Second)
	u.c.lag = true
	u.reconcile()
	n := 0
	for _, p := range u.replicas() {
		if v, ok := p.Annotations[crawlv1.DrainingAnnotation]; ok {
			n++
			if v != since {
				t.Errorf("%s draining since %s, was %s: a stale cache restarted its drain", p.Name, v, since)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d replicas draining after a stale reconcile, want 1", n)
	}
	if last := u.pubs[len(u.pubs)-1]; slices.Contains(last, draining[0]) {
		t.Errorf("a stale cache republished the drained %s", draining[0])
	}
	u.c.lag = false

	// Drained long enough: deleted; on a cache still showing it, nothing
	// else goes.
	u.c.freeze(t)
	u.clock.Step(20 * time.Second)
	u.reconcile()
	if n := len(u.replicas()); n != 2 {
		t.Fatalf("%d replicas after the drain time, want 2", n)
	}
	u.c.lag = true
	u.reconcile()
	if n := len(u.replicas()); n != 2 {
		t.Fatalf("%d replicas after a stale reconcile, want still 2", n)
	}
	if st := u.getPool().Status; st.Replicas != 3 || st.AvailableReplicas != 2 || st.DrainingReplicas != 0 {
		t.Errorf("status replicas %d available %d draining %d on the stale cache, want the deleting one counted as such: 3, 2, 0",
			st.Replicas, st.AvailableReplicas, st.DrainingReplicas)
	}
}

func TestPoolPlacementRefusalAndTheCreateCap(t *testing.T) {
	u := newPoolUnit(t, 0, func(p *crawlv1.ProxyPool) { p.Spec.Remediation.MaxCreatesPerMinute = 2 })
	u.reconcile()

	refuse := true
	u.r.place = func(ctx context.Context, pool *crawlv1.ProxyPool, rs []crawlv1.Proxy, p *crawlv1.Proxy, reads *placementReads) (*PlacementBlocked, error) {
		if refuse {
			return &PlacementBlocked{Reason: crawlv1.PoolInsufficientCapacityReason, Message: "no host has 512Mi free"}, nil
		}
		return u.r.placeReplica(ctx, pool, rs, p, reads)
	}
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(5)) })
	res := u.reconcile()
	pool := u.getPool()
	if !conditions.IsTrue(pool, crawlv1.PoolPlacementBlockedCondition) || conditions.GetReason(pool, crawlv1.PoolPlacementBlockedCondition) != crawlv1.PoolInsufficientCapacityReason {
		t.Fatalf("PlacementBlocked %+v", conditions.Get(pool, crawlv1.PoolPlacementBlockedCondition))
	}
	if len(u.replicas()) != 0 || res.RequeueAfter != u.r.PlacementRetry {
		t.Fatalf("%d created, requeue %s; want none and a retry after %s", len(u.replicas()), res.RequeueAfter, u.r.PlacementRetry)
	}

	refuse = false
	res = u.reconcile()
	if n := len(u.replicas()); n != 2 {
		t.Fatalf("%d created with maxCreatesPerMinute 2", n)
	}
	if !conditions.IsFalse(u.getPool(), crawlv1.PoolPlacementBlockedCondition) {
		t.Error("PlacementBlocked still True after replicas were placed")
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > time.Minute {
		t.Errorf("requeue after %s, want when the create window frees (≤ 1m)", res.RequeueAfter)
	}
	u.clock.Step(30 * time.Second)
	u.reconcile()
	if n := len(u.replicas()); n != 2 {
		t.Fatalf("%d replicas 30s later, want still 2", n)
	}
	u.clock.Step(31 * time.Second)
	u.reconcile()
	if n := len(u.replicas()); n != 4 {
		t.Fatalf("%d replicas a minute after the first creates, want 4", n)
	}
}

func TestPoolStatusAndConditions(t *testing.T) {
	u := newPoolUnit(t, 2, func(p *crawlv1.ProxyPool) {
		p.Spec.Rotation.MaxAge = &metav1.Duration{Duration: 6 * time.Hour}
	})
	u.reconcile()
	// The status is what the reconcile observed before acting; the next
	// one sees the replicas it made.
	u.reconcile()
	pool := u.getPool()
	if pool.Status.Selector != "app=p" || pool.Status.ObservedGeneration != 1 || pool.Status.Replicas != 2 {
		t.Errorf("status %+v", pool.Status)
	}
	if !conditions.IsFalse(pool, crawlv1.PoolAvailableCondition) || conditions.GetReason(pool, crawlv1.PoolAvailableCondition) != crawlv1.PoolMinimumUnavailableReason {
		t.Errorf("Available %+v with nothing Ready", conditions.Get(pool, crawlv1.PoolAvailableCondition))
	}
	u.readyAll(time.Minute)
	for i, p := range u.replicas() {
		p.Status.Host = "hv1"
		p.Status.EgressAddress, p.Status.EgressSource = []string{"203.0.113.1", "203.0.113.2"}[i], crawlv1.EgressSourceEcho
		if err := u.c.Client.Status().Update(context.Background(), &p); err != nil {
			t.Fatal(err)
		}
	}
	u.reconcile()
	pool = u.getPool()
	st := pool.Status
	if st.ReadyReplicas != 2 || st.AvailableReplicas != 2 || st.UpToDateReplicas != 2 || st.DistinctHosts != 1 || st.DistinctEgressAddresses != 2 {
		t.Errorf("status %+v", st)
	}
	if st.Rotation == nil || st.Rotation.NextTime == nil {
		t.Errorf("rotation status %+v, want the next rotation", st.Rotation)
	}
	for cond, want := range map[string]string{
		crawlv1.PoolAvailableCondition:          crawlv1.PoolMinimumAvailableReason,
		crawlv1.PoolRollingOutCondition:         crawlv1.PoolUpToDateReason,
		crawlv1.PoolRotatingCondition:           crawlv1.PoolRotationIdleReason,
		crawlv1.PoolRotationBehindCondition:     crawlv1.PoolRotationCaughtUpReason,
		crawlv1.PoolRemediatingCondition:        crawlv1.PoolHealthyReason,
		crawlv1.PoolRemediationAllowedCondition: crawlv1.PoolRemediationAllowedReason,
		crawlv1.PoolPlacementBlockedCondition:   crawlv1.PoolPlacedReason,
		crawlv1.PoolPausedCondition:             crawlv1.PoolNotPausedReason,
	} {
		if got := conditions.GetReason(pool, cond); got != want {
			t.Errorf("%s reason %q, want %q", cond, got, want)
		}
	}

	// A template change: RollingOut, one surged replica.
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Template.Spec.Placement.Image = "debian-13" })
	u.reconcile()
	u.reconcile()
	pool = u.getPool()
	if !conditions.IsTrue(pool, crawlv1.PoolRollingOutCondition) || len(u.replicas()) != 3 {
		t.Errorf("RollingOut %+v with %d replicas", conditions.Get(pool, crawlv1.PoolRollingOutCondition), len(u.replicas()))
	}
	if pool.Status.UpToDateReplicas != 1 || pool.Status.Replicas != 3 {
		t.Errorf("upToDate %d of %d, want the surged replica up to date", pool.Status.UpToDateReplicas, pool.Status.Replicas)
	}
}

func TestPoolPublishesOnChangeAndAtTheRepublishInterval(t *testing.T) {
	u := newPoolUnit(t, 1)
	u.reconcile()
	if len(u.pubs) != 1 || len(u.pubs[0]) != 0 {
		t.Fatalf("publishes %v, want one empty list before anything is Ready", u.pubs)
	}
	u.readyAll(time.Minute)
	u.reconcile()
	u.reconcile()
	if len(u.pubs) != 2 || len(u.pubs[1]) != 1 {
		t.Fatalf("publishes %v, want the Ready replica once", u.pubs)
	}
	// A published field changes: published again.
	p := u.replicas()[0]
	p.Status.EgressAddress = "203.0.113.9"
	if err := u.c.Client.Status().Update(context.Background(), &p); err != nil {
		t.Fatal(err)
	}
	u.reconcile()
	if len(u.pubs) != 3 {
		t.Fatalf("%d publishes, want one more after the egress address changed", len(u.pubs))
	}
	u.clock.Step(u.r.RepublishInterval)
	u.reconcile()
	if len(u.pubs) != 4 {
		t.Errorf("an unchanged list was not republished after %s", u.r.RepublishInterval)
	}
}

func TestPoolCreatesInGrowingBatchesAndStopsAtTheFirstError(t *testing.T) {
	u := newPoolUnit(t, 10)
	u.c.failCreate = func(n int) error {
		if n == 4 {
			return apierrors.NewForbidden(schema.GroupResource{Group: "crawl.example.com", Resource: "proxies"}, "", errors.New("quota"))
		}
		return nil
	}
	_, err := u.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: u.pool})
	if err == nil || !strings.Contains(err.Error(), "quota") {
		t.Fatalf("reconcile error %v, want the failed create's", err)
	}
	// Batches of 1, 2 and 4: the fourth create fails, the batch finishes,
	// the remaining three are not tried.
	if u.c.seq != 7 || len(u.replicas()) != 6 {
		t.Fatalf("%d creates tried, %d made; want 7 and 6", u.c.seq, len(u.replicas()))
	}
	// The six made count: the next reconcile makes only the four missing.
	u.c.failCreate = nil
	u.reconcile()
	if n := len(u.replicas()); n != 10 {
		t.Fatalf("%d replicas after the retry, want 10", n)
	}
}

// Deleting a pool takes it down in the order a crawler needs, with or
// without a garbage collector: the published list first, then the
// replicas (each Proxy's finalizer removes its instance), and the pool
// once none is left.
func TestPoolDeletionUnpublishesThenDeletesItsReplicas(t *testing.T) {
	u := newPoolUnit(t, 2)
	u.reconcile()
	if !slices.Contains(u.getPool().Finalizers, crawlv1.ProxyPoolFinalizer) {
		t.Fatalf("finalizers %v, want %s before anything is created", u.getPool().Finalizers, crawlv1.ProxyPoolFinalizer)
	}
	u.readyAll(time.Minute)
	u.reconcile()
	// A replica of another pool of the same name prefix must survive.
	stranger := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p-stranger"},
		Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM}}
	if err := u.c.Client.Create(context.Background(), stranger); err != nil {
		t.Fatal(err)
	}
	published := &corev1.Secret{}
	secretKey := client.ObjectKey{Namespace: "ns", Name: crawlv1.PublishedName("p")}
	if err := u.c.Client.Get(context.Background(), secretKey, published); err != nil {
		t.Fatalf("published Secret: %v", err)
	}

	// The replicas hold a finalizer, as the Proxy controller's do: they
	// stay, deleting, while their instances go.
	for _, p := range u.replicas() {
		if p.Name == stranger.Name {
			continue
		}
		p.Finalizers = []string{crawlv1.ProxyFinalizer}
		if err := u.c.Client.Update(context.Background(), &p); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.c.Client.Delete(context.Background(), u.getPool()); err != nil {
		t.Fatal(err)
	}
	u.reconcile()
	if err := u.c.Client.Get(context.Background(), secretKey, published); !apierrors.IsNotFound(err) {
		t.Fatalf("published Secret after the pool's deletion began: %v, want it gone", err)
	}
	deleting := 0
	for _, p := range u.replicas() {
		switch {
		case p.Name == stranger.Name:
			if !p.DeletionTimestamp.IsZero() {
				t.Errorf("a Proxy the pool does not own was deleted")
			}
		case p.DeletionTimestamp.IsZero():
			t.Errorf("replica %s not deleted", p.Name)
		default:
			deleting++
		}
	}
	if deleting != 2 {
		t.Fatalf("%d replicas deleting, want 2", deleting)
	}
	if c := conditions.Get(u.getPool(), crawlv1.PoolAvailableCondition); c == nil || c.Reason != crawlv1.PoolDeletingReason {
		t.Errorf("Available %+v, want reason %s while replicas remain", c, crawlv1.PoolDeletingReason)
	}

	// Their instances gone, the Proxy controller releases them; then the pool goes.
	for _, p := range u.replicas() {
		if p.Name == stranger.Name {
			continue
		}
		p.Finalizers = nil
		if err := u.c.Client.Update(context.Background(), &p); err != nil {
			t.Fatal(err)
		}
	}
	u.reconcile()
	if err := u.c.Client.Get(context.Background(), u.pool, &crawlv1.ProxyPool{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pool after its replicas went: %v, want it released and gone", err)
	}
}

// TestPoolRotationBehind: replicas past maxAge are counted in
// status.rotation.overdueReplicas; RotationBehind turns True (with one
// Warning event) only once one is past maxAge by more than the grace, and
// clears when none is.
func TestPoolRotationBehind(t *testing.T) {
	u := newPoolUnit(t, 2, func(p *crawlv1.ProxyPool) {
		p.Spec.Rotation.MaxAge = &metav1.Duration{Duration: time.Hour}
		// Paused: nothing rotates, the replicas only age.
		p.Spec.Paused = true
	})
	u.readyPool(2)
	u.events()
	check := func(when string, overdue int32, status metav1.ConditionStatus, reason string) {
		t.Helper()
		u.reconcile()
		pool := u.getPool()
		if got := pool.Status.Rotation.OverdueReplicas; got != overdue {
			t.Errorf("%s: %d overdue replicas, want %d", when, got, overdue)
		}
		c := conditions.Get(pool, crawlv1.PoolRotationBehindCondition)
		if c == nil || c.Status != status || c.Reason != reason {
			t.Errorf("%s: RotationBehind %+v, want %s %s", when, c, status, reason)
		}
	}
	// readyPool made them an hour and a minute ago: past maxAge, within
	// the grace (2m boot + 30s drain).
	check("just past maxAge", 2, metav1.ConditionFalse, crawlv1.PoolRotationCaughtUpReason)
	u.clock.Step(2 * time.Minute)
	check("past maxAge by more than the grace", 2, metav1.ConditionTrue, crawlv1.PoolReplicasOverdueReason)
	if msg := conditions.GetMessage(u.getPool(), crawlv1.PoolRotationBehindCondition); !strings.Contains(msg, "2 replicas older than maxAge 1h0m0s by more than 2m30s") || !strings.Contains(msg, "paused") {
		t.Errorf("message %q", msg)
	}
	u.clock.Step(time.Minute)
	check("still behind", 2, metav1.ConditionTrue, crawlv1.PoolReplicasOverdueReason)
	if ev := u.events(); len(ev) != 1 || !strings.Contains(ev[0], "Warning RotationBehind") {
		t.Errorf("events %q, want one Warning RotationBehind", ev)
	}
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Rotation.MaxAge = &metav1.Duration{Duration: 6 * time.Hour} })
	check("maxAge raised", 0, metav1.ConditionFalse, crawlv1.PoolRotationCaughtUpReason)
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Rotation.MaxAge = nil })
	u.reconcile()
	if r := conditions.GetReason(u.getPool(), crawlv1.PoolRotationBehindCondition); r != crawlv1.PoolRotationDisabledReason {
		t.Errorf("without maxAge RotationBehind reason %q, want %s", r, crawlv1.PoolRotationDisabledReason)
	}
}
