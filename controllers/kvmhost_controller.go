package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
)

const (
	// KVMHostFinalizer holds a KVMHost while Proxies still live on it, so
	// their deletion can still reach the host.
	KVMHostFinalizer = "crawl.example.com/kvmhost"

	// statusHeartbeat: an unchanged status is rewritten at most this often
	// (only lastCheckTime moves), so a healthy fleet costs no write per check.
	statusHeartbeat = 5 * time.Minute

	// ProxyHostIndex indexes Proxies by the KVMHost they are on or placed on.
	ProxyHostIndex = "crawl.example.com/host"
)

// HostProber is what the KVMHost controller needs from the kvm provider.
type HostProber interface {
	Probe(ctx context.Context, host string) (kvm.HostHealth, error)
	ForgetHost(host string)
}

// KVMHostReconciler checks each hypervisor's health every check interval.
type KVMHostReconciler struct {
	Client   client.Client
	Prober   HostProber
	Recorder record.EventRecorder
	Clock    clock.PassiveClock
	// DefaultInterval and DefaultTimeout come from --provider-check-interval
	// and --provider-check-timeout (0: derived).
	DefaultInterval time.Duration
	DefaultTimeout  time.Duration
}

// +kubebuilder:rbac:groups=crawl.example.com,resources=kvmhosts,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=kvmhosts/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=kvmhosts/finalizers,verbs=update
// SSH Secrets are read only from the manager's own namespace (config/ binds
// this Role there; the KVMHost webhook and KubeHosts refuse other namespaces).
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=get

// SetupWithManager registers the controller. Every host is its own reconcile,
// so hosts are checked concurrently up to opts.MaxConcurrentReconciles, each
// bounded by its timeout.
func (r *KVMHostReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if err := requireDeps("KVMHostReconciler", map[string]bool{
		"Client": r.Client != nil, "Prober": r.Prober != nil, "Recorder": r.Recorder != nil,
	}); err != nil {
		return err
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.DefaultInterval == 0 {
		r.DefaultInterval = crawlv1.DefaultCheckInterval
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&crawlv1.KVMHost{}, builder.WithPredicates(specOrAnnotationChanged)).
		WithOptions(opts).
		Named("kvmhost").
		Complete(r)
}

// IndexProxyHost registers the Proxy-by-host index the KVMHost finalizer uses.
func IndexProxyHost(ctx context.Context, mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(ctx, &crawlv1.Proxy{}, ProxyHostIndex, func(o client.Object) []string {
		p := o.(*crawlv1.Proxy)
		var hosts []string
		for _, h := range []string{p.Status.Host, p.Spec.Placement.Host} {
			if h != "" && (len(hosts) == 0 || hosts[0] != h) {
				hosts = append(hosts, h)
			}
		}
		return hosts
	})
}

// timing returns the interval and timeout in force for h.
func (r *KVMHostReconciler) timing(h *crawlv1.KVMHost) (interval, timeout time.Duration) {
	interval, timeout = r.DefaultInterval, r.DefaultTimeout
	if h.Spec.CheckInterval != nil && h.Spec.CheckInterval.Duration > 0 {
		interval, timeout = h.Spec.CheckInterval.Duration, 0
	}
	if h.Spec.CheckTimeout != nil && h.Spec.CheckTimeout.Duration > 0 {
		timeout = h.Spec.CheckTimeout.Duration
	}
	return interval, crawlv1.EffectiveCheckTimeout(interval, timeout)
}

func (r *KVMHostReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	log := logf.FromContext(ctx).WithValues("host", req.Name)
	ctx = logf.IntoContext(ctx, log)

	h := &crawlv1.KVMHost{}
	if err := r.Client.Get(ctx, req.NamespacedName, h); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if h.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(h, KVMHostFinalizer) {
		// Written before the first check, then the check goes on.
		orig := h.DeepCopy()
		controllerutil.AddFinalizer(h, KVMHostFinalizer)
		if err := r.Client.Patch(ctx, h, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, err
		}
	}
	helper := newObjectPatcher(r.Client, h)
	before := h.DeepCopy()
	defer func() {
		r.emitTransition(before, h)
		// Also writes a released finalizer.
		helper.finish(ctx, h, &res, &reterr)
	}()

	if !h.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, h)
	}
	return r.reconcileNormal(ctx, h, before)
}

func (r *KVMHostReconciler) reconcileNormal(ctx context.Context, h *crawlv1.KVMHost, before *crawlv1.KVMHost) (ctrl.Result, error) {
	interval, timeout := r.timing(h)
	probeCtx, cancel := context.WithTimeout(ctx, timeout)
	start := r.Clock.Now()
	health, err := r.Prober.Probe(probeCtx, h.Name)
	cancel()
	took := r.Clock.Since(start)

	reason := kvm.Reason(err)
	recordHostCheck(h.Name, reason, took, err)
	cond := metav1.Condition{Type: crawlv1.ReadyCondition, Reason: reason}
	if err != nil {
		cond.Status, cond.Message = metav1.ConditionFalse, err.Error()
		if reason == crawlv1.HostTimeoutReason {
			cond.Message = fmt.Sprintf("no answer within %s: %v", timeout, err)
		}
		logf.FromContext(ctx).V(1).Info("health check failed", "reason", reason, "took", took, "err", err)
	} else {
		cond.Status = metav1.ConditionTrue
		cond.Message = fmt.Sprintf("libvirt %s on %s, pool %s running", health.LibvirtVersion, health.Hostname, health.Pool.Name)
		h.Status.LibvirtVersion = health.LibvirtVersion
		h.Status.Hostname = health.Hostname
		h.Status.Pool = &crawlv1.PoolStatus{
			Name:            health.Pool.Name,
			CapacityBytes:   int64(health.Pool.Capacity),
			AllocationBytes: int64(health.Pool.Allocation),
			AvailableBytes:  int64(health.Pool.Available),
			Available:       humanBytes(health.Pool.Available),
		}
		c := health.Capacity
		h.Status.Capacity = &crawlv1.HostCapacity{
			CPUs:                 c.CPUs,
			MemoryBytes:          int64(c.MemoryBytes),
			FreeMemoryBytes:      int64(c.FreeMemoryBytes),
			FreeMemory:           humanBytes(c.FreeMemoryBytes),
			RunningDomains:       c.RunningDomains,
			AllocatedVCPUs:       c.AllocatedVCPUs,
			AllocatedMemoryBytes: int64(c.AllocatedMemoryBytes),
		}
	}
	conditions.Set(h, cond)
	h.Status.ObservedGeneration = h.Generation

	// Write lastCheckTime only when something else changed, or as a
	// heartbeat; otherwise restore the old status so the patch is empty.
	now := metav1.NewTime(r.Clock.Now())
	if statusChanged(&before.Status, &h.Status) || before.Status.LastCheckTime == nil ||
		r.Clock.Since(before.Status.LastCheckTime.Time) >= statusHeartbeat {
		h.Status.LastCheckTime = &now
	} else {
		h.Status = before.Status
	}
	return ctrl.Result{RequeueAfter: interval}, nil
}

func (r *KVMHostReconciler) reconcileDelete(ctx context.Context, h *crawlv1.KVMHost) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(h, KVMHostFinalizer) {
		return ctrl.Result{}, nil
	}
	proxies := &crawlv1.ProxyList{}
	if err := r.Client.List(ctx, proxies, client.MatchingFields{ProxyHostIndex: h.Name}); err != nil {
		return ctrl.Result{}, err
	}
	if n := len(proxies.Items); n > 0 {
		conditions.Set(h, metav1.Condition{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse,
			Reason:  crawlv1.HostProxiesRemainingReason,
			Message: fmt.Sprintf("deletion waits for %d Proxies on this host (first: %s/%s)", n, proxies.Items[0].Namespace, proxies.Items[0].Name)})
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	}
	r.Prober.ForgetHost(h.Name)
	forgetHostMetrics(h.Name)
	controllerutil.RemoveFinalizer(h, KVMHostFinalizer)
	return ctrl.Result{}, nil
}

// emitTransition records an Event when Ready changes status or reason, not
// on every check.
func (r *KVMHostReconciler) emitTransition(before, after *crawlv1.KVMHost) {
	b, a := conditions.Get(before, crawlv1.ReadyCondition), conditions.Get(after, crawlv1.ReadyCondition)
	if a == nil || (b != nil && b.Status == a.Status && b.Reason == a.Reason) {
		return
	}
	typ := "Normal"
	if a.Status != metav1.ConditionTrue {
		typ = "Warning"
	}
	r.Recorder.Eventf(after, typ, "Host"+a.Reason, "%s", a.Message)
}

// statusChanged compares everything but lastCheckTime, condition times and
// the exact bytes of the pool and of free memory.
func statusChanged(a, b *crawlv1.KVMHostStatus) bool {
	ac, bc := a.DeepCopy(), b.DeepCopy()
	ac.LastCheckTime, bc.LastCheckTime = nil, nil
	for _, s := range []*crawlv1.KVMHostStatus{ac, bc} {
		// Pool bytes move with every write on the host; the rounded
		// Available string is what counts as a change.
		if s.Pool != nil {
			s.Pool.CapacityBytes, s.Pool.AllocationBytes, s.Pool.AvailableBytes = 0, 0, 0
		}
		// Likewise free memory; what domains were given is exact, so a
		// domain starting or stopping is written at the check that sees it.
		if s.Capacity != nil {
			s.Capacity.FreeMemoryBytes = 0
		}
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
			s.Conditions[i].ObservedGeneration = 0
		}
	}
	return !equality.Semantic.DeepEqual(ac, bc)
}

// humanBytes rounds to 0.1Gi, or to whole Mi below 1Gi: coarse enough that
// a status holding it is not rewritten for every byte a host moves.
func humanBytes(n uint64) string {
	const mi, gi = 1 << 20, 1 << 30
	if n >= gi {
		return fmt.Sprintf("%.1fGi", float64(n)/gi)
	}
	return fmt.Sprintf("%dMi", n/mi)
}
