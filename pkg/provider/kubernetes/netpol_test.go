package kubernetes

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"crawl.example.com/proxy-operator/pkg/squid"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// peer is one end of a connection as a NetworkPolicy sees it: an address,
// and for a pod its labels and its namespace's labels.
type peer struct {
	ip        netip.Addr
	pod       labels.Set // nil: not a pod
	namespace labels.Set
}

// egressAllowed applies the NetworkPolicy API's semantics to one
// connection from a pod (in the policy's namespace, with podLabels) to dst:
// a policy that selects the pod and has the Egress type isolates its
// egress, which is then allowed only if some rule matches both a port
// (none listed: all; protocol TCP when unset; a number, or a range with
// endPort; named ports match no address here) and a peer (none listed:
// all; an ipBlock by address, outside every except, whether or not the
// address is a pod's: the strict reading, since CNIs differ; selectors
// only pods, an absent namespaceSelector meaning the policy's namespace).
func egressAllowed(t *testing.T, np *networkingv1.NetworkPolicy, podLabels labels.Set, dst peer, proto corev1.Protocol, port int32) bool {
	t.Helper()
	selects := func(sel *metav1.LabelSelector, set labels.Set) bool {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Fatalf("selector %v: %v", sel, err)
		}
		return s.Matches(set)
	}
	if !selects(&np.Spec.PodSelector, podLabels) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		return true
	}
	for _, rule := range np.Spec.Egress {
		portOK := len(rule.Ports) == 0
		for _, p := range rule.Ports {
			pr := corev1.ProtocolTCP
			if p.Protocol != nil {
				pr = *p.Protocol
			}
			if pr != proto {
				continue
			}
			switch {
			case p.Port == nil:
				portOK = true
			case p.Port.Type == intstr.Int && p.EndPort != nil:
				portOK = portOK || (port >= p.Port.IntVal && port <= *p.EndPort)
			case p.Port.Type == intstr.Int:
				portOK = portOK || port == p.Port.IntVal
			}
		}
		if !portOK {
			continue
		}
		peerOK := len(rule.To) == 0
		for _, to := range rule.To {
			switch {
			case to.IPBlock != nil:
				cidr := netip.MustParsePrefix(to.IPBlock.CIDR)
				in := cidr.Contains(dst.ip)
				for _, e := range to.IPBlock.Except {
					ex := netip.MustParsePrefix(e)
					if ex.Bits() <= cidr.Bits() || !cidr.Overlaps(ex) {
						t.Fatalf("except %s is not strictly inside %s: the API server refuses it", ex, cidr)
					}
					in = in && !ex.Contains(dst.ip)
				}
				peerOK = peerOK || in
			case dst.pod != nil:
				nsOK := to.NamespaceSelector == nil && dst.namespace[corev1.LabelMetadataName] == np.Namespace ||
					to.NamespaceSelector != nil && selects(to.NamespaceSelector, dst.namespace)
				podOK := to.PodSelector == nil || selects(to.PodSelector, dst.pod)
				peerOK = peerOK || nsOK && podOK
			}
		}
		if peerOK {
			return true
		}
	}
	return false
}

// The managed Proxy's NetworkPolicy under its API's semantics, on issue
// 25's cluster: squid reaches the Internet and the cluster's DNS pods on
// port 53; not the metadata server, nor a Service, pod or node of the
// cluster (its exception for 10.128.0.0/16 does not lift the node at
// 10.128.0.5), nor any address squid itself refuses.
func TestNetworkPolicyEgress(t *testing.T) {
	c := newFake(t, gkeCluster()...)
	ranges := NewClusterRanges(c, c)
	if _, _, _, err := ranges.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := New(c, Options{ManagerNamespace: managerNS, ClusterRanges: ranges, DNSCIDRs: prefixes("169.254.20.10/32")}).(*Provider)
	m := machine()
	m.Squid = &squid.Config{
		AllowedSourceCIDRs:           []string{"10.244.0.0/16"},
		Auth:                         squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: squidPassword},
		AllowedDestinationExceptions: []string{"10.128.0.0/16", "192.168.7.0/24"},
		ExtraDeniedDestinations:      []string{"203.0.114.0/24"},
	}
	if _, err := p.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	var np networkingv1.NetworkPolicy
	if err := c.Get(context.Background(), podKey(m), &np); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := c.Get(context.Background(), podKey(m), &pod); err != nil {
		t.Fatal(err)
	}
	squidPod := labels.Set(pod.Labels)
	if !egressAllowed(t, &np, labels.Set{"app": "other"}, peer{ip: netip.MustParseAddr("169.254.169.254")}, corev1.ProtocolTCP, 80) {
		t.Fatal("the policy isolates pods other than the Proxy's")
	}

	kubeSystem := labels.Set{corev1.LabelMetadataName: "kube-system"}
	addr := func(s string) peer { return peer{ip: netip.MustParseAddr(s)} }
	dnsPod := peer{ip: netip.MustParseAddr("34.118.0.10"), pod: labels.Set{"k8s-app": "kube-dns"}, namespace: kubeSystem}
	otherPod := peer{ip: netip.MustParseAddr("34.118.0.11"), pod: labels.Set{"app": "metrics"}, namespace: kubeSystem}
	for _, tc := range []struct {
		what  string
		dst   peer
		proto corev1.Protocol
		port  int32
		want  bool
	}{
		{"metadata, HTTP", addr("169.254.169.254"), corev1.ProtocolTCP, 80, false},
		{"metadata, HTTPS", addr("169.254.169.254"), corev1.ProtocolTCP, 443, false},
		{"metadata, NAT64", addr("64:ff9b::a9fe:a9fe"), corev1.ProtocolTCP, 80, false},
		{"loopback", addr("127.0.0.1"), corev1.ProtocolTCP, 443, false},
		{"the API server's ClusterIP", addr("34.118.224.1"), corev1.ProtocolTCP, 443, false},
		{"a ClusterIP Service", addr("34.118.230.17"), corev1.ProtocolTCP, 80, false},
		{"a pod in a global pod range", addr("34.118.0.7"), corev1.ProtocolTCP, 80, false},
		{"a pod in Class E", addr("240.16.0.9"), corev1.ProtocolTCP, 443, false},
		{"a pod on IPv6", addr("2600:1900:4000:1::9"), corev1.ProtocolTCP, 443, false},
		{"a node's kubelet", addr("10.128.0.5"), corev1.ProtocolTCP, 10250, false},
		{"a node's external address", addr("35.0.0.5"), corev1.ProtocolTCP, 10250, false},
		{"a node's IPv6 address", addr("2600:1900:4000::6"), corev1.ProtocolTCP, 443, false},
		{"private space", addr("172.16.5.5"), corev1.ProtocolTCP, 80, false},
		{"ULA", addr("fd00::1"), corev1.ProtocolTCP, 80, false},
		{"the Proxy's extra range", addr("203.0.114.9"), corev1.ProtocolTCP, 443, false},
		{"a public address", addr("93.184.215.14"), corev1.ProtocolTCP, 443, true},
		{"a public address, HTTP", addr("93.184.215.14"), corev1.ProtocolTCP, 80, true},
		{"a public IPv6 address", addr("2606:4700::1111"), corev1.ProtocolTCP, 443, true},
		{"the Proxy's exception", addr("10.128.9.9"), corev1.ProtocolTCP, 443, true},
		{"its other exception", addr("192.168.7.7"), corev1.ProtocolTCP, 80, true},
		{"cluster DNS over UDP", dnsPod, corev1.ProtocolUDP, 53, true},
		{"cluster DNS over TCP", dnsPod, corev1.ProtocolTCP, 53, true},
		{"the DNS pod on another port", dnsPod, corev1.ProtocolTCP, 8080, false},
		{"another kube-system pod on 53", otherPod, corev1.ProtocolUDP, 53, false},
		{"NodeLocal DNSCache by address", addr("169.254.20.10"), corev1.ProtocolUDP, 53, true},
		{"NodeLocal DNSCache on another port", addr("169.254.20.10"), corev1.ProtocolTCP, 80, false},
	} {
		if got := egressAllowed(t, &np, squidPod, tc.dst, tc.proto, tc.port); got != tc.want {
			t.Errorf("%s (%s %s:%d): allowed %v, want %v", tc.what, tc.proto, tc.dst.ip, tc.port, got, tc.want)
		}
	}

	// Everything squid refuses, by its own list or the cluster's file, is
	// refused here too, at both ends of each range and on every port
	// another rule opens: no rule re-opens a denied address.
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), podKey(m), &cm); err != nil {
		t.Fatal(err)
	}
	own, err := parsePrefixes(cm.Annotations[AnnotationDeniedDestinations])
	if err != nil || len(own) == 0 {
		t.Fatalf("own list %v (%v)", own, err)
	}
	cluster, err := parsePrefixes(fileEntries(cm.Data[ClusterRangesKey]))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range slices.Concat(own, cluster) {
		for _, a := range []netip.Addr{d.Addr(), squidtest.LastAddr(d)} {
			for _, pp := range []struct {
				proto corev1.Protocol
				port  int32
			}{{corev1.ProtocolTCP, 80}, {corev1.ProtocolTCP, 443}, {corev1.ProtocolTCP, 53}, {corev1.ProtocolUDP, 53}} {
				if egressAllowed(t, &np, squidPod, peer{ip: a}, pp.proto, pp.port) {
					t.Errorf("%s (in %s), %s/%d: allowed", a, d, pp.proto, pp.port)
				}
			}
		}
	}
}

// fileEntries are the ranges of a squid ACL file, space separated.
func fileEntries(file string) string {
	var out []string
	for _, l := range strings.Split(file, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, " ")
}
