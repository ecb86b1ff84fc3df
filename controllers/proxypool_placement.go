package controllers

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	poolfleet "crawl.example.com/proxy-operator/pkg/fleet"
	"crawl.example.com/proxy-operator/pkg/placement"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// PlacementBlocked says why a replica cannot be created now. Reason is
// crawlv1.PoolInsufficientCapacityReason or crawlv1.PoolSpreadUnsatisfiableReason.
type PlacementBlocked struct{ Reason, Message string }

// placeReplica places one new replica before it is created (see
// docs/placement.md), by the placement domain of its provider's plug-in.
// replicas are the pool's replicas in any state, those created earlier in
// the same reconcile included: they are what keeps a burst from piling
// onto one host before any host is checked again.
//
//   - Hosts (kvm): a KVMHost among the Ready ones matching the pool's
//     placement.hostSelector (else the template's hostSelector, else its
//     host, else every KVMHost), with room for the replica and holding the
//     fewest of the pool's replicas; replica.Spec.Placement.Host is set and
//     its hostSelector cleared.
//   - Zones (gcp): the listed placement.zones zone with the fewest replicas,
//     a zone that had no room last after the others (chooseZone; none
//     listed: the template's zone).
//   - Nodes (kubernetes): nothing here; the Proxy controller asks the
//     provider for a spread of the pool's instances over nodes.
//
// reads holds what the placements before it in the same pass read (nil:
// read everything afresh).
//
// nil, nil: create it; a PlacementBlocked: do not create it now.
func (r *ProxyPoolReconciler) placeReplica(ctx context.Context, pool *crawlv1.ProxyPool, replicas []crawlv1.Proxy, replica *crawlv1.Proxy, reads *placementReads) (*PlacementBlocked, error) {
	switch r.Plugins.DomainOf(string(replica.Spec.Provider)) {
	case plugin.Hosts:
		return r.placeOnHost(ctx, pool, replicas, replica, reads)
	case plugin.Zones:
		var inUse []string
		for i := range replicas {
			if spreads(&replicas[i]) {
				inUse = append(inUse, replicas[i].Spec.Placement.Zone)
			}
		}
		if z := r.chooseZone(pool, inUse); z != "" {
			replica.Spec.Placement.Zone = z
		}
	}
	return nil, nil
}

func (r *ProxyPoolReconciler) placeOnHost(ctx context.Context, pool *crawlv1.ProxyPool, replicas []crawlv1.Proxy, replica *crawlv1.Proxy, reads *placementReads) (*PlacementBlocked, error) {
	scope, err := hostScopeOf(pool, replica)
	if err != nil {
		// The pool's webhook refuses a malformed selector; one stored
		// without it waits for a fix rather than failing the reconcile.
		return &PlacementBlocked{crawlv1.PoolInsufficientCapacityReason, err.Error()}, nil //nolint:nilerr // blocked, reported in the pool's status
	}
	policy, err := poolfleet.PolicyFor(&pool.Spec)
	if err != nil {
		return nil, err // the reconcile checked it before planning
	}
	hr, err := reads.hostsFor(ctx, r, scope, policy.StartupTimeout)
	if err != nil {
		return nil, err
	}
	if len(hr.hosts) == 0 {
		msg := "no KVMHost matches " + scope.what
		if len(hr.notReady) > 0 {
			msg = fmt.Sprintf("no Ready KVMHost matches %s: %s", scope.what, strings.Join(hr.notReady, ", "))
		}
		return &PlacementBlocked{crawlv1.PoolInsufficientCapacityReason, msg}, nil
	}
	onHosts, err := hr.replicasOn(ctx, r, replicas)
	if err != nil {
		return nil, err
	}
	req := placement.Request{
		Hosts:         hr.hosts,
		Replicas:      onHosts,
		Need:          sizeOf(replica),
		CPUOvercommit: int64(pool.Spec.Placement.CPUOvercommit),
		MaxCreating:   policy.MaxConcurrentCreates,
	}
	host, blocked, egressBlocked := r.chooseHostForEgress(pool, replica, req, hr, replicas)
	if egressBlocked != nil {
		return egressBlocked, nil
	}
	if blocked != nil {
		return &PlacementBlocked{blocked.Reason, blocked.Message}, nil
	}
	replica.Spec.Placement.Host = host
	replica.Spec.Placement.HostSelector = nil
	logf.FromContext(ctx).V(1).Info("placed replica", "proxy", replica.Name, "host", host)
	return nil, nil
}

// placementReads is what placing one pool's replicas on hosts reads (the
// eligible hosts, every Proxy on them, the hosts giving an egress address
// in use), kept for the placements of one pass: each replica placed is
// added to it instead of everything being read again, so a pass placing n
// replicas lists the cached Proxies once, not n times (quadratic: a pool
// filling to 5,000 copied every cached Proxy for each replica it placed).
// nil reads nothing ahead: every placement reads afresh.
type placementReads struct {
	byScope map[string]*hostsRead
}

func newPlacementReads() *placementReads {
	return &placementReads{byScope: map[string]*hostsRead{}}
}

// hostsRead is the hosts of one scope and what is on them, as of the pass.
type hostsRead struct {
	hosts          []placement.Host
	checks         map[string]hostChecks
	eligible       map[string]*crawlv1.KVMHost
	notReady       []string
	now            time.Time
	startupTimeout time.Duration

	// onHosts are the placement entries of every Proxy on the eligible
	// hosts (order does not matter to placement): the others' (nil: not
	// listed yet), then those of the pool's replicas counted so far.
	onHosts []placement.Replica
	ours    appendOnly
	// inUse and seen: countEgressInUse over the replicas counted.
	inUse map[string]string
	seen  map[string]map[string]string
	used  appendOnly
}

// appendOnly follows a list of the pool's replicas that only grows at its
// end within a pass (each placed replica is appended), so what was
// counted of it need not be counted again.
type appendOnly struct {
	counted int
	last    types.NamespacedName // of the last one counted
}

// grown says whether replicas is what was counted plus new ones at the end.
func (a *appendOnly) grown(replicas []crawlv1.Proxy) bool {
	return a.counted <= len(replicas) && (a.counted == 0 || client.ObjectKeyFromObject(&replicas[a.counted-1]) == a.last)
}

func (a *appendOnly) countedAll(replicas []crawlv1.Proxy) {
	a.counted = len(replicas)
	if a.counted > 0 {
		a.last = client.ObjectKeyFromObject(&replicas[a.counted-1])
	}
}

func (reads *placementReads) hostsFor(ctx context.Context, r *ProxyPoolReconciler, scope hostScope, startupTimeout time.Duration) (*hostsRead, error) {
	key := scope.what
	if reads != nil {
		if hr, ok := reads.byScope[key]; ok && hr.startupTimeout == startupTimeout {
			return hr, nil
		}
	}
	hostList := &crawlv1.KVMHostList{}
	if err := r.Client.List(ctx, hostList, client.MatchingLabelsSelector{Selector: scope.selector}); err != nil {
		return nil, fmt.Errorf("list KVMHosts: %w", err)
	}
	hr := &hostsRead{checks: map[string]hostChecks{}, eligible: map[string]*crawlv1.KVMHost{}, now: r.now(), startupTimeout: startupTimeout}
	for i := range hostList.Items {
		h := &hostList.Items[i]
		if scope.name != "" && h.Name != scope.name {
			continue
		}
		switch {
		case !h.DeletionTimestamp.IsZero():
			hr.notReady = append(hr.notReady, h.Name+" (being deleted)")
		case !conditions.IsTrue(h, crawlv1.ReadyCondition):
			hr.notReady = append(hr.notReady, fmt.Sprintf("%s (%s)", h.Name, cmp.Or(conditions.GetReason(h, crawlv1.ReadyCondition), "not checked yet")))
		default:
			hr.hosts = append(hr.hosts, placement.Host{Name: h.Name, Capacity: capacityOf(h)})
			hr.checks[h.Name] = r.checksOf(h)
			hr.eligible[h.Name] = h
		}
	}
	if reads != nil {
		reads.byScope[key] = hr
	}
	return hr, nil
}

// replicasOn returns every Proxy on or placed on the eligible hosts: the
// pool's replicas as passed (they include creates the cache has not seen
// yet) and every other Proxy of the Hosts domain from the cache (other
// pools', standalone ones), which take room too and count against the
// hosts' create concurrency while being created (see creating). Replicas
// appended since the last call are added; the cache is listed once.
func (hr *hostsRead) replicasOn(ctx context.Context, r *ProxyPoolReconciler, replicas []crawlv1.Proxy) ([]placement.Replica, error) {
	if hr.onHosts == nil || !hr.ours.grown(replicas) {
		others, err := hr.readOthers(ctx, r, replicas)
		if err != nil {
			return nil, err
		}
		hr.onHosts, hr.ours = others, appendOnly{}
	}
	for i := hr.ours.counted; i < len(replicas); i++ {
		if e, ok := hr.entry(r, &replicas[i], true); ok {
			hr.onHosts = append(hr.onHosts, e)
		}
	}
	hr.ours.countedAll(replicas)
	return hr.onHosts, nil
}

// readOthers lists the Proxies of the Hosts domain that are not among
// replicas.
func (hr *hostsRead) readOthers(ctx context.Context, r *ProxyPoolReconciler, replicas []crawlv1.Proxy) ([]placement.Replica, error) {
	ours := make(map[types.NamespacedName]bool, len(replicas))
	for i := range replicas {
		ours[client.ObjectKeyFromObject(&replicas[i])] = true
	}
	all := &crawlv1.ProxyList{}
	// Read only, so the cache's objects are not copied for every placement.
	if err := r.Client.List(ctx, all, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list Proxies: %w", err)
	}
	others := []placement.Replica{}
	for i := range all.Items {
		if p := &all.Items[i]; !ours[client.ObjectKeyFromObject(p)] {
			if e, ok := hr.entry(r, p, false); ok {
				others = append(others, e)
			}
		}
	}
	return others, nil
}

// entry is p's placement entry, if it is on an eligible host; pools: p is
// one of the pool's replicas (only those count for its spread).
func (hr *hostsRead) entry(r *ProxyPoolReconciler, p *crawlv1.Proxy, pools bool) (placement.Replica, bool) {
	pl := r.Plugins.Get(string(p.Spec.Provider))
	if pl == nil || pl.Domain() != plugin.Hosts {
		return placement.Replica{}, false
	}
	host := pl.HostOf(p)
	hc, eligible := hr.checks[host]
	if !eligible {
		return placement.Replica{}, false
	}
	return placement.Replica{
		Host:      host,
		Resources: sizeOf(p),
		Settled:   hc.settled(p, hr.now),
		Spreads:   pools && spreads(p),
		Creating:  creating(p, hr.startupTimeout, hr.now),
	}, true
}

// egressInUse names the hosts that would give a new replica an egress
// address in use, each with why (countEgressInUse over replicas, counting
// only those appended since the last call).
func (hr *hostsRead) egressInUse(pl plugin.Plugin, replicas []crawlv1.Proxy) map[string]string {
	if hr.inUse == nil || !hr.used.grown(replicas) {
		hr.inUse, hr.seen, hr.used = map[string]string{}, map[string]map[string]string{}, appendOnly{}
	}
	for i := hr.used.counted; i < len(replicas); i++ {
		countEgressInUse(pl, hr.eligible, &replicas[i], hr.inUse, hr.seen)
	}
	hr.used.countedAll(replicas)
	return hr.inUse
}

// chooseHostForEgress chooses a host under the pool's egress.distinct:
// Required leaves out the hosts that would give an address in use
// (egressInUse) and is blocked, naming them, when none is left;
// Preferred tries the others first, then every host; Ignore looks at
// capacity and spread only.
func (r *ProxyPoolReconciler) chooseHostForEgress(pool *crawlv1.ProxyPool, replica *crawlv1.Proxy, req placement.Request,
	hr *hostsRead, replicas []crawlv1.Proxy) (string, *placement.Blocked, *PlacementBlocked) {
	policy := distinctPolicy(pool)
	pl := r.Plugins.Get(string(replica.Spec.Provider))
	if policy == crawlv1.EgressDistinctIgnore || pl == nil {
		host, blocked := placement.ChooseHost(req)
		return host, blocked, nil
	}
	inUse := hr.egressInUse(pl, replicas)
	fresh := req
	fresh.Hosts = slices.DeleteFunc(slices.Clone(req.Hosts), func(h placement.Host) bool { _, used := inUse[h.Name]; return used })
	if policy == crawlv1.EgressDistinctRequired {
		if len(fresh.Hosts) == 0 {
			why := make([]string, 0, len(inUse))
			for _, h := range req.Hosts {
				why = append(why, inUse[h.Name])
			}
			return "", nil, &PlacementBlocked{crawlv1.PoolNoDistinctEgressReason, fmt.Sprintf(
				"spec.egress.distinct Required: every eligible KVMHost already gives this pool an egress address in use: %s", strings.Join(why, ", "))}
		}
		host, blocked := placement.ChooseHost(fresh)
		return host, blocked, nil
	}
	if len(fresh.Hosts) > 0 && len(fresh.Hosts) < len(req.Hosts) {
		// A fresh host busy creating is waited for, not passed over.
		if host, blocked := placement.ChooseHost(fresh); blocked == nil || blocked.Reason == placement.CreatesInFlight {
			return host, blocked, nil
		}
	}
	host, blocked := placement.ChooseHost(req)
	return host, blocked, nil
}

// hostScope is the hosts a replica may go to: those matching selector
// (and named name, if set), described by what in messages.
type hostScope struct {
	selector labels.Selector
	name     string
	what     string
}

func hostScopeOf(pool *crawlv1.ProxyPool, replica *crawlv1.Proxy) (hostScope, error) {
	ls, field := pool.Spec.Placement.HostSelector, "spec.placement.hostSelector"
	if ls == nil {
		ls, field = replica.Spec.Placement.HostSelector, "spec.template.spec.placement.hostSelector"
	}
	if ls == nil {
		if h := replica.Spec.Placement.Host; h != "" {
			return hostScope{labels.Everything(), h, fmt.Sprintf("spec.template.spec.placement.host %q", h)}, nil
		}
		return hostScope{labels.Everything(), "", "any labels (no hostSelector)"}, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return hostScope{}, fmt.Errorf("%s: %w", field, err)
	}
	return hostScope{sel, "", fmt.Sprintf("%s %q", field, sel.String())}, nil
}

// capacityOf is a host's last reported capacity; nil until it has reported
// both its memory and CPUs and its pool.
func capacityOf(h *crawlv1.KVMHost) *placement.Capacity {
	c, p := h.Status.Capacity, h.Status.Pool
	if c == nil || p == nil {
		return nil
	}
	return &placement.Capacity{
		CPUs:                 int64(c.CPUs),
		MemoryBytes:          c.MemoryBytes,
		FreeMemoryBytes:      c.FreeMemoryBytes,
		AllocatedVCPUs:       int64(c.AllocatedVCPUs),
		AllocatedMemoryBytes: c.AllocatedMemoryBytes,
		PoolAvailableBytes:   p.AvailableBytes,
	}
}

// hostChecks is when a host's figures were last written and how often it
// is checked.
type hostChecks struct {
	writtenAt time.Time
	interval  time.Duration
}

func (r *ProxyPoolReconciler) checksOf(h *crawlv1.KVMHost) hostChecks {
	hc := hostChecks{interval: cmp.Or(r.HostCheckInterval, crawlv1.DefaultCheckInterval)}
	if h.Spec.CheckInterval != nil && h.Spec.CheckInterval.Duration > 0 {
		hc.interval = h.Spec.CheckInterval.Duration
	}
	if t := h.Status.LastCheckTime; t != nil {
		hc.writtenAt = t.Time
	}
	return hc
}

// settled says whether a Proxy's instance is in its host's figures. It is
// once it runs with an address (InstanceProvisioned) and either the figures
// were written after that, or a check has run since without writing them:
// the status is written whenever what running domains take changes, so an
// unchanged status after the domain started includes it. Two intervals
// and a second (condition times are whole seconds) make sure such a check
// has run. Until then the Proxy is reserved on top of the figures, which
// errs towards leaving room unused, never towards overfilling.
func (hc hostChecks) settled(p *crawlv1.Proxy, now time.Time) bool {
	c := conditions.Get(p, crawlv1.InstanceProvisionedCondition)
	if c == nil || c.Status != metav1.ConditionTrue {
		return false
	}
	since := c.LastTransitionTime.Time
	return (!hc.writtenAt.IsZero() && since.Before(hc.writtenAt)) || now.Sub(since) > 2*hc.interval+time.Second
}

func (r *ProxyPoolReconciler) now() time.Time {
	if r.Clock != nil {
		return r.Clock.Now()
	}
	return time.Now()
}

// creating says whether p's instance is being created, and so counts
// against its placement domain's create concurrency: not Ready yet, not on
// its way out (deleted or drained), not failed for good, and younger than
// startupTimeout (past it the pool counts it as failed to start). A
// replica placed in this pass has no creation time yet: it is being
// created.
func creating(p *crawlv1.Proxy, startupTimeout time.Duration, now time.Time) bool {
	if !spreads(p) {
		return false
	}
	if c := p.CreationTimestamp.Time; !c.IsZero() && now.Sub(c) >= startupTimeout {
		return false
	}
	ready := conditions.Get(p, crawlv1.ReadyCondition)
	switch {
	case ready == nil:
		return true
	case ready.Status == metav1.ConditionTrue:
		return false
	}
	return ready.Reason != crawlv1.ProxyPermanentErrorReason && ready.Reason != crawlv1.ProxySpecRefusedReason
}

// spreads says whether one of the pool's replicas counts for the spread:
// replicas being deleted or drained are on their way out.
func spreads(p *crawlv1.Proxy) bool {
	_, draining := p.Annotations[crawlv1.DrainingAnnotation]
	return p.DeletionTimestamp.IsZero() && !draining
}

// sizeOf is what a Proxy takes, with the defaults admission applies (a
// replica is placed before it is stored, and Proxies stored with the
// webhook off carry none).
func sizeOf(p *crawlv1.Proxy) placement.Resources {
	res := defaulted(&p.Spec).Resources
	return placement.Resources{CPUs: int64(res.CPUs), MemoryBytes: res.Memory.Value(), DiskBytes: res.Disk.Value()}
}

// poolCreateLimit is the pool's replicas that may be being created at once,
// all domains together (fleet.Policy.MaxCreating), where placement cannot
// keep maxConcurrentCreates per domain itself: per zone, the listed zones
// (else one) times it; per node, the nodes the pool's replicas run on
// (at least one) times it, so the bound grows as the provider spreads
// them. Hosts: none here, placement keeps it per host.
func (r *ProxyPoolReconciler) poolCreateLimit(pool *crawlv1.ProxyPool, policy poolfleet.Policy, replicas []crawlv1.Proxy) int {
	switch r.Plugins.DomainOf(string(pool.Spec.Template.Spec.Provider)) {
	case plugin.Hosts:
		return 0
	case plugin.Zones:
		return policy.MaxConcurrentCreates * max(1, len(pool.Spec.Placement.Zones))
	default:
		nodes := map[string]bool{}
		for i := range replicas {
			if h := replicas[i].Status.Host; h != "" && spreads(&replicas[i]) {
				nodes[h] = true
			}
		}
		return policy.MaxConcurrentCreates * max(1, len(nodes))
	}
}
