package kubernetes

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/pkg/squid"
)

// KubernetesService is the Service through which pods reach the API
// server; its ClusterIP is the first address of the primary Service range.
var KubernetesService = types.NamespacedName{Namespace: "default", Name: "kubernetes"}

// ClusterRanges learns the cluster's own address ranges, which every
// squid of this provider refuses (a crawler's request or a redirect must
// not reach a ClusterIP Service, a pod, a node's kubelet or the API server
// from inside the cluster): the ServiceCIDR objects, the kubernetes
// Service's addresses and each Node's pod ranges and addresses
// (CollectClusterRanges). Refresh reads them again; Current waits for the
// first read. NewForManager keeps it fresh from the manager's informers.
type ClusterRanges struct {
	// reader lists ServiceCIDRs and Nodes: the manager's cache, whose
	// informers also tell when they change.
	reader client.Reader
	// api reads the kubernetes Service: one GET per refresh, rather than an
	// informer on every Service of the cluster for one object.
	api client.Reader

	mu     sync.Mutex
	ranges []netip.Prefix
	known  chan struct{} // closed by the first successful Refresh
}

// NewClusterRanges reads ServiceCIDRs and Nodes through reader and the
// kubernetes Service through api.
func NewClusterRanges(reader, api client.Reader) *ClusterRanges {
	return &ClusterRanges{reader: reader, api: api, known: make(chan struct{})}
}

// Refresh reads the cluster's ranges and reports them, whether they differ
// from the last read, and the values that were not addresses (skipped).
// A cluster that does not serve the ServiceCIDR API (before 1.33, or with
// it disabled) contributes the kubernetes Service's address alone for its
// Service range: --kubernetes-cluster-ranges must name the rest.
func (r *ClusterRanges) Refresh(ctx context.Context) (ranges []netip.Prefix, changed bool, skipped []string, err error) {
	var cidrs networkingv1.ServiceCIDRList
	if err := r.reader.List(ctx, &cidrs); err != nil && !meta.IsNoMatchError(err) {
		return nil, false, nil, fmt.Errorf("list ServiceCIDRs: %w", err)
	}
	var svc *corev1.Service
	got := &corev1.Service{}
	switch err := r.api.Get(ctx, KubernetesService, got); {
	case err == nil:
		svc = got
	case !apierrors.IsNotFound(err):
		return nil, false, nil, fmt.Errorf("get Service %s: %w", KubernetesService, err)
	}
	var nodes corev1.NodeList
	// Read only, and possibly thousands: no copy of each.
	if err := r.reader.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, false, nil, fmt.Errorf("list Nodes: %w", err)
	}
	ranges, skipped = CollectClusterRanges(cidrs.Items, svc, nodes.Items)

	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.known:
		changed = !slices.Equal(ranges, r.ranges)
	default:
		changed = true
		close(r.known)
	}
	r.ranges = ranges
	return ranges, changed, skipped, nil
}

// Current returns the ranges of the last Refresh, waiting for the first
// one until ctx ends.
func (r *ClusterRanges) Current(ctx context.Context) ([]netip.Prefix, error) {
	select {
	case <-r.known:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ranges, nil
}

// CollectClusterRanges is the cluster's own address space as its objects
// tell it, normalised: every ServiceCIDR's ranges; the kubernetes
// Service's addresses; each Node's pod ranges (spec.podCIDRs, where the
// cluster allocates them per node: GKE, kubeadm, kind; Calico's and
// Cilium's own IPAM keep theirs elsewhere) and its InternalIP and
// ExternalIP addresses (the kubelet's 10250, NodePorts, hostNetwork pods).
// Values that are not addresses or ranges are returned in skipped.
func CollectClusterRanges(cidrs []networkingv1.ServiceCIDR, kubernetesService *corev1.Service, nodes []corev1.Node) (ranges []netip.Prefix, skipped []string) {
	add := func(s string) {
		if p, ok := parseRange(s); ok {
			ranges = append(ranges, p)
		} else {
			skipped = append(skipped, s)
		}
	}
	for i := range cidrs {
		for _, c := range cidrs[i].Spec.CIDRs {
			add(c)
		}
	}
	if svc := kubernetesService; svc != nil {
		for _, ip := range serviceIPs(svc) {
			add(ip)
		}
	}
	for i := range nodes {
		for _, s := range nodeRanges(&nodes[i]) {
			add(s)
		}
	}
	return squid.Normalize(ranges), skipped
}

// parseRange reads a CIDR or an address (as a one-address range). IPv4
// written as IPv4-mapped IPv6 becomes IPv4 (squid confuses the mapped
// form with IPv4 entries); an IPv6 range wider than the mapped block is
// refused for the same reason, as in spec.access.
func parseRange(s string) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, false
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	p = p.Masked()
	switch a := p.Addr(); {
	case a.Is4In6() && p.Bits() >= 96:
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96), true
	case a.Is6() && p.Overlaps(v4Mapped):
		return netip.Prefix{}, false
	}
	return p, true
}

var v4Mapped = netip.MustParsePrefix("::ffff:0:0/96")

func serviceIPs(svc *corev1.Service) []string {
	ips := slices.Clone(svc.Spec.ClusterIPs)
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	return slices.DeleteFunc(ips, func(ip string) bool { return ip == corev1.ClusterIPNone })
}

// nodeRanges are the values of a Node that CollectClusterRanges denies.
func nodeRanges(n *corev1.Node) []string {
	out := slices.Clone(n.Spec.PodCIDRs)
	if len(out) == 0 && n.Spec.PodCIDR != "" {
		out = append(out, n.Spec.PodCIDR)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			out = append(out, a.Address)
		}
	}
	return out
}

// rangeValues are the values of a Node or ServiceCIDR that CollectClusterRanges
// reads: an update that leaves them alone changes no range.
func rangeValues(obj any) []string {
	switch o := obj.(type) {
	case *corev1.Node:
		return nodeRanges(o)
	case *networkingv1.ServiceCIDR:
		return o.Spec.CIDRs
	}
	return nil
}

// trimNode drops from cached Nodes what is large and never read here (the
// image list, the volumes, managedFields), so the cache of every Node of a
// big cluster stays small. Conditions and addresses stay: the provider
// reads those.
func trimNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status.Images = nil
		n.Status.VolumesInUse = nil
		n.Status.VolumesAttached = nil
	}
	return obj, nil
}

// clusterDenied is what the cluster's ranges add to a squid that refuses
// own already: ranges with their NAT64 spellings, less those inside own.
// So a cluster numbered in private space (the common case) adds nothing,
// and a node joining it rewrites no ConfigMap and reloads no squid.
func clusterDenied(own, ranges []netip.Prefix) []netip.Prefix {
	return slices.DeleteFunc(squid.WithNAT64Spellings(ranges), func(p netip.Prefix) bool {
		return slices.ContainsFunc(own, func(o netip.Prefix) bool { return o.Bits() <= p.Bits() && o.Contains(p.Addr()) })
	})
}
