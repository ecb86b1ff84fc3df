package kubernetes

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// countingClient records the kind and name of every write that succeeded.
func countingClient(base client.WithWatch, writes *[]string) client.WithWatch {
	record := func(verb string, obj client.Object, err error) error {
		if err == nil {
			*writes = append(*writes, verb+" "+kindOf(obj)+" "+obj.GetNamespace()+"/"+obj.GetName())
		}
		return err
	}
	return interceptor.NewClient(base, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return record("update", obj, c.Update(ctx, obj, opts...))
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return record("create", obj, c.Create(ctx, obj, opts...))
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return record("delete", obj, c.Delete(ctx, obj, opts...))
		},
	})
}

// When the cluster's ranges change, every Proxy of this install gets them
// where it runs: the ConfigMap's file and the NetworkPolicy's egress, not
// a new pod; and nothing is written when nothing changed.
func TestApplyClusterRangesUpdatesWhatProxiesRunWith(t *testing.T) {
	ctx := context.Background()
	objs, joining := gkeClusterBefore("n2")
	// Written by an operator before this one: no annotation, a subPath pod.
	legacy := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "proxy-legacy-12345678", Labels: map[string]string{LabelManagedBy: ManagedBy, LabelProxyUID: "legacy", LabelInstall: "install-a"}},
		Data:       map[string]string{ConfigKey: "# old\n"},
	}
	// Another install's, in the same cluster.
	theirs := legacy.DeepCopy()
	theirs.Name, theirs.Labels[LabelInstall], theirs.Labels[LabelProxyUID] = "proxy-theirs-12345678", "install-b", "theirs"
	theirs.Annotations = map[string]string{AnnotationDeniedDestinations: "10.0.0.0/8"}
	base := newFake(t, append(objs, legacy, theirs)...)
	var writes []string
	c := countingClient(base, &writes)
	ranges := NewClusterRanges(c, c)
	first, _, _, err := ranges.Refresh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := New(c, Options{ClusterRanges: ranges, InstallID: "install-a", ManagerNamespace: managerNS}).(*Provider)

	managed := clusterMachine()
	unmanaged := machine()
	unmanaged.Name, unmanaged.UID = "unmanaged", "5c2d7a1e-0000-4000-8000-000000000002"
	pods := map[string]types.UID{}
	for _, m := range []*provider.Machine{managed, unmanaged} {
		if _, err := p.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		var pod corev1.Pod
		if err := c.Get(ctx, podKey(m), &pod); err != nil {
			t.Fatal(err)
		}
		pods[m.Name] = pod.UID
	}

	writes = nil
	if _, err := p.applyClusterRanges(ctx, first); err != nil {
		t.Fatal(err)
	}
	if len(writes) != 0 {
		t.Fatalf("ranges unchanged, yet %v", writes)
	}

	if err := c.Create(ctx, joining); err != nil {
		t.Fatal(err)
	}
	now, _, _, err := ranges.Refresh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	writes = nil
	if n, err := p.applyClusterRanges(ctx, now); err != nil || n != 2 {
		t.Fatalf("applyClusterRanges updated %d Proxies (%v), want 2", n, err)
	}
	want := []string{
		"update NetworkPolicy " + podKey(managed).String(),
		"update ConfigMap " + podKey(managed).String(),
		// An unmanaged Proxy's pod is guarded by a NetworkPolicy too.
		"update NetworkPolicy " + podKey(unmanaged).String(),
		"update ConfigMap " + podKey(unmanaged).String(),
	}
	if strings.Join(writes, "\n") != strings.Join(want, "\n") {
		t.Errorf("writes:\n%s\nwant:\n%s", strings.Join(writes, "\n"), strings.Join(want, "\n"))
	}
	for _, m := range []*provider.Machine{managed, unmanaged} {
		var cm corev1.ConfigMap
		var pod corev1.Pod
		if err := c.Get(ctx, podKey(m), &cm); err != nil {
			t.Fatal(err)
		}
		if file := fileEntries(cm.Data[ClusterRangesKey]); !strings.Contains(file, "34.118.0.0/24") || !strings.Contains(file, "2600:1900:4000:1::/64") {
			t.Errorf("%s: the cluster file lacks the new node's pod ranges: %s", m.Name, file)
		}
		if err := c.Get(ctx, podKey(m), &pod); err != nil || pod.UID != pods[m.Name] {
			t.Errorf("%s: the pod was replaced (%v)", m.Name, err)
		}
	}
	var np networkingv1.NetworkPolicy
	if err := c.Get(ctx, podKey(managed), &np); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := c.Get(ctx, podKey(managed), &pod); err != nil {
		t.Fatal(err)
	}
	if egressAllowed(t, &np, labels.Set(pod.Labels), peer{ip: netip.MustParseAddr("34.118.0.7")}, corev1.ProtocolTCP, 443) {
		t.Error("the NetworkPolicy still lets squid reach the new node's pods")
	}
	for _, untouched := range []*corev1.ConfigMap{legacy, theirs} {
		var got corev1.ConfigMap
		if err := c.Get(ctx, client.ObjectKeyFromObject(untouched), &got); err != nil || got.ResourceVersion != untouched.ResourceVersion {
			t.Errorf("%s rewritten (%v)", untouched.Name, err)
		}
	}

	// Create after the change agrees with what the change wrote.
	writes = nil
	for _, m := range []*provider.Machine{managed, unmanaged} {
		if _, err := p.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if len(writes) != 0 {
		t.Errorf("Create rewrote what applyClusterRanges wrote: %v", writes)
	}
}

// A cluster numbered in private space, as most are: what it adds is
// inside every Proxy's own list, so a node joining rewrites nothing and
// reloads no squid.
func TestPrivateClusterRangesChangeNothing(t *testing.T) {
	ctx := context.Background()
	base := newFake(t, serviceCIDR("kubernetes", "10.96.0.0/12"), kubernetesService("10.96.0.1"),
		node("n1", []string{"10.244.0.0/24"}, "InternalIP=192.168.1.10"))
	var writes []string
	c := countingClient(base, &writes)
	ranges := NewClusterRanges(c, c)
	if _, _, _, err := ranges.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	p := New(c, Options{ClusterRanges: ranges}).(*Provider)
	m := clusterMachine()
	if _, err := p.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx, podKey(m), &cm); err != nil {
		t.Fatal(err)
	}
	if got := fileEntries(cm.Data[ClusterRangesKey]); got != "0.0.0.0/32" {
		t.Errorf("cluster file %q, want nothing beyond the placeholder", got)
	}
	if err := c.Create(ctx, node("n2", []string{"10.244.1.0/24"}, "InternalIP=192.168.1.11")); err != nil {
		t.Fatal(err)
	}
	now, changed, _, err := ranges.Refresh(ctx)
	if err != nil || !changed {
		t.Fatalf("Refresh: changed %v (%v)", changed, err)
	}
	writes = nil
	if _, err := p.applyClusterRanges(ctx, now); err != nil {
		t.Fatal(err)
	}
	if len(writes) != 0 {
		t.Errorf("a private node joining wrote %v", writes)
	}
}

// An exception lifts part of the default list, never a cluster range:
// the cluster's nodes in 10.128.0.0/16 stay refused by squid (the file is
// an ACL of its own) where the exception opens the rest.
func TestExceptionsDoNotLiftClusterRanges(t *testing.T) {
	ctx := context.Background()
	c := newFake(t, gkeCluster()...)
	p := New(c, Options{ClusterRanges: discovered(t, c)}).(*Provider)
	m := clusterMachine()
	m.Squid.AllowedDestinationExceptions = []string{"10.128.0.0/16"}
	if _, err := p.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx, podKey(m), &cm); err != nil {
		t.Fatal(err)
	}
	file := fileEntries(cm.Data[ClusterRangesKey])
	for _, want := range []string{"10.128.0.5/32", "10.128.0.6/32"} {
		if !strings.Contains(file, want) {
			t.Errorf("cluster file %q lacks the node %s inside the exception", file, want)
		}
	}
	if strings.Contains(cm.Annotations[AnnotationDeniedDestinations], "10.128.") {
		t.Errorf("the own list still denies the exception: %s", cm.Annotations[AnnotationDeniedDestinations])
	}
	if !strings.Contains(cm.Data[ConfigKey], "http_access deny file_denied_destinations\n") {
		t.Errorf("squid.conf does not refuse the file's ranges:\n%s", cm.Data[ConfigKey])
	}
}

// Create waits for the first discovery rather than start a squid without
// the cluster's ranges, and says what it waits for.
func TestCreateWaitsForTheClusterRanges(t *testing.T) {
	c := newFake(t)
	p := New(c, Options{ClusterRanges: NewClusterRanges(c, c)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := p.Create(ctx, clusterMachine())
	wantClass(t, err, provider.ClassTransient)
	if !strings.Contains(err.Error(), "cluster's own address ranges") {
		t.Errorf("error %v does not say what is missing", err)
	}
	var cms corev1.ConfigMapList
	if err := c.List(context.Background(), &cms); err != nil || len(cms.Items) != 0 {
		t.Errorf("created %d ConfigMaps (%v)", len(cms.Items), err)
	}
}

// squid.conf reads the file where the pod mounts it; the flag's ranges are
// in it without any discovery, less what the default list has already.
func TestSquidConfReadsTheMountedClusterFile(t *testing.T) {
	c := newFake(t)
	m := clusterMachine()
	if _, err := New(c, Options{ExtraClusterRanges: prefixes("34.64.0.0/16", "100.100.0.0/16")}).Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), podKey(m), &cm); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cm.Data[ConfigKey], `acl file_denied_destinations dst "`+ConfigDir+"/"+ClusterRangesKey+`"`) {
		t.Errorf("squid.conf does not read %s/%s:\n%s", ConfigDir, ClusterRangesKey, cm.Data[ConfigKey])
	}
	// 100.100/16 is inside 100.64/10, a default.
	if got, want := fileEntries(cm.Data[ClusterRangesKey]), "0.0.0.0/32 34.64.0.0/16 64:ff9b::2240:0/112"; got != want {
		t.Errorf("cluster file %q, want %q", got, want)
	}
}
