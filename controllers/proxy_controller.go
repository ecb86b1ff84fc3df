// Package controllers holds the reconcilers: Proxy (provider-agnostic),
// KVMHost (fleet health), KVMImage (image cache) and the orphan sweep.
package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
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
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/portwatch"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

// ProxyReconciler turns Proxies into provider instances, whatever the
// provider.
type ProxyReconciler struct {
	Client client.Client
	// APIReader reads what the cache does not hold: the user's credential
	// Secrets (the cache keeps only the operator's own).
	APIReader client.Reader
	Registry  *provider.Registry
	Recorder  record.EventRecorder
	// Prober checks the proxy (TCP connect, or HTTP through it with
	// --proxy-probe-url).
	Prober proxyprobe.Prober
	// Tag is written on every instance and selects them for the sweep.
	Tag   string
	Clock clock.PassiveClock
	// ProbeSourceCIDRs (--probe-source-cidrs) are where the manager's
	// probes come from as the proxies see them; they join every managed
	// squid's allowed sources with Basic auth (where they still need the
	// credential). See proxyaccess.SquidConfig.
	ProbeSourceCIDRs []string
	// Plugins are the providers' plug-ins (Plugins): how a Proxy becomes
	// its provider's Machine.
	Plugins plugin.List
	// DestinationExceptionGrants (--allow-destination-exceptions) and
	// RefuseUserData (--allow-proxy-user-data=false) are the manager's
	// rules admission applies, applied again to stored Proxies
	// (reconcilePolicy).
	DestinationExceptionGrants proxyaccess.Grants
	RefuseUserData             bool

	// ProbeInterval re-probes a Ready proxy.
	ProbeInterval time.Duration
	// ProbeHeartbeat: a probe that changes nothing else writes
	// status.probe.lastProbeTime only once the written one is this old
	// (DefaultProbeHeartbeat when zero).
	ProbeHeartbeat time.Duration
	// Echoer measures egress addresses (proxyprobe.HTTPEcho when nil).
	Echoer proxyprobe.Echoer
	// Egress configures the measurement of egress addresses.
	Egress EgressOptions
	// Stats reads managed squids' traffic counters after each successful
	// probe into Traffic (when nil: the Prober, if it reads them too, and
	// one that counts a Proxy unread for three probe intervals stale).
	Stats   proxyprobe.StatsReader
	Traffic *Traffic
	// ProbeFailureThreshold consecutive failures turn a healthy proxy
	// unhealthy, so one lost probe does not flap it.
	ProbeFailureThreshold int32
	// ProvisionPollInterval polls an instance that is not running with an
	// address yet (addresses come with no libvirt event).
	ProvisionPollInterval time.Duration
	// AddressTimeout bounds the wait for an address before the Proxy is
	// marked Failed with what was missing.
	AddressTimeout time.Duration
	// ResyncInterval: a Ready proxy's instance is re-read from the provider
	// this often, or at once on a provider event. Between, only the proxy
	// itself is probed. A booting one with an address is re-read every
	// bootingResync (at most this).
	ResyncInterval time.Duration
	// ProviderCallTimeout bounds each provider call, so a wedged provider
	// (e.g. libvirtd hung behind a live sshd) cannot pin a worker forever.
	ProviderCallTimeout time.Duration
	// Events from providers (e.g. libvirt lifecycle) that requeue a Proxy.
	Events <-chan event.GenericEvent
	// WatchPods: the kubernetes provider is enabled, and a change of one of
	// its squid pods requeues the pod's Proxy at once (proxyOfPod). The
	// manager's cache should hold only the provider's pods
	// (kubernetes.CacheByObject), as main.go's does.
	WatchPods bool
	// PortWatch, when set, watches the port of each Proxy in its first-probe
	// backoff and sends the Proxy on PortOpen when the port accepts, so the
	// real probe runs at once instead of at the next backoff step. Setup
	// wires both (newPortWatch).
	PortWatch *portwatch.Watcher[types.NamespacedName]
	PortOpen  <-chan event.GenericEvent

	// IPAM: the cluster serves Cluster API IPAddressClaims (ServesIPAM);
	// Proxies naming an IPAM pool get their address through one.
	IPAM bool

	// mem: what the reconciler remembers of each Proxy between reconciles.
	mem proxyMemory
	// addressMu makes checking and recording a static address one step
	// (holdAddress).
	addressMu sync.Mutex
}

// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/finalizers,verbs=update
// +kubebuilder:rbac:groups=crawl.example.com,resources=kvmhosts;kvmimages,verbs=get;list;watch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the controller. Missing dependencies are an
// error here, at start-up, not a surprise in some later Reconcile.
func (r *ProxyReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if err := r.complete(); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&crawlv1.Proxy{}, builder.WithPredicates(specOrAnnotationChanged)).
		// A credential Secret deleted (or restored) is acted on at once.
		// Updates are not: most are this controller's own writes (the url),
		// and a reconcile for each would probe again.
		Owns(&corev1.Secret{}, builder.WithPredicates(predicate.Funcs{
			UpdateFunc:  func(event.UpdateEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		WithOptions(opts).
		Named("proxy")
	if r.IPAM {
		// A claim bound (status.addressRef), or gone on deletion, wakes
		// its Proxy.
		b = b.Owns(&ipamv1.IPAddressClaim{})
	}
	if r.Events != nil {
		b = b.WatchesRawSource(source.Channel(r.Events, &handler.EnqueueRequestForObject{}))
	}
	if r.WatchPods {
		b = b.Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.proxyOfPod), builder.WithPredicates(squidPodChanged))
	}
	if r.PortOpen != nil {
		b = b.WatchesRawSource(source.Channel(r.PortOpen, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}

// complete checks the required dependencies and fills the optional ones
// once.
func (r *ProxyReconciler) complete() error {
	if err := requireDeps("ProxyReconciler", map[string]bool{
		"Client": r.Client != nil, "APIReader": r.APIReader != nil, "Recorder": r.Recorder != nil,
		"Prober": r.Prober != nil, "Registry": r.Registry != nil, "Plugins": r.Plugins != nil,
	}); err != nil {
		return err
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.ProbeInterval == 0 {
		r.ProbeInterval = 30 * time.Second
	}
	if r.ProbeHeartbeat == 0 {
		r.ProbeHeartbeat = DefaultProbeHeartbeat
	}
	if r.ProbeFailureThreshold == 0 {
		r.ProbeFailureThreshold = 3
	}
	if r.Echoer == nil {
		r.Echoer = proxyprobe.HTTPEcho{}
	}
	r.Egress = r.Egress.withDefaults()
	if r.Stats == nil {
		r.Stats, _ = r.Prober.(proxyprobe.StatsReader)
	}
	if r.Traffic == nil {
		r.Traffic = newTraffic(3 * r.ProbeInterval)
	}
	if r.ProvisionPollInterval == 0 {
		r.ProvisionPollInterval = 5 * time.Second
	}
	if r.AddressTimeout == 0 {
		r.AddressTimeout = 10 * time.Minute
	}
	if r.ResyncInterval == 0 {
		r.ResyncInterval = 10 * time.Minute
	}
	if r.ProviderCallTimeout == 0 {
		r.ProviderCallTimeout = DefaultProviderCallTimeout
	}
	return nil
}

// DefaultProviderCallTimeout bounds one provider call as a whole. A kvm
// Create may download and upload an image that is not cached yet, so it is
// generous. For kvm it is only a backstop: each libvirt RPC of a call has
// its own deadline (pkg/provider/kvm/virt/deadline.go), so a host that
// stops answering holds a worker for one RPC's deadline, not for this.
const DefaultProviderCallTimeout = 10 * time.Minute

// providerCall is the context of one provider call.
func (r *ProxyReconciler) providerCall(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.ProviderCallTimeout)
}

// MarkDirty makes the next reconcile of the Proxy re-read its instance (a
// provider event says it changed).
func (r *ProxyReconciler) MarkDirty(key types.NamespacedName) {
	r.mem.markDirty(key)
}

// InterruptProbe cancels key's probe under way, if any: a provider event
// says its instance changed (see reconcileHealth).
func (r *ProxyReconciler) InterruptProbe(key types.NamespacedName) {
	r.mem.interruptProbe(key)
}

// notePortOpened is the port watch's report that key's port accepted at
// address (host:port); it comes just before the reconcile it wakes.
func (r *ProxyReconciler) notePortOpened(key types.NamespacedName, address string) {
	r.mem.notePortOpened(key, address)
}

// forget drops what the reconciler remembers of a Proxy, its port watch
// included.
func (r *ProxyReconciler) forget(key types.NamespacedName) {
	r.mem.forget(key)
	r.forgetPort(key)
	r.Traffic.Forget(key)
	forgetProbeMetrics(key)
}

func (r *ProxyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	log := logf.FromContext(ctx).WithValues("proxy", req.NamespacedName)
	ctx = logf.IntoContext(ctx, log)

	p := &crawlv1.Proxy{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone without our finalizer's release (it was removed by
			// hand): nothing of it is worth keeping, a port watch least.
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if p.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(p, crawlv1.ProxyFinalizer) {
		// Persist the finalizer before anything is created, then go on.
		if err := r.addFinalizer(ctx, p); err != nil {
			return ctrl.Result{}, err
		}
	}
	s := newProxyScope(ctx, r.Client, p)
	before := p.Status.Phase
	defer func() {
		summarize(p)
		if before != p.Status.Phase {
			r.Recorder.Eventf(p, eventType(p.Status.Phase), "Phase"+string(p.Status.Phase), "%s", phaseMessage(p))
		}
		p.Status.ObservedGeneration = p.Generation
		holdHeartbeat(s.patcher.before.(*crawlv1.Proxy), p, r.ProbeHeartbeat)
		// Also writes a released finalizer.
		s.patcher.finish(ctx, p, &res, &reterr)
		for _, fn := range s.written {
			fn(ctx)
		}
	}()

	if !p.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}
	return r.reconcileNormal(ctx, s)
}

// addFinalizer writes the finalizer alone, guarded by resourceVersion so it
// cannot overwrite another writer's finalizers.
func (r *ProxyReconciler) addFinalizer(ctx context.Context, p *crawlv1.Proxy) error {
	orig := p.DeepCopy()
	controllerutil.AddFinalizer(p, crawlv1.ProxyFinalizer)
	return r.Client.Patch(ctx, p, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
}

// summarize computes Ready from InstanceProvisioned and ProxyHealthy (Cluster
// API's summary condition) and the phase from the conditions: the one place
// either is decided.
func summarize(p *crawlv1.Proxy) {
	if !p.DeletionTimestamp.IsZero() {
		msg := "deleting; no instance recorded"
		if p.Status.ProviderID != "" {
			msg = "deleting instance " + p.Status.ProviderID
		}
		conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse,
			Reason: crawlv1.ProxyDeletingReason, Message: msg})
	} else if err := conditions.SetSummaryCondition(p, p, crawlv1.ReadyCondition,
		conditions.ForConditionTypes{crawlv1.InstanceProvisionedCondition, crawlv1.ProxyHealthyCondition},
		conditions.CustomMergeStrategy{MergeStrategy: readyMerge{endpoint: p.Status.Endpoint}}); err != nil {
		// Only a programming error (no condition types) gets here.
		conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionUnknown,
			Reason: crawlv1.ProxyProvisioningReason, Message: err.Error()})
	} else if openManagedProxy(p) {
		// It serves, but anyone: a proxy that should authenticate and
		// does not is never reported Ready.
		sec := conditions.Get(p, crawlv1.SecureCondition)
		conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: sec.Reason, Message: sec.Message})
	}
	p.Status.Phase = proxyPhase(p)
}

// openManagedProxy: a managed squid with Basic auth served a request
// without credentials. Unmanaged proxies get Secure False for the same
// answer but stay Ready: their safety is their user's (admission warned),
// and the manager cannot tell a source-restricted one from an open one.
func openManagedProxy(p *crawlv1.Proxy) bool {
	return proxyaccess.UsesBasic(p) && conditions.IsFalse(p, crawlv1.SecureCondition) &&
		conditions.GetReason(p, crawlv1.SecureCondition) == crawlv1.ProxyOpenProxyReason
}

// readyMerge: Ready is the first sub-condition that is not True, with its
// reason and message (what to fix), or True "serving at <endpoint>".
type readyMerge struct{ endpoint string }

func (m readyMerge) Merge(_ conditions.MergeOperation, conds []conditions.ConditionWithOwnerInfo, types []string) (metav1.ConditionStatus, string, string, error) {
	for _, t := range types {
		for _, c := range conds {
			if c.Type == t && c.Status != metav1.ConditionTrue {
				return metav1.ConditionFalse, c.Reason, c.Message, nil
			}
		}
	}
	return metav1.ConditionTrue, crawlv1.ProxyReadyReason, "serving at " + m.endpoint, nil
}

// failedReasons are the InstanceProvisioned reasons that need a change (of
// the spec, the provider or the world) before the Proxy can progress.
var failedReasons = sets.New(crawlv1.ProxyPermanentErrorReason, crawlv1.ProxyForeignInstanceReason,
	crawlv1.ProxyAddressTimeoutReason, crawlv1.ProxyProviderDisabledReason,
	crawlv1.ProxyCredentialsInvalidReason, crawlv1.ProxyCredentialsConflictReason,
	crawlv1.ProxyCredentialsNotForProxiesReason, crawlv1.ProxySpecRefusedReason)

// proxyPhase derives the phase from the conditions: Pending until an
// instance is recorded, Provisioning until Ready, Failed when provisioning
// stopped on something permanent.
func proxyPhase(p *crawlv1.Proxy) crawlv1.ProxyPhase {
	switch {
	case !p.DeletionTimestamp.IsZero():
		return crawlv1.ProxyDeleting
	case conditions.IsTrue(p, crawlv1.ReadyCondition):
		return crawlv1.ProxyReady
	case openManagedProxy(p):
		return crawlv1.ProxyFailed
	case conditions.IsFalse(p, crawlv1.InstanceProvisionedCondition) &&
		failedReasons.Has(conditions.GetReason(p, crawlv1.InstanceProvisionedCondition)):
		return crawlv1.ProxyFailed
	case p.Status.ProviderID == "":
		return crawlv1.ProxyPending
	}
	return crawlv1.ProxyProvisioning
}

// reconcileNormal brings the Proxy to a serving instance, one phase after
// the other (see reconcilePhase). Each phase lives in the file named after
// it: proxy_policy.go, proxy_static_address.go (and reconcileStaticEgress),
// proxy_resync.go, proxy_credentials.go, proxy_instance.go,
// proxy_address.go, proxy_health.go; reconcileMachine is below, the machine
// it builds in proxy_machine.go.
func (r *ProxyReconciler) reconcileNormal(ctx context.Context, s *proxyScope) (ctrl.Result, error) {
	return runPhases(ctx, s,
		r.reconcilePolicy,        // the manager's admission rules, for Proxies stored past them
		r.reconcileMachine,       // the provider and its view of the Proxy; a kvm Proxy is placed first
		r.reconcileStaticAddress, // an IPAM pool's address: claimed, bound, checked and held before any instance
		r.reconcileResync,        // whether the instance is read, or only the proxy probed
		r.reconcileCredentials,   // the Basic credential and its Secret, before any instance has it
		r.reconcileInstance,      // Get first, else Create; a missing instance is rebuilt
		r.reconcileStaticEgress,  // a static address on a bridge is the egress
		r.reconcileAddress,       // InstanceProvisioned once it runs with an address
		r.reconcileHealth,        // the probe: ProxyHealthy, egress address, Secure
	)
}

// reconcileMachine finds spec.provider's provider and builds its view of
// the Proxy (machineFor, which places a kvm Proxy on a host first).
func (r *ProxyReconciler) reconcileMachine(ctx context.Context, s *proxyScope) (ctrl.Result, error) {
	p := s.proxy
	prov, err := r.Registry.Get(ctx, string(p.Spec.Provider))
	if err != nil {
		return r.fail(p, registryReason(err), err)
	}
	s.provider = prov
	if conditions.Get(p, crawlv1.SecureCondition) == nil {
		conditions.Set(p, metav1.Condition{Type: crawlv1.SecureCondition, Status: metav1.ConditionUnknown,
			Reason: crawlv1.ProxySecureUnknownReason, Message: "checked once the proxy serves"})
	}
	m, wait, err := r.machineFor(ctx, p)
	if err != nil || wait != nil {
		return r.stopFor(p, wait, err)
	}
	s.machine = m
	return ctrl.Result{}, nil
}

// reconcileDelete removes the instance and releases the finalizer; the
// deferred patch writes the release.
func (r *ProxyReconciler) reconcileDelete(ctx context.Context, s *proxyScope) (ctrl.Result, error) {
	p, log := s.proxy, s.log
	if !controllerutil.ContainsFinalizer(p, crawlv1.ProxyFinalizer) {
		return ctrl.Result{}, nil
	}
	// Checked before any provider lookup: it frees a Proxy whose provider or
	// host is gone for good.
	if p.Annotations[crawlv1.SkipCleanupAnnotation] == "true" {
		log.Info("skip-cleanup set: releasing without touching the provider", "providerID", p.Status.ProviderID)
		r.Recorder.Eventf(p, "Warning", "CleanupSkipped", "instance %s left in place (annotation %s)", p.Status.ProviderID, crawlv1.SkipCleanupAnnotation)
		// Its claims are deleted, not waited for: the annotation asks
		// for the Proxy to go now, and the garbage collector deletes
		// them anyway through their owner reference.
		if _, err := r.releaseAddressClaims(ctx, p); err != nil {
			log.Info("address claims not deleted; the garbage collector will", "err", err)
		}
		r.release(p)
		return ctrl.Result{}, nil
	}

	prov, err := r.Registry.Get(ctx, string(p.Spec.Provider))
	if err != nil {
		conditions.Set(p, metav1.Condition{Type: crawlv1.DeletionBlockedCondition, Status: metav1.ConditionTrue,
			Reason: registryReason(err), Message: err.Error() + "; set annotation " + crawlv1.SkipCleanupAnnotation + "=true to release without cleanup"})
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	}
	m, err := r.machineForDelete(ctx, p)
	if err != nil {
		return ctrl.Result{}, err
	}
	if r.neverPlaced(p, m) {
		// Never placed, so nothing was ever created.
		r.Recorder.Eventf(p, "Normal", "Deleted", "never placed on a host; nothing to delete")
		return r.releaseAfterClaims(ctx, p)
	}
	// Delete even when Get would fail: Delete is idempotent and can converge
	// where Get cannot.
	callCtx, cancel := r.providerCall(ctx)
	err = prov.Delete(callCtx, m)
	cancel()
	noteHost(p, err)
	if errors.Is(err, provider.ErrUnavailable) {
		// Not an error to back off from: the deletion waits for the host,
		// without a worker, and the provider wakes it when the host
		// answers.
		conditions.Set(p, metav1.Condition{Type: crawlv1.DeletionBlockedCondition, Status: metav1.ConditionTrue,
			Reason:  crawlv1.ProxyHostNotAnsweringReason,
			Message: err.Error() + "; deletion waits for it, or set annotation " + crawlv1.SkipCleanupAnnotation + "=true to release without cleanup"})
		return ctrl.Result{RequeueAfter: dependencyPoll}, nil
	}
	if errors.Is(err, provider.ErrBusy) {
		return waitBusy(ctx, err)
	}
	if err != nil {
		var idErr *provider.IdentityError
		if errors.As(err, &idErr) || provider.Class(err) == provider.ClassPermanent {
			reason := crawlv1.ProxyPermanentErrorReason
			if idErr != nil {
				reason = crawlv1.ProxyForeignInstanceReason
			}
			conditions.Set(p, metav1.Condition{Type: crawlv1.DeletionBlockedCondition, Status: metav1.ConditionTrue,
				Reason: reason, Message: err.Error() + "; resolve it, or set annotation " + crawlv1.SkipCleanupAnnotation + "=true"})
			r.Recorder.Eventf(p, "Warning", "DeletionBlocked", "%v", err)
			// No hot loop: an operator must act; the annotation triggers a reconcile.
			return ctrl.Result{RequeueAfter: r.ResyncInterval}, nil
		}
		conditions.Set(p, metav1.Condition{Type: crawlv1.DeletionBlockedCondition, Status: metav1.ConditionFalse,
			Reason: crawlv1.ProxyTransientErrorReason, Message: "retrying: " + err.Error()})
		return ctrl.Result{}, err
	}
	if conditions.GetReason(p, crawlv1.DeletionBlockedCondition) != crawlv1.ProxyWaitingForIPAddressReason {
		r.Recorder.Eventf(p, "Normal", "Deleted", "instance %s deleted", p.Status.ProviderID)
	}
	return r.releaseAfterClaims(ctx, p)
}

// releaseAfterClaims releases the finalizer of a Proxy whose instance is
// gone once its address claims are gone too (releaseAddressClaims), so
// the address goes back to its pool only after the VM using it, and a
// claim is never left behind.
func (r *ProxyReconciler) releaseAfterClaims(ctx context.Context, p *crawlv1.Proxy) (ctrl.Result, error) {
	gone, err := r.releaseAddressClaims(ctx, p)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !gone {
		conditions.Set(p, metav1.Condition{Type: crawlv1.DeletionBlockedCondition, Status: metav1.ConditionTrue,
			Reason:  crawlv1.ProxyWaitingForIPAddressReason,
			Message: "instance deleted; waiting for the IPAM provider to release the address claim (" + addressClaimName(p, 0) + "), or set annotation " + crawlv1.SkipCleanupAnnotation + "=true to release without it"})
		return ctrl.Result{RequeueAfter: claimReleasePoll}, nil
	}
	r.release(p)
	return ctrl.Result{}, nil
}

// release lets a deleted Proxy go: the deferred patch writes it.
func (r *ProxyReconciler) release(p *crawlv1.Proxy) {
	controllerutil.RemoveFinalizer(p, crawlv1.ProxyFinalizer)
	r.forget(client.ObjectKeyFromObject(p))
}

// fail records a provider error by class: transient errors retry with the
// controller's backoff, permanent ones (a Failed phase) wait for a change.
func (r *ProxyReconciler) fail(p *crawlv1.Proxy, reason string, err error) (ctrl.Result, error) {
	r.setNotProvisioned(p, reason, err.Error())
	if provider.Class(err) == provider.ClassPermanent {
		return ctrl.Result{RequeueAfter: r.ResyncInterval}, nil
	}
	return ctrl.Result{}, err
}

// stopFor ends a phase on an error (see fail) or a wait, which leaves the
// Proxy not provisioned with the wait's reason until it has passed. A
// wait's after must be positive: a zero Result would hand on to the next
// phase.
func (r *ProxyReconciler) stopFor(p *crawlv1.Proxy, wait *waitFor, err error) (ctrl.Result, error) {
	if err != nil {
		return r.fail(p, reasonFor(err), err)
	}
	r.setNotProvisioned(p, wait.reason, wait.message)
	return ctrl.Result{RequeueAfter: wait.after}, nil
}

func (r *ProxyReconciler) setNotProvisioned(p *crawlv1.Proxy, reason, msg string) {
	conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
}

func reasonFor(err error) string {
	switch provider.Class(err) {
	case provider.ClassPermanent:
		var idErr *provider.IdentityError
		if errors.As(err, &idErr) {
			return crawlv1.ProxyForeignInstanceReason
		}
		return crawlv1.ProxyPermanentErrorReason
	case provider.ClassNotFound:
		return crawlv1.ProxyInstanceMissingReason
	}
	if errors.Is(err, provider.ErrNoCapacity) {
		return crawlv1.ProxyInsufficientCapacityReason
	}
	return crawlv1.ProxyTransientErrorReason
}

// registryReason is the condition reason for a provider that cannot be had.
func registryReason(err error) string {
	if errors.Is(err, provider.ErrNotEnabled) {
		return crawlv1.ProxyProviderDisabledReason
	}
	return reasonFor(err)
}

func eventType(phase crawlv1.ProxyPhase) string {
	if phase == crawlv1.ProxyFailed {
		return "Warning"
	}
	return "Normal"
}

func phaseMessage(p *crawlv1.Proxy) string {
	if c := conditions.Get(p, crawlv1.ReadyCondition); c != nil {
		return c.Message
	}
	return string(p.Status.Phase)
}
