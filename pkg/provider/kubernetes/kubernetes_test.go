package kubernetes

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"crawl.example.com/proxy-operator/pkg/provider"
)

const uid = "0b8e4f7e-3c1a-4d2b-9a55-7e2f6c9d1a01"

func machine() *provider.Machine {
	return &provider.Machine{
		Namespace:   "crawl",
		Name:        "eu-egress",
		UID:         uid,
		Tag:         "prod",
		CPUs:        2,
		MemoryBytes: 512 << 20,
		Port:        3128,
		UserData:    []byte("ignored here"),
	}
}

func newFake(t *testing.T, objs ...client.Object) client.WithWatch {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(objs...).Build()
}

func newProvider(c client.Client) *Provider {
	return New(c, Options{SquidImage: "example.test/squid:6"}).(*Provider)
}

func wantClass(t *testing.T, err error, want provider.ErrorClass) {
	t.Helper()
	if got := provider.Class(err); got != want {
		t.Fatalf("error %v: class %q, want %q", err, got, want)
	}
}

func podKey(m *provider.Machine) types.NamespacedName {
	return types.NamespacedName{Namespace: m.Namespace, Name: ObjectName(m.Name, m.UID)}
}

func TestCreateTwiceIsIdempotent(t *testing.T) {
	c := newFake(t)
	p := newProvider(c)
	m := machine()
	a, err := p.Create(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	m.ProviderID = a.ProviderID
	b, err := p.Create(context.Background(), m)
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if a.ProviderID != b.ProviderID {
		t.Errorf("provider IDs differ: %s / %s", a.ProviderID, b.ProviderID)
	}
	var pods corev1.PodList
	var cms corev1.ConfigMapList
	if err := c.List(context.Background(), &pods); err != nil {
		t.Fatal(err)
	}
	if err := c.List(context.Background(), &cms); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || len(cms.Items) != 1 {
		t.Errorf("%d pods, %d configmaps; want 1 each", len(pods.Items), len(cms.Items))
	}
}

func notReadyNode(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown",
		}}},
	}
}

// replaced checks that the Proxy's pod was written off and replaced under a
// new name that keeps the identity rule, and that Get, Create and Delete
// agree on the replacement.
func replaced(t *testing.T, c client.Client, p *Provider, m *provider.Machine, old string) {
	t.Helper()
	ctx := context.Background()
	recorded := *m
	recorded.ProviderID = FormatProviderID(m.Namespace, old)
	_, err := p.Get(ctx, &recorded)
	wantClass(t, err, provider.ClassNotFound)

	// The controller forgets the provider ID and creates again.
	inst, err := p.Create(ctx, m)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	want := PodName(m.Name, m.UID, 1)
	if inst.Name != want || want == old || inst.State != provider.StatePending {
		t.Fatalf("Create = %+v, want a Pending pod %s", inst, want)
	}
	var pod corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: want}, &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Labels[LabelProxyUID] != m.UID || pod.Annotations[AnnotationIncarnation] != "1" ||
		pod.Spec.Volumes[0].ConfigMap.Name != ObjectName(m.Name, m.UID) {
		t.Errorf("replacement pod: labels %v annotations %v volumes %+v", pod.Labels, pod.Annotations, pod.Spec.Volumes)
	}
	if got, err := p.Get(ctx, m); err != nil || got.Name != want {
		t.Errorf("Get without provider ID = %+v, %v; want the replacement", got, err)
	}
	if again, err := p.Create(ctx, m); err != nil || again.Name != want {
		t.Errorf("second Create = %+v, %v; want the same replacement", again, err)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(m.Namespace)); err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp == nil {
			live++
		}
	}
	if live != 1 {
		t.Errorf("%d live pods, want 1", live)
	}

	byID := *m
	byID.ProviderID = inst.ProviderID
	if err := p.Delete(ctx, &byID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := c.List(ctx, &pods, client.InNamespace(m.Namespace)); err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp == nil {
			t.Errorf("pod %s left after Delete", pod.Name)
		}
	}
}

func TestEvictedPodIsReplacedUnderANewName(t *testing.T) {
	for _, phase := range []corev1.PodPhase{corev1.PodFailed, corev1.PodSucceeded} {
		t.Run(string(phase), func(t *testing.T) {
			m := machine()
			pod := newProvider(newFake(t)).pod(m, podKey(m), 0, false)
			pod.Status = corev1.PodStatus{Phase: phase, Reason: "Evicted", Message: "The node was low on resource: memory."}
			c := newFake(t, pod)
			p := newProvider(c)
			replaced(t, c, p, m, pod.Name)
			// Written off and not deleting yet: Create deleted it.
			if err := c.Get(context.Background(), podKey(m), &corev1.Pod{}); !apierrors.IsNotFound(err) {
				t.Errorf("evicted pod after replacement: %v", err)
			}
		})
	}
}

func TestPodStuckTerminatingOnNotReadyNodeIsReplaced(t *testing.T) {
	m := machine()
	pod := newProvider(newFake(t)).pod(m, podKey(m), 0, false)
	pod.Spec.NodeName = "node-a"
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	since := metav1.NewTime(time.Now().Add(-DefaultStuckDeletionAfter - time.Minute))
	pod.DeletionTimestamp, pod.Finalizers = &since, []string{"test/keep"}
	c := newFake(t, pod, notReadyNode("node-a"))
	p := newProvider(c)
	replaced(t, c, p, m, pod.Name)
	// Not force-deleted: the node may be partitioned, not dead.
	if err := c.Get(context.Background(), podKey(m), &corev1.Pod{}); err != nil {
		t.Errorf("stuck pod: %v", err)
	}
}

// --kubernetes-stuck-deletion-after reaches the provider: a pod stuck past
// the flag's bound (and short of the default) is written off, one short of
// it is not, and a bound that is not positive is refused by name.
func TestStuckDeletionAfterFlag(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		stuckFor    time.Duration
		writtenOff  bool
		validateErr bool
	}{
		{nil, DefaultStuckDeletionAfter - 30*time.Second, false, false},
		{nil, DefaultStuckDeletionAfter + 30*time.Second, true, false},
		{[]string{"--kubernetes-stuck-deletion-after=30s"}, 45 * time.Second, true, false},
		{[]string{"--kubernetes-stuck-deletion-after=30s"}, 15 * time.Second, false, false},
		{[]string{"--kubernetes-stuck-deletion-after=0"}, 0, false, true},
		{[]string{"--kubernetes-stuck-deletion-after=-1m"}, 0, false, true},
	} {
		t.Run(fmt.Sprintf("%q stuck %v", tc.args, tc.stuckFor), func(t *testing.T) {
			o := Options{SquidImage: "example.test/squid@sha256:" + strings.Repeat("0", 64)}
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			o.BindFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			if tc.validateErr {
				if err == nil || !strings.Contains(err.Error(), "--kubernetes-stuck-deletion-after") {
					t.Fatalf("Validate = %v, want an error naming --kubernetes-stuck-deletion-after", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			m := machine()
			pod := newProvider(newFake(t)).pod(m, podKey(m), 0, false)
			pod.Spec.NodeName = "node-a"
			since := metav1.NewTime(time.Now().Add(-tc.stuckFor))
			pod.DeletionTimestamp, pod.Finalizers = &since, []string{"test/keep"}
			c := newFake(t, pod, notReadyNode("node-a"))
			p := New(c, o).(*Provider)
			if tc.writtenOff {
				replaced(t, c, p, m, pod.Name)
				return
			}
			if inst, err := p.Get(context.Background(), m); err != nil || inst.State != provider.StateDeleting {
				t.Fatalf("Get = %+v, %v; want Deleting (not written off yet)", inst, err)
			}
		})
	}
}

func TestTerminatingPodIsNotWrittenOffEarly(t *testing.T) {
	ready := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	long := metav1.NewTime(time.Now().Add(-time.Hour))
	recent := metav1.Now()
	for _, tc := range []struct {
		name  string
		since metav1.Time
		node  *corev1.Node
		phase corev1.PodPhase
	}{
		{"long past, node Ready", long, ready, corev1.PodRunning},
		{"recent, node NotReady", recent, notReadyNode("node-a"), corev1.PodRunning},
		// The kubelet's last status write before it removes a deleted
		// pod: squid exited 0 on SIGTERM.
		{"recent, Succeeded on its way out", recent, ready, corev1.PodSucceeded},
		{"recent, Failed on its way out", recent, ready, corev1.PodFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := machine()
			pod := newProvider(newFake(t)).pod(m, podKey(m), 0, false)
			pod.Spec.NodeName = "node-a"
			pod.Status.Phase = tc.phase
			pod.DeletionTimestamp, pod.Finalizers = &tc.since, []string{"test/keep"}
			p := newProvider(newFake(t, pod, tc.node))
			inst, err := p.Get(context.Background(), m)
			if err != nil || inst.State != provider.StateDeleting {
				t.Fatalf("Get = %+v, %v; want Deleting", inst, err)
			}
			_, err = p.Create(context.Background(), m)
			wantClass(t, err, provider.ClassTransient)
		})
	}
}

func TestCreateOnTerminatingPodIsTransient(t *testing.T) {
	m := machine()
	pod := newProvider(newFake(t)).pod(m, podKey(m), 0, false)
	now := metav1.Now()
	pod.DeletionTimestamp, pod.Finalizers = &now, []string{"test/keep"}
	_, err := newProvider(newFake(t, pod)).Create(context.Background(), m)
	wantClass(t, err, provider.ClassTransient)
}

func TestDeleteIsIdempotent(t *testing.T) {
	c := newFake(t)
	p := newProvider(c)
	m := machine()
	if _, err := p.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(context.Background(), m); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	k := podKey(m)
	if err := c.Get(context.Background(), k, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod after Delete: %v", err)
	}
	if err := c.Get(context.Background(), k, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("configmap after Delete: %v", err)
	}
	if err := p.Delete(context.Background(), m); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	_, err := p.Get(context.Background(), m)
	wantClass(t, err, provider.ClassNotFound)
}

func TestForeignObjectsAreNeverDeleted(t *testing.T) {
	m := machine()
	k := podKey(m)
	foreignLabels := map[string]string{LabelProxyUID: "some-other-uid", LabelManagedBy: ManagedBy}
	for _, tc := range []struct {
		name string
		objs []client.Object
	}{
		{"pod with other uid", []client.Object{
			&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace, Labels: foreignLabels}},
		}},
		{"unlabelled pod", []client.Object{
			&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace}},
		}},
		{"configmap with other uid", []client.Object{
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace, Labels: foreignLabels}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFake(t, tc.objs...)
			p := newProvider(c)
			var ie *provider.IdentityError
			_, err := p.Create(context.Background(), m)
			if !errors.As(err, &ie) || !errors.Is(err, provider.ErrPermanent) {
				t.Fatalf("Create: %v, want permanent IdentityError", err)
			}
			if err := p.Delete(context.Background(), m); !errors.As(err, &ie) {
				t.Fatalf("Delete: %v, want IdentityError", err)
			}
			if _, isPod := tc.objs[0].(*corev1.Pod); isPod {
				if _, err := p.Get(context.Background(), m); !errors.As(err, &ie) {
					t.Fatalf("Get: %v, want IdentityError", err)
				}
			}
			for _, obj := range tc.objs {
				if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object)); err != nil {
					t.Fatalf("foreign %T was removed: %v", obj, err)
				}
			}
		})
	}
}

func TestRecordedProviderID(t *testing.T) {
	c := newFake(t)
	p := newProvider(c)
	m := machine()
	m.ProviderID = "kubernetes://crawl/legacy-pod"
	inst, err := p.Create(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Name != "legacy-pod" {
		t.Errorf("recorded pod name not used: %+v", inst)
	}
	m.ProviderID = "kubernetes://elsewhere/legacy-pod"
	_, err = p.Get(context.Background(), m)
	wantClass(t, err, provider.ClassPermanent)
	m.ProviderID = "gce://p/z/n"
	_, err = p.Get(context.Background(), m)
	wantClass(t, err, provider.ClassPermanent)
}

func TestListByTag(t *testing.T) {
	c := newFake(t)
	p := newProvider(c)
	a := machine()
	b := machine()
	b.Namespace, b.Name, b.UID = "other-ns", "b.dotted", "11111111-2222-3333-4444-555555555555"
	staging := machine()
	staging.Name, staging.UID, staging.Tag = "staging", "99999999-2222-3333-4444-555555555555", "staging"
	for _, m := range []*provider.Machine{a, b, staging} {
		if _, err := p.Create(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	untagged := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "crawl", Labels: map[string]string{"app": "x"}}}
	notOurs := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "imposter", Namespace: "crawl", Labels: map[string]string{LabelTag: "prod"}}}
	for _, o := range []client.Object{untagged, notOurs} {
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}

	got, err := p.ListByTag(context.Background(), "prod")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("ListByTag = %+v, want 2", got)
	}
	want := map[provider.Owner]bool{
		{Namespace: "crawl", Name: "eu-egress", UID: a.UID}:   true,
		{Namespace: "other-ns", Name: "b.dotted", UID: b.UID}: true,
	}
	for _, i := range got {
		if !want[i.Owner] {
			t.Errorf("unexpected owner %+v", i.Owner)
		}
	}
	_, err = p.ListByTag(context.Background(), "not a label value!")
	wantClass(t, err, provider.ClassPermanent)
}

func TestCheck(t *testing.T) {
	if err := newProvider(newFake(t)).Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("RBAC: no list"))
		},
	}).Build()
	wantClass(t, newProvider(c).Check(context.Background()), provider.ClassPermanent)
}

func TestAPIReaderUsedOnAlreadyExists(t *testing.T) {
	m := machine()
	k := podKey(m)
	// The cache (client) cannot see the foreign pod; the API reader can.
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace}}
	apiReader := newFake(t, foreign)
	cached := interceptor.NewClient(newFake(t), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Pod); ok {
				return apierrors.NewAlreadyExists(schema.GroupResource{Resource: "pods"}, obj.GetName())
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	p := New(cached, Options{APIReader: apiReader})
	_, err := p.Create(context.Background(), m)
	var ie *provider.IdentityError
	if !errors.As(err, &ie) {
		t.Fatalf("Create: %v, want IdentityError read through the API reader", err)
	}
}

func TestInvalidMachine(t *testing.T) {
	p := newProvider(newFake(t))
	for name, mut := range map[string]func(*provider.Machine){
		"no uid":    func(m *provider.Machine) { m.UID = "" },
		"bad tag":   func(m *provider.Machine) { m.Tag = "no spaces allowed" },
		"bad port":  func(m *provider.Machine) { m.Port = 70000 },
		"low port":  func(m *provider.Machine) { m.Port = 80 },
		"neg cpus":  func(m *provider.Machine) { m.CPUs = -1 },
		"no name":   func(m *provider.Machine) { m.Name = "" },
		"bad recid": func(m *provider.Machine) { m.ProviderID = "kubernetes://" },
	} {
		t.Run(name, func(t *testing.T) {
			m := machine()
			mut(m)
			_, err := p.Create(context.Background(), m)
			wantClass(t, err, provider.ClassPermanent)
		})
	}
}

// Two installs in one cluster (--install-id) list only their own pods, and
// pods made before install ids (no label) are nobody's to collect.
func TestListByTagReturnsOnlyThisInstall(t *testing.T) {
	c := newFake(t)
	mine := New(c, Options{InstallID: "install-a"}).(*Provider)
	theirs := New(c, Options{InstallID: "install-b"}).(*Provider)
	legacy := New(c, Options{}).(*Provider)
	a, b, old := machine(), machine(), machine()
	b.Name, b.UID = "b", "11111111-2222-3333-4444-555555555555"
	old.Name, old.UID = "old", "99999999-2222-3333-4444-555555555555"
	for p, m := range map[*Provider]*provider.Machine{mine: a, theirs: b, legacy: old} {
		if _, err := p.Create(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	got, err := mine.ListByTag(context.Background(), "prod")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Owner.UID != a.UID || got[0].InstallID != "install-a" {
		t.Fatalf("ListByTag = %+v, want only %s of install-a", got, a.UID)
	}
	pod := &corev1.Pod{}
	if err := c.Get(context.Background(), podKey(a), pod); err != nil || pod.Labels[LabelInstall] != "install-a" {
		t.Fatalf("pod labels %v, %v; want %s=install-a", pod.Labels, err, LabelInstall)
	}
	cm := &corev1.ConfigMap{}
	if err := c.Get(context.Background(), podKey(a), cm); err != nil || cm.Labels[LabelInstall] != "install-a" {
		t.Fatalf("configmap labels %v, %v; want %s=install-a", cm.Labels, err, LabelInstall)
	}
}
