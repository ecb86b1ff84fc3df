// Package controllers holds the reconcilers: Proxy (provider-agnostic),
// KVMHost (fleet health), KVMImage (image cache) and the orphan sweep.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/source"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

// ProxyReconciler turns Proxies into provider instances, whatever the
// provider.
type ProxyReconciler struct {
	Client   client.Client
	Registry *provider.Registry
	Recorder record.EventRecorder
	// Prober checks the proxy (TCP connect, or HTTP through it with
	// --proxy-probe-url).
	Prober proxyprobe.Prober
	// Tag is written on every instance and selects them for the sweep.
	Tag   string
	Clock clock.PassiveClock

	// ProbeInterval re-probes a Ready proxy.
	ProbeInterval time.Duration
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
	// itself is probed.
	ResyncInterval time.Duration
	// Events from providers (e.g. libvirt lifecycle) that requeue a Proxy.
	Events <-chan event.GenericEvent

	memMu sync.Mutex
	// synced: when each Proxy's instance was last read from its provider.
	synced map[types.NamespacedName]time.Time
	// waiting: since when each Proxy has waited for its address.
	waiting map[types.NamespacedName]time.Time
}

// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/finalizers,verbs=update
// +kubebuilder:rbac:groups=crawl.example.com,resources=kvmhosts;kvmimages,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the controller.
func (r *ProxyReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	r.defaults()
	b := ctrl.NewControllerManagedBy(mgr).
		For(&crawlv1.Proxy{}, builder.WithPredicates(specOrAnnotationChanged)).
		WithOptions(opts).
		Named("proxy")
	if r.Events != nil {
		b = b.WatchesRawSource(source.Channel(r.Events, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}

func (r *ProxyReconciler) defaults() {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Prober == nil {
		r.Prober = proxyprobe.TCP{}
	}
	if r.ProbeInterval == 0 {
		r.ProbeInterval = 30 * time.Second
	}
	if r.ProbeFailureThreshold == 0 {
		r.ProbeFailureThreshold = 3
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
	if r.synced == nil {
		r.synced = map[types.NamespacedName]time.Time{}
		r.waiting = map[types.NamespacedName]time.Time{}
	}
}

// MarkDirty makes the next reconcile of the Proxy re-read its instance (a
// provider event says it changed).
func (r *ProxyReconciler) MarkDirty(key types.NamespacedName) {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	delete(r.synced, key)
}

func (r *ProxyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	r.defaults()
	log := logf.FromContext(ctx).WithValues("proxy", req.NamespacedName)
	ctx = logf.IntoContext(ctx, log)

	p := &crawlv1.Proxy{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	helper, err := patch.NewHelper(p, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	before := p.Status.Phase
	defer func() {
		if before != p.Status.Phase && p.Status.Phase != "" {
			r.Recorder.Eventf(p, eventType(p.Status.Phase), "Phase"+string(p.Status.Phase), "%s", phaseMessage(p))
		}
		if !p.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(p, crawlv1.ProxyFinalizer) {
			// The finalizer was released: the object may be gone already.
			return
		}
		p.Status.ObservedGeneration = p.Generation
		if err := helper.Patch(ctx, p, patch.WithOwnedConditions{Conditions: []string{
			crawlv1.ReadyCondition, crawlv1.InstanceProvisionedCondition,
			crawlv1.ProxyHealthyCondition, crawlv1.DeletionBlockedCondition,
		}}); err != nil && !apierrors.IsNotFound(err) {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()

	if !p.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, p, helper)
	}
	if controllerutil.AddFinalizer(p, crawlv1.ProxyFinalizer) {
		// Persist the finalizer before anything is created.
		return ctrl.Result{Requeue: true}, nil
	}
	return r.reconcileNormal(ctx, p)
}

func (r *ProxyReconciler) reconcileNormal(ctx context.Context, p *crawlv1.Proxy) (ctrl.Result, error) {
	if p.Status.Phase == "" {
		p.Status.Phase = crawlv1.ProxyPending
	}
	prov, err := r.Registry.Get(ctx, string(p.Spec.Provider))
	if err != nil {
		return r.fail(p, registryReason(err), err)
	}

	m, wait, err := r.machineFor(ctx, p)
	if err != nil {
		return r.fail(p, crawlv1.ProxyPermanentErrorReason, err)
	}
	if wait != nil {
		r.setNotProvisioned(p, crawlv1.ProxyPending, wait.reason, wait.message)
		return ctrl.Result{RequeueAfter: wait.after}, nil
	}

	// A Ready proxy whose instance was read recently and has had no event
	// since only needs its proxy probed.
	if p.Status.Phase == crawlv1.ProxyReady && r.recentlySynced(client.ObjectKeyFromObject(p)) {
		return r.reconcileHealth(ctx, p)
	}

	// With an instance recorded, Get first: a running one needs no Create
	// (for gcp a Create is an insert answered 409). Otherwise Create, which
	// is idempotent and starts a stopped instance, then Get.
	var inst *provider.Instance
	if p.Status.ProviderID != "" {
		inst, err = prov.Get(ctx, m)
		if provider.Class(err) == provider.ClassNotFound {
			return r.rebuild(ctx, p)
		}
	}
	if p.Status.ProviderID == "" || err != nil || inst.State != provider.StateRunning {
		created, err := prov.Create(ctx, m)
		if err != nil {
			return r.fail(p, reasonFor(err), err)
		}
		r.recordInstance(p, created)
		inst, err = prov.Get(ctx, m)
		switch {
		case provider.Class(err) == provider.ClassNotFound:
			return r.rebuild(ctx, p)
		case err != nil:
			return r.fail(p, reasonFor(err), err)
		}
	}
	r.recordInstance(p, inst)
	r.markSynced(client.ObjectKeyFromObject(p))
	if inst.State == provider.StateRunning && inst.Address != "" {
		r.stopWaiting(client.ObjectKeyFromObject(p))
	}

	if inst.State != provider.StateRunning || inst.Address == "" {
		return r.waitForAddress(p, inst)
	}
	conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue,
		Reason: crawlv1.ProxyReadyReason, Message: fmt.Sprintf("running on %s, address %s from %s", inst.Host, inst.Address, inst.AddressSource)})
	return r.reconcileHealth(ctx, p)
}

// rebuild forgets an instance its host reports gone (the host answered, so
// this is not an outage): the next reconcile creates it again.
func (r *ProxyReconciler) rebuild(ctx context.Context, p *crawlv1.Proxy) (ctrl.Result, error) {
	logf.FromContext(ctx).Info("instance missing, rebuilding", "providerID", p.Status.ProviderID)
	r.Recorder.Eventf(p, "Warning", "InstanceMissing", "instance %s not found on its host; rebuilding", p.Status.ProviderID)
	p.Status.ProviderID, p.Status.Address, p.Status.Endpoint = "", "", ""
	r.setNotProvisioned(p, crawlv1.ProxyProvisioning, crawlv1.ProxyInstanceMissingReason, "instance not found; rebuilding")
	return ctrl.Result{Requeue: true}, nil
}

// waitForAddress keeps the Proxy Provisioning while the instance boots, and
// fails it with what was missing once AddressTimeout has passed since this
// manager first saw it waiting.
func (r *ProxyReconciler) waitForAddress(p *crawlv1.Proxy, inst *provider.Instance) (ctrl.Result, error) {
	reason, msg := crawlv1.ProxyProvisioningReason, fmt.Sprintf("instance is %s", inst.State)
	if inst.State == provider.StateRunning {
		reason, msg = crawlv1.ProxyWaitingForAddress, "running, no routable IPv4 address yet"
	}
	if inst.Message != "" {
		msg += ": " + inst.Message
	}
	if inst.State == provider.StateFailed {
		r.setNotProvisioned(p, crawlv1.ProxyFailed, crawlv1.ProxyPermanentErrorReason, msg)
		return ctrl.Result{RequeueAfter: r.ResyncInterval}, nil
	}
	if waited := r.Clock.Since(r.waitingSince(client.ObjectKeyFromObject(p))); waited > r.AddressTimeout {
		r.setNotProvisioned(p, crawlv1.ProxyFailed, crawlv1.ProxyAddressTimeoutReason,
			fmt.Sprintf("no address after %s: %s", waited.Round(time.Second), msg))
		// Keep looking, slowly: a late address still heals the Proxy.
		return ctrl.Result{RequeueAfter: max(r.ProvisionPollInterval, time.Minute)}, nil
	}
	r.setNotProvisioned(p, crawlv1.ProxyProvisioning, reason, msg)
	return ctrl.Result{RequeueAfter: r.ProvisionPollInterval}, nil
}

// reconcileHealth probes the proxy and sets ProxyHealthy and Ready.
func (r *ProxyReconciler) reconcileHealth(ctx context.Context, p *crawlv1.Proxy) (ctrl.Result, error) {
	res := r.Prober.Probe(ctx, p.Status.Address, p.Spec.Port)
	now := metav1.NewTime(r.Clock.Now())
	if p.Status.Probe == nil {
		p.Status.Probe = &crawlv1.ProxyProbeStatus{}
	}
	ps := p.Status.Probe
	ps.LastProbeTime = &now
	ps.LatencyMilliseconds = res.Latency.Milliseconds()

	wasHealthy := conditions.IsTrue(p, crawlv1.ProxyHealthyCondition)
	if res.OK {
		ps.ConsecutiveFailures, ps.LastError = 0, ""
		reason, msg := crawlv1.ProxyProbeSucceededReason, fmt.Sprintf("request through the proxy succeeded in %s", res.Latency.Round(time.Millisecond))
		if !res.Through {
			reason, msg = crawlv1.ProxyNotProbedReason, fmt.Sprintf("port %d accepts connections (%s); the proxy itself was not probed: set --proxy-probe-url", p.Spec.Port, res.Latency.Round(time.Millisecond))
		}
		conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue, Reason: reason, Message: msg})
		conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: crawlv1.ProxyReadyReason,
			Message: "serving at " + p.Status.Endpoint})
		p.Status.Phase = crawlv1.ProxyReady
		return ctrl.Result{RequeueAfter: r.ProbeInterval}, nil
	}

	ps.ConsecutiveFailures++
	ps.LastError = res.Err.Error()
	reason := crawlv1.ProxyProbeFailedReason
	if !res.Through {
		reason = crawlv1.ProxyPortClosedReason
	}
	if wasHealthy && ps.ConsecutiveFailures < r.ProbeFailureThreshold {
		// One lost probe does not flap a healthy proxy.
		logf.FromContext(ctx).V(1).Info("probe failed, below threshold", "failures", ps.ConsecutiveFailures, "err", res.Err)
		return ctrl.Result{RequeueAfter: r.ProvisionPollInterval}, nil
	}
	msg := fmt.Sprintf("%d consecutive probe failures, last after %s: %v", ps.ConsecutiveFailures, res.Latency.Round(time.Millisecond), res.Err)
	if why := r.Registry.CheckError(string(p.Spec.Provider)); why != nil {
		// e.g. no firewall rule admits the port: say so, not just "closed".
		msg += "; provider check fails: " + why.Error()
	}
	conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	p.Status.Phase = crawlv1.ProxyProvisioning
	if wasHealthy {
		// It served before: a failing proxy is re-read from the provider.
		r.MarkDirty(client.ObjectKeyFromObject(p))
	}
	return ctrl.Result{RequeueAfter: r.ProvisionPollInterval}, nil
}

func (r *ProxyReconciler) reconcileDelete(ctx context.Context, p *crawlv1.Proxy, helper *patch.Helper) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	if !controllerutil.ContainsFinalizer(p, crawlv1.ProxyFinalizer) {
		return ctrl.Result{}, nil
	}
	// Checked before any provider lookup: it frees a Proxy whose provider or
	// host is gone for good.
	if p.Annotations[crawlv1.SkipCleanupAnnotation] == "true" {
		log.Info("skip-cleanup set: releasing without touching the provider", "providerID", p.Status.ProviderID)
		r.Recorder.Eventf(p, "Warning", "CleanupSkipped", "instance %s left in place (annotation %s)", p.Status.ProviderID, crawlv1.SkipCleanupAnnotation)
		return r.releaseFinalizer(ctx, p, helper)
	}
	p.Status.Phase = crawlv1.ProxyDeleting

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
	// Delete even when Get would fail: Delete is idempotent and can converge
	// where Get cannot.
	if err := prov.Delete(ctx, m); err != nil {
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
	r.Recorder.Eventf(p, "Normal", "Deleted", "instance %s deleted", p.Status.ProviderID)
	return r.releaseFinalizer(ctx, p, helper)
}

// releaseFinalizer is the one exit that lets a deleted Proxy go.
func (r *ProxyReconciler) releaseFinalizer(ctx context.Context, p *crawlv1.Proxy, helper *patch.Helper) (ctrl.Result, error) {
	controllerutil.RemoveFinalizer(p, crawlv1.ProxyFinalizer)
	r.forget(client.ObjectKeyFromObject(p))
	if err := helper.Patch(ctx, p); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// fail records a provider error by class: transient errors retry with the
// controller's backoff, permanent ones set Failed and wait for a change.
func (r *ProxyReconciler) fail(p *crawlv1.Proxy, reason string, err error) (ctrl.Result, error) {
	if provider.Class(err) == provider.ClassPermanent {
		r.setNotProvisioned(p, crawlv1.ProxyFailed, reason, err.Error())
		return ctrl.Result{RequeueAfter: r.ResyncInterval}, nil
	}
	r.setNotProvisioned(p, p.Status.Phase, reason, err.Error())
	return ctrl.Result{}, err
}

func (r *ProxyReconciler) setNotProvisioned(p *crawlv1.Proxy, phase crawlv1.ProxyPhase, reason, msg string) {
	if phase != "" {
		p.Status.Phase = phase
	}
	conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	conditions.Set(p, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
}

func (r *ProxyReconciler) recordInstance(p *crawlv1.Proxy, inst *provider.Instance) {
	if inst == nil {
		return
	}
	if inst.ProviderID != "" {
		p.Status.ProviderID = inst.ProviderID
	}
	if inst.Host != "" {
		p.Status.Host = inst.Host
	}
	p.Status.Address, p.Status.AddressSource, p.Status.Endpoint = inst.Address, inst.AddressSource, ""
	if inst.Address != "" {
		p.Status.Endpoint = "http://" + net.JoinHostPort(inst.Address, strconv.Itoa(int(p.Spec.Port)))
	}
}

func (r *ProxyReconciler) recentlySynced(key types.NamespacedName) bool {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	t, ok := r.synced[key]
	return ok && r.Clock.Since(t) < r.ResyncInterval
}

func (r *ProxyReconciler) markSynced(key types.NamespacedName) {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	r.synced[key] = r.Clock.Now()
}

func (r *ProxyReconciler) waitingSince(key types.NamespacedName) time.Time {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	t, ok := r.waiting[key]
	if !ok {
		t = r.Clock.Now()
		r.waiting[key] = t
	}
	return t
}

// forget drops what the reconciler remembers of a Proxy.
func (r *ProxyReconciler) forget(key types.NamespacedName) {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	delete(r.synced, key)
	delete(r.waiting, key)
}

func (r *ProxyReconciler) stopWaiting(key types.NamespacedName) {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	delete(r.waiting, key)
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
