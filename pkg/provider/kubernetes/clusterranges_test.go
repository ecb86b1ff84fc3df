package kubernetes

import (
	"context"
	"errors"
	"flag"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

func kubernetesService(ips ...string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: KubernetesService.Namespace, Name: KubernetesService.Name},
		Spec:       corev1.ServiceSpec{ClusterIP: ips[0], ClusterIPs: ips},
	}
}

// node has pod ranges and addresses of the given kinds ("InternalIP=…").
func node(name string, podCIDRs []string, addresses ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: podCIDRs}}
	if len(podCIDRs) > 0 {
		n.Spec.PodCIDR = podCIDRs[0]
	}
	for _, a := range addresses {
		typ, addr, _ := strings.Cut(a, "=")
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeAddressType(typ), Address: addr})
	}
	return n
}

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

// gkeCluster is issue 25's cluster: Services in 34.118.224.0/20 (the
// kubernetes Service at its first address), pods in Class E and in global
// space, dual-stack, nodes with private and public addresses.
func gkeCluster() []client.Object {
	return []client.Object{
		serviceCIDR("kubernetes", "34.118.224.0/20"),
		kubernetesService("34.118.224.1"),
		node("n1", []string{"240.16.0.0/24"}, "InternalIP=10.128.0.5", "ExternalIP=35.0.0.5", "Hostname=n1"),
		node("n2", []string{"34.118.0.0/24", "2600:1900:4000:1::/64"}, "InternalIP=10.128.0.6", "InternalIP=2600:1900:4000::6", "InternalDNS=n2.internal"),
	}
}

// gkeClusterBefore is gkeCluster before node joins, and that node.
func gkeClusterBefore(node string) (objs []client.Object, joining client.Object) {
	for _, obj := range gkeCluster() {
		if obj.GetName() == node {
			joining = obj
			continue
		}
		objs = append(objs, obj)
	}
	return objs, joining
}

func TestCollectClusterRanges(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cidrs   []networkingv1.ServiceCIDR
		svc     *corev1.Service
		nodes   []corev1.Node
		want    []string
		skipped []string
	}{
		{name: "nothing"},
		{
			name:  "ServiceCIDRs, dual-stack and several",
			cidrs: []networkingv1.ServiceCIDR{*serviceCIDR("kubernetes", "34.118.224.0/20", "2600:2d00:0:4::/112"), *serviceCIDR("more", "34.118.240.0/24")},
			want:  []string{"34.118.224.0/20", "34.118.240.0/24", "2600:2d00:0:4::/112"},
		},
		{
			name: "the kubernetes Service alone (no ServiceCIDR API)",
			svc:  kubernetesService("34.118.224.1", "2600:2d00:0:4::1"),
			want: []string{"34.118.224.1/32", "2600:2d00:0:4::1/128"},
		},
		{
			name:  "the kubernetes Service inside its ServiceCIDR adds nothing",
			cidrs: []networkingv1.ServiceCIDR{*serviceCIDR("kubernetes", "34.118.224.0/20")},
			svc:   kubernetesService("34.118.224.1"),
			want:  []string{"34.118.224.0/20"},
		},
		{
			name: "nodes: pod ranges, internal and external addresses, not names",
			nodes: []corev1.Node{
				*node("n1", []string{"240.16.0.0/24"}, "InternalIP=10.128.0.5", "ExternalIP=35.0.0.5", "Hostname=n1", "InternalDNS=n1.internal"),
				*node("n2", []string{"34.118.0.0/24", "2600:1900:4000:1::/64"}, "InternalIP=2600:1900:4000::6"),
			},
			want: []string{"10.128.0.5/32", "34.118.0.0/24", "35.0.0.5/32", "240.16.0.0/24", "2600:1900:4000::6/128", "2600:1900:4000:1::/64"},
		},
		{
			name:  "a node with the legacy single podCIDR only",
			nodes: []corev1.Node{{Spec: corev1.NodeSpec{PodCIDR: "10.244.3.0/24"}}},
			want:  []string{"10.244.3.0/24"},
		},
		{
			name: "IPv4-mapped forms become IPv4, host bits are dropped, junk is reported",
			nodes: []corev1.Node{
				*node("n1", []string{"10.244.1.7/24"}, "InternalIP=::ffff:10.128.0.9", "ExternalIP=not-an-ip", "InternalIP=fe80::1%eth0"),
			},
			svc:     kubernetesService("::ffff:0:0/95"),
			want:    []string{"10.128.0.9/32", "10.244.1.0/24"},
			skipped: []string{"::ffff:0:0/95", "not-an-ip", "fe80::1%eth0"},
		},
		{
			name: "headless (None) is no address",
			svc:  &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, skipped := CollectClusterRanges(tc.cidrs, tc.svc, tc.nodes)
			if s := formatPrefixes(got); s != strings.Join(tc.want, " ") {
				t.Errorf("ranges %q, want %q", s, tc.want)
			}
			if !slices.Equal(skipped, tc.skipped) {
				t.Errorf("skipped %q, want %q", skipped, tc.skipped)
			}
		})
	}
}

func TestClusterRangesRefresh(t *testing.T) {
	ctx := context.Background()
	c := newFake(t, gkeCluster()...)
	r := NewClusterRanges(c, c)

	early, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := r.Current(early); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Current before any Refresh: %v, want to wait for it", err)
	}

	want := "10.128.0.5/32 10.128.0.6/32 34.118.0.0/24 34.118.224.0/20 35.0.0.5/32 240.16.0.0/24 2600:1900:4000::6/128 2600:1900:4000:1::/64"
	got, changed, _, err := r.Refresh(ctx)
	if err != nil || !changed || formatPrefixes(got) != want {
		t.Fatalf("first Refresh: %q changed %v (%v), want %q", formatPrefixes(got), changed, err, want)
	}
	if cur, err := r.Current(ctx); err != nil || formatPrefixes(cur) != want {
		t.Errorf("Current: %q (%v)", formatPrefixes(cur), err)
	}
	if _, changed, _, err := r.Refresh(ctx); err != nil || changed {
		t.Errorf("Refresh with nothing new: changed %v (%v)", changed, err)
	}
	if err := c.Create(ctx, node("n3", []string{"34.118.1.0/24"})); err != nil {
		t.Fatal(err)
	}
	if got, changed, _, err := r.Refresh(ctx); err != nil || !changed || !slices.Contains(got, netip.MustParsePrefix("34.118.1.0/24")) {
		t.Errorf("after a node joined: %q changed %v (%v)", formatPrefixes(got), changed, err)
	}
}

// A cluster without the ServiceCIDR API (before 1.33) still yields the
// rest; any other failure to read is an error, never an empty list.
func TestClusterRangesWithoutTheServiceCIDRAPI(t *testing.T) {
	for _, tc := range []struct {
		name    string
		listErr error
		wantErr bool
	}{
		{"not served", &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "networking.k8s.io", Kind: "ServiceCIDR"}}, false},
		{"forbidden", errors.New("servicecidrs.networking.k8s.io is forbidden"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := interceptor.NewClient(newFake(t, gkeCluster()...), interceptor.Funcs{
				List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					if _, ok := list.(*networkingv1.ServiceCIDRList); ok {
						return tc.listErr
					}
					return c.List(ctx, list, opts...)
				},
			})
			got, _, _, err := NewClusterRanges(c, c).Refresh(context.Background())
			if tc.wantErr {
				if err == nil {
					t.Errorf("Refresh: %q, want an error", formatPrefixes(got))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(got, netip.MustParsePrefix("34.118.224.1/32")) || slices.Contains(got, netip.MustParsePrefix("34.118.224.0/20")) {
				t.Errorf("ranges %q, want the kubernetes Service's address instead of its range", formatPrefixes(got))
			}
		})
	}
}

// What the cluster adds to a Proxy's own list: nothing its list covers
// already (no rewrite, no reload when a node joins a private cluster), and
// all the rest, with NAT64 spellings, whatever its exceptions lifted.
func TestClusterDenied(t *testing.T) {
	own := prefixes("10.0.0.0/9", "10.129.0.0/16", "64:ff9b::a00:0/104") // 10/8 less an exception, and its spelling
	got := clusterDenied(own, prefixes("10.0.0.0/16", "10.128.0.5/32", "10.129.0.0/24", "34.118.224.0/20"))
	// 10.128.0.5's NAT64 spelling is in own already (10/8's).
	want := "10.128.0.5/32 34.118.224.0/20 64:ff9b::2276:e000/116"
	if s := formatPrefixes(got); s != want {
		t.Errorf("clusterDenied = %q, want %q", s, want)
	}
}

func TestClusterRangeFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    string
		wantErr string
	}{
		{[]string{"--kubernetes-cluster-ranges=10.244.0.0/16, 2600:1900:4000::/44"}, "10.244.0.0/16 2600:1900:4000::/44", ""},
		{[]string{"--kubernetes-cluster-ranges=10.244.0.1/16"}, "", "kubernetes-cluster-ranges"},
		{[]string{"--kubernetes-cluster-ranges=10.244.0.1"}, "", "kubernetes-cluster-ranges"},
		{[]string{"--kubernetes-cluster-ranges=::ffff:10.0.0.0/104"}, "", "kubernetes-cluster-ranges"},
		{[]string{"--kubernetes-dns-cidrs=169.254.20.10"}, "", "kubernetes-dns-cidrs"},
	} {
		var o Options
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(new(strings.Builder))
		o.BindFlags(fs)
		err := fs.Parse(tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: %v, want an error naming %s", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || formatPrefixes(o.ExtraClusterRanges) != tc.want {
			t.Errorf("%q: %q (%v), want %q", tc.args, formatPrefixes(o.ExtraClusterRanges), err, tc.want)
		}
	}
}

func TestTrimNodeKeepsWhatIsRead(t *testing.T) {
	n := node("n1", []string{"34.118.0.0/24"}, "InternalIP=10.128.0.5")
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"a"}}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	before := rangeValues(n)
	got, err := trimNode(n)
	if err != nil {
		t.Fatal(err)
	}
	tn := got.(*corev1.Node)
	if tn.ManagedFields != nil || tn.Status.Images != nil {
		t.Errorf("kept %v %v", tn.ManagedFields, tn.Status.Images)
	}
	if !slices.Equal(rangeValues(tn), before) || len(tn.Status.Conditions) != 1 {
		t.Errorf("lost what is read: %v, %v", rangeValues(tn), tn.Status.Conditions)
	}
}
