package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/placement"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

const giB = int64(1) << 30

// sizedHost is a Ready KVMHost labelled role=proxy that reported free
// memory free on 16 CPUs and 16Gi, with a 500Gi pool.
func sizedHost(name string, free int64, mutate ...func(*crawlv1.KVMHost)) *crawlv1.KVMHost {
	h := &crawlv1.KVMHost{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"role": "proxy"}},
		Spec:       crawlv1.KVMHostSpec{Address: name + ".lan"},
		Status: crawlv1.KVMHostStatus{
			Conditions: []metav1.Condition{{Type: crawlv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: crawlv1.HostReadyReason,
				LastTransitionTime: metav1.Now()}},
			Pool:          &crawlv1.PoolStatus{Name: "default", AvailableBytes: 500 * giB},
			LastCheckTime: ptr.To(metav1.Now()),
			Capacity:      &crawlv1.HostCapacity{CPUs: 16, MemoryBytes: 16 * giB, FreeMemoryBytes: free},
		},
	}
	for _, m := range mutate {
		m(h)
	}
	return h
}

func kvmPool(sel *metav1.LabelSelector) *crawlv1.ProxyPool {
	return &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "fleet"},
		Spec: crawlv1.ProxyPoolSpec{
			Placement: crawlv1.ProxyPoolPlacement{HostSelector: sel},
			Template: crawlv1.ProxyTemplate{Spec: crawlv1.ProxySpec{
				Provider:  crawlv1.ProviderKVM,
				Placement: crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{}, Image: "debian"},
				Resources: crawlv1.ProxyResources{CPUs: 1, Memory: ptr.To(resource.MustParse("1Gi")), Disk: ptr.To(resource.MustParse("10Gi"))},
			}},
		},
	}
}

// newReplica is what the pool hands placement: the template's spec, named.
func newReplicaOf(pool *crawlv1.ProxyPool, n int) *crawlv1.Proxy {
	p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: fmt.Sprintf("%s-%d", pool.Name, n),
		Labels: map[string]string{crawlv1.PoolNameLabel: pool.Name}}}
	pool.Spec.Template.Spec.DeepCopyInto(&p.Spec)
	return p
}

func placementReconciler(t *testing.T, objs ...client.Object) *ProxyPoolReconciler {
	t.Helper()
	sch := envtestutil.Scheme()
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(objs...).
		WithStatusSubresource(&crawlv1.KVMHost{}, &crawlv1.Proxy{}).Build()
	// Completed as Setup does: placement reads the pool's memory (the
	// zones that had no room).
	r := &ProxyPoolReconciler{Client: c, Scheme: sch, Recorder: record.NewFakeRecorder(100), Publisher: &Publisher{Client: c}, Plugins: Plugins()}
	if err := r.complete(); err != nil {
		t.Fatal(err)
	}
	return r
}

// placeBurst places n replicas in one pass as the pool does: each created
// (in the API, so the cache sees it too) and passed on to the next call,
// with no host status update in between.
func placeBurst(t *testing.T, r *ProxyPoolReconciler, pool *crawlv1.ProxyPool, existing []crawlv1.Proxy, n int) (map[string]int, *PlacementBlocked) {
	t.Helper()
	ctx := context.Background()
	replicas := existing
	placed := map[string]int{}
	for i := range n {
		p := newReplicaOf(pool, len(existing)+i)
		blocked, err := r.placeReplica(ctx, pool, replicas, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if blocked != nil {
			return placed, blocked
		}
		if p.Spec.Placement.Host == "" || p.Spec.Placement.HostSelector != nil {
			t.Fatalf("replica placed with host %q, hostSelector %v: the Proxy webhook wants exactly one", p.Spec.Placement.Host, p.Spec.Placement.HostSelector)
		}
		if err := r.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		placed[p.Spec.Placement.Host]++
		replicas = append(replicas, *p)
	}
	return placed, nil
}

func TestPlaceReplicaOnHostsOfDifferentSizes(t *testing.T) {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"role": "proxy"}}
	otherHost := sizedHost("elsewhere", 64*giB, func(h *crawlv1.KVMHost) { h.Labels = nil })
	r := placementReconciler(t, sizedHost("h2", 2*giB), sizedHost("h4", 4*giB), sizedHost("h8", 8*giB), otherHost)
	pool := kvmPool(sel)

	placed, blocked := placeBurst(t, r, pool, nil, 10)
	if fmt.Sprint(placed) != "map[h2:2 h4:3 h8:3]" {
		t.Fatalf("placed %v (blocked %v), want h2:2 h4:3 h8:3", placed, blocked)
	}
	if blocked == nil || blocked.Reason != crawlv1.PoolSpreadUnsatisfiableReason ||
		!strings.Contains(blocked.Message, "h2 (2 replicas) memory 0 free, 1Gi needed") ||
		!strings.Contains(blocked.Message, "h4 (3 replicas), h8 (3 replicas) have room") {
		t.Fatalf("9th replica: %+v", blocked)
	}
}

func TestPlaceReplicaReservesOtherProxiesOnTheHost(t *testing.T) {
	// A standalone Proxy being created on h4 holds 3Gi of its 4Gi; one of
	// another pool already runs there (in the host's figures: settled).
	standalone := &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "solo"},
		Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: "h4"},
			Resources: crawlv1.ProxyResources{CPUs: 1, Memory: ptr.To(resource.MustParse("3Gi"))}},
	}
	running := &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "running", Labels: map[string]string{crawlv1.PoolNameLabel: "other"}},
		Spec:       crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{}}},
		Status: crawlv1.ProxyStatus{Host: "h8", Conditions: []metav1.Condition{{Type: crawlv1.InstanceProvisionedCondition,
			Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason, LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Minute))}}},
	}
	r := placementReconciler(t, sizedHost("h4", 4*giB), sizedHost("h8", 2*giB), standalone, running)
	placed, blocked := placeBurst(t, r, kvmPool(nil), nil, 5)
	// h4: 1 left; h8: 2 free (the running one is in that figure already).
	if fmt.Sprint(placed) != "map[h4:1 h8:2]" || blocked == nil || blocked.Reason != crawlv1.PoolInsufficientCapacityReason {
		t.Fatalf("placed %v, blocked %+v", placed, blocked)
	}
}

func TestPlaceReplicaWithoutRoomOrHosts(t *testing.T) {
	ctx := context.Background()
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"role": "proxy"}}
	notReady := sizedHost("down", 8*giB, func(h *crawlv1.KVMHost) {
		h.Status.Conditions[0].Status, h.Status.Conditions[0].Reason = metav1.ConditionFalse, crawlv1.HostTimeoutReason
	})
	deleting := sizedHost("going", 8*giB, func(h *crawlv1.KVMHost) {
		h.Finalizers = []string{KVMHostFinalizer}
		h.DeletionTimestamp = ptr.To(metav1.Now())
	})
	unchecked := sizedHost("new", 0, func(h *crawlv1.KVMHost) { h.Status = crawlv1.KVMHostStatus{} })
	for _, tc := range []struct {
		name    string
		objs    []client.Object
		pool    *crawlv1.ProxyPool
		reason  string
		message []string
	}{
		{
			name: "no host matches", objs: []client.Object{sizedHost("x", 8*giB, func(h *crawlv1.KVMHost) { h.Labels = nil })},
			pool: kvmPool(sel), reason: crawlv1.PoolInsufficientCapacityReason,
			message: []string{`no KVMHost matches spec.placement.hostSelector "role=proxy"`},
		},
		{
			name: "matching hosts are not Ready", objs: []client.Object{notReady, deleting, unchecked},
			pool: kvmPool(sel), reason: crawlv1.PoolInsufficientCapacityReason,
			message: []string{"no Ready KVMHost matches", "down (Timeout)", "going (being deleted)", "new (not checked yet)"},
		},
		{
			name: "a Ready host that has not reported its capacity takes nothing",
			objs: []client.Object{sizedHost("old", 8*giB, func(h *crawlv1.KVMHost) { h.Status.Capacity = nil })},
			pool: kvmPool(sel), reason: crawlv1.PoolInsufficientCapacityReason,
			message: []string{"old (0 replicas) capacity not reported yet"},
		},
		{
			name:   "a malformed selector names its field",
			pool:   kvmPool(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "role", Operator: "Near"}}}),
			reason: crawlv1.PoolInsufficientCapacityReason, message: []string{"spec.placement.hostSelector", "Near"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := placementReconciler(t, tc.objs...)
			p := newReplicaOf(tc.pool, 0)
			blocked, err := r.placeReplica(ctx, tc.pool, nil, p, nil)
			if err != nil || blocked == nil || blocked.Reason != tc.reason {
				t.Fatalf("placeReplica = %+v, %v; want %s", blocked, err, tc.reason)
			}
			for _, m := range tc.message {
				if !strings.Contains(blocked.Message, m) {
					t.Errorf("message %q lacks %q", blocked.Message, m)
				}
			}
			if p.Spec.Placement.Host != "" {
				t.Errorf("a blocked replica got host %q", p.Spec.Placement.Host)
			}
		})
	}
}

func TestPlaceReplicaHostScope(t *testing.T) {
	ctx := context.Background()
	a := sizedHost("a", 8*giB, func(h *crawlv1.KVMHost) { h.Labels = map[string]string{"tier": "x"} })
	b := sizedHost("b", 4*giB, func(h *crawlv1.KVMHost) { h.Labels = map[string]string{"tier": "y"} })
	for _, tc := range []struct {
		name     string
		poolSel  *metav1.LabelSelector
		template crawlv1.ProxyPlacement
		want     string
	}{
		{"the pool's selector wins over the template's", &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "y"}},
			crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "x"}}}, "b"},
		{"else the template's selector", nil,
			crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "y"}}}, "b"},
		{"else the template's host, whose room is still checked", nil, crawlv1.ProxyPlacement{Host: "b"}, "b"},
		{"else every host", nil, crawlv1.ProxyPlacement{}, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := kvmPool(tc.poolSel)
			pool.Spec.Template.Spec.Placement = tc.template
			p := newReplicaOf(pool, 0)
			blocked, err := placementReconciler(t, a, b).placeReplica(ctx, pool, nil, p, nil)
			if err != nil || blocked != nil || p.Spec.Placement.Host != tc.want || p.Spec.Placement.HostSelector != nil {
				t.Fatalf("placeReplica = %+v, %v; host %q selector %v, want host %q", blocked, err, p.Spec.Placement.Host, p.Spec.Placement.HostSelector, tc.want)
			}
		})
	}
	// The template's host without room blocks rather than going elsewhere.
	pool := kvmPool(nil)
	pool.Spec.Template.Spec.Placement = crawlv1.ProxyPlacement{Host: "b"}
	placed, blocked := placeBurst(t, placementReconciler(t, a, b), pool, nil, 6)
	if fmt.Sprint(placed) != "map[b:4]" || blocked == nil || !strings.Contains(blocked.Message, "b (4 replicas) memory 0 free") {
		t.Fatalf("placed %v, blocked %+v", placed, blocked)
	}
}

// A replica is sized as the webhook will default it: with no resources,
// 1 vCPU, 512Mi and a 10Gi disk.
func TestPlaceReplicaSizesWithTheWebhookDefaults(t *testing.T) {
	pool := kvmPool(nil)
	pool.Spec.Template.Spec.Resources = crawlv1.ProxyResources{}
	r := placementReconciler(t, sizedHost("a", giB, func(h *crawlv1.KVMHost) { h.Status.Pool.AvailableBytes = 25 * giB }))
	placed, blocked := placeBurst(t, r, pool, nil, 5)
	if fmt.Sprint(placed) != "map[a:2]" || blocked == nil || !strings.Contains(blocked.Message, "a replica of 1 vCPU, 512Mi memory, 10Gi disk") {
		t.Fatalf("placed %v, blocked %+v", placed, blocked)
	}
}

// Replicas on their way out (deleted, drained) leave the spread but keep
// their room until they are gone.
func TestPlaceReplicaIgnoresLeavingReplicasForTheSpread(t *testing.T) {
	pool := kvmPool(nil)
	leaving := []crawlv1.Proxy{*newReplicaOf(pool, 100), *newReplicaOf(pool, 101)}
	leaving[0].Spec.Placement = crawlv1.ProxyPlacement{Host: "a"}
	leaving[0].Annotations = map[string]string{crawlv1.DrainingAnnotation: "2026-01-01T00:00:00Z"}
	leaving[1].Spec.Placement = crawlv1.ProxyPlacement{Host: "a"}
	leaving[1].DeletionTimestamp = ptr.To(metav1.Now())
	r := placementReconciler(t, sizedHost("a", 8*giB), sizedHost("b", 3*giB))
	p := newReplicaOf(pool, 0)
	if blocked, err := r.placeReplica(context.Background(), pool, leaving, p, nil); err != nil || blocked != nil || p.Spec.Placement.Host != "a" {
		t.Fatalf("placeReplica = %+v, %v, host %q; want a (most free, no replica counting)", blocked, err, p.Spec.Placement.Host)
	}
	// Their memory is still reserved: a has 6Gi left, so after 3 more on
	// b (full) the spread is blocked, not a's room.
	placed, blocked := placeBurst(t, r, pool, leaving, 8)
	if fmt.Sprint(placed) != "map[a:4 b:3]" || blocked == nil || blocked.Reason != crawlv1.PoolSpreadUnsatisfiableReason {
		t.Fatalf("placed %v, blocked %+v", placed, blocked)
	}
}

func TestPlaceReplicaZones(t *testing.T) {
	ctx := context.Background()
	pool := &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "g"},
		Spec: crawlv1.ProxyPoolSpec{
			Placement: crawlv1.ProxyPoolPlacement{Zones: []string{"europe-west1-b", "europe-west1-c", "europe-west1-d"}},
			Template:  crawlv1.ProxyTemplate{Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderGCP, Placement: crawlv1.ProxyPlacement{Zone: "us-east1-b"}}},
		},
	}
	r := placementReconciler(t)
	var replicas []crawlv1.Proxy
	var got []string
	for i := range 5 {
		p := newReplicaOf(pool, i)
		if blocked, err := r.placeReplica(ctx, pool, replicas, p, nil); err != nil || blocked != nil {
			t.Fatalf("placeReplica = %+v, %v", blocked, err)
		}
		got = append(got, p.Spec.Placement.Zone[len("europe-west1-"):])
		replicas = append(replicas, *p)
	}
	if strings.Join(got, "") != "bcdbc" {
		t.Fatalf("zones %v, want b c d b c", got)
	}
	// A deleted replica's zone is free again.
	replicas[2].DeletionTimestamp = ptr.To(metav1.Now())
	p := newReplicaOf(pool, 9)
	if _, err := r.placeReplica(ctx, pool, replicas, p, nil); err != nil || p.Spec.Placement.Zone != "europe-west1-d" {
		t.Fatalf("zone %q, %v; want europe-west1-d", p.Spec.Placement.Zone, err)
	}
	// No zones listed: the template's zone.
	pool.Spec.Placement.Zones = nil
	p = newReplicaOf(pool, 10)
	if _, err := r.placeReplica(ctx, pool, replicas, p, nil); err != nil || p.Spec.Placement.Zone != "us-east1-b" {
		t.Fatalf("zone %q, %v; want the template's", p.Spec.Placement.Zone, err)
	}
}

func TestPlaceReplicaKubernetesIsLeftToTheScheduler(t *testing.T) {
	pool := &crawlv1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "k"},
		Spec: crawlv1.ProxyPoolSpec{Template: crawlv1.ProxyTemplate{Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes}}}}
	p := newReplicaOf(pool, 0)
	before := p.DeepCopy()
	if blocked, err := placementReconciler(t).placeReplica(context.Background(), pool, nil, p, nil); err != nil || blocked != nil || p.Spec.Placement != before.Spec.Placement {
		t.Fatalf("placeReplica = %+v, %v, placement %+v", blocked, err, p.Spec.Placement)
	}
}

// A running Proxy is in its host's figures only once a check has seen it:
// the figures were written after it had its address, or a check has run
// since (an unchanged status then includes it); until then it is reserved.
func TestPlaceReplicaSettledByTheHostCheck(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	for _, tc := range []struct {
		name                 string
		written, provisioned time.Time
		interval             time.Duration // the host's spec.checkInterval; 0: the default, 30s
		want                 string
	}{
		{"running before the figures were written: in them", now.Add(-time.Minute), now.Add(-70 * time.Second), 0, "map[h:2]"},
		{"running since they were written, no check since: reserved", now.Add(-time.Minute), now.Add(-50 * time.Second), 0, "map[h:1]"},
		{"same second: reserved", now.Add(-time.Minute), now.Add(-time.Minute), 0, "map[h:1]"},
		{"checks have run since without writing: in them", now.Add(-10 * time.Minute), now.Add(-5 * time.Minute), 0, "map[h:2]"},
		{"a longer check interval: not yet", now.Add(-10 * time.Minute), now.Add(-5 * time.Minute), 3 * time.Minute, "map[h:1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := sizedHost("h", 2*giB, func(h *crawlv1.KVMHost) {
				h.Status.LastCheckTime = ptr.To(metav1.NewTime(tc.written))
				if tc.interval > 0 {
					h.Spec.CheckInterval = &metav1.Duration{Duration: tc.interval}
				}
			})
			other := &crawlv1.Proxy{
				ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "running"},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: "h"},
					Resources: crawlv1.ProxyResources{CPUs: 1, Memory: ptr.To(resource.MustParse("1Gi"))}},
				Status: crawlv1.ProxyStatus{Host: "h", Conditions: []metav1.Condition{{Type: crawlv1.InstanceProvisionedCondition,
					Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason, LastTransitionTime: metav1.NewTime(tc.provisioned)}}},
			}
			r := placementReconciler(t, host, other)
			r.Clock = clocktesting.NewFakePassiveClock(now)
			placed, _ := placeBurst(t, r, kvmPool(nil), nil, 5)
			if fmt.Sprint(placed) != tc.want {
				t.Fatalf("placed %v, want %s", placed, tc.want)
			}
		})
	}
}

// Another pool's Proxy still booting on a host counts against that host's
// maxConcurrentCreates; once the pool's own fill both hosts' slots, the
// next waits (CreatesInFlight), which is not a PlacementBlocked reason.
func TestPlaceReplicaCreateConcurrency(t *testing.T) {
	booting := &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "booting", CreationTimestamp: metav1.Now()},
		Spec:       crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: "a"}},
	}
	r := placementReconciler(t, sizedHost("a", 8*giB), sizedHost("b", 8*giB), booting)
	pool := kvmPool(nil)
	pool.Spec.Placement.MaxConcurrentCreates = 2
	placed, blocked := placeBurst(t, r, pool, nil, 10)
	if fmt.Sprint(placed) != "map[a:1 b:2]" {
		t.Fatalf("placed %v (blocked %+v), want a:1 b:2", placed, blocked)
	}
	if blocked == nil || blocked.Reason != placement.CreatesInFlight {
		t.Fatalf("4th replica: %+v, want %s", blocked, placement.CreatesInFlight)
	}
}

func TestCreating(t *testing.T) {
	now := time.Now()
	proxy := func(age time.Duration, ready *metav1.Condition, deleting bool) *crawlv1.Proxy {
		p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
		if age >= 0 {
			p.CreationTimestamp = metav1.NewTime(now.Add(-age))
		}
		if ready != nil {
			ready.Type = crawlv1.ReadyCondition
			p.Status.Conditions = []metav1.Condition{*ready}
		}
		if deleting {
			p.DeletionTimestamp = ptr.To(metav1.NewTime(now))
		}
		return p
	}
	notReady := func(reason string) *metav1.Condition {
		return &metav1.Condition{Status: metav1.ConditionFalse, Reason: reason}
	}
	for _, tc := range []struct {
		name string
		p    *crawlv1.Proxy
		want bool
	}{
		{"placed in this pass, not stored yet", proxy(-1, nil, false), true},
		{"new, no Ready condition yet", proxy(time.Second, nil, false), true},
		{"provisioning", proxy(time.Minute, notReady(crawlv1.ProxyProvisioningReason), false), true},
		{"a transient error is still being created", proxy(time.Minute, notReady(crawlv1.ProxyTransientErrorReason), false), true},
		{"Ready", proxy(time.Minute, &metav1.Condition{Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason}, false), false},
		{"failed for good", proxy(time.Minute, notReady(crawlv1.ProxyPermanentErrorReason), false), false},
		{"spec refused", proxy(time.Minute, notReady(crawlv1.ProxySpecRefusedReason), false), false},
		{"past the startup timeout", proxy(11*time.Minute, notReady(crawlv1.ProxyProvisioningReason), false), false},
		{"being deleted", proxy(time.Minute, nil, true), false},
		{"drained", func() *crawlv1.Proxy {
			p := proxy(time.Minute, nil, false)
			p.Annotations = map[string]string{crawlv1.DrainingAnnotation: now.Format(time.RFC3339)}
			return p
		}(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := creating(tc.p, 10*time.Minute, now); got != tc.want {
				t.Fatalf("creating = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPlacementReadsOncePerPass: a pass placing many replicas (the pool's
// create) reads the hosts and the Proxies on them once, and places every
// replica where reading everything afresh for each would: under each
// egress policy, with NAT and bridged hosts, another pool's Proxies on
// them, and replicas of the pool already measured. Listing every Proxy
// per replica placed made filling a pool quadratic in its size.
func TestPlacementReadsOncePerPass(t *testing.T) {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"role": "proxy"}}
	bridged := func(h *crawlv1.KVMHost) { h.Spec.NetworkMode = crawlv1.NetworkModeBridge }
	objects := func() []client.Object {
		objs := []client.Object{sizedHost("h2", 2*giB), sizedHost("h4", 4*giB), sizedHost("h8", 8*giB),
			sizedHost("b16", 16*giB, bridged), sizedHost("b12", 12*giB, bridged)}
		other := kvmPool(sel)
		other.Name = "other"
		for i, host := range []string{"h8", "h8", "b16"} {
			p := newReplicaOf(other, i)
			p.Spec.Placement.Host, p.Spec.Placement.HostSelector = host, nil
			objs = append(objs, p)
		}
		return objs
	}
	// The pool's own: two on b16 measured leaving from one address.
	existing := func(pool *crawlv1.ProxyPool) []crawlv1.Proxy {
		var out []crawlv1.Proxy
		for i := range 2 {
			p := newReplicaOf(pool, 100+i)
			p.Spec.Placement.Host, p.Spec.Placement.HostSelector = "b16", nil
			p.Status.Host, p.Status.EgressAddress, p.Status.EgressSource = "b16", "203.0.113.9", crawlv1.EgressSourceEcho
			out = append(out, *p)
		}
		return out
	}
	for _, policy := range []crawlv1.EgressDistinctPolicy{crawlv1.EgressDistinctIgnore, crawlv1.EgressDistinctPreferred, crawlv1.EgressDistinctRequired} {
		t.Run(string(policy), func(t *testing.T) {
			place := func(shared bool) (hosts []string, lists int) {
				r := placementReconciler(t, objects()...)
				r.Client = interceptor.NewClient(r.Client.(client.WithWatch), interceptor.Funcs{
					List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
						if _, ok := list.(*crawlv1.ProxyList); ok {
							lists++
						}
						return c.List(ctx, list, opts...)
					}})
				pool := kvmPool(sel)
				pool.Spec.Egress.Distinct = policy
				replicas := existing(pool)
				var reads *placementReads
				if shared {
					reads = newPlacementReads()
				}
				for i := range 12 {
					p := newReplicaOf(pool, i)
					blocked, err := r.placeReplica(context.Background(), pool, replicas, p, reads)
					if err != nil {
						t.Fatal(err)
					}
					if blocked != nil {
						hosts = append(hosts, "blocked: "+blocked.Reason)
						break
					}
					hosts = append(hosts, p.Spec.Placement.Host)
					replicas = append(replicas, *p)
				}
				return hosts, lists
			}
			fresh, freshLists := place(false)
			once, onceLists := place(true)
			if strings.Join(once, " ") != strings.Join(fresh, " ") {
				t.Errorf("placed with the pass's reads: %v\nreading afresh each time:      %v", once, fresh)
			}
			if onceLists != 1 {
				t.Errorf("a pass of %d placements listed the Proxies %d times, want once", len(once), onceLists)
			}
			t.Logf("placed %v (lists: %d once, %d afresh)", once, onceLists, freshLists)
		})
	}
}
