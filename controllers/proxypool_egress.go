package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/util/conditions"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// distinctPolicy is the pool's egress.distinct, Preferred when empty (the
// API's default, for pools stored without it).
func distinctPolicy(pool *crawlv1.ProxyPool) crawlv1.EgressDistinctPolicy {
	if d := pool.Spec.Egress.Distinct; d != "" {
		return d
	}
	return crawlv1.EgressDistinctPreferred
}

// measuredEgress is p's egress address when it is known (measured by an
// echo, or assigned on a network without NAT); "" otherwise.
func measuredEgress(p *crawlv1.Proxy) string {
	switch p.Status.EgressSource {
	case crawlv1.EgressSourceEcho, crawlv1.EgressSourceStatic:
		return p.Status.EgressAddress
	}
	return ""
}

// egressShare is one address several live replicas leave from, the
// oldest first (it keeps the address).
type egressShare struct {
	address  string
	replicas []*crawlv1.Proxy
}

// egressShares groups the live replicas (neither draining nor being
// deleted) by measured egress address and returns the addresses more
// than one has, by address. Within each, the oldest replica (then the
// first by name) comes first.
func egressShares(replicas []crawlv1.Proxy) []egressShare {
	by := map[string][]*crawlv1.Proxy{}
	for i := range replicas {
		p := &replicas[i]
		if a := measuredEgress(p); a != "" && spreads(p) {
			by[a] = append(by[a], p)
		}
	}
	var out []egressShare
	for a, ps := range by {
		if len(ps) < 2 {
			continue
		}
		slices.SortFunc(ps, func(x, y *crawlv1.Proxy) int {
			if c := x.CreationTimestamp.Compare(y.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(x.Name, y.Name)
		})
		out = append(out, egressShare{address: a, replicas: ps})
	}
	slices.SortFunc(out, func(x, y egressShare) int { return strings.Compare(x.address, y.address) })
	return out
}

// sharingEgress names the replicas that Required refuses: each one whose
// egress address an older live replica has. None unless the policy is
// Required and the provider can give distinct addresses at all (a pool
// whose provider shares one address cannot be helped by replacing
// replicas; its condition says so).
func (r *ProxyPoolReconciler) sharingEgress(pool *crawlv1.ProxyPool, replicas []crawlv1.Proxy) map[string]bool {
	if distinctPolicy(pool) != crawlv1.EgressDistinctRequired || r.providerSharedEgress(pool) != "" {
		return nil
	}
	out := map[string]bool{}
	for _, s := range egressShares(replicas) {
		for _, p := range s.replicas[1:] {
			out[p.Name] = true
		}
	}
	return out
}

// providerSharedEgress is why the pool's provider gives its replicas one
// shared address, "" when it may give them their own.
func (r *ProxyPoolReconciler) providerSharedEgress(pool *crawlv1.ProxyPool) string {
	pl := r.Plugins.Get(string(pool.Spec.Template.Spec.Provider))
	if pl == nil {
		return ""
	}
	return plugin.SharedEgressOf(pl, &pool.Spec.Template.Spec)
}

// distinctEgress counts the distinct measured (echo or static) egress
// addresses of the published replicas.
func distinctEgress(published []*crawlv1.Proxy) int {
	seen := map[string]bool{}
	for _, p := range published {
		if a := measuredEgress(p); a != "" {
			seen[a] = true
		}
	}
	return len(seen)
}

// setEgressDistinct sets the EgressDistinct condition, on every pool:
// Ignore says so (True, Ignored); a provider that shares one address is
// False under Required (it cannot be kept) and Preferred alike; otherwise
// False names each address live replicas share, with their hosts and the
// hosts' egress model, and True counts the distinct addresses. Under
// Preferred it is information; under Required the sharing replicas are
// being replaced, or placement says why they cannot be.
func (r *ProxyPoolReconciler) setEgressDistinct(ctx context.Context, pool *crawlv1.ProxyPool, replicas []crawlv1.Proxy) {
	policy := distinctPolicy(pool)
	if policy == crawlv1.EgressDistinctIgnore {
		setPoolCondition(pool, crawlv1.PoolEgressDistinctCondition, true, crawlv1.PoolEgressIgnoredReason, "egress.distinct Ignore: egress addresses are measured and counted, not compared")
		return
	}
	if why := r.providerSharedEgress(pool); why != "" {
		msg := why
		if policy == crawlv1.EgressDistinctRequired {
			msg = "spec.egress.distinct Required cannot be kept: " + why + "; replicas are published as with Preferred"
		}
		setPoolCondition(pool, crawlv1.PoolEgressDistinctCondition, false, crawlv1.PoolEgressProviderSharedReason, msg)
		return
	}
	shares := egressShares(replicas)
	blocked := policy == crawlv1.EgressDistinctRequired && r.egressPlacementBlocked(pool)
	if len(shares) == 0 && !blocked {
		measured, live := 0, 0
		for i := range replicas {
			if spreads(&replicas[i]) {
				live++
				if measuredEgress(&replicas[i]) != "" {
					measured++
				}
			}
		}
		setPoolCondition(pool, crawlv1.PoolEgressDistinctCondition, true, crawlv1.PoolEgressDistinctReason,
			fmt.Sprintf("%d of %d replicas measured, each with its own egress address", measured, live))
		return
	}
	var parts []string
	for _, s := range shares {
		parts = append(parts, fmt.Sprintf("%d replicas share %s%s", len(s.replicas), s.address, r.shareHosts(ctx, s)))
	}
	if blocked {
		// Required refuses to create what it would refuse to publish.
		parts = append(parts, "no replica created: "+placementMessage(pool))
		setPoolCondition(pool, crawlv1.PoolEgressDistinctCondition, false, crawlv1.PoolNoDistinctEgressReason, strings.Join(parts, "; "))
		return
	}
	msg := strings.Join(parts, "; ")
	if policy == crawlv1.EgressDistinctRequired {
		msg += "; the newer are not published and are being replaced"
	}
	setPoolCondition(pool, crawlv1.PoolEgressDistinctCondition, false, crawlv1.PoolEgressSharedReason, msg)
}

// shareHosts says where the replicas of s run: " on host hv1 (NAT)", or
// " on hosts hv1, hv2"; "" outside the Hosts domain.
func (r *ProxyPoolReconciler) shareHosts(ctx context.Context, s egressShare) string {
	var hosts []string
	for _, p := range s.replicas {
		pl := r.Plugins.Get(string(p.Spec.Provider))
		if pl == nil || pl.Domain() != plugin.Hosts {
			continue
		}
		h := pl.HostOf(p)
		if h == "" {
			continue
		}
		kh := &crawlv1.KVMHost{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: h}, kh); err == nil {
			if by := plugin.HostSharedBy(pl, kh); by != "" {
				h += " (" + by + ")"
			}
		}
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	switch len(hosts) {
	case 0:
		return ""
	case 1:
		return " on host " + hosts[0]
	}
	return " on hosts " + strings.Join(hosts, ", ")
}

// egressPlacementBlocked: the last placement was refused for want of a
// host giving a new egress address.
func (r *ProxyPoolReconciler) egressPlacementBlocked(pool *crawlv1.ProxyPool) bool {
	return conditions.IsTrue(pool, crawlv1.PoolPlacementBlockedCondition) &&
		conditions.GetReason(pool, crawlv1.PoolPlacementBlockedCondition) == crawlv1.PoolNoDistinctEgressReason
}

func placementMessage(pool *crawlv1.ProxyPool) string {
	return conditions.GetMessage(pool, crawlv1.PoolPlacementBlockedCondition)
}

// countEgressInUse counts replica p towards the hosts that would give a
// new replica an egress address the pool's live replicas already leave
// from, each with why (out: host -> why), after the replicas before it
// (seen: host -> address -> replica): a host whose instances all leave
// through one address (plugin.HostEgress, e.g. libvirt's NAT) that holds
// a live replica, or a host two of whose live replicas measured one
// address (a bridge behind a router's NAT). The replicas counted include
// those placed earlier in the same pass, so a burst does not pile onto
// one NAT host.
func countEgressInUse(pl plugin.Plugin, hosts map[string]*crawlv1.KVMHost, p *crawlv1.Proxy, out map[string]string, seen map[string]map[string]string) {
	if !spreads(p) {
		return
	}
	h := pl.HostOf(p)
	kh, ok := hosts[h]
	if !ok {
		return
	}
	if by := plugin.HostSharedBy(pl, kh); by != "" {
		out[h] = fmt.Sprintf("%s (%s, replica %s)", h, by, p.Name)
		return
	}
	a := measuredEgress(p)
	if a == "" {
		return
	}
	if seen[h] == nil {
		seen[h] = map[string]string{}
	}
	if other, dup := seen[h][a]; dup {
		out[h] = fmt.Sprintf("%s (replicas %s and %s share %s)", h, other, p.Name, a)
	}
	seen[h][a] = p.Name
}
