package controllers

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	poolfleet "crawl.example.com/proxy-operator/pkg/fleet"
	"crawl.example.com/proxy-operator/pkg/placement"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// ProxyPoolReconciler keeps a ProxyPool's replicas (Proxies it owns) at
// spec.replicas and of its template, rotates and heals them within one
// disruption budget, and publishes the Ready ones. The decisions are
// fleet.Decide's; this carries them out and remembers, per pool, what it
// wrote that the informer cache may not show yet.
type ProxyPoolReconciler struct {
	Client   client.Client
	Scheme   *runtime.Scheme
	Recorder record.EventRecorder
	// Publisher writes the pool's published objects.
	Publisher *Publisher
	Clock     clock.PassiveClock
	// Rand names replicas and orders a Random scale-down; guarded by randMu.
	Rand *rand.Rand
	// OnPublished, if set, sees each successful Publish (tests, metrics).
	OnPublished func(pool types.NamespacedName, replicas []crawlv1.Proxy)
	// Traffic is the replicas' traffic as the Proxy controller reads it
	// (status.traffic); nil: none is reported.
	Traffic *Traffic
	// PlacementRetry is how soon a create refused by placement is tried
	// again; placement may free without any event the pool watches.
	PlacementRetry time.Duration
	// RepublishInterval: an unchanged list is published again this often,
	// so published objects changed by hand come back.
	RepublishInterval time.Duration
	// APIReader reads the user's credential Secrets by name; nil: the
	// Publisher's reader (the manager's API reader).
	APIReader client.Reader
	// CredentialsCheckInterval: how often the Secret a template's
	// auth.secretRef names is read for a change; 0: a minute.
	CredentialsCheckInterval time.Duration
	// Plugins are the providers' plug-ins (Plugins): where a provider's
	// replicas are placed.
	Plugins plugin.List
	// HostCheckInterval is the KVMHosts' default check interval: placement
	// waits about that long for a running replica to show in its host's
	// capacity figures.
	HostCheckInterval time.Duration
	// IPAM: the cluster serves IPAddressClaims (ServesIPAM); the pool holds
	// the claims of quarantined static addresses.
	IPAM bool

	// place is placeReplica; unit tests refuse placements through it.
	place func(ctx context.Context, pool *crawlv1.ProxyPool, replicas []crawlv1.Proxy, replica *crawlv1.Proxy, reads *placementReads) (*PlacementBlocked, error)

	randMu sync.Mutex
	memMu  sync.Mutex
	pools  map[types.NamespacedName]*poolMemory
}

// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools/finalizers,verbs=update
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;patch;delete

// PoolOwnerIndex indexes Proxies by the name of the ProxyPool that
// controls them.
const PoolOwnerIndex = "crawl.example.com/pool-owner"

// IndexPoolOwner registers PoolOwnerIndex.
func IndexPoolOwner(ctx context.Context, mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(ctx, &crawlv1.Proxy{}, PoolOwnerIndex, poolOwnerOf)
}

func poolOwnerOf(o client.Object) []string {
	if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "ProxyPool" && strings.HasPrefix(ref.APIVersion, crawlv1.GroupVersion.Group+"/") {
		return []string{ref.Name}
	}
	return nil
}

// SetupWithManager registers the controller.
func (r *ProxyPoolReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if err := r.complete(); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&crawlv1.ProxyPool{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{},
			predicate.AnnotationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		// The Proxy controller ignores status-only updates of Proxies;
		// the pool needs those that change what it decides or publishes.
		Owns(&crawlv1.Proxy{}, builder.WithPredicates(replicaChanged)).
		// Ban reports name their pool (proxypool_bans.go).
		Watches(&crawlv1.ProxyBan{}, handler.EnqueueRequestsFromMapFunc(banPool)).
		WithOptions(opts).
		Named("proxypool")
	if r.Traffic != nil {
		// Woken when the replicas' traffic moves materially.
		b = b.WatchesRawSource(source.Channel(r.Traffic.events, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}

func (r *ProxyPoolReconciler) complete() error {
	if err := requireDeps("ProxyPoolReconciler", map[string]bool{
		"Client": r.Client != nil, "Scheme": r.Scheme != nil, "Recorder": r.Recorder != nil, "Publisher": r.Publisher != nil,
		"Plugins": r.Plugins != nil,
	}); err != nil {
		return err
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Rand == nil {
		r.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if r.PlacementRetry == 0 {
		r.PlacementRetry = 15 * time.Second
	}
	if r.RepublishInterval == 0 {
		r.RepublishInterval = 5 * time.Minute
	}
	if r.CredentialsCheckInterval == 0 {
		r.CredentialsCheckInterval = defaultCredentialsCheckInterval
	}
	if r.APIReader == nil {
		r.APIReader = r.Publisher.reader()
	}
	if r.place == nil {
		r.place = r.placeReplica
	}
	if r.Publisher.BannedDomains == nil {
		r.Publisher.BannedDomains = r.bannedDomains
	}
	r.memMu.Lock()
	r.pools = map[types.NamespacedName]*poolMemory{}
	r.memMu.Unlock()
	return nil
}

// replicaChanged lets through the replica changes a pool acts on: creation,
// deletion, spec, labels, annotations (drain, rotation, delete-proxy), the
// start of deletion, Ready and its transition time, and what is published
// (address, endpoint, host, egress address, credentials). A probe's
// timestamp alone is not a change: with a thousand replicas that would be a
// pool reconcile every few milliseconds.
var replicaChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*crawlv1.Proxy)
		n, ok2 := e.ObjectNew.(*crawlv1.Proxy)
		if !ok1 || !ok2 {
			return true
		}
		if o.Generation != n.Generation || !o.DeletionTimestamp.Equal(n.DeletionTimestamp) ||
			!mapsEqual(o.Labels, n.Labels) || !mapsEqual(o.Annotations, n.Annotations) ||
			publishedFields(o) != publishedFields(n) {
			return true
		}
		oc, nc := conditions.Get(o, crawlv1.ReadyCondition), conditions.Get(n, crawlv1.ReadyCondition)
		if (oc == nil) != (nc == nil) {
			return true
		}
		return oc != nil && (oc.Status != nc.Status || !oc.LastTransitionTime.Equal(&nc.LastTransitionTime))
	},
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// publishedFields are the fields of a replica its published entry is made
// of.
func publishedFields(p *crawlv1.Proxy) string {
	cred := ""
	if p.Status.CredentialsSecretRef != nil {
		cred = p.Status.CredentialsSecretRef.Name
	}
	return strings.Join([]string{p.Status.Address, p.Status.Endpoint, p.Status.Host, p.Status.EgressAddress, string(p.Status.EgressSource), cred,
		strconv.Itoa(int(p.Spec.Port))}, "\x00")
}

func (r *ProxyPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	// "proxypool", not "pool": that key is a libvirt storage pool.
	log := logf.FromContext(ctx).WithValues("proxypool", req.NamespacedName)
	ctx = logf.IntoContext(ctx, log)

	pool := &crawlv1.ProxyPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pool.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(pool, crawlv1.ProxyPoolFinalizer) {
		// Persisted before anything is published or created, then go on.
		orig := pool.DeepCopy()
		controllerutil.AddFinalizer(pool, crawlv1.ProxyPoolFinalizer)
		if err := r.Client.Patch(ctx, pool, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, err
		}
	}
	patcher := newObjectPatcher(r.Client, pool)
	defer func() {
		pool.Status.ObservedGeneration = pool.Generation
		// Also writes a released finalizer.
		patcher.finish(ctx, pool, &res, &reterr)
	}()
	if !pool.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, pool)
	}
	return r.reconcileNormal(ctx, pool)
}

// reconcileDelete takes the pool down in the order a crawler needs: the
// published list goes first (no crawler picks a proxy that is about to
// go), then every replica is deleted (each Proxy's own finalizer removes
// its instance), and the pool is released once none is left. Owner
// references would let the garbage collector do the last two, but not in
// this order, and not at all where no collector runs.
//
// Deleted with propagationPolicy Orphan (kubectl delete --cascade=orphan),
// the pool leaves its replicas and published objects as they are, as the
// garbage collector does (it holds the pool with the orphan finalizer
// while it removes their owner references); only the claims it holds for
// quarantined addresses are released, as they would otherwise leak.
func (r *ProxyPoolReconciler) reconcileDelete(ctx context.Context, pool *crawlv1.ProxyPool) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(pool, crawlv1.ProxyPoolFinalizer) {
		r.forget(client.ObjectKeyFromObject(pool))
		return ctrl.Result{}, nil
	}
	if controllerutil.ContainsFinalizer(pool, metav1.FinalizerOrphanDependents) {
		logf.FromContext(ctx).Info("deleted with its dependents orphaned: replicas and published objects are left as they are")
		r.Recorder.Event(pool, "Normal", "Orphaned", "deleted with propagation policy Orphan: its replicas and published objects stay")
		// Except the claims it holds for quarantined addresses: orphaned,
		// nothing would ever release them.
		if err := r.releaseHeldClaims(ctx, r.APIReader, pool, nil); err != nil {
			return ctrl.Result{}, err
		}
		r.forget(client.ObjectKeyFromObject(pool))
		controllerutil.RemoveFinalizer(pool, crawlv1.ProxyPoolFinalizer)
		return ctrl.Result{}, nil
	}
	if err := r.Publisher.Unpublish(ctx, pool); err != nil {
		return ctrl.Result{}, fmt.Errorf("unpublish: %w", err)
	}
	list := &crawlv1.ProxyList{}
	if err := r.Client.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingFields{PoolOwnerIndex: pool.Name}); err != nil {
		return ctrl.Result{}, err
	}
	left := 0
	var deleted []string
	for i := range list.Items {
		p := &list.Items[i]
		if !metav1.IsControlledBy(p, pool) {
			continue
		}
		left++
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		if err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID}); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("delete replica %s: %w", p.Name, err)
		}
		deleted = append(deleted, p.Name)
	}
	r.event(pool, "Deleted", "deleted", deleted)
	if left > 0 {
		conditions.Set(pool, metav1.Condition{Type: crawlv1.PoolAvailableCondition, Status: metav1.ConditionFalse,
			Reason: crawlv1.PoolDeletingReason, Message: fmt.Sprintf("deleting: %d replicas left", left)})
		// Replica deletions are watched; the poll is a safety net.
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	}
	// Its replicas gone, so are the claims it held for them and their
	// credential copies (without waiting for a garbage collector). Read
	// live: the last replica's deletion has just handed its claim over.
	if err := r.releaseHeldClaims(ctx, r.APIReader, pool, nil); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.pruneRevisions(ctx, pool, nil); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(client.ObjectKeyFromObject(pool))
	controllerutil.RemoveFinalizer(pool, crawlv1.ProxyPoolFinalizer)
	return ctrl.Result{}, nil
}

func (r *ProxyPoolReconciler) reconcileNormal(ctx context.Context, pool *crawlv1.ProxyPool) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	now := r.Clock.Now()
	policy, ok := poolPolicy(pool)
	if !ok {
		return ctrl.Result{}, nil
	}
	mem := r.memory(pool)
	defer func() { pool.Status.RecentCreates = mem.recentCreatesStatus(now) }()

	// Observe: the replicas, the zones they ran out of, the credentials
	// they should carry.
	replicas, err := r.replicas(ctx, pool, mem, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	mem.observeZones(replicas, now)
	creds, err := r.credentialsRevision(ctx, pool, mem, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	bans, err := r.readBans(ctx, pool, mem, policy, replicas, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	// A failed release is retried with the controller's backoff, after
	// the plan was carried out.
	releaseErr := r.releaseHeldClaims(ctx, r.Client, pool, mem.bans.quarantine)
	templateHash := poolfleet.TemplateHash(&pool.Spec.Template)
	hash := replicaHash(templateHash, creds)
	state, byName := r.fleetState(ctx, pool, mem, replicas, hash, policy.StartupTimeout, now)
	policy.MaxCreating = r.poolCreateLimit(pool, policy, replicas)
	shared := r.sharingEgress(pool, replicas)
	for i := range state.Replicas {
		state.Replicas[i].EgressShared = shared[state.Replicas[i].Name]
	}
	bans.applyBans(&state, mem)

	// Plan.
	plan := poolfleet.Decide(policy, state)
	r.startBanReplacements(pool, mem, bans, plan, byName, now)
	r.setBanStatus(pool, mem, plan.Status)
	r.setStatus(pool, policy, plan, byName, now)
	r.setCredentialsStatus(pool, replicas, templateHash, hash, plan.Status)
	log.V(1).Info("plan", "replicas", len(replicas), "publish", len(plan.Publish), "drain", plan.Drain, "delete", plan.Delete,
		"rotate", plan.Rotate, "create", len(plan.Create), "available", plan.Status.Available, "next", plan.Next)

	// Publish first: a replica is out of the crawlers' list before its
	// drain time starts. Whatever became of the publish, the rest of the
	// plan goes on: only a replica a published object may still name
	// waits (its drain for a list without it, its deletion for the drain).
	pub := r.publish(ctx, pool, mem, replicasNamed(byName, plan.Publish), now)

	// Drain, delete, rotate.
	held, errs := r.drainAndDelete(ctx, pool, mem, policy, plan, replicas, byName, hash, now)
	r.setPublished(pool, pub, held)
	errs = append(errs, r.rotate(ctx, pool, mem, byName, plan.Rotate, now)...)
	if len(errs) > 0 {
		// Creates wait: a replacement counted on a drain or rotation
		// that was not written would exceed the budget.
		return ctrl.Result{}, errors.Join(errs...)
	}

	// Create.
	res := ctrl.Result{}
	if plan.Status.Want == 0 || conditions.Get(pool, crawlv1.PoolPlacementBlockedCondition) == nil {
		conditions.Set(pool, metav1.Condition{Type: crawlv1.PoolPlacementBlockedCondition, Status: metav1.ConditionFalse,
			Reason: crawlv1.PoolPlacedReason, Message: "no replica waits for placement"})
	}
	made, blocked, err := r.create(ctx, pool, mem, replicas, replicaKind{hash: hash, credentials: creds}, plan.Create, now)
	if err != nil {
		return ctrl.Result{}, err
	} else if blocked {
		res.RequeueAfter = r.PlacementRetry
	}
	// After placement: a Required pool's condition says when no host can
	// give a new address.
	r.setEgressDistinct(ctx, pool, replicas)

	// Housekeeping: unused credential copies, when to look again.
	if keep := revisionsInUse(pool, append(slices.Clone(replicas), made...), creds); keep != nil {
		if err := r.pruneRevisions(ctx, pool, keep); err != nil {
			// Unused copies only: the next pass tries again.
			log.Info("could not delete unused credentials revisions", "err", err.Error())
		}
	}
	res = bans.nextBanLook(r.nextLook(pool, res, plan, pub, now), now)
	// A failed write is retried with the controller's backoff, after the
	// rest of the plan was carried out.
	return res, errors.Join(pub.failed(), releaseErr)
}

// poolPolicy is the policy of pool's spec, and the selector in its status;
// a spec the controller cannot act on is recorded instead (not ok).
func poolPolicy(pool *crawlv1.ProxyPool) (poolfleet.Policy, bool) {
	sel, err := metav1.LabelSelectorAsSelector(&pool.Spec.Selector)
	if err != nil {
		invalidSpec(pool, fmt.Errorf("spec.selector: %w", err))
		return poolfleet.Policy{}, false
	}
	pool.Status.Selector = sel.String()
	policy, err := poolfleet.PolicyFor(&pool.Spec)
	if err != nil {
		invalidSpec(pool, err)
		return poolfleet.Policy{}, false
	}
	return policy, true
}

// drainAndDelete carries out the plan's drains and deletions. A drained
// replica never published, or unpublished a drain time ago, is deleted
// right away: crawlers cannot be using it. It returns the replicas held
// because a published object may still list them, and the errors.
func (r *ProxyPoolReconciler) drainAndDelete(ctx context.Context, pool *crawlv1.ProxyPool, mem *poolMemory, policy poolfleet.Policy,
	plan poolfleet.Plan, replicas []crawlv1.Proxy, byName map[string]*crawlv1.Proxy, hash string, now time.Time) (held []string, errs []error) {
	drainedLongEnough := func(since time.Time, never bool) bool { return never || !now.Before(since.Add(policy.Drain)) }
	var deletes, drained []string
	for _, n := range plan.Drain {
		p := byName[n]
		listed, since, never := mem.exposure(p)
		switch {
		case listed:
			held = append(held, n)
		case drainedLongEnough(since, never):
			// Never published, or unpublished a drain time ago: crawlers
			// cannot be using it, nothing to wait for.
			deletes = append(deletes, n)
		default:
			// Its drain time runs from when it left the lists.
			if err := r.annotate(ctx, mem, p, crawlv1.DrainingAnnotation, poolfleet.FormatTime(since)); err != nil {
				errs = append(errs, err)
				continue
			}
			drained = append(drained, n)
		}
	}
	r.event(pool, "Draining", "unpublished, deleted after the drain time", drained)
	deletes = append(deletes, plan.Delete...)
	for i := range replicas {
		p := &replicas[i]
		rep := replicaFrom(p, hash)
		if rep.DrainingSince.IsZero() || !rep.DeletingSince.IsZero() || slices.Contains(plan.Delete, p.Name) {
			continue
		}
		// Draining, but unpublished for long enough already (or never
		// published): the drain is over.
		if listed, since, never := mem.exposure(p); !listed && drainedLongEnough(since, never) {
			deletes = append(deletes, p.Name)
		}
	}
	var deleted []string
	for _, n := range deletes {
		p := byName[n]
		if listed, _, _ := mem.exposure(p); listed {
			held = append(held, n)
			continue
		}
		if poolfleet.FailedToStart(policy, now, replicaFrom(p, hash)) {
			mem.rememberLineage(replicas, p)
		}
		if err := r.holdClaims(ctx, pool, mem.bans.quarantine, p); err != nil {
			errs = append(errs, err) // not deleted: it would release the address
			continue
		}
		if err := r.delete(ctx, mem, p); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, n)
	}
	r.event(pool, "Deleted", "deleted", deleted)
	return held, errs
}

// rotate marks the replicas the plan replaces for age.
func (r *ProxyPoolReconciler) rotate(ctx context.Context, pool *crawlv1.ProxyPool, mem *poolMemory, byName map[string]*crawlv1.Proxy, names []string, now time.Time) []error {
	var errs []error
	for _, n := range names {
		if err := r.annotate(ctx, mem, byName[n], crawlv1.RotationAnnotation, poolfleet.FormatTime(now)); err != nil {
			errs = append(errs, err)
			continue
		}
		mem.lastRotation = now
	}
	r.event(pool, "Rotating", "reached its maximum age; replacing", names)
	return errs
}

// nextLook brings res forward to the next thing the pool waits for: the
// plan's next step, a publish to retry, the user's credential Secret
// (polled, not watched).
func (r *ProxyPoolReconciler) nextLook(pool *crawlv1.ProxyPool, res ctrl.Result, plan poolfleet.Plan, pub publishOutcome, now time.Time) ctrl.Result {
	if !plan.Next.IsZero() {
		res = requeueSooner(res, max(plan.Next.Sub(now), time.Millisecond))
	}
	if retry := pub.retryAfter(); retry > 0 {
		res = requeueSooner(res, retry)
	}
	if userCredentialsSecret(pool) != "" {
		res = requeueSooner(res, r.CredentialsCheckInterval)
	}
	return res
}

// fleetState is what Decide sees of the pool: its replicas (also returned
// by name), when it last rotated one, its recent creates and lineages.
func (r *ProxyPoolReconciler) fleetState(ctx context.Context, pool *crawlv1.ProxyPool, mem *poolMemory, replicas []crawlv1.Proxy, hash string,
	startupTimeout time.Duration, now time.Time) (poolfleet.State, map[string]*crawlv1.Proxy) {
	byName := make(map[string]*crawlv1.Proxy, len(replicas))
	state := poolfleet.State{Now: now, PlacementBlocked: conditions.IsTrue(pool, crawlv1.PoolPlacementBlockedCondition)}
	if rot := pool.Status.Rotation; rot != nil && rot.LastTime != nil {
		// Stored in whole seconds: the start was up to a second later, and
		// minInterval must not come short.
		state.LastRotation = rot.LastTime.Add(time.Second - time.Nanosecond)
	}
	if mem.lastRotation.After(state.LastRotation) {
		state.LastRotation = mem.lastRotation
	}
	for i := range replicas {
		p := &replicas[i]
		byName[p.Name] = p
		rep := replicaFrom(p, hash)
		rep.Creating = creating(p, startupTimeout, now)
		if !rep.DeletingSince.IsZero() && !rep.DeletionStuck {
			rep.DeletionStuck = r.hostUnreachable(ctx, p)
		}
		state.Replicas = append(state.Replicas, rep)
		// The annotation outlives a lost status write.
		if rep.RotatingSince.After(state.LastRotation) {
			state.LastRotation = rep.RotatingSince
		}
	}
	state.RecentCreates, state.Lineages = mem.recentCreates(replicas, now), mem.lineages
	r.randMu.Lock()
	state.Rand = rand.New(rand.NewPCG(r.Rand.Uint64(), r.Rand.Uint64()))
	r.randMu.Unlock()
	return state, byName
}

func replicasNamed(byName map[string]*crawlv1.Proxy, names []string) []crawlv1.Proxy {
	out := make([]crawlv1.Proxy, 0, len(names))
	for _, n := range names {
		out = append(out, *byName[n])
	}
	return out
}

// leftOutRetry: how soon a list that left replicas out is written again.
const leftOutRetry = 2 * time.Second

// blockedRetry: how soon a pool whose published name is taken looks
// again; the pool does not watch the object in the way.
const blockedRetry = 30 * time.Second

// publishOutcome is what became of one pass's publish.
type publishOutcome struct {
	// skipped: nothing changed since the last complete write.
	skipped bool
	listed  int
	err     error
}

func (o publishOutcome) asPublishError() (*PublishError, bool) {
	var pe *PublishError
	return pe, errors.As(o.err, &pe)
}

// failed is the error to retry with backoff: a write that did not go
// through, or a publish that could not even read what to publish.
func (o publishOutcome) failed() error {
	if o.err == nil {
		return nil
	}
	if pe, ok := o.asPublishError(); ok {
		if pe.Written() {
			return nil
		}
		return fmt.Errorf("publish: %w", errors.Join(pe.Failed...))
	}
	return fmt.Errorf("publish: %w", o.err)
}

func (o publishOutcome) retryAfter() time.Duration {
	pe, ok := o.asPublishError()
	switch {
	case !ok:
		return 0
	case len(pe.LeftOut) > 0:
		return leftOutRetry
	case len(pe.Blocked) > 0:
		return blockedRetry
	}
	return 0
}

// setPublished sets the Published condition from this pass's publish, and
// says which drains and deletions wait for a list without their replica.
func (r *ProxyPoolReconciler) setPublished(pool *crawlv1.ProxyPool, o publishOutcome, held []string) {
	waiting := ""
	if len(held) > 0 {
		slices.Sort(held)
		waiting = fmt.Sprintf("; %d replicas wait to be removed until a list without them is written: %s", len(held), strings.Join(shortList(held), ", "))
	}
	if o.skipped && len(held) == 0 && conditions.Get(pool, crawlv1.PoolPublishedCondition) != nil {
		return
	}
	ok, reason := true, crawlv1.PoolPublishedReason
	msg := fmt.Sprintf("%d replicas listed in Secret and Service %s", o.listed, crawlv1.PublishedName(pool.Name))
	pe, isPublishError := o.asPublishError()
	switch {
	case o.err == nil:
	case !isPublishError:
		ok, reason, msg = false, crawlv1.PoolPublishFailedReason, o.err.Error()
	case len(pe.Failed) > 0:
		ok, reason, msg = false, crawlv1.PoolPublishFailedReason, errors.Join(pe.Failed...).Error()
	case len(pe.Blocked) > 0:
		var msgs []string
		for _, b := range pe.Blocked {
			msgs = append(msgs, b.Message)
		}
		ok, reason, msg = false, pe.Blocked[0].Reason, strings.Join(msgs, "; ")
	case len(pe.LeftOut) > 0:
		reason, msg = crawlv1.PoolReplicasLeftOutReason, leftOutError(pool.Namespace+"/"+pool.Name, pe.LeftOut).Error()
	}
	setPoolCondition(pool, crawlv1.PoolPublishedCondition, ok, reason, msg+waiting)
}

// shortList is names, the first five and a count of the rest.
func shortList(names []string) []string {
	if len(names) <= 5 {
		return names
	}
	return append(slices.Clone(names[:5]), fmt.Sprintf("and %d more", len(names)-5))
}

// invalidSpec records a spec the controller cannot act on (stored without
// the webhook); a change of the spec triggers the next reconcile.
func invalidSpec(pool *crawlv1.ProxyPool, err error) {
	conditions.Set(pool, metav1.Condition{Type: crawlv1.PoolAvailableCondition, Status: metav1.ConditionUnknown,
		Reason: crawlv1.PoolInvalidSpecReason, Message: err.Error()})
}

// replicas lists the pool's replicas from the cache, with what this manager
// wrote that the cache does not show yet laid over them. The cached objects
// are shared with the informer (not copied: a large pool is listed on every
// change) and must not be modified.
func (r *ProxyPoolReconciler) replicas(ctx context.Context, pool *crawlv1.ProxyPool, mem *poolMemory, now time.Time) ([]crawlv1.Proxy, error) {
	list := &crawlv1.ProxyList{}
	if err := r.Client.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingFields{PoolOwnerIndex: pool.Name},
		client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	out := list.Items[:0]
	for _, p := range list.Items {
		if metav1.IsControlledBy(&p, pool) {
			out = append(out, p)
		}
	}
	return mem.overlay(out, now), nil
}

// publish hands the published replicas to the Publisher when they, or the
// pool, changed since the last complete write, or RepublishInterval ago,
// and keeps in mem which replicas the published objects may name.
func (r *ProxyPoolReconciler) publish(ctx context.Context, pool *crawlv1.ProxyPool, mem *poolMemory, published []crawlv1.Proxy, now time.Time) publishOutcome {
	fp := publishFingerprint(pool, published, mem.bans.fingerprint())
	if fp == mem.publishedFP && now.Sub(mem.publishedAt) < r.RepublishInterval {
		return publishOutcome{skipped: true, listed: len(mem.listed)}
	}
	err := r.Publisher.Publish(ctx, pool, published)
	attempted := make(map[string]bool, len(published))
	for i := range published {
		attempted[published[i].Name] = true
	}
	written := err == nil
	var pe *PublishError
	if errors.As(err, &pe) {
		for _, l := range pe.LeftOut {
			delete(attempted, l.Name)
		}
		written = pe.Written()
		if len(pe.LeftOut) > 0 {
			logf.FromContext(ctx).V(1).Info("some replicas are not published yet", "reason", leftOutError(pool.Namespace+"/"+pool.Name, pe.LeftOut).Error())
		}
	}
	mem.wrote(attempted, written, now)
	if err != nil {
		return publishOutcome{listed: len(attempted), err: err}
	}
	mem.publishedFP, mem.publishedAt = fp, now
	if r.OnPublished != nil {
		r.OnPublished(client.ObjectKeyFromObject(pool), published)
	}
	return publishOutcome{listed: len(attempted)}
}

func publishFingerprint(pool *crawlv1.ProxyPool, published []crawlv1.Proxy, bans uint64) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00", pool.UID, pool.Generation, bans)
	for i := range published {
		p := &published[i]
		fmt.Fprintf(h, "%s\x00%s\x00%s\x01", p.Name, p.UID, publishedFields(p))
	}
	return h.Sum64()
}

// annotate sets one annotation with a merge patch, no resourceVersion
// precondition: the annotation is the decision, and a concurrent status
// write must not make it fail.
func (r *ProxyPoolReconciler) annotate(ctx context.Context, mem *poolMemory, p *crawlv1.Proxy, key, value string) error {
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, key, value))
	obj := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	if err := r.Client.Patch(ctx, obj, patch); apierrors.IsNotFound(err) {
		// Deleted by someone else meanwhile: nothing left to mark, and
		// the deletion's event brings the next reconcile.
		logf.FromContext(ctx).V(1).Info("replica gone before it was annotated", "proxy", client.ObjectKeyFromObject(p), "annotation", key)
		return nil
	} else if err != nil {
		return fmt.Errorf("annotate %s with %s: %w", p.Name, key, err)
	}
	mem.annotated(p.UID, key, value, r.Clock.Now())
	logf.FromContext(ctx).V(1).Info("annotated replica", "proxy", client.ObjectKeyFromObject(p), "annotation", key)
	return nil
}

func (r *ProxyPoolReconciler) delete(ctx context.Context, mem *poolMemory, p *crawlv1.Proxy) error {
	err := r.Client.Delete(ctx, &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}},
		client.Preconditions{UID: &p.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s: %w", p.Name, err)
	}
	mem.deleting(p.UID, r.Clock.Now())
	logf.FromContext(ctx).Info("deleted replica", "proxy", client.ObjectKeyFromObject(p))
	return nil
}

// create makes the planned replicas, each placed first. It reports whether
// placement refused one or held it for the creates in flight (the rest
// wait for the next attempt).
//
// Placement runs one replica after another (each sees those placed before
// it, reading the hosts and the Proxies on them once for all); the creates then go in batches of 1, 2, 4, ... up to maxCreateBatch
// at once, stopping at the first error, as a ReplicaSet does: a pool of a
// thousand does not wait for a thousand round trips in a row, and a
// template the API refuses costs one create, not a thousand.
func (r *ProxyPoolReconciler) create(ctx context.Context, pool *crawlv1.ProxyPool, mem *poolMemory, replicas []crawlv1.Proxy,
	kind replicaKind, creates []poolfleet.Create, now time.Time) (made []crawlv1.Proxy, blocked bool, _ error) {
	log := logf.FromContext(ctx)
	all := slices.Clone(replicas)
	var placed []*crawlv1.Proxy
	waiting := false
	reads := newPlacementReads()
	for _, c := range creates {
		p, err := r.newReplica(pool, kind, c, all)
		if err != nil {
			return nil, false, err
		}
		why, err := r.place(ctx, pool, all, p, reads)
		if err != nil {
			return nil, false, fmt.Errorf("place a replica: %w", err)
		}
		if why != nil && why.Reason == placement.CreatesInFlight {
			// Not blocked: the hosts are busy booting. A replica's Ready
			// wakes the pool; the retry covers other pools' creates.
			log.V(1).Info("creates wait for those in flight", "message", why.Message)
			waiting = true
			break
		}
		if why != nil {
			conditions.Set(pool, metav1.Condition{Type: crawlv1.PoolPlacementBlockedCondition, Status: metav1.ConditionTrue,
				Reason: why.Reason, Message: why.Message})
			log.Info("placement refused a replica", "reason", why.Reason, "message", why.Message)
			blocked = true
			break
		}
		placed = append(placed, p)
		all = append(all, *p)
	}
	if len(placed) > 0 && !blocked {
		conditions.Set(pool, metav1.Condition{Type: crawlv1.PoolPlacementBlockedCondition, Status: metav1.ConditionFalse,
			Reason: crawlv1.PoolPlacedReason, Message: "every replica asked for was placed"})
	}

	errs := make([]error, len(placed))
	done := 0
	for batch := 1; done < len(placed); batch = min(2*batch, maxCreateBatch) {
		n := min(batch, len(placed)-done)
		var wg sync.WaitGroup
		for i := done; i < done+n; i++ {
			wg.Go(func() { errs[i] = r.Client.Create(ctx, placed[i]) })
		}
		wg.Wait()
		done += n
		if slices.ContainsFunc(errs[:done], func(e error) bool { return e != nil }) {
			break
		}
	}
	var names []string
	var failed []error
	for i, p := range placed[:done] {
		if errs[i] != nil {
			failed = append(failed, fmt.Errorf("create replica %s: %w", p.Name, errs[i]))
			continue
		}
		mem.created(p, p.Annotations[crawlv1.ReplacesAnnotation], now)
		made = append(made, *p)
		names = append(names, p.Name)
		log.Info("created replica", "proxy", client.ObjectKeyFromObject(p), "templateHash", kind.hash)
	}
	r.event(pool, "Created", "created", names)
	return made, blocked || waiting, errors.Join(failed...)
}

// replicaKind is what makes a new replica of the pool now: its template
// hash and the credentials revision it refers to (nil: the template's own
// reference).
type replicaKind struct {
	hash        string
	credentials *credentialsRevision
}

// maxCreateBatch bounds the creates in flight at once.
const maxCreateBatch = 32

// nameAlphabet is the API server's generateName alphabet: no vowels (no
// words), no look-alikes.
const nameAlphabet = "bcdfghjklmnpqrstvwxz2456789"

// newReplica builds a replica of the template: the template's labels and
// annotations with the pool's name and the template hash, a controller
// reference to the pool, and a name <pool>-<5 random characters> not taken
// by another replica.
func (r *ProxyPoolReconciler) newReplica(pool *crawlv1.ProxyPool, kind replicaKind, c poolfleet.Create, taken []crawlv1.Proxy) (*crawlv1.Proxy, error) {
	tpl := &pool.Spec.Template
	p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Labels: map[string]string{}, Annotations: map[string]string{}}}
	for k, v := range tpl.Metadata.Labels {
		p.Labels[k] = v
	}
	for k, v := range tpl.Metadata.Annotations {
		p.Annotations[k] = v
	}
	p.Labels[crawlv1.PoolNameLabel] = pool.Name
	p.Labels[crawlv1.TemplateHashLabel] = kind.hash
	if c.Replaces != "" {
		p.Annotations[crawlv1.ReplacesAnnotation] = c.Replaces
		p.Annotations[crawlv1.StartupFailuresAnnotation] = strconv.Itoa(c.Failures)
	}
	if len(p.Annotations) == 0 {
		p.Annotations = nil
	}
	tpl.Spec.DeepCopyInto(&p.Spec)
	if kind.credentials != nil {
		p.Spec.Access.Auth.SecretRef = &crawlv1.LocalObjectReference{Name: kind.credentials.name}
	}
	if err := controllerutil.SetControllerReference(pool, p, r.Scheme); err != nil {
		return nil, err
	}
	r.randMu.Lock()
	defer r.randMu.Unlock()
	for {
		b := make([]byte, 5)
		for i := range b {
			b[i] = nameAlphabet[r.Rand.IntN(len(nameAlphabet))]
		}
		p.Name = pool.Name + "-" + string(b)
		if !slices.ContainsFunc(taken, func(o crawlv1.Proxy) bool { return o.Name == p.Name }) {
			return p, nil
		}
	}
}

func (r *ProxyPoolReconciler) event(pool *crawlv1.ProxyPool, reason, what string, names []string) {
	if len(names) == 0 {
		return
	}
	shown := names
	if len(shown) > 5 {
		shown = shown[:5]
	}
	more := ""
	if len(names) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(names)-len(shown))
	}
	r.Recorder.Eventf(pool, "Normal", reason, "%d replicas %s: %s%s", len(names), what, strings.Join(shown, ", "), more)
}

// setStatus writes what Decide observed, and the conditions.
func (r *ProxyPoolReconciler) setStatus(pool *crawlv1.ProxyPool, policy poolfleet.Policy, plan poolfleet.Plan, byName map[string]*crawlv1.Proxy, now time.Time) {
	setReplicaCounts(&pool.Status, policy, plan, byName)
	setAvailable(pool, policy, plan.Status)
	setRollingOut(pool, policy, plan.Status)
	setRotating(pool, policy, plan.Status, now)
	r.setRotationBehind(pool, policy, plan.Status)
	r.setRemediating(pool, policy, plan.Status)
	r.setDeletionStuck(pool, policy, plan.Status)
	r.setTraffic(pool, now)
	if policy.Paused {
		setPoolCondition(pool, crawlv1.PoolPausedCondition, true, crawlv1.PoolPausedReason, "rollout, rotation and remediation stopped; scaling and publishing go on")
	} else {
		setPoolCondition(pool, crawlv1.PoolPausedCondition, false, crawlv1.PoolNotPausedReason, "")
	}
}

// setReplicaCounts writes the replica counts, how many hosts and measured
// egress addresses the published replicas use, and the rotation times.
func setReplicaCounts(st *crawlv1.ProxyPoolStatus, policy poolfleet.Policy, plan poolfleet.Plan, byName map[string]*crawlv1.Proxy) {
	s := plan.Status
	st.Replicas, st.ReadyReplicas, st.AvailableReplicas = int32(s.Replicas), int32(s.Ready), int32(s.Available)
	st.UpToDateReplicas, st.DrainingReplicas, st.UnhealthyReplicas = int32(s.UpToDate), int32(s.Draining), int32(s.Unhealthy)
	hosts := map[string]bool{}
	published := make([]*crawlv1.Proxy, 0, len(plan.Publish))
	for _, n := range plan.Publish {
		p := byName[n]
		if p.Status.Host != "" {
			hosts[p.Status.Host] = true
		}
		published = append(published, p)
	}
	st.DistinctHosts, st.DistinctEgressAddresses = int32(len(hosts)), int32(distinctEgress(published))
	st.Rotation = nil
	if policy.MaxAge > 0 {
		st.Rotation = &crawlv1.ProxyPoolRotationStatus{LastTime: metaTime(s.LastRotation), NextTime: metaTime(s.NextRotation),
			OverdueReplicas: int32(s.RotationOverdue)}
	}
}

func setPoolCondition(pool *crawlv1.ProxyPool, t string, ok bool, reason, msg string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	conditions.Set(pool, metav1.Condition{Type: t, Status: status, Reason: reason, Message: msg})
}

func setAvailable(pool *crawlv1.ProxyPool, policy poolfleet.Policy, s poolfleet.Summary) {
	if s.Available >= s.MinAvailable {
		setPoolCondition(pool, crawlv1.PoolAvailableCondition, true, crawlv1.PoolMinimumAvailableReason,
			fmt.Sprintf("%d of %d replicas available (at least %d needed)", s.Available, policy.Replicas, s.MinAvailable))
	} else {
		setPoolCondition(pool, crawlv1.PoolAvailableCondition, false, crawlv1.PoolMinimumUnavailableReason,
			fmt.Sprintf("%d of %d replicas available, at least %d needed", s.Available, policy.Replicas, s.MinAvailable))
	}
}

func setRollingOut(pool *crawlv1.ProxyPool, policy poolfleet.Policy, s poolfleet.Summary) {
	switch {
	case s.Outdated > 0 && policy.OnDelete:
		setPoolCondition(pool, crawlv1.PoolRollingOutCondition, false, crawlv1.PoolOnDeleteReason,
			fmt.Sprintf("%d replicas outdated; each is replaced when deleted", s.Outdated))
	case s.Outdated > 0 && policy.Paused:
		setPoolCondition(pool, crawlv1.PoolRollingOutCondition, false, crawlv1.PoolPausedReason, fmt.Sprintf("%d replicas outdated; paused", s.Outdated))
	case s.Outdated > 0:
		setPoolCondition(pool, crawlv1.PoolRollingOutCondition, true, crawlv1.PoolRollingOutReason,
			fmt.Sprintf("%d replicas outdated, %d of %d up to date%s", s.Outdated, s.UpToDate, policy.Replicas, waitingForDeletions(s)))
	default:
		setPoolCondition(pool, crawlv1.PoolRollingOutCondition, false, crawlv1.PoolUpToDateReason, "every replica is of the current template")
	}
}

func setRotating(pool *crawlv1.ProxyPool, policy poolfleet.Policy, s poolfleet.Summary, now time.Time) {
	switch {
	case policy.MaxAge == 0:
		setPoolCondition(pool, crawlv1.PoolRotatingCondition, false, crawlv1.PoolRotationDisabledReason, "no rotation.maxAge")
	case s.RotationsInFlight > 0:
		setPoolCondition(pool, crawlv1.PoolRotatingCondition, true, crawlv1.PoolRotatingReason,
			fmt.Sprintf("%d replicas being replaced for age; %d more expired", s.RotationsInFlight, s.ExpiredWaiting))
	case s.ExpiredWaiting > 0:
		why := "for every replica to be available, room to surge and the create cap"
		switch {
		case policy.Paused:
			why = "while paused"
		case s.NextRotation.After(now):
			why = "until " + s.NextRotation.UTC().Format(time.RFC3339) + " (minInterval)"
		}
		setPoolCondition(pool, crawlv1.PoolRotatingCondition, false, crawlv1.PoolRotationWaitingReason,
			fmt.Sprintf("%d expired replicas wait %s", s.ExpiredWaiting, why))
	default:
		msg := "no replica expired"
		if !s.NextRotation.IsZero() {
			msg += "; next at " + s.NextRotation.UTC().Format(time.RFC3339)
		}
		setPoolCondition(pool, crawlv1.PoolRotatingCondition, false, crawlv1.PoolRotationIdleReason, msg)
	}
}

// setRotationBehind says whether rotation keeps the replicas within maxAge:
// True when one is past it by more than the grace, or when the limits
// cannot replace the pool within one maxAge (before any replica is late,
// so the user can act in time), with a Warning event when it turns True.
// It says nothing of availability: an old replica still serves.
func (r *ProxyPoolReconciler) setRotationBehind(pool *crawlv1.ProxyPool, policy poolfleet.Policy, s poolfleet.Summary) {
	if policy.MaxAge == 0 {
		setPoolCondition(pool, crawlv1.PoolRotationBehindCondition, false, crawlv1.PoolRotationDisabledReason, "no rotation.maxAge")
		return
	}
	tooSlow := ""
	if s.RotationCapacity < policy.Replicas {
		tooSlow = fmt.Sprintf("the rotation limits replace at most %d of %d replicas per maxAge %s (%s): raise them",
			s.RotationCapacity, policy.Replicas, policy.MaxAge, policy.RotationLimits())
	}
	var reason, msg string
	switch {
	case s.RotationLate > 0:
		reason = crawlv1.PoolReplicasOverdueReason
		msg = fmt.Sprintf("%d replicas older than maxAge %s by more than %s (%d past maxAge)", s.RotationLate, policy.MaxAge, policy.RotationGrace(), s.RotationOverdue)
		switch {
		case policy.Paused:
			msg += "; paused"
		case tooSlow != "":
			msg += "; " + tooSlow
		}
	case tooSlow != "":
		reason, msg = crawlv1.PoolRotationTooSlowReason, tooSlow
	default:
		setPoolCondition(pool, crawlv1.PoolRotationBehindCondition, false, crawlv1.PoolRotationCaughtUpReason,
			fmt.Sprintf("%d replicas past maxAge %s, none by more than %s", s.RotationOverdue, policy.MaxAge, policy.RotationGrace()))
		return
	}
	if !conditions.IsTrue(pool, crawlv1.PoolRotationBehindCondition) {
		r.Recorder.Event(pool, "Warning", crawlv1.PoolRotationBehindCondition, msg)
	}
	setPoolCondition(pool, crawlv1.PoolRotationBehindCondition, true, reason, msg)
}

// setRemediating writes Remediating and RemediationAllowed, with an event
// when remediation stops for too many unhealthy replicas.
func (r *ProxyPoolReconciler) setRemediating(pool *crawlv1.ProxyPool, policy poolfleet.Policy, s poolfleet.Summary) {
	switch {
	case s.Remediating > 0:
		setPoolCondition(pool, crawlv1.PoolRemediatingCondition, true, crawlv1.PoolRemediatingReason,
			fmt.Sprintf("replacing %d unhealthy replicas%s", s.Remediating, waitingForDeletions(s)))
	case s.BackingOff > 0:
		setPoolCondition(pool, crawlv1.PoolRemediatingCondition, false, crawlv1.PoolRemediationBackoffReason,
			fmt.Sprintf("%d replicas failed to start; their slots wait until %s before replacing them", s.BackingOff, s.BackoffUntil.UTC().Format(time.RFC3339)))
	case s.Unhealthy > 0 && !s.RemediationAllowed:
		setPoolCondition(pool, crawlv1.PoolRemediatingCondition, false, crawlv1.PoolTooManyUnhealthyReason, fmt.Sprintf("%d unhealthy replicas are left alone", s.Unhealthy))
	case s.Unhealthy > 0 && policy.Paused:
		setPoolCondition(pool, crawlv1.PoolRemediatingCondition, false, crawlv1.PoolPausedReason, fmt.Sprintf("%d unhealthy replicas; paused", s.Unhealthy))
	default:
		setPoolCondition(pool, crawlv1.PoolRemediatingCondition, false, crawlv1.PoolHealthyReason, "no unhealthy replica")
	}
	if !s.RemediationAllowed && !conditions.IsFalse(pool, crawlv1.PoolRemediationAllowedCondition) {
		r.Recorder.Eventf(pool, "Warning", crawlv1.PoolTooManyUnhealthyReason,
			"%d replicas unhealthy, more than maxUnhealthy (%d): replacing none", s.Unhealthy, s.MaxUnhealthy)
	}
	if s.RemediationAllowed {
		setPoolCondition(pool, crawlv1.PoolRemediationAllowedCondition, true, crawlv1.PoolRemediationAllowedReason,
			fmt.Sprintf("%d unhealthy replicas, at most %d replaced", s.Unhealthy, s.MaxUnhealthy))
	} else {
		setPoolCondition(pool, crawlv1.PoolRemediationAllowedCondition, false, crawlv1.PoolTooManyUnhealthyReason,
			fmt.Sprintf("%d replicas unhealthy, more than maxUnhealthy (%d): the cause is likely outside them, nothing is replaced", s.Unhealthy, s.MaxUnhealthy))
	}
}

// waitingForDeletions is what a condition claiming progress adds when
// replacements wait for room that deletions in progress hold: the plan
// creates nothing for them until then.
func waitingForDeletions(s poolfleet.Summary) string {
	if s.WaitingForDeletions == 0 {
		return ""
	}
	return fmt.Sprintf("; %d replacements wait for replicas being deleted to go (until %s at the latest)",
		s.WaitingForDeletions, s.DeletionsReleaseAt.UTC().Format(time.RFC3339))
}

// setDeletionStuck names the replicas whose deletion did not finish within
// deletionTimeout or cannot finish: the pool no longer counts them and has
// replaced them, though they may still hold an instance. A Warning event
// when the list changes.
func (r *ProxyPoolReconciler) setDeletionStuck(pool *crawlv1.ProxyPool, policy poolfleet.Policy, s poolfleet.Summary) {
	names := s.DeletionsReleased
	if len(names) == 0 {
		setPoolCondition(pool, crawlv1.PoolDeletionStuckCondition, false, crawlv1.PoolNoDeletionStuckReason, "no replica's deletion outlasted deletionTimeout")
		return
	}
	msg := fmt.Sprintf("%d replicas still being deleted past deletionTimeout (%s) or blocked by their provider or host: %s; "+
		"no longer counted against maxSurge, replaced, and deleted when their provider lets them go",
		len(names), policy.DeletionTimeout, strings.Join(shortList(names), ", "))
	if c := conditions.Get(pool, crawlv1.PoolDeletionStuckCondition); c == nil || c.Status != metav1.ConditionTrue || c.Message != msg {
		r.Recorder.Event(pool, "Warning", crawlv1.PoolDeletionStuckReason, msg)
	}
	setPoolCondition(pool, crawlv1.PoolDeletionStuckCondition, true, crawlv1.PoolDeletionStuckReason, msg)
}

// hostUnreachable reports whether p runs on a host (its provider is of
// the Hosts domain: a KVMHost) known not to answer: deleting p cannot
// finish until it does, so the pool need not wait out deletionTimeout for
// it. Only the host's own dial and probe failures
// count; anything else (or a host the cache cannot show) is no news.
func (r *ProxyPoolReconciler) hostUnreachable(ctx context.Context, p *crawlv1.Proxy) bool {
	if r.Plugins.DomainOf(string(p.Spec.Provider)) != plugin.Hosts || p.Status.Host == "" {
		return false
	}
	h := &crawlv1.KVMHost{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: p.Status.Host}, h); err != nil {
		return false
	}
	c := conditions.Get(h, crawlv1.ReadyCondition)
	if c == nil || c.Status != metav1.ConditionFalse {
		return false
	}
	switch c.Reason {
	case crawlv1.HostTCPUnreachableReason, crawlv1.HostSSHHandshakeFailedReason, crawlv1.HostLibvirtConnectFailedReason,
		crawlv1.HostTimeoutReason, crawlv1.HostProbeFailedReason:
		return true
	}
	return false
}

func metaTime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	mt := metav1.NewTime(t)
	return &mt
}

// poolMemory is what this manager wrote for one pool that its informer
// cache may not show yet (ReplicaSet-style expectations: without them a
// reconcile right after a create would create again), plus the per-minute
// create record, the lineages of slots whose failed replica is gone, and
// the last published list.
type poolMemory struct {
	uid types.UID
	// made: created, not yet in the cache.
	made map[string]madeReplica
	// marks: annotations written, not yet in the cache.
	marks map[types.UID]map[string]mark
	// gone: deletions issued (when), the cache not showing them yet.
	gone map[types.UID]time.Time
	// creates: when each replica was created, kept a CreateWindow; also
	// in status.recentCreates, so a restarted manager keeps the cap.
	creates  map[string]time.Time
	lineages []poolfleet.Lineage
	// lastRotation: the status keeps whole seconds only.
	lastRotation time.Time
	// credentials: the last reading of the template's credential Secret.
	credentials *credentialsCheck
	// zones: where replicas went and which zones had no room.
	zones zoneMemory
	// bans: ban replacements started, the quarantine, domain bans
	// (proxypool_bans.go).
	bans *banMemory

	publishedFP uint64
	publishedAt time.Time

	// listed: the replicas the published objects may name now: those of
	// the last write that went through, and those a failed write since
	// tried to list. Unknown (listedKnown false) until a write goes
	// through after this memory began (at a manager's start), from when
	// (trackedSince) every listing is seen here.
	listed       map[string]bool
	listedKnown  bool
	trackedSince time.Time
	// unlisted: when a replica left the lists.
	unlisted map[string]time.Time
}

type madeReplica struct {
	obj *crawlv1.Proxy
	at  time.Time
}

// mark is an annotation value written at a time.
type mark struct {
	value string
	at    time.Time
}

// expectationTimeout bounds how long a write is assumed to be on its way to
// the cache; past it, the cache is believed (someone may have undone the
// write, or it never took).
const expectationTimeout = time.Minute

func (r *ProxyPoolReconciler) memory(pool *crawlv1.ProxyPool) *poolMemory {
	key := client.ObjectKeyFromObject(pool)
	r.memMu.Lock()
	defer r.memMu.Unlock()
	m := r.pools[key]
	if m == nil || m.uid != pool.UID {
		m = &poolMemory{uid: pool.UID, made: map[string]madeReplica{}, marks: map[types.UID]map[string]mark{},
			gone: map[types.UID]time.Time{}, creates: map[string]time.Time{}}
		// The creates of the manager before this one (a restart): the
		// status keeps whole seconds, so each counts up to a second
		// longer, never shorter.
		for _, c := range pool.Status.RecentCreates {
			m.creates[c.Name] = c.Time.Add(time.Second - time.Nanosecond)
		}
		r.pools[key] = m
	}
	return m
}

func (r *ProxyPoolReconciler) forget(key types.NamespacedName) {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	delete(r.pools, key)
}

// A pool is reconciled by one worker at a time, so its memory needs no lock
// of its own.

func (m *poolMemory) created(p *crawlv1.Proxy, replaces string, now time.Time) {
	m.made[p.Name] = madeReplica{obj: p.DeepCopy(), at: now}
	m.creates[p.Name] = now
	if replaces != "" {
		m.lineages = slices.DeleteFunc(m.lineages, func(l poolfleet.Lineage) bool { return l.Replaces == replaces })
	}
}

func (m *poolMemory) annotated(uid types.UID, key, value string, now time.Time) {
	if m.marks[uid] == nil {
		m.marks[uid] = map[string]mark{}
	}
	m.marks[uid][key] = mark{value: value, at: now}
}

func (m *poolMemory) deleting(uid types.UID, now time.Time) { m.gone[uid] = now }

// recentCreatesStatus is the create record for the status: the creates
// within the window, oldest first.
func (m *poolMemory) recentCreatesStatus(now time.Time) []crawlv1.ProxyPoolCreate {
	var out []crawlv1.ProxyPoolCreate
	for name, t := range m.creates {
		if now.Sub(t) < poolfleet.CreateWindow {
			out = append(out, crawlv1.ProxyPoolCreate{Name: name, Time: metav1.NewTime(t)})
		}
	}
	slices.SortFunc(out, func(a, b crawlv1.ProxyPoolCreate) int {
		if c := a.Time.Compare(b.Time.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	// The newest maxRecentCreates: what the status may hold.
	return out[max(0, len(out)-maxRecentCreates):]
}

// maxRecentCreates is the MaxItems of status.recentCreates.
const maxRecentCreates = 1000

// wrote records a publish of attempted: written, the published objects
// list exactly those now; not written, they may also list them.
func (m *poolMemory) wrote(attempted map[string]bool, written bool, now time.Time) {
	if m.listed == nil {
		m.listed, m.unlisted = map[string]bool{}, map[string]time.Time{}
	}
	for n := range attempted {
		m.listed[n] = true
		delete(m.unlisted, n)
	}
	if !written {
		return
	}
	for n := range m.listed {
		if !attempted[n] {
			delete(m.listed, n)
			m.unlisted[n] = now
		}
	}
	if !m.listedKnown {
		m.listedKnown, m.trackedSince = true, now
	}
}

// exposure says whether a published object may name p now; if none does,
// since when (never: none ever did).
func (m *poolMemory) exposure(p *crawlv1.Proxy) (listed bool, since time.Time, never bool) {
	switch {
	case !m.listedKnown || m.listed[p.Name]:
		return true, time.Time{}, false
	case !m.unlisted[p.Name].IsZero():
		return false, m.unlisted[p.Name], false
	case p.CreationTimestamp.Time.Before(m.trackedSince.Truncate(time.Second)):
		// Made before this memory: another manager may have listed it
		// until then. (Creation times are whole seconds; a replica made
		// within the second before cannot have been Ready, let alone
		// published.)
		return false, m.trackedSince, false
	}
	return false, time.Time{}, true
}

// rememberLineage keeps the failure count of a replica that failed to start
// and is deleted before any replacement names it.
func (m *poolMemory) rememberLineage(replicas []crawlv1.Proxy, p *crawlv1.Proxy) {
	for i := range replicas {
		if replicas[i].Annotations[crawlv1.ReplacesAnnotation] == p.Name {
			return
		}
	}
	if slices.ContainsFunc(m.lineages, func(l poolfleet.Lineage) bool { return l.Replaces == p.Name }) {
		return
	}
	n, _ := strconv.Atoi(p.Annotations[crawlv1.StartupFailuresAnnotation])
	m.lineages = append(m.lineages, poolfleet.Lineage{Failures: n + 1, Replaces: p.Name})
	// Bounded: a scale-down can leave lineages no create will take.
	if len(m.lineages) > 64 {
		m.lineages = m.lineages[len(m.lineages)-64:]
	}
}

// overlay lays what this manager wrote over the cached replicas, and drops
// the expectations the cache now meets.
func (m *poolMemory) overlay(cached []crawlv1.Proxy, now time.Time) []crawlv1.Proxy {
	seen := make(map[types.UID]bool, len(cached))
	names := make(map[string]bool, len(cached))
	out := cached
	for i := range out {
		p := &out[i]
		seen[p.UID], names[p.Name] = true, true
		delete(m.made, p.Name)
		stale := false
		if at, ok := m.gone[p.UID]; ok {
			if p.DeletionTimestamp.IsZero() && now.Sub(at) <= expectationTimeout {
				stale = true
			} else {
				delete(m.gone, p.UID)
			}
		}
		for k, v := range m.marks[p.UID] {
			if p.Annotations[k] == v.value || now.Sub(v.at) > expectationTimeout {
				delete(m.marks[p.UID], k)
			} else {
				stale = true
			}
		}
		if len(m.marks[p.UID]) == 0 {
			delete(m.marks, p.UID)
		}
		if !stale {
			continue
		}
		// Copy before changing: the cached object is the informer's.
		c := p.DeepCopy()
		if _, ok := m.gone[c.UID]; ok {
			c.DeletionTimestamp = &metav1.Time{Time: now}
		}
		for k, v := range m.marks[c.UID] {
			if c.Annotations == nil {
				c.Annotations = map[string]string{}
			}
			c.Annotations[k] = v.value
		}
		out[i] = *c
	}
	maps.DeleteFunc(m.gone, func(uid types.UID, _ time.Time) bool { return !seen[uid] })
	maps.DeleteFunc(m.marks, func(uid types.UID, _ map[string]mark) bool { return !seen[uid] })
	maps.DeleteFunc(m.listed, func(n string, _ bool) bool { return !names[n] })
	maps.DeleteFunc(m.unlisted, func(n string, _ time.Time) bool { return !names[n] })
	for name, made := range m.made {
		if now.Sub(made.at) > expectationTimeout {
			delete(m.made, name)
			continue
		}
		if !names[name] {
			c := made.obj.DeepCopy()
			c.CreationTimestamp = metav1.NewTime(made.at)
			out = append(out, *c)
		}
	}
	return out
}

// recentCreates are the creation times within the create window: those this
// manager made (gone or not) and, for replicas it did not make (another
// manager before a restart), their creation timestamps.
func (m *poolMemory) recentCreates(replicas []crawlv1.Proxy, now time.Time) []time.Time {
	var out []time.Time
	for name, t := range m.creates {
		if now.Sub(t) >= poolfleet.CreateWindow {
			delete(m.creates, name)
			continue
		}
		out = append(out, t)
	}
	for i := range replicas {
		p := &replicas[i]
		if _, ours := m.creates[p.Name]; !ours && now.Sub(p.CreationTimestamp.Time) < poolfleet.CreateWindow {
			out = append(out, p.CreationTimestamp.Time)
		}
	}
	return out
}
