package controllers

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// publishFaults makes the pool's published Secret unwritable on demand and
// checks, at every replica deletion, that the stored list does not name
// the replica: a replica is deleted only after a list without it was
// written.
type publishFaults struct {
	*laggingClient
	t         *testing.T
	failWrite bool
	deleted   []string
}

func withPublishFaults(u *poolUnit) *publishFaults {
	f := &publishFaults{laggingClient: u.c, t: u.t}
	u.r.Client = f
	u.r.Publisher = &Publisher{Client: f}
	return f
}

func (f *publishFaults) secretWrite(obj client.Object) error {
	if _, ok := obj.(*corev1.Secret); ok && f.failWrite && strings.HasSuffix(obj.GetName(), crawlv1.PublishedNameSuffix) {
		return apierrors.NewServiceUnavailable("etcd leader changed")
	}
	return nil
}

func (f *publishFaults) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := f.secretWrite(obj); err != nil {
		return err
	}
	return f.laggingClient.Create(ctx, obj, opts...)
}

func (f *publishFaults) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := f.secretWrite(obj); err != nil {
		return err
	}
	return f.laggingClient.Update(ctx, obj, opts...)
}

func (f *publishFaults) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if p, ok := obj.(*crawlv1.Proxy); ok {
		f.t.Helper()
		if slices.Contains(storedList(f.t, f.laggingClient, p.Namespace, "p"), p.Name) {
			f.t.Errorf("replica %s deleted while the published Secret still lists it", p.Name)
		}
		f.deleted = append(f.deleted, p.Name)
	}
	return f.laggingClient.Delete(ctx, obj, opts...)
}

// storedList is the names in the stored proxies.json of pool.
func storedList(t *testing.T, c client.Client, ns, pool string) []string {
	t.Helper()
	sec := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: crawlv1.PublishedName(pool)}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	var entries []PublishedProxy
	if err := json.Unmarshal(sec.Data[crawlv1.ProxiesJSONKey], &entries); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name)
	}
	return out
}

func (u *poolUnit) reconcileErr() (ctrl.Result, error) {
	return u.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: u.pool})
}

func (u *poolUnit) annotated(key string) []string {
	var out []string
	for _, p := range u.replicas() {
		if _, ok := p.Annotations[key]; ok {
			out = append(out, p.Name)
		}
	}
	return out
}

func (u *poolUnit) names() []string { return proxyNames(u.replicas()) }

// serving creates the pool's replicas, makes them Ready an hour ago and
// publishes them: a pool at rest.
func (u *poolUnit) serving() {
	u.t.Helper()
	u.reconcile()
	u.readyAll(time.Hour)
	u.reconcile()
}

// Issue 26, defect 1: a name the pool cannot publish under, or an object
// under it that the pool does not own, must not freeze the fleet; the
// Published condition says what is in the way.
func TestPoolPublishBlockedDoesNotStopTheFleet(t *testing.T) {
	for _, tc := range []struct {
		name       string
		poolName   string
		theirs     client.Object
		wantReason string
		wantInMsg  string
	}{
		{name: "a Secret of the user's under <pool>-proxies", poolName: "p",
			theirs:     &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p-proxies"}},
			wantReason: crawlv1.PoolPublishConflictReason, wantInMsg: "Secret ns/p-proxies exists and is not controlled by ProxyPool p"},
		{name: "a Service from kubectl expose under <pool>-proxies", poolName: "p",
			theirs: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p-proxies"},
				Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80}}}},
			wantReason: crawlv1.PoolPublishConflictReason, wantInMsg: "Service ns/p-proxies exists and is not controlled by ProxyPool p"},
		{name: "a pool name no Service can have (stored before the name rule)", poolName: "7fleet",
			wantReason: crawlv1.PoolPublishInvalidNameReason, wantInMsg: `"7fleet-proxies" is not a valid Service name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newPoolUnitNamed(t, tc.poolName, 2)
			if tc.theirs != nil {
				if err := u.c.Client.Create(context.Background(), tc.theirs); err != nil {
					t.Fatal(err)
				}
			}
			res, err := u.reconcileErr()
			if err != nil {
				t.Fatalf("reconcile: %v; a name in the way is no error to back off from", err)
			}
			if n := len(u.replicas()); n != 2 {
				t.Fatalf("%d replicas created, want 2: publishing must not stop creates", n)
			}
			c := conditions.Get(u.getPool(), crawlv1.PoolPublishedCondition)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != tc.wantReason || !strings.Contains(c.Message, tc.wantInMsg) {
				t.Fatalf("Published %+v, want False/%s naming %q", c, tc.wantReason, tc.wantInMsg)
			}
			if res.RequeueAfter <= 0 || res.RequeueAfter > blockedRetry {
				t.Errorf("requeue after %s: the pool must look again for the object in the way", res.RequeueAfter)
			}

			// Remediation and scaling go on: a replica that never started
			// is replaced, and scaling down removes it.
			u.clock.Step(11 * time.Minute) // past the default startupTimeout
			u.reconcile()
			u.reconcile()
			if n := len(u.replicas()); n < 3 {
				t.Fatalf("%d replicas after both failed to start, want replacements made", n)
			}
			u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(0)) })
			u.reconcile()
			left := 0
			for _, p := range u.replicas() {
				if p.DeletionTimestamp.IsZero() {
					left++
				}
			}
			if left != 0 {
				t.Errorf("%d replicas not deleted after scaling to 0: none was ever published", left)
			}
			if tc.theirs != nil {
				// What is theirs stays theirs.
				got := tc.theirs.DeepCopyObject().(client.Object)
				if err := u.c.Client.Get(context.Background(), client.ObjectKeyFromObject(tc.theirs), got); err != nil || len(got.GetOwnerReferences()) != 0 {
					t.Errorf("the user's %T: %v, owners %v", got, err, got.GetOwnerReferences())
				}
			}
		})
	}
}

// newPoolUnitNamed is newPoolUnit for a pool of another name.
// Any number unhealthy is remediated: the test's replicas never start.
func newPoolUnitNamed(t *testing.T, name string, replicas int32) *poolUnit {
	return newPoolUnit(t, replicas, func(p *crawlv1.ProxyPool) {
		p.Name = name
		p.Spec.Remediation.MaxUnhealthy = ptr.To(intstr.FromString("100%"))
	})
}

// Issue 26, defects 1 and 3: a publish that fails holds back only drains
// that need the list rewritten; a left-out replica does not hide the
// failure; and a replica is deleted only after a list without it was
// written.
func TestPoolPublishFailureHoldsOnlyDrainsOfListedReplicas(t *testing.T) {
	u := newPoolUnit(t, 3)
	f := withPublishFaults(u)
	u.serving()
	if got := storedList(t, u.c, "ns", "p"); len(got) != 3 {
		t.Fatalf("published %v, want the 3 Ready replicas", got)
	}
	// A replica left out (no endpoint any more) alongside the failure:
	// the error of the write must not pass for "left out".
	rs := u.replicas()
	leftOut := rs[2]
	leftOut.Status.Endpoint, leftOut.Status.Address = "", ""
	if err := u.c.Client.Status().Update(context.Background(), &leftOut); err != nil {
		t.Fatal(err)
	}
	f.failWrite = true
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(1)) })
	if _, err := u.reconcileErr(); err == nil {
		t.Errorf("reconcile succeeded while the published Secret could not be written; want the error, for a retry")
	}
	if d := u.annotated(crawlv1.DrainingAnnotation); len(d) != 0 {
		t.Fatalf("drained %v while the list naming them could not be rewritten", d)
	}
	c := conditions.Get(u.getPool(), crawlv1.PoolPublishedCondition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != crawlv1.PoolPublishFailedReason || !strings.Contains(c.Message, "wait to be removed") {
		t.Fatalf("Published %+v, want False/%s saying which replicas wait", c, crawlv1.PoolPublishFailedReason)
	}
	u.clock.Step(time.Minute)
	_, _ = u.reconcileErr()
	if len(f.deleted) != 0 {
		t.Fatalf("deleted %v while the list still names them", f.deleted)
	}

	// The write goes through: drains, then deletes, each after a list
	// without the replica (the client checks at every delete).
	f.failWrite = false
	for range 4 {
		u.reconcile()
		u.clock.Step(31 * time.Second)
	}
	if n := len(u.replicas()); n != 1 {
		t.Fatalf("%d replicas at the end, want 1", n)
	}
	if c := conditions.Get(u.getPool(), crawlv1.PoolPublishedCondition); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Published %+v after a write went through", c)
	}
}

// Issue 26, defect 4: draining or rotating a replica someone else deleted
// meanwhile is no error, and the pass's creates go on.
func TestPoolActingOnAReplicaDeletedMeanwhile(t *testing.T) {
	u := newPoolUnit(t, 1, func(p *crawlv1.ProxyPool) {
		p.Spec.Rotation.MaxAge = &metav1.Duration{Duration: time.Hour}
	})
	u.reconcile()
	u.readyAll(2 * time.Hour) // expired
	old := u.replicas()[0]
	// The cache still shows it; the API server no longer has it.
	u.c.freeze(t)
	if err := u.c.Client.Delete(context.Background(), &old); err != nil {
		t.Fatal(err)
	}
	if _, err := u.reconcileErr(); err != nil {
		t.Fatalf("reconcile: %v; rotating a replica already gone is nothing to fail on", err)
	}
	u.c.lag = false
	if n := len(u.replicas()); n != 1 || u.replicas()[0].Name == old.Name {
		t.Errorf("replicas %v after the rotation of the deleted %s, want its replacement made in the same pass", u.names(), old.Name)
	}

	// A drain of a replica gone meanwhile.
	u = newPoolUnit(t, 2)
	u.serving()
	u.c.freeze(t)
	for _, p := range u.replicas() {
		if err := u.c.Client.Delete(context.Background(), &p); err != nil {
			t.Fatal(err)
		}
	}
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(1)) })
	if _, err := u.reconcileErr(); err != nil {
		t.Fatalf("reconcile: %v; draining a replica already gone is nothing to fail on", err)
	}
}

// Issue 26, defect 5: a replica that was never published is deleted at
// once; it neither keeps its instance nor a surge slot for drainSeconds.
func TestPoolNeverPublishedReplicasAreNotDrained(t *testing.T) {
	t.Run("a booting replica scaled down", func(t *testing.T) {
		u := newPoolUnit(t, 2)
		u.serving()
		ready := u.names()
		u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(3)) })
		u.reconcile()
		var booting string
		for _, n := range u.names() {
			if !slices.Contains(ready, n) {
				booting = n
			}
		}
		u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(2)) })
		u.reconcile()
		if d := u.annotated(crawlv1.DrainingAnnotation); len(d) != 0 {
			t.Errorf("drained %v; the booting %s was never published", d, booting)
		}
		if got := u.names(); slices.Contains(got, booting) || len(got) != 2 {
			t.Errorf("replicas %v, want the booting %s deleted at once", got, booting)
		}
	})
	t.Run("a failed start replaced", func(t *testing.T) {
		u := newPoolUnit(t, 1, func(p *crawlv1.ProxyPool) {
			p.Spec.Remediation.StartupTimeout = &metav1.Duration{Duration: time.Minute}
		})
		u.reconcile()
		failed := u.names()[0]
		u.clock.Step(2 * time.Minute)
		u.reconcile() // the replacement
		if n := len(u.replicas()); n != 2 {
			t.Fatalf("%d replicas, want the failed one and its replacement", n)
		}
		for _, p := range u.replicas() {
			if p.Name == failed {
				continue
			}
			p.Status.Conditions = []metav1.Condition{{Type: crawlv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: "Ready",
				LastTransitionTime: metav1.NewTime(u.clock.Now())}}
			p.Status.Address, p.Status.Endpoint = "192.0.2.20", "http://192.0.2.20:3128"
			if err := u.c.Client.Status().Update(context.Background(), &p); err != nil {
				t.Fatal(err)
			}
		}
		u.reconcile()
		if slices.Contains(u.names(), failed) {
			t.Errorf("replicas %v: the failed %s, never published, waits out drainSeconds", u.names(), failed)
		}
	})
}

// exposure is what a drain waits for: table of what the memory knows.
func TestPoolMemoryExposure(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	proxy := func(name string, created time.Time) *crawlv1.Proxy {
		return &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
	}
	set := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	m := &poolMemory{}
	if listed, _, _ := m.exposure(proxy("a", t0)); !listed {
		t.Fatal("before any write went through, every replica may be listed")
	}
	m.wrote(set("a", "b"), false, t0)
	if listed, _, _ := m.exposure(proxy("c", t0)); !listed {
		t.Fatal("a failed write says nothing of what is listed")
	}
	m.wrote(set("a", "b"), true, t0.Add(time.Second))
	for _, tc := range []struct {
		name        string
		p           *crawlv1.Proxy
		listed      bool
		since       time.Time
		never       bool
		afterWrites func()
	}{
		{name: "listed", p: proxy("a", t0.Add(-time.Hour)), listed: true},
		{name: "made before the memory: maybe listed until then", p: proxy("old", t0.Add(-time.Hour)), since: t0.Add(time.Second)},
		{name: "made since: never listed", p: proxy("new", t0.Add(2*time.Second)), never: true},
		{name: "unlisted by a write", p: proxy("b", t0.Add(-time.Hour)), since: t0.Add(3 * time.Second),
			afterWrites: func() { m.wrote(set("a"), true, t0.Add(3*time.Second)) }},
		{name: "a failed write that tried to list it", p: proxy("new2", t0.Add(2*time.Second)), listed: true,
			afterWrites: func() { m.wrote(set("a", "new2"), false, t0.Add(4*time.Second)) }},
		{name: "listed again, then unlisted", p: proxy("new2", t0.Add(2*time.Second)), since: t0.Add(5 * time.Second),
			afterWrites: func() { m.wrote(set("a"), true, t0.Add(5*time.Second)) }},
	} {
		if tc.afterWrites != nil {
			tc.afterWrites()
		}
		listed, since, never := m.exposure(tc.p)
		if listed != tc.listed || !since.Equal(tc.since) || never != tc.never {
			t.Errorf("%s: listed %v since %s never %v, want %v %s %v", tc.name, listed, since, never, tc.listed, tc.since, tc.never)
		}
	}
}

// Issue 26, defect 7: kubectl delete --cascade=orphan leaves the replicas
// (and the published objects) alone, as the garbage collector does; only
// the pool goes.
func TestPoolDeletedWithOrphanPolicyLeavesItsReplicas(t *testing.T) {
	u := newPoolUnit(t, 2)
	u.serving()
	before := u.names()
	// What the API server does for propagationPolicy Orphan: the orphan
	// finalizer, then the deletion timestamp.
	pool := u.getPool()
	pool.Finalizers = append(pool.Finalizers, metav1.FinalizerOrphanDependents)
	if err := u.c.Client.Update(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	if err := u.c.Client.Delete(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	u.reconcile()
	for _, p := range u.replicas() {
		if !p.DeletionTimestamp.IsZero() {
			t.Errorf("replica %s deleted; the pool was deleted with its dependents orphaned", p.Name)
		}
	}
	if got := u.names(); !slices.Equal(got, before) {
		t.Errorf("replicas %v, want %v left as they were", got, before)
	}
	if got := storedList(t, u.c, "ns", "p"); len(got) != 2 {
		t.Errorf("published list %v, want it left as it was", got)
	}
	if f := u.getPool().Finalizers; !slices.Equal(f, []string{metav1.FinalizerOrphanDependents}) {
		t.Errorf("finalizers %v, want only the garbage collector's orphan finalizer left", f)
	}
}

// Issue 26, defect 7: maxCreatesPerMinute holds across a manager restart,
// replicas made and already deleted included.
func TestPoolCreateCapSurvivesARestart(t *testing.T) {
	u := newPoolUnit(t, 4, func(p *crawlv1.ProxyPool) {
		p.Spec.Remediation.MaxCreatesPerMinute = 2
		p.Spec.Rollout.DrainSeconds = ptr.To(int32(0))
	})
	u.reconcile()
	if n := len(u.replicas()); n != 2 {
		t.Fatalf("%d created, want the cap's 2", n)
	}
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(0)) })
	u.reconcile()
	if n := len(u.replicas()); n != 0 {
		t.Fatalf("%d replicas after scaling to 0", n)
	}
	u.restart()
	u.clock.Step(10 * time.Second)
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(4)) })
	u.reconcile()
	if n := len(u.replicas()); n != 0 {
		t.Fatalf("%d created by the restarted manager within the minute of 2 creates, with maxCreatesPerMinute 2", n)
	}
	u.clock.Step(51 * time.Second)
	u.reconcile()
	if n := len(u.replicas()); n != 2 {
		t.Fatalf("%d created once the minute passed, want 2", n)
	}
}

// restart replaces the reconciler by a new one, memory and all, as a new
// manager process would.
func (u *poolUnit) restart() {
	u.t.Helper()
	old := u.r
	u.r = &ProxyPoolReconciler{Client: old.Client, Scheme: old.Scheme, Recorder: old.Recorder, Publisher: &Publisher{Client: old.Client},
		Clock: old.Clock, Rand: rand.New(rand.NewPCG(3, 4)), OnPublished: old.OnPublished, Plugins: old.Plugins}
	if err := u.r.complete(); err != nil {
		u.t.Fatal(err)
	}
}

// Issue 26, defect 7: what the pool wrote is laid over a lagging cache for
// a while, not for ever: an annotation someone took back, or a deletion the
// cache never shows, stops counting after the expectation timeout.
func TestPoolMemoryOfWritesExpires(t *testing.T) {
	u := newPoolUnit(t, 2)
	u.reconcile()
	ctx := context.Background()
	rs := u.replicas()
	mem := u.r.memory(u.getPool())
	if err := u.r.annotate(ctx, mem, &rs[0], crawlv1.RotationAnnotation, "2026-12-04T12:00:00Z"); err != nil {
		t.Fatal(err)
	}
	// Taken back by hand.
	undo := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+crawlv1.RotationAnnotation+`":null}}}`))
	if err := u.c.Client.Patch(ctx, &rs[0], undo); err != nil {
		t.Fatal(err)
	}
	// A deletion the cache does not show.
	p1 := rs[1].DeepCopy()
	p1.Finalizers = []string{crawlv1.ProxyFinalizer}
	if err := u.c.Client.Update(ctx, p1); err != nil {
		t.Fatal(err)
	}
	if err := u.r.delete(ctx, mem, p1); err != nil {
		t.Fatal(err)
	}
	cached := func() []crawlv1.Proxy {
		out := u.replicas()
		for i := range out {
			out[i].DeletionTimestamp = nil
		}
		return out
	}
	view := func(at time.Duration) (rotating, deleting bool) {
		for _, p := range mem.overlay(cached(), u.clock.Now().Add(at)) {
			_, r := p.Annotations[crawlv1.RotationAnnotation]
			rotating = rotating || r
			deleting = deleting || !p.DeletionTimestamp.IsZero()
		}
		return rotating, deleting
	}
	if r, d := view(10 * time.Second); !r || !d {
		t.Fatalf("10s after the writes: rotating %v deleting %v; the cache may still be on its way", r, d)
	}
	if r, d := view(2 * time.Minute); r || d {
		t.Errorf("2m after the writes: rotating %v deleting %v; past the expectation timeout the cache is believed", r, d)
	}
}

// credentialPool is a pool whose replicas take the credential of the
// user's Secret crawl-creds (password pw).
func credentialPool(t *testing.T, replicas int32, pw string) *poolUnit {
	u := newPoolUnit(t, replicas, func(p *crawlv1.ProxyPool) {
		p.Spec.Template.Spec.Access = &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"},
			Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthBasic, SecretRef: &crawlv1.LocalObjectReference{Name: "crawl-creds"}}}
	})
	u.r.CredentialsCheckInterval = time.Minute
	if err := u.c.Client.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "crawl-creds"},
		Data: map[string][]byte{"username": []byte("crawler"), "password": []byte(pw)}}); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u *poolUnit) setUserPassword(pw string) {
	u.t.Helper()
	s := &corev1.Secret{}
	if err := u.c.Client.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "crawl-creds"}, s); err != nil {
		u.t.Fatal(err)
	}
	s.Data["password"] = []byte(pw)
	if err := u.c.Client.Update(context.Background(), s); err != nil {
		u.t.Fatal(err)
	}
}

// revisionsOf are the pool's credential revisions: name → password.
func (u *poolUnit) revisionsOf() map[string]string {
	u.t.Helper()
	list := &corev1.SecretList{}
	if err := u.c.Client.List(context.Background(), list, client.InNamespace("ns")); err != nil {
		u.t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range list.Items {
		if s.Name != "crawl-creds" && strings.Contains(s.Name, "-credentials-") {
			out[s.Name] = string(s.Data["password"])
		}
	}
	return out
}

// Issue 26, defect 6: a changed password in the Secret the template's
// auth.secretRef names is a rollout within the budget: every replica keeps
// the credential its squid was given until it is replaced.
func TestPoolCredentialChangeIsARollout(t *testing.T) {
	u := credentialPool(t, 2, "first-password-1")
	u.reconcile()
	revs := u.revisionsOf()
	if len(revs) != 1 {
		t.Fatalf("credential revisions %v, want one copy of the user's Secret", revs)
	}
	var first string
	for n := range revs {
		first = n
	}
	for _, p := range u.replicas() {
		if got := credentialsRef(&p); got != first {
			t.Errorf("replica %s takes its credential from %q, want the revision %s", p.Name, got, first)
		}
	}
	u.readyAll(time.Hour)
	u.reconcile()
	old := u.names()

	u.setUserPassword("second-password-2")
	u.clock.Step(61 * time.Second)
	u.reconcile()
	revs = u.revisionsOf()
	if len(revs) != 2 || revs[first] != "first-password-1" {
		t.Fatalf("revisions %v, want the first kept unchanged and a second with the new password", revs)
	}
	pool := u.getPool()
	if c := conditions.Get(pool, crawlv1.PoolRollingOutCondition); c == nil || c.Reason != crawlv1.PoolCredentialsChangedReason || !strings.Contains(c.Message, "crawl-creds") {
		t.Errorf("RollingOut %+v, want %s naming the Secret", c, crawlv1.PoolCredentialsChangedReason)
	}
	// One surged replica with the new credential; the old ones untouched.
	var fresh []string
	for _, p := range u.replicas() {
		if slices.Contains(old, p.Name) {
			if credentialsRef(&p) != first {
				t.Errorf("old replica %s now takes %q", p.Name, credentialsRef(&p))
			}
			continue
		}
		fresh = append(fresh, p.Name)
		if ref := credentialsRef(&p); ref == first || revs[ref] != "second-password-2" {
			t.Errorf("new replica %s takes %q, want the new revision", p.Name, ref)
		}
	}
	if len(fresh) != 1 {
		t.Fatalf("%d replicas made after the change, want 1 (maxSurge 1)", len(fresh))
	}

	// The rollout finishes; the first revision goes with its last replica.
	for range 12 {
		u.readyAll(time.Minute)
		u.reconcile()
		u.clock.Step(31 * time.Second)
	}
	for _, p := range u.replicas() {
		if slices.Contains(old, p.Name) {
			t.Errorf("old replica %s still there after the rollout", p.Name)
		}
	}
	if n := len(u.replicas()); n != 2 {
		t.Errorf("%d replicas after the rollout, want 2", n)
	}
	if revs := u.revisionsOf(); len(revs) != 1 || revs[first] != "" {
		t.Errorf("revisions %v after the rollout, want only the current one", revs)
	}

	// Deleted, the pool takes its copies with it (no garbage collector
	// needed).
	if err := u.c.Client.Delete(context.Background(), u.getPool()); err != nil {
		t.Fatal(err)
	}
	u.reconcile()
	u.reconcile()
	if revs := u.revisionsOf(); len(revs) != 0 {
		t.Errorf("revisions %v after the pool's deletion", revs)
	}
}

// Issue 26, defect 6: replicas whose squid rejects the credential they are
// probed with (407) are reported as such, and replaced by rollout even
// when they are more than maxUnhealthy.
func TestPoolReplicasRejectingTheirCredentialAreReplaced(t *testing.T) {
	u := credentialPool(t, 2, "first-password-1")
	u.serving()
	old := u.names()
	// Both answer 407 (their squid has another password than the copy
	// their Proxy probes with), for ten minutes.
	for _, p := range u.replicas() {
		p.Status.Conditions = []metav1.Condition{
			{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: crawlv1.ProxyProbeAuthFailedReason, LastTransitionTime: metav1.NewTime(u.clock.Now().Add(-10 * time.Minute))},
			{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionFalse, Reason: crawlv1.ProxyProbeAuthFailedReason, LastTransitionTime: metav1.NewTime(u.clock.Now().Add(-10 * time.Minute))},
		}
		if err := u.c.Client.Status().Update(context.Background(), &p); err != nil {
			t.Fatal(err)
		}
	}
	u.reconcile()
	pool := u.getPool()
	if c := conditions.Get(pool, crawlv1.PoolAvailableCondition); c == nil || c.Reason != crawlv1.PoolCredentialsRejectedReason || !strings.Contains(c.Message, "407") {
		t.Errorf("Available %+v, want %s saying they answer 407", c, crawlv1.PoolCredentialsRejectedReason)
	}
	made := 0
	for _, p := range u.replicas() {
		if !slices.Contains(old, p.Name) {
			made++
		}
	}
	if made == 0 {
		t.Errorf("no replacement made for replicas rejecting their credential (2 of 2 unhealthy, over maxUnhealthy)")
	}
}

// A zone that answered it has no room (ZONE_RESOURCE_POOL_EXHAUSTED) is
// tried again only after the pool's other zones.
func TestPoolTriesAnExhaustedZoneLast(t *testing.T) {
	zones := []string{"us-central1-a", "us-central1-b", "us-central1-c"}
	u := newPoolUnit(t, 3, func(p *crawlv1.ProxyPool) {
		p.Spec.Template.Spec = crawlv1.ProxySpec{Provider: crawlv1.ProviderGCP}
		p.Spec.Placement.Zones = zones
	})
	u.reconcile()
	zoneOf := func() map[string]string {
		out := map[string]string{}
		for _, p := range u.replicas() {
			out[p.Name] = p.Spec.Placement.Zone
		}
		return out
	}
	count := func() map[string]int {
		out := map[string]int{}
		for _, z := range zoneOf() {
			out[z]++
		}
		return out
	}
	if c := count(); c[zones[0]] != 1 || c[zones[1]] != 1 || c[zones[2]] != 1 {
		t.Fatalf("zones %v, want one replica in each", c)
	}
	// The replica in the first zone is told there is no room there.
	for _, p := range u.replicas() {
		if p.Spec.Placement.Zone != zones[0] {
			continue
		}
		p.Status.Conditions = []metav1.Condition{{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionFalse,
			Reason: crawlv1.ProxyInsufficientCapacityReason, Message: "ZONE_RESOURCE_POOL_EXHAUSTED", LastTransitionTime: metav1.NewTime(u.clock.Now())}}
		if err := u.c.Client.Status().Update(context.Background(), &p); err != nil {
			t.Fatal(err)
		}
	}
	u.clock.Step(time.Second)
	u.reconcile()
	before := zoneOf()
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(5)) })
	u.reconcile()
	var placed []string
	for n, z := range zoneOf() {
		if _, ok := before[n]; !ok {
			placed = append(placed, z)
		}
	}
	slices.Sort(placed)
	if !slices.Equal(placed, zones[1:]) {
		t.Fatalf("new replicas went to %v, want %v: %s has no room and the others were not tried since", placed, zones[1:], zones[0])
	}
	// Both others tried since: the first zone is back in the spread.
	u.clock.Step(time.Second)
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(6)) })
	u.reconcile()
	if c := count(); c[zones[0]] != 2 {
		t.Errorf("zones %v, want the sixth replica in %s again, the others having been tried", c, zones[0])
	}
}

// Issue 26, defect 2: a replica whose deletion cannot finish (its host
// does not answer) holds no room, so the unhealthy replica it blocked is
// replaced; meanwhile the status says the replacement waits, and for how
// long, rather than claiming it is under way.
func TestPoolStopsCountingADeletionItsHostCannotFinish(t *testing.T) {
	u := newPoolUnit(t, 1)
	u.serving()
	ctx := context.Background()

	// The replica is being deleted (the Proxy's finalizer holds it until
	// its host deletes the instance), and a second one runs but stopped serving
	// ten minutes ago: the pool wants a replacement; maxSurge 1 is the
	// deleting replica's room.
	dying := u.replicas()[0]
	dying.Finalizers = append(dying.Finalizers, crawlv1.ProxyFinalizer)
	if err := u.c.Client.Update(ctx, &dying); err != nil {
		t.Fatal(err)
	}
	// On another host than the one new replicas go to.
	dying.Status.Host = "hv0"
	if err := u.c.Client.Status().Update(ctx, &dying); err != nil {
		t.Fatal(err)
	}
	if err := u.c.Client.Delete(ctx, &dying); err != nil {
		t.Fatal(err)
	}
	u.reconcile()
	u.readyAll(time.Hour)
	var sick crawlv1.Proxy
	for _, p := range u.replicas() {
		if p.Name != dying.Name {
			sick = p
		}
	}
	conditions.Set(&sick, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: "ProbeFailed",
		LastTransitionTime: metav1.NewTime(u.clock.Now().Add(-10 * time.Minute))})
	if err := u.c.Client.Status().Update(ctx, &sick); err != nil {
		t.Fatal(err)
	}
	u.reconcile()
	if n := len(u.replicas()); n != 2 {
		t.Fatalf("%d replicas, want 2: the deletion holds the surge", n)
	}
	pool := u.getPool()
	if c := conditions.Get(pool, crawlv1.PoolRemediatingCondition); c == nil || !strings.Contains(c.Message, "wait for replicas being deleted") {
		t.Errorf("Remediating %+v: it must say the replacement waits for a deletion", c)
	}
	if c := conditions.Get(pool, crawlv1.PoolDeletionStuckCondition); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("DeletionStuck %+v, want False within deletionTimeout", c)
	}

	// The host stops answering: the deletion cannot finish, the room is
	// free at once, and the pool says which replica it gave up on.
	host := sizedHost("hv0", 64*giB, func(h *crawlv1.KVMHost) {
		conditions.Set(h, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: crawlv1.HostTCPUnreachableReason})
	})
	if err := u.c.Client.Create(ctx, host); err != nil {
		t.Fatal(err)
	}
	u.reconcile()
	if n := len(u.replicas()); n != 3 {
		t.Fatalf("%d replicas, want 3: the replacement made beside the stuck deletion", n)
	}
	pool = u.getPool()
	c := conditions.Get(pool, crawlv1.PoolDeletionStuckCondition)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != crawlv1.PoolDeletionStuckReason || !strings.Contains(c.Message, dying.Name) {
		t.Errorf("DeletionStuck %+v, want True naming %s", c, dying.Name)
	}
	if c := conditions.Get(pool, crawlv1.PoolRemediatingCondition); c == nil || strings.Contains(c.Message, "wait") {
		t.Errorf("Remediating %+v: nothing waits any more", c)
	}
	warned := 0
	for len(u.r.Recorder.(*record.FakeRecorder).Events) > 0 {
		if e := <-u.r.Recorder.(*record.FakeRecorder).Events; strings.HasPrefix(e, "Warning "+crawlv1.PoolDeletionStuckReason) && strings.Contains(e, dying.Name) {
			warned++
		}
	}
	// Once, not at every pass.
	u.reconcile()
	for len(u.r.Recorder.(*record.FakeRecorder).Events) > 0 {
		if e := <-u.r.Recorder.(*record.FakeRecorder).Events; strings.HasPrefix(e, "Warning "+crawlv1.PoolDeletionStuckReason) {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("%d DeletionStuck warnings, want 1", warned)
	}
}
