package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"crawl.example.com/proxy-operator/pkg/squid"
)

// How a Proxy's deny list is laid out in its objects. squid.conf holds the
// Proxy's own list (spec.access: the default list less its exceptions,
// plus its extra ranges); the ConfigMap's ClusterRangesKey file holds what
// the cluster's ranges add to it, which squid reads as a second ACL, so no
// exception of the Proxy lifts a cluster range; the NetworkPolicy denies
// the union. The own list is also kept as AnnotationDeniedDestinations on
// the ConfigMap: when the cluster's ranges change, the file and the
// NetworkPolicy are rewritten from it, without the Proxy's credential or
// spec, and the pod's squid re-reads the file (SquidCommand) in place.

// AnnotationDeniedDestinations on a Proxy's ConfigMap lists, space
// separated, the destinations its squid.conf refuses by itself.
const AnnotationDeniedDestinations = "crawl.example.com/denied-destinations"

var (
	allIPv4 = netip.MustParsePrefix("0.0.0.0/0")
	allIPv6 = netip.MustParsePrefix("::/0")
)

func formatPrefixes(ps []netip.Prefix) string {
	words := make([]string, len(ps))
	for i, p := range ps {
		words[i] = p.String()
	}
	return strings.Join(words, " ")
}

func parsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, w := range strings.Fields(s) {
		p, err := netip.ParsePrefix(w)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// clusterRanges are the ranges every squid of this provider refuses
// beside its own list: Options.ExtraClusterRanges and, with
// Options.ClusterRanges, what was discovered, waiting for the first
// discovery (a squid must not start without them).
func (p *Provider) clusterRanges(ctx context.Context) ([]netip.Prefix, error) {
	if p.opts.ClusterRanges == nil {
		return p.opts.ExtraClusterRanges, nil
	}
	found, err := p.opts.ClusterRanges.Current(ctx)
	if err != nil {
		return nil, fmt.Errorf("the cluster's own address ranges are not known yet (the manager needs list and watch on nodes and servicecidrs): %w", err)
	}
	return squid.Normalize(slices.Concat(found, p.opts.ExtraClusterRanges)), nil
}

// egressRules let squid reach the cluster's DNS (port 53 only) and every
// address outside denied, and nothing else. denied is all that squid
// refuses (its own list and the cluster's), so the NetworkPolicy is the
// second layer behind squid's dst ACL. A NetworkPolicy's rules add up: an
// ipBlock's except cannot be undone by another rule, so no other rule may
// admit a denied address; the only other rule admits the DNS pods (and
// Options.DNSCIDRs), on port 53 alone.
func (p *Provider) egressRules(denied []netip.Prefix) []networkingv1.NetworkPolicyEgressRule {
	var internet []networkingv1.NetworkPolicyPeer
	denied = squid.Aggregate(denied) // a short except list
	for _, all := range []netip.Prefix{allIPv4, allIPv6} {
		var except []string
		whole := false
		for _, d := range denied {
			if d.Addr().Is4() != all.Addr().Is4() {
				continue
			}
			// An except must lie strictly inside the cidr; a denied
			// family is left out instead.
			whole = whole || d.Bits() == 0
			except = append(except, d.String())
		}
		if !whole {
			internet = append(internet, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: all.String(), Except: except}})
		}
	}
	dns := []networkingv1.NetworkPolicyPeer{{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: p.opts.DNSNamespace}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: p.opts.DNSPodLabels},
	}}
	for _, c := range p.opts.DNSCIDRs {
		dns = append(dns, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: c.String()}})
	}
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	port53 := intstr.FromInt32(53)
	rules := []networkingv1.NetworkPolicyEgressRule{{
		To:    dns,
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &port53}, {Protocol: &tcp, Port: &port53}},
	}}
	if len(internet) > 0 {
		rules = append(rules, networkingv1.NetworkPolicyEgressRule{To: internet})
	}
	return rules
}

// applyClusterRanges brings every Proxy of this install up to ranges (the
// discovered cluster ranges): for each ConfigMap whose cluster file
// differs, its NetworkPolicy (if any) first, then the file, which the
// pod's squid re-reads within ReloadInterval of the kubelet updating the
// mounted ConfigMap. A ConfigMap without AnnotationDeniedDestinations was
// written by an operator before this one: its pod reads squid.conf
// through a subPath, which never changes in a running pod, so it is left
// to its next rebuild. It returns how many Proxies it updated; failures
// are returned together, and the caller tries again.
func (p *Provider) applyClusterRanges(ctx context.Context, discovered []netip.Prefix) (updated int, err error) {
	ranges := squid.Normalize(slices.Concat(discovered, p.opts.ExtraClusterRanges))
	sel := client.MatchingLabels{LabelManagedBy: ManagedBy}
	if p.opts.InstallID != "" {
		sel[LabelInstall] = p.opts.InstallID
	}
	var cms corev1.ConfigMapList
	if err := p.c.List(ctx, &cms, sel); err != nil {
		return 0, classify(err, "list ConfigMaps")
	}
	var errs []error
	for i := range cms.Items {
		cm := &cms.Items[i]
		raw, ok := cm.Annotations[AnnotationDeniedDestinations]
		if !ok || cm.DeletionTimestamp != nil || cm.Labels[LabelProxyUID] == "" {
			continue
		}
		own, err := parsePrefixes(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("ConfigMap %s/%s: annotation %s: %w", cm.Namespace, cm.Name, AnnotationDeniedDestinations, err))
			continue
		}
		cluster := clusterDenied(own, ranges)
		file := string(squid.DeniedDestinationsFile(cluster))
		if cm.Data[ClusterRangesKey] == file {
			continue
		}
		if err := p.updateEgress(ctx, cm, slices.Concat(own, cluster)); err != nil {
			errs = append(errs, err)
			continue
		}
		next := cm.DeepCopy()
		next.Data[ClusterRangesKey] = file
		log.FromContext(ctx).V(1).Info("updating what the proxy refuses", "object", "ConfigMap "+cm.Namespace+"/"+cm.Name)
		if err := p.c.Update(ctx, next); err != nil {
			errs = append(errs, classify(err, "update ConfigMap "+cm.Namespace+"/"+cm.Name))
			continue
		}
		updated++
	}
	return updated, errors.Join(errs...)
}

// updateEgress rewrites the egress of the NetworkPolicy beside cm (same
// name and Proxy) to deny denied; none is fine (an unmanaged Proxy).
func (p *Provider) updateEgress(ctx context.Context, cm *corev1.ConfigMap, denied []netip.Prefix) error {
	np := &networkingv1.NetworkPolicy{}
	k := client.ObjectKeyFromObject(cm)
	if err := p.r.Get(ctx, k, np); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return classify(err, "get NetworkPolicy "+k.String())
	}
	if np.Labels[LabelProxyUID] != cm.Labels[LabelProxyUID] || np.DeletionTimestamp != nil {
		return nil // not this Proxy's, or going: nothing of ours to keep current
	}
	egress := p.egressRules(denied)
	if equality.Semantic.DeepEqual(np.Spec.Egress, egress) && slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		return nil
	}
	np.Spec.Egress = egress
	np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	log.FromContext(ctx).V(1).Info("updating what the proxy refuses", "object", "NetworkPolicy "+k.String())
	return classify(p.c.Update(ctx, np), "update NetworkPolicy "+k.String())
}
