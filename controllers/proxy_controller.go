// Package controllers holds the reconcilers: Proxy (provider-agnostic),
// KVMHost (fleet health), KVMImage (image cache) and the orphan sweep.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
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
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/portwatch"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/pkg/squid"
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
	// itself is probed. A booting one with an address is re-read every
	// bootingResync (at most this).
	ResyncInterval time.Duration
	// ProviderCallTimeout bounds each provider call, so a wedged provider
	// (e.g. libvirtd hung behind a live sshd) cannot pin a worker forever.
	ProviderCallTimeout time.Duration
	// Events from providers (e.g. libvirt lifecycle) that requeue a Proxy.
	Events <-chan event.GenericEvent
	// PortWatch, when set, watches the port of each Proxy in its first-probe
	// backoff and sends the Proxy on PortOpen when the port accepts, so the
	// real probe runs at once instead of at the next backoff step. Setup
	// wires both (newPortWatch).
	PortWatch *portwatch.Watcher[types.NamespacedName]
	PortOpen  <-chan event.GenericEvent

	memMu sync.Mutex
	// synced: when each Proxy's instance was last read from its provider.
	synced map[types.NamespacedName]time.Time
	// waiting: since when each Proxy has waited for its address.
	waiting map[types.NamespacedName]time.Time
	// probeBackoff: the next requeue of each Proxy probed but never yet
	// healthy (see firstProbeBackoff).
	probeBackoff map[types.NamespacedName]time.Duration
	// portOpened: where (host:port) the port watch saw each Proxy's port
	// accept, until the reconcile it woke takes it (portJustOpened).
	portOpened map[types.NamespacedName]string
	// probing: how to interrupt each Proxy's probe under way
	// (InterruptProbe).
	probing map[types.NamespacedName]context.CancelFunc
}

// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/finalizers,verbs=update
// +kubebuilder:rbac:groups=crawl.example.com,resources=kvmhosts;kvmimages,verbs=get;list;watch
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
	if r.Events != nil {
		b = b.WatchesRawSource(source.Channel(r.Events, &handler.EnqueueRequestForObject{}))
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
		"Prober": r.Prober != nil, "Registry": r.Registry != nil,
	}); err != nil {
		return err
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
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
	if r.ProviderCallTimeout == 0 {
		r.ProviderCallTimeout = DefaultProviderCallTimeout
	}
	// Under the lock: the event bridge may already mark Proxies dirty.
	r.memMu.Lock()
	r.synced = map[types.NamespacedName]time.Time{}
	r.waiting = map[types.NamespacedName]time.Time{}
	r.probeBackoff = map[types.NamespacedName]time.Duration{}
	if r.portOpened == nil {
		r.portOpened = map[types.NamespacedName]string{}
	}
	r.probing = map[types.NamespacedName]context.CancelFunc{}
	r.memMu.Unlock()
	return nil
}

// DefaultProviderCallTimeout bounds one provider call. A kvm Create may
// download and upload an image that is not cached yet, so it is generous.
const DefaultProviderCallTimeout = 10 * time.Minute

// providerCall is the context of one provider call.
func (r *ProxyReconciler) providerCall(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.ProviderCallTimeout)
}

// MarkDirty makes the next reconcile of the Proxy re-read its instance (a
// provider event says it changed).
func (r *ProxyReconciler) MarkDirty(key types.NamespacedName) {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	delete(r.synced, key)
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
	helper := newObjectPatcher(r.Client, p)
	before := p.Status.Phase
	defer func() {
		summarize(p)
		if before != p.Status.Phase {
			r.Recorder.Eventf(p, eventType(p.Status.Phase), "Phase"+string(p.Status.Phase), "%s", phaseMessage(p))
		}
		p.Status.ObservedGeneration = p.Generation
		// Also writes a released finalizer.
		helper.finish(ctx, p, &res, &reterr)
	}()

	if !p.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, p)
	}
	return r.reconcileNormal(ctx, p)
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
	crawlv1.ProxyCredentialsInvalidReason, crawlv1.ProxyCredentialsConflictReason)

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

func (r *ProxyReconciler) reconcileNormal(ctx context.Context, p *crawlv1.Proxy) (ctrl.Result, error) {
	prov, err := r.Registry.Get(ctx, string(p.Spec.Provider))
	if err != nil {
		return r.fail(p, registryReason(err), err)
	}

	if conditions.Get(p, crawlv1.SecureCondition) == nil {
		conditions.Set(p, metav1.Condition{Type: crawlv1.SecureCondition, Status: metav1.ConditionUnknown,
			Reason: crawlv1.ProxySecureUnknownReason, Message: "checked once the proxy serves"})
	}

	m, wait, err := r.machineFor(ctx, p)
	if err != nil {
		return r.fail(p, reasonFor(err), err)
	}
	if wait != nil {
		r.setNotProvisioned(p, wait.reason, wait.message)
		return ctrl.Result{RequeueAfter: wait.after}, nil
	}

	// A proxy whose instance was read recently and has had no event since
	// only needs its proxy probed (fast): a Ready one until ResyncInterval;
	// a booting one, whose port is all that is missing, until
	// bootingResync, or ResyncInterval once its port has just accepted at
	// its recorded address (which says the instance runs there). Reading
	// it asks the guest agent, which a booting TCG guest answers in up to
	// 2 s, and the reconcile woken by the port opening waits behind it.
	key := client.ObjectKeyFromObject(p)
	// Only an address the provider will not replace counts: a read would
	// still change its source.
	provisioned := conditions.IsTrue(p, crawlv1.InstanceProvisionedCondition) && p.Status.Address != "" && settledAddress(p)
	var readWithin time.Duration
	switch portOpened := r.portJustOpened(p); {
	case conditions.IsTrue(p, crawlv1.ReadyCondition), provisioned && portOpened:
		readWithin = r.ResyncInterval
	case provisioned && (booting(p) || r.inProbeBackoff(key)):
		readWithin = min(bootingResync, r.ResyncInterval)
	}
	fast := readWithin > 0 && r.readWithin(key, readWithin)
	creds, wait, err := r.reconcileCredentials(ctx, p, fast)
	if err != nil {
		return r.fail(p, reasonFor(err), err)
	}
	if wait != nil {
		r.setNotProvisioned(p, wait.reason, wait.message)
		return ctrl.Result{RequeueAfter: wait.after}, nil
	}
	if fast {
		return r.reconcileHealth(ctx, p, creds)
	}
	if err := r.attachSquid(p, m, creds); err != nil {
		return r.fail(p, reasonFor(err), err)
	}

	// With an instance recorded, Get first: a running one needs no Create
	// (for gcp a Create is an insert answered 409). Otherwise Create, which
	// is idempotent and starts a stopped instance, then Get.
	var inst *provider.Instance
	if p.Status.ProviderID != "" {
		inst, err = r.get(ctx, prov, m)
		switch {
		case provider.Class(err) == provider.ClassNotFound:
			return r.rebuild(ctx, p)
		case err != nil && provider.Class(err) == provider.ClassTransient && conditions.IsTrue(p, crawlv1.InstanceProvisionedCondition):
			// The provider could not be asked (host busy, link down, call
			// deadline): that says nothing about an instance last seen
			// running. Keep what is known, let the probe judge the proxy,
			// and ask again soon; a Create now would only meet the same
			// outage.
			logf.FromContext(ctx).Info("instance not re-read, keeping its last state", "providerID", p.Status.ProviderID, "err", err)
			res, err := r.reconcileHealth(ctx, p, creds)
			res.RequeueAfter = min(res.RequeueAfter, r.ProvisionPollInterval)
			return res, err
		}
	}
	if p.Status.ProviderID == "" || err != nil || inst.State != provider.StateRunning {
		if err == nil && inst != nil {
			// Found not running (stopped, crashed, destroyed): the proxy
			// is down now, whatever the last probes said. The probe
			// threshold is for noise on a running instance.
			wasHealthy := conditions.IsTrue(p, crawlv1.ProxyHealthyCondition)
			r.instanceDown(p, inst.State)
			if wasHealthy {
				// Say so before repairing it: starting the instance and
				// probing it again take seconds (a VM's start under load,
				// a probe to an address nothing answers yet), and clients
				// must stop using it now. The next reconcile starts it.
				return ctrl.Result{RequeueAfter: time.Millisecond}, nil
			}
		}
		if wait, err := r.resolveForCreate(ctx, p, m); wait != nil || err != nil {
			if err != nil {
				return r.fail(p, reasonFor(err), err)
			}
			r.setNotProvisioned(p, wait.reason, wait.message)
			return ctrl.Result{RequeueAfter: wait.after}, nil
		}
		callCtx, cancel := r.providerCall(ctx)
		created, err := prov.Create(callCtx, m)
		cancel()
		if err != nil {
			return r.fail(p, reasonFor(err), err)
		}
		r.recordInstance(p, created)
		inst, err = r.get(ctx, prov, m)
		switch {
		case provider.Class(err) == provider.ClassNotFound:
			return r.rebuild(ctx, p)
		case err != nil:
			return r.fail(p, reasonFor(err), err)
		}
	}
	r.recordInstance(p, inst)
	r.markSynced(key)
	if inst.State == provider.StateRunning && inst.Address != "" {
		r.stopWaiting(key)
	}

	if inst.State != provider.StateRunning || inst.Address == "" {
		return r.waitForAddress(p, inst)
	}
	msg := fmt.Sprintf("running on %s, address %s from %s", inst.Host, inst.Address, inst.AddressSource)
	if inst.Message != "" {
		// What the provider remarks on a running instance (the guest
		// agent disagreeing with the lease, squid's restarts) stays visible.
		msg += "; " + inst.Message
	}
	conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue,
		Reason: crawlv1.ProxyReadyReason, Message: msg})
	if creds != nil {
		// The address is known now: the url in the credential Secret
		// follows it.
		if err := r.writeCredentials(ctx, p, creds); err != nil {
			return r.fail(p, reasonFor(err), err)
		}
	}
	return r.reconcileHealth(ctx, p, creds)
}

func (r *ProxyReconciler) get(ctx context.Context, prov provider.Provider, m *provider.Machine) (*provider.Instance, error) {
	callCtx, cancel := r.providerCall(ctx)
	defer cancel()
	return prov.Get(callCtx, m)
}

// rebuild forgets an instance its host reports gone (the host answered, so
// this is not an outage); the next reconcile, at once, creates it again.
func (r *ProxyReconciler) rebuild(ctx context.Context, p *crawlv1.Proxy) (ctrl.Result, error) {
	logf.FromContext(ctx).Info("instance missing, rebuilding", "providerID", p.Status.ProviderID)
	r.Recorder.Eventf(p, "Warning", "InstanceMissing", "instance %s not found on its host; rebuilding", p.Status.ProviderID)
	p.Status.ProviderID, p.Status.Address, p.Status.Endpoint = "", "", ""
	r.setNotProvisioned(p, crawlv1.ProxyInstanceMissingReason, "instance not found; rebuilding")
	r.forgetHealth(p, "instance not found; rebuilding")
	return ctrl.Result{RequeueAfter: time.Millisecond}, nil
}

// waitForAddress keeps the Proxy Provisioning while the instance boots, and
// fails it with what was missing once AddressTimeout has passed since this
// manager first saw it waiting.
func (r *ProxyReconciler) waitForAddress(p *crawlv1.Proxy, inst *provider.Instance) (ctrl.Result, error) {
	reason, msg := crawlv1.ProxyProvisioningReason, fmt.Sprintf("instance is %s", inst.State)
	if inst.State == provider.StateRunning {
		reason, msg = crawlv1.ProxyWaitingForAddressReason, "running, no routable IPv4 address yet"
	}
	if inst.Message != "" {
		msg += ": " + inst.Message
	}
	if inst.State == provider.StateFailed {
		r.setNotProvisioned(p, crawlv1.ProxyPermanentErrorReason, msg)
		return ctrl.Result{RequeueAfter: r.ResyncInterval}, nil
	}
	if waited := r.Clock.Since(r.waitingSince(client.ObjectKeyFromObject(p))); waited > r.AddressTimeout {
		r.setNotProvisioned(p, crawlv1.ProxyAddressTimeoutReason, fmt.Sprintf("no address after %s: %s", waited.Round(time.Second), msg))
		// Keep looking, slowly: a late address still heals the Proxy.
		return ctrl.Result{RequeueAfter: max(r.ProvisionPollInterval, time.Minute)}, nil
	}
	r.setNotProvisioned(p, reason, msg)
	return ctrl.Result{RequeueAfter: r.ProvisionPollInterval}, nil
}

// instanceDown records that the instance was found not running: ProxyHealthy
// goes False at once, so the next probe decides afresh.
func (r *ProxyReconciler) instanceDown(p *crawlv1.Proxy, state provider.State) {
	conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionFalse,
		Reason: crawlv1.ProxyInstanceNotRunningReason, Message: fmt.Sprintf("instance was found %s; starting it", state)})
}

// reconcileHealth probes the proxy (with its credential, if it has one)
// and sets ProxyHealthy; after a successful probe it records the egress
// address and checks that the proxy refuses a request without credentials
// (Secure). Both ride on the probe's own schedule: at most one probe and
// one check per probe interval.
func (r *ProxyReconciler) reconcileHealth(ctx context.Context, p *crawlv1.Proxy, creds *credentials) (ctrl.Result, error) {
	key := client.ObjectKeyFromObject(p)
	// Read before this probe's verdict changes the conditions.
	startsBackoff := booting(p)
	target := proxyprobe.Target{Address: p.Status.Address, Port: p.Spec.Port}
	if creds != nil {
		target.Username, target.Password = creds.Username, creds.Password
	}
	probeCtx, probed := r.startProbe(ctx, key)
	defer probed()
	res := r.Prober.Probe(probeCtx, target)
	if probeCtx.Err() != nil && ctx.Err() == nil {
		// A provider event about the instance came during the probe
		// (stopped, gone, started): whatever the probe got is about the
		// instance as it was, and a probe of a guest being destroyed can
		// take its whole timeout while the event's reconcile waits behind
		// it. That reconcile re-reads the instance and probes afresh; the
		// verdict stays as it was until then.
		logf.FromContext(ctx).V(1).Info("probe interrupted by a provider event; the instance is read again")
		return ctrl.Result{RequeueAfter: time.Millisecond}, nil
	}
	logf.FromContext(ctx).V(1).Info("probed", "ok", res.OK, "latency", res.Latency, "status", res.StatusCode, "err", res.Err)
	now := metav1.NewTime(r.Clock.Now())
	if p.Status.Probe == nil {
		p.Status.Probe = &crawlv1.ProxyProbeStatus{}
	}
	ps := p.Status.Probe
	ps.LastProbeTime = &now
	ps.LatencyMilliseconds = res.Latency.Milliseconds()

	wasHealthy := conditions.IsTrue(p, crawlv1.ProxyHealthyCondition)
	if res.OK {
		r.endProbeBackoff(key)
		ps.ConsecutiveFailures, ps.LastError = 0, ""
		reason, msg := crawlv1.ProxyProbeSucceededReason, fmt.Sprintf("request through the proxy succeeded in %s", res.Latency.Round(time.Millisecond))
		if !res.Through {
			reason, msg = crawlv1.ProxyNotProbedReason, fmt.Sprintf("port %d accepts connections (%s); the proxy itself was not probed: set --proxy-probe-url", p.Spec.Port, res.Latency.Round(time.Millisecond))
		}
		conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue, Reason: reason, Message: msg})
		r.recordEgress(p, res.EgressAddress)
		r.checkSecure(probeCtx, p, target)
		return ctrl.Result{RequeueAfter: r.ProbeInterval}, nil
	}

	ps.ConsecutiveFailures++
	ps.LastError = res.Err.Error()
	reason := crawlv1.ProxyProbeFailedReason
	if !res.Through {
		reason = crawlv1.ProxyPortClosedReason
	}
	if res.StatusCode == http.StatusProxyAuthRequired {
		reason = crawlv1.ProxyProbeAuthFailedReason
	}
	if wasHealthy && ps.ConsecutiveFailures < r.ProbeFailureThreshold {
		// One lost probe does not flap a healthy proxy.
		logf.FromContext(ctx).V(1).Info("probe failed, below threshold", "failures", ps.ConsecutiveFailures, "err", res.Err)
		return ctrl.Result{RequeueAfter: r.ProvisionPollInterval}, nil
	}
	msg := fmt.Sprintf("%d consecutive probe failures, last after %s: %v", ps.ConsecutiveFailures, res.Latency.Round(time.Millisecond), res.Err)
	if hint := probeStatusHint(p, res.StatusCode); hint != "" {
		msg += "; " + hint
	}
	if why := r.Registry.CheckError(string(p.Spec.Provider)); why != nil {
		// e.g. no firewall rule admits the port: say so, not just "closed".
		msg += "; provider check fails: " + why.Error()
	}
	conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	if wasHealthy {
		// It served before: a failing proxy is re-read from the provider.
		r.MarkDirty(key)
	} else if after, ok := r.nextProbeBackoff(key, startsBackoff); ok {
		// The backoff soon reaches the poll interval, long before a
		// guest's squid starts; the watch notices the port opening
		// without a probe or a status write per look.
		r.watchPort(ctx, key, target)
		return ctrl.Result{RequeueAfter: after}, nil
	}
	return ctrl.Result{RequeueAfter: r.ProvisionPollInterval}, nil
}

// booting: the Proxy has not served since its instance was (re)started, so
// a closed port means it is still coming up, not broken.
func booting(p *crawlv1.Proxy) bool {
	return p.Status.Probe == nil || notReadySinceProvisioned(p) || startedAgain(p)
}

// settledAddress: p's address came from a source the provider will not
// replace with a better one. kvm prefers the DHCP lease, which can appear
// after the guest agent has reported the same address (or ARP seen it).
func settledAddress(p *crawlv1.Proxy) bool {
	return p.Status.AddressSource != provider.AddressSourceAgent && p.Status.AddressSource != provider.AddressSourceARP
}

// bootingResync bounds how long a booting Proxy with an address is only
// probed between reads of its instance. Its address seldom changes once
// leased, and a provider event (lifecycle, guest agent connected) or its
// port opening wakes it at once; the read catches what comes without one.
const bootingResync = 30 * time.Second

// notReadySinceProvisioned: the Proxy has not been Ready since its
// instance was last provisioned, so a closed port means it is still
// booting, not broken. Unlike the probe backoff's memory this survives a
// manager restart: Ready has been False since before InstanceProvisioned
// turned True (both times are whole seconds; a tie counts as booting).
func notReadySinceProvisioned(p *crawlv1.Proxy) bool {
	prov, ready := conditions.Get(p, crawlv1.InstanceProvisionedCondition), conditions.Get(p, crawlv1.ReadyCondition)
	if prov == nil || prov.Status != metav1.ConditionTrue {
		return false
	}
	if ready == nil {
		return true
	}
	return ready.Status != metav1.ConditionTrue && !ready.LastTransitionTime.After(prov.LastTransitionTime.Time)
}

// startedAgain: the instance was found not running and has been started
// again since (instanceDown's verdict stands until a probe replaces it), so
// it boots like a new one.
func startedAgain(p *crawlv1.Proxy) bool {
	c := conditions.Get(p, crawlv1.ProxyHealthyCondition)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == crawlv1.ProxyInstanceNotRunningReason
}

// probeStatusHint says what a refusal of the probe means for p.
func probeStatusHint(p *crawlv1.Proxy, status int) string {
	switch status {
	case http.StatusProxyAuthRequired:
		switch {
		case !p.IsManaged():
			return "the proxy asks for credentials, and the operator has none for a squid it does not manage (spec.access.managed false)"
		case p.Spec.Access.Auth != nil && p.Spec.Access.Auth.SecretRef != nil:
			return fmt.Sprintf("squid refused the credential of Secret %s (spec.access.auth.secretRef); a credential changed after the instance was created reaches squid only with a new instance", p.Spec.Access.Auth.SecretRef.Name)
		default:
			return fmt.Sprintf("squid refused the credential of Secret %s", crawlv1.CredentialsSecretName(p))
		}
	case http.StatusForbidden:
		return "the proxy refused the request: the manager's source address must be admitted (spec.access.allowedSourceCIDRs, or the manager's --probe-source-cidrs), " +
			"and the probe URL's destination must be allowed (spec.access.allowedDestinationExceptions for an internal one)"
	}
	return ""
}

// recordEgress keeps status.egressAddress at what the probe URL last
// echoed (empty when it echoes nothing), with an Event on each change.
func (r *ProxyReconciler) recordEgress(p *crawlv1.Proxy, addr string) {
	old := p.Status.EgressAddress
	if addr == old {
		return
	}
	p.Status.EgressAddress = addr
	if addr == "" {
		return
	}
	if old == "" {
		old = "none"
	}
	r.Recorder.Eventf(p, corev1.EventTypeNormal, "EgressAddressChanged", "egress address %s -> %s", old, addr)
}

// checkSecure sends one request without credentials and sets Secure from
// the answer. A managed squid with auth None is not asked: it serves
// whoever its source list admits, by design. A check that got no answer
// keeps the last verdict.
func (r *ProxyReconciler) checkSecure(ctx context.Context, p *crawlv1.Proxy, target proxyprobe.Target) {
	set := func(status metav1.ConditionStatus, reason, msg string) {
		if status == metav1.ConditionFalse && reason == crawlv1.ProxyOpenProxyReason && !conditions.IsFalse(p, crawlv1.SecureCondition) {
			r.Recorder.Eventf(p, corev1.EventTypeWarning, crawlv1.ProxyOpenProxyReason, "%s", msg)
		}
		conditions.Set(p, metav1.Condition{Type: crawlv1.SecureCondition, Status: status, Reason: reason, Message: msg})
	}
	if p.IsManaged() && proxyaccess.AuthType(p.Spec.Access) == squid.AuthNone {
		set(metav1.ConditionFalse, crawlv1.ProxySourceListOnlyReason, fmt.Sprintf(
			"auth type None: only spec.access.allowedSourceCIDRs (%s) guards this proxy", strings.Join(p.Spec.Access.AllowedSourceCIDRs, ", ")))
		return
	}
	target.Username, target.Password = "", ""
	res := r.Prober.ProbeWithoutCredentials(ctx, target)
	switch res.StatusCode {
	case http.StatusProxyAuthRequired:
		set(metav1.ConditionTrue, crawlv1.ProxyAuthRequiredReason, "a request without credentials was refused with 407")
	case 0:
		logf.FromContext(ctx).V(1).Info("request without credentials got no answer; Secure unchanged", "err", res.Err)
		if r := conditions.GetReason(p, crawlv1.SecureCondition); r == "" || r == crawlv1.ProxySecureUnknownReason {
			set(metav1.ConditionUnknown, crawlv1.ProxySecureUnknownReason, fmt.Sprintf("a request without credentials got no answer: %v", res.Err))
		}
	case http.StatusForbidden:
		// squid judges the source before credentials: a 403 says the
		// manager was refused, not whether others must authenticate.
		set(metav1.ConditionUnknown, crawlv1.ProxySecureUnknownReason,
			"a request without credentials was refused with 403 before any credential was asked for; admit the manager's source address to check (spec.access.allowedSourceCIDRs or --probe-source-cidrs)")
	default:
		msg := fmt.Sprintf("a request without credentials was answered with status %d instead of 407: the proxy serves whoever reaches it without authentication", res.StatusCode)
		if !p.IsManaged() {
			msg += "; its squid is the user's (spec.access.managed false or absent), whose configuration alone decides who that is"
		}
		set(metav1.ConditionFalse, crawlv1.ProxyOpenProxyReason, msg)
	}
}

// firstProbeBackoff is the first requeue of a new Proxy whose port is not
// open yet; it doubles up to ProvisionPollInterval. A guest's squid comes up
// seconds after its address, so a fixed poll would add most of a poll
// interval to time-to-Ready. A Proxy that was healthy keeps the poll
// interval (and the failure threshold): it is not booting.
const firstProbeBackoff = 500 * time.Millisecond

// nextProbeBackoff returns the requeue after a failed probe of a Proxy that
// has never been healthy: start says it is booting (first probe, or not
// Ready since provisioned), which begins the backoff if it has not begun;
// false means the Proxy is not backing off (it was healthy before).
func (r *ProxyReconciler) nextProbeBackoff(key types.NamespacedName, start bool) (time.Duration, bool) {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	d, ok := r.probeBackoff[key]
	if !ok {
		if !start {
			return 0, false
		}
		d = firstProbeBackoff
	}
	d = min(d, r.ProvisionPollInterval)
	r.probeBackoff[key] = min(2*d, r.ProvisionPollInterval)
	return d, true
}

// inProbeBackoff: key is booting by this manager's memory, which outlasts
// the conditions' evidence (an instance started again is booting, but its
// first failed probe replaces the InstanceNotRunning verdict).
func (r *ProxyReconciler) inProbeBackoff(key types.NamespacedName) bool {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	_, ok := r.probeBackoff[key]
	return ok
}

func (r *ProxyReconciler) endProbeBackoff(key types.NamespacedName) {
	r.memMu.Lock()
	delete(r.probeBackoff, key)
	r.memMu.Unlock()
	r.forgetPort(key)
}

// watchPort watches target's port for key (one watch per Proxy; see
// portwatch.Watcher.Watch).
func (r *ProxyReconciler) watchPort(ctx context.Context, key types.NamespacedName, target proxyprobe.Target) {
	if r.PortWatch == nil {
		return
	}
	if r.PortWatch.Watch(key, net.JoinHostPort(target.Address, strconv.Itoa(int(target.Port)))) {
		logf.FromContext(ctx).V(1).Info("watching the proxy port until it opens", "address", target.Address, "port", target.Port)
	}
}

func (r *ProxyReconciler) forgetPort(key types.NamespacedName) {
	if r.PortWatch != nil {
		r.PortWatch.Forget(key)
	}
}

// reconcileDelete removes the instance and releases the finalizer; the
// deferred patch writes the release.
func (r *ProxyReconciler) reconcileDelete(ctx context.Context, p *crawlv1.Proxy) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	if !controllerutil.ContainsFinalizer(p, crawlv1.ProxyFinalizer) {
		return ctrl.Result{}, nil
	}
	// Checked before any provider lookup: it frees a Proxy whose provider or
	// host is gone for good.
	if p.Annotations[crawlv1.SkipCleanupAnnotation] == "true" {
		log.Info("skip-cleanup set: releasing without touching the provider", "providerID", p.Status.ProviderID)
		r.Recorder.Eventf(p, "Warning", "CleanupSkipped", "instance %s left in place (annotation %s)", p.Status.ProviderID, crawlv1.SkipCleanupAnnotation)
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
	if p.Spec.Provider == crawlv1.ProviderKVM && m.Host == "" {
		// Never placed, so nothing was ever created.
		r.Recorder.Eventf(p, "Normal", "Deleted", "never placed on a host; nothing to delete")
		r.release(p)
		return ctrl.Result{}, nil
	}
	// Delete even when Get would fail: Delete is idempotent and can converge
	// where Get cannot.
	callCtx, cancel := r.providerCall(ctx)
	err = prov.Delete(callCtx, m)
	cancel()
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
	r.Recorder.Eventf(p, "Normal", "Deleted", "instance %s deleted", p.Status.ProviderID)
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

func (r *ProxyReconciler) setNotProvisioned(p *crawlv1.Proxy, reason, msg string) {
	conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
}

// forgetHealth drops the health verdict: it was about another instance or
// address, and the failure threshold must not keep a proxy that has never
// answered here Ready. The next probe starts from scratch (first-probe
// backoff and a new port watch included).
func (r *ProxyReconciler) forgetHealth(p *crawlv1.Proxy, why string) {
	conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionFalse,
		Reason: crawlv1.ProxyNotYetProbedReason, Message: why})
	p.Status.Probe = nil
	r.forgetPort(client.ObjectKeyFromObject(p))
}

func (r *ProxyReconciler) recordInstance(p *crawlv1.Proxy, inst *provider.Instance) {
	if inst == nil {
		return
	}
	switch prevID, prevAddr := p.Status.ProviderID, p.Status.Address; {
	case prevID != "" && inst.ProviderID != "" && inst.ProviderID != prevID:
		r.forgetHealth(p, fmt.Sprintf("a new instance %s replaced %s", inst.ProviderID, prevID))
	case prevAddr != "" && inst.Address != "" && inst.Address != prevAddr:
		r.forgetHealth(p, fmt.Sprintf("address changed from %s to %s", prevAddr, inst.Address))
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

// readWithin: key's instance was read from its provider less than d ago
// and no provider event about it came since.
func (r *ProxyReconciler) readWithin(key types.NamespacedName, d time.Duration) bool {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	t, ok := r.synced[key]
	return ok && r.Clock.Since(t) < d
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

// startProbe returns the context of key's probe, which InterruptProbe
// cancels, and the func that ends it. One reconcile per Proxy runs at a
// time, so there is at most one probe per key.
func (r *ProxyReconciler) startProbe(ctx context.Context, key types.NamespacedName) (context.Context, func()) {
	probeCtx, cancel := context.WithCancel(ctx)
	r.memMu.Lock()
	r.probing[key] = cancel
	r.memMu.Unlock()
	return probeCtx, func() {
		r.memMu.Lock()
		delete(r.probing, key)
		r.memMu.Unlock()
		cancel()
	}
}

// InterruptProbe cancels key's probe under way, if any: a provider event
// says its instance changed (see reconcileHealth).
func (r *ProxyReconciler) InterruptProbe(key types.NamespacedName) {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	if cancel, ok := r.probing[key]; ok {
		cancel()
	}
}

// notePortOpened is the port watch's report that key's port accepted at
// address (host:port); it comes just before the reconcile it wakes.
func (r *ProxyReconciler) notePortOpened(key types.NamespacedName, address string) {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	if r.portOpened == nil {
		r.portOpened = map[types.NamespacedName]string{}
	}
	r.portOpened[key] = address
}

// portJustOpened takes the port watch's report for p: whether its port
// accepted, since p's last reconcile, at the address and port in its
// status now (a report about an address since replaced says nothing).
func (r *ProxyReconciler) portJustOpened(p *crawlv1.Proxy) bool {
	key := client.ObjectKeyFromObject(p)
	r.memMu.Lock()
	address, ok := r.portOpened[key]
	delete(r.portOpened, key)
	r.memMu.Unlock()
	return ok && p.Status.Address != "" && address == net.JoinHostPort(p.Status.Address, strconv.Itoa(int(p.Spec.Port)))
}

// forget drops what the reconciler remembers of a Proxy.
func (r *ProxyReconciler) forget(key types.NamespacedName) {
	r.memMu.Lock()
	defer r.memMu.Unlock()
	delete(r.synced, key)
	delete(r.waiting, key)
	delete(r.probeBackoff, key)
	delete(r.portOpened, key)
	r.forgetPort(key)
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
