package controllers

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	poolfleet "crawl.example.com/proxy-operator/pkg/fleet"
)

// +kubebuilder:rbac:groups=crawl.example.com,resources=proxybans,verbs=get;list;watch;patch;delete

// BanPoolIndex indexes ProxyBans by the ProxyPool they report on.
const BanPoolIndex = "crawl.example.com/ban-pool"

// IndexBanPool registers BanPoolIndex.
func IndexBanPool(ctx context.Context, mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(ctx, &crawlv1.ProxyBan{}, BanPoolIndex, banPoolOf)
}

func banPoolOf(o client.Object) []string {
	if b, ok := o.(*crawlv1.ProxyBan); ok {
		return []string{b.Spec.Pool}
	}
	return nil
}

// banPool maps a ProxyBan to the pool it reports on.
func banPool(_ context.Context, o client.Object) []reconcile.Request {
	b, ok := o.(*crawlv1.ProxyBan)
	if !ok || b.Spec.Pool == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: b.Namespace, Name: b.Spec.Pool}}}
}

// BannedDomain is one entry of a proxies.json entry's bannedDomains: the
// crawler leaves the proxy out for this domain (and its subdomains) until
// expiresAt (RFC 3339).
type BannedDomain struct {
	Domain    string `json:"domain"`
	ExpiresAt string `json:"expiresAt"`
}

// maxQuarantine is the MaxItems of status.quarantine, and
// maxBanRecords of status.banReplacements.
const (
	maxQuarantine = 1000
	maxBanRecords = 1000
)

// banMemory is what the pool keeps of ban reports between reconciles. The
// records and the quarantine are also in the status (which a restarted
// manager starts from); the memory covers a status the cache does not show
// yet.
type banMemory struct {
	records    map[string]time.Time
	quarantine map[string]crawlv1.QuarantinedAddress
	// domains: the replicas' current domain bans, for the Publisher.
	domains map[string][]BannedDomain
	// warned: reports already recorded as ignored (one event each).
	warned map[types.UID]bool
}

// poolBans is what this reconcile read of the pool's ban reports.
type poolBans struct {
	// replace: replicas a report asks to replace, with the reason.
	replace map[string]string
	// quarantined: replicas whose egress address is quarantined.
	quarantined map[string]bool
	// nextExpiry: the earliest domain ban or quarantine to end.
	nextExpiry time.Time
}

// readBans reads the pool's ban reports (ProxyBans naming it, delete-proxy
// annotations) and its quarantine, pruning what expired: domain bans go
// into the published list, replacement requests and quarantined addresses
// into the planner's state (applyBans). A report naming no replica of the
// pool is recorded with a Warning event and otherwise ignored; one whose
// replica is gone, or that expired without asking for replacement, is
// deleted.
func (r *ProxyPoolReconciler) readBans(ctx context.Context, pool *crawlv1.ProxyPool, mem *poolMemory, policy poolfleet.Policy,
	replicas []crawlv1.Proxy, now time.Time) (*poolBans, error) {
	bm := mem.banMemory(pool)
	list := &crawlv1.ProxyBanList{}
	if err := r.Client.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingFields{BanPoolIndex: pool.Name}); err != nil {
		return nil, fmt.Errorf("list ProxyBans: %w", err)
	}
	byName := make(map[string]*crawlv1.Proxy, len(replicas))
	for i := range replicas {
		byName[replicas[i].Name] = &replicas[i]
	}
	pb := &poolBans{replace: map[string]string{}, quarantined: map[string]bool{}}
	domains := map[string]map[string]time.Time{}
	for i := range list.Items {
		if b := &list.Items[i]; b.DeletionTimestamp.IsZero() {
			r.readReport(ctx, pool, bm, pb, domains, b, byName[b.Spec.Proxy], b.CreationTimestamp.Add(policy.DomainBanDuration), now)
		}
	}
	bm.domains = map[string][]BannedDomain{}
	for name, ds := range domains {
		for d, t := range ds {
			bm.domains[name] = append(bm.domains[name], BannedDomain{Domain: d, ExpiresAt: t.UTC().Format(time.RFC3339)})
		}
		slices.SortFunc(bm.domains[name], func(a, b BannedDomain) int { return strings.Compare(a.Domain, b.Domain) })
		if len(ds) >= policy.ReplaceAfterDomains {
			pb.ask(name, fmt.Sprintf("banned on %d domains", len(ds)))
		}
	}
	for i := range replicas {
		if v, ok := replicas[i].Annotations[crawlv1.DeleteProxyAnnotation]; ok {
			pb.ask(replicas[i].Name, strings.TrimSpace(crawlv1.DeleteProxyAnnotation+" "+v))
		}
	}
	bm.prune(byName, now)
	for _, q := range bm.quarantine {
		pb.soonest(q.ExpiresAt.Time)
	}
	for i := range replicas {
		// Whatever the source: a replica that says it leaves from a
		// quarantined address is not published (failing closed).
		if _, ok := bm.quarantine[replicas[i].Status.EgressAddress]; ok {
			pb.quarantined[replicas[i].Name] = true
		}
	}
	return pb, nil
}

// readReport adds one ProxyBan to pb and domains, p being its replica (nil:
// none of the pool's by that name) and expires when its domain ban ends.
func (r *ProxyPoolReconciler) readReport(ctx context.Context, pool *crawlv1.ProxyPool, bm *banMemory, pb *poolBans,
	domains map[string]map[string]time.Time, b *crawlv1.ProxyBan, p *crawlv1.Proxy, expires, now time.Time) {
	switch {
	case p == nil && (ownedBy(b, b.Spec.Proxy, "") || !now.Before(expires)):
		// Its replica is gone (replaced), or it never named one and is
		// as old as a domain ban lasts: the report is done.
		r.deleteBan(ctx, b)
		return
	case p == nil:
		if !bm.warned[b.UID] {
			bm.warned[b.UID] = true
			r.Recorder.Eventf(b, "Warning", "BanIgnored", "ProxyBan %s names %q, which is not a replica of ProxyPool %s: ignored",
				b.Name, b.Spec.Proxy, pool.Name)
		}
		pb.soonest(expires)
		return
	case b.Spec.Domain != "" && !b.Spec.Replace && !now.Before(expires):
		r.deleteBan(ctx, b)
		return
	}
	if !ownedBy(b, p.Name, p.UID) {
		// Goes with its Proxy (the garbage collector), and the pool tells
		// a report on a replica gone from one never valid.
		r.ownBan(ctx, b, p)
	}
	if b.Spec.Domain != "" && now.Before(expires) {
		if domains[p.Name] == nil {
			domains[p.Name] = map[string]time.Time{}
		}
		if expires.After(domains[p.Name][b.Spec.Domain]) {
			domains[p.Name][b.Spec.Domain] = expires
		}
		pb.soonest(expires)
	}
	if b.Spec.Replace {
		pb.ask(p.Name, reportReason(b))
	}
}

func (pb *poolBans) ask(replica, reason string) {
	if _, ok := pb.replace[replica]; !ok {
		pb.replace[replica] = reason
	}
}

func (pb *poolBans) soonest(t time.Time) {
	if pb.nextExpiry.IsZero() || t.Before(pb.nextExpiry) {
		pb.nextExpiry = t
	}
}

// reportReason is how a replace report is named in the quarantine and
// events: its reason, else the ProxyBan.
func reportReason(b *crawlv1.ProxyBan) string {
	why := "ProxyBan " + b.Name
	if b.Spec.Domain != "" {
		why += " (" + b.Spec.Domain + ")"
	}
	if b.Spec.Reason != "" {
		why += ": " + b.Spec.Reason
	}
	return truncate(why, 256)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// ownedBy reports whether b has an owner reference to the Proxy name (with
// uid, unless uid is empty).
func ownedBy(b *crawlv1.ProxyBan, name string, uid types.UID) bool {
	for _, o := range b.OwnerReferences {
		if o.Kind == "Proxy" && o.Name == name && (uid == "" || o.UID == uid) && strings.HasPrefix(o.APIVersion, crawlv1.GroupVersion.Group+"/") {
			return true
		}
	}
	return false
}

// ownBan makes p the owner of b. A failure is logged: the report counts
// all the same, and the next reconcile tries again.
func (r *ProxyPoolReconciler) ownBan(ctx context.Context, b *crawlv1.ProxyBan, p *crawlv1.Proxy) {
	orig := b.DeepCopy()
	b.OwnerReferences = append(b.OwnerReferences, metav1.OwnerReference{
		APIVersion: crawlv1.GroupVersion.String(), Kind: "Proxy", Name: p.Name, UID: p.UID})
	if err := r.Client.Patch(ctx, b, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		logf.FromContext(ctx).V(1).Info("could not set the owner of a ban report", "proxyban", b.Name, "err", err.Error())
	}
}

func (r *ProxyPoolReconciler) deleteBan(ctx context.Context, b *crawlv1.ProxyBan) {
	if err := r.Client.Delete(ctx, b, client.Preconditions{UID: &b.UID}); client.IgnoreNotFound(err) != nil {
		logf.FromContext(ctx).V(1).Info("could not delete a ban report that is done", "proxyban", b.Name, "err", err.Error())
	}
}

// applyBans marks the replicas reports ask to replace and those whose
// egress is quarantined, and gives the planner the replacements started.
func (pb *poolBans) applyBans(state *poolfleet.State, mem *poolMemory) {
	for i := range state.Replicas {
		rep := &state.Replicas[i]
		_, asked := pb.replace[rep.Name]
		rep.Marked = rep.Marked || asked
		rep.Quarantined = pb.quarantined[rep.Name]
	}
	for name, t := range mem.bans.records {
		state.BanRecords = append(state.BanRecords, poolfleet.BanRecord{Replica: name, Time: t})
	}
}

// startBanReplacements records the replacements the plan starts and
// quarantines the egress address of each reported replica (a measured or
// assigned one only: an unknown egress could be anything). A replica
// replaced because its address is quarantined adds nothing. A static
// address's IPAM claim is held from the replica's deletion until the
// entry goes (proxypool_held_claims.go).
func (r *ProxyPoolReconciler) startBanReplacements(pool *crawlv1.ProxyPool, mem *poolMemory, pb *poolBans, plan poolfleet.Plan,
	byName map[string]*crawlv1.Proxy, now time.Time) {
	bm := mem.bans
	quarantine := quarantineFor(pool)
	for _, name := range plan.BanAccepted {
		bm.records[name] = now
		reason, reported := pb.replace[name]
		p := byName[name]
		if !reported || p == nil {
			continue
		}
		addr := measuredEgress(p)
		if addr == "" {
			continue
		}
		q := crawlv1.QuarantinedAddress{Address: addr, Replica: name, Reason: reason, ExpiresAt: metav1.NewTime(now.Add(quarantine))}
		if old, ok := bm.quarantine[q.Address]; !ok || q.ExpiresAt.After(old.ExpiresAt.Time) {
			bm.quarantine[q.Address] = q
		}
		r.Recorder.Eventf(pool, "Normal", "EgressQuarantined", "egress address %s of %s quarantined until %s: %s",
			q.Address, name, q.ExpiresAt.UTC().Format(time.RFC3339), reason)
	}
	r.event(pool, "BanReplacing", "reported banned or leaving from a quarantined address: unpublished, being replaced", plan.BanAccepted)
	bm.bound()
}

// DefaultQuarantine is spec.egress.quarantine's default.
const DefaultQuarantine = 24 * time.Hour

func quarantineFor(pool *crawlv1.ProxyPool) time.Duration {
	if q := pool.Spec.Egress.Quarantine; q != nil && q.Duration > 0 {
		return q.Duration
	}
	return DefaultQuarantine
}

// setBanStatus writes status.banReplacements, status.quarantine and the
// BanReplacementPaused condition, with a Warning event when replacement
// pauses.
func (r *ProxyPoolReconciler) setBanStatus(pool *crawlv1.ProxyPool, mem *poolMemory, s poolfleet.Summary) {
	bm := mem.bans
	pool.Status.BanReplacements = nil
	for name, t := range bm.records {
		pool.Status.BanReplacements = append(pool.Status.BanReplacements, crawlv1.ProxyPoolBanReplacement{Replica: name, Time: metav1.NewTime(t)})
	}
	slices.SortFunc(pool.Status.BanReplacements, func(a, b crawlv1.ProxyPoolBanReplacement) int {
		if c := a.Time.Compare(b.Time.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Replica, b.Replica)
	})
	pool.Status.Quarantine = nil
	for _, q := range bm.quarantine {
		pool.Status.Quarantine = append(pool.Status.Quarantine, q)
	}
	slices.SortFunc(pool.Status.Quarantine, func(a, b crawlv1.QuarantinedAddress) int { return strings.Compare(a.Address, b.Address) })

	budget := fmt.Sprintf("%d ban replacements in the last hour, at most %d; %d under way", s.BanRecent, s.BanMaxPerHour, s.BanReplacing)
	if s.BanWaiting == 0 {
		setPoolCondition(pool, crawlv1.PoolBanReplacementPausedCondition, false, crawlv1.PoolBansWithinBudgetReason, budget)
		return
	}
	reason, why := "", ""
	switch s.BanPaused {
	case poolfleet.BanPausedTooMany:
		reason, why = crawlv1.PoolTooManyBannedReason,
			fmt.Sprintf("more than maxBanned (%d) replicas reported at once: the cause is likely the crawler or the site", s.BanMaxReported)
	case poolfleet.BanPausedPoolPause:
		reason, why = crawlv1.PoolPausedReason, "the pool is paused"
	default:
		reason, why = crawlv1.PoolBanBudgetExhaustedReason, "the hourly budget is spent"
		if !s.BanBudgetFreeAt.IsZero() {
			why += " until " + s.BanBudgetFreeAt.UTC().Format(time.RFC3339)
		}
	}
	msg := fmt.Sprintf("%d replicas reported banned or quarantined wait: %s (%s): %s", s.BanWaiting, why, budget,
		strings.Join(shortList(s.BanWaitingReplicas), ", "))
	if !conditions.IsTrue(pool, crawlv1.PoolBanReplacementPausedCondition) {
		r.Recorder.Event(pool, "Warning", reason, msg)
	}
	setPoolCondition(pool, crawlv1.PoolBanReplacementPausedCondition, true, reason, msg)
}

// banMemory is pool's ban memory, with what its status holds laid over it
// (a restarted manager starts from the status).
func (m *poolMemory) banMemory(pool *crawlv1.ProxyPool) *banMemory {
	if m.bans == nil {
		m.bans = &banMemory{records: map[string]time.Time{}, quarantine: map[string]crawlv1.QuarantinedAddress{}, warned: map[types.UID]bool{}}
	}
	for _, b := range pool.Status.BanReplacements {
		if _, ok := m.bans.records[b.Replica]; !ok {
			// Whole seconds in the status: count up to a second longer.
			m.bans.records[b.Replica] = b.Time.Add(time.Second - time.Nanosecond)
		}
	}
	for _, q := range pool.Status.Quarantine {
		if old, ok := m.bans.quarantine[q.Address]; !ok || q.ExpiresAt.After(old.ExpiresAt.Time) {
			m.bans.quarantine[q.Address] = q
		}
	}
	return m.bans
}

// prune drops the quarantine entries that expired and the records that
// neither count against the hourly budget nor name a replica still there.
func (bm *banMemory) prune(replicas map[string]*crawlv1.Proxy, now time.Time) {
	for a, q := range bm.quarantine {
		if !now.Before(q.ExpiresAt.Time) {
			// A claim held for it is released after (releaseHeldClaims).
			delete(bm.quarantine, a)
		}
	}
	for name, t := range bm.records {
		if now.Sub(t) >= poolfleet.BanWindow && replicas[name] == nil {
			delete(bm.records, name)
		}
	}
}

// bound keeps the quarantine within the status' limit, dropping the
// entries that end soonest, and the records, dropping the oldest.
func (bm *banMemory) bound() {
	if n := len(bm.quarantine) - maxQuarantine; n > 0 {
		qs := make([]crawlv1.QuarantinedAddress, 0, len(bm.quarantine))
		for _, q := range bm.quarantine {
			qs = append(qs, q)
		}
		slices.SortFunc(qs, func(a, b crawlv1.QuarantinedAddress) int {
			if c := a.ExpiresAt.Compare(b.ExpiresAt.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Address, b.Address)
		})
		for _, q := range qs[:n] {
			delete(bm.quarantine, q.Address)
		}
	}
	if n := len(bm.records) - maxBanRecords; n > 0 {
		type rec struct {
			name string
			t    time.Time
		}
		rs := make([]rec, 0, len(bm.records))
		for name, t := range bm.records {
			rs = append(rs, rec{name, t})
		}
		slices.SortFunc(rs, func(a, b rec) int { return a.t.Compare(b.t) })
		for _, r := range rs[:n] {
			delete(bm.records, r.name)
		}
	}
}

// fingerprint changes whenever the published domain bans do.
func (bm *banMemory) fingerprint() uint64 {
	if bm == nil {
		return 0
	}
	h := fnv.New64a()
	names := make([]string, 0, len(bm.domains))
	for n := range bm.domains {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(h, "%s\x00", n)
		for _, d := range bm.domains[n] {
			fmt.Fprintf(h, "%s\x00%s\x01", d.Domain, d.ExpiresAt)
		}
	}
	return h.Sum64()
}

// bannedDomains is what the Publisher lists as replica's bannedDomains: the
// domain bans the pool's last reconcile read (the publish happens within
// it).
func (r *ProxyPoolReconciler) bannedDomains(pool *crawlv1.ProxyPool, replica string) []BannedDomain {
	r.memMu.Lock()
	m := r.pools[client.ObjectKeyFromObject(pool)]
	r.memMu.Unlock()
	if m == nil || m.uid != pool.UID || m.bans == nil {
		return nil
	}
	return m.bans.domains[replica]
}

// nextBanLook brings res forward to when a domain ban or a quarantine ends.
func (pb *poolBans) nextBanLook(res ctrl.Result, now time.Time) ctrl.Result {
	if pb == nil || pb.nextExpiry.IsZero() {
		return res
	}
	return requeueSooner(res, max(pb.nextExpiry.Sub(now), time.Millisecond))
}
