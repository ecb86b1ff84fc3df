package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
)

// ImageCacher is what the KVMImage controller needs from the kvm provider.
// The provider bounds concurrent uploads per host.
type ImageCacher interface {
	EnsureImage(ctx context.Context, host string, img provider.Image, progress kvm.Progress) (kvm.CachedImage, error)
}

// KVMImageReconciler caches every KVMImage on every Ready KVMHost: a Proxy
// then boots without waiting for a download, and a hostSelector may place it
// on any host. Downloads run as background jobs, one per image, host and
// checksum; reconciles only start them and report their progress.
type KVMImageReconciler struct {
	Client   client.Client
	Cacher   ImageCacher
	Recorder record.EventRecorder
	Clock    clock.PassiveClock
	// JobContext outlives single reconciles (the manager's context).
	JobContext context.Context
	// ProgressInterval between status updates while downloading.
	ProgressInterval time.Duration

	jobsMu sync.Mutex
	jobs   map[imageJobKey]*imageJob
	// finished carries a KVMImage whose job just ended, so its result is
	// reported at once rather than at the next progress poll.
	finished chan event.GenericEvent
	prunes   pruneClock // see kvmimage_prune.go
}

type imageJobKey struct{ image, host, checksum string }

type imageJob struct {
	cancel      context.CancelFunc
	mu          sync.Mutex
	done, total int64
	finished    bool
	result      kvm.CachedImage
	err         error
}

func (j *imageJob) snapshot() (done, total int64, finished bool, res kvm.CachedImage, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.done, j.total, j.finished, j.result, j.err
}

// +kubebuilder:rbac:groups=crawl.example.com,resources=kvmimages,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=kvmimages/status,verbs=get;update;patch

// SetupWithManager registers the controller; a KVMHost change (e.g. it
// becomes Ready) requeues every image.
func (r *KVMImageReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if err := r.complete(); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&crawlv1.KVMImage{}, builder.WithPredicates(specOrAnnotationChanged)).
		Watches(&crawlv1.KVMHost{}, handler.EnqueueRequestsFromMapFunc(r.allImages)).
		WatchesRawSource(source.Channel(r.finished, &handler.EnqueueRequestForObject{})).
		WithOptions(opts).
		Named("kvmimage").
		Complete(r)
}

func (r *KVMImageReconciler) complete() error {
	if err := requireDeps("KVMImageReconciler", map[string]bool{
		"Client": r.Client != nil, "Cacher": r.Cacher != nil, "Recorder": r.Recorder != nil, "JobContext": r.JobContext != nil,
	}); err != nil {
		return err
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.ProgressInterval == 0 {
		r.ProgressInterval = 2 * time.Second
	}
	r.jobs = map[imageJobKey]*imageJob{}
	r.finished = make(chan event.GenericEvent, 64)
	return nil
}

func (r *KVMImageReconciler) allImages(ctx context.Context, _ client.Object) []reconcile.Request {
	list := &crawlv1.KVMImageList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, img := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&img)})
	}
	return reqs
}

func (r *KVMImageReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	log := logf.FromContext(ctx).WithValues("image", req.Name)
	ctx = logf.IntoContext(ctx, log)
	img := &crawlv1.KVMImage{}
	if err := r.Client.Get(ctx, req.NamespacedName, img); err != nil {
		if apierrors.IsNotFound(err) {
			r.stopJobs(req.Name, nil)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !img.DeletionTimestamp.IsZero() {
		r.stopJobs(img.Name, nil)
		return r.reconcileDelete(ctx, img)
	}
	helper := newObjectPatcher(r.Client, img)
	defer func() {
		img.Status.ObservedGeneration = img.Generation
		helper.finish(ctx, img, &res, &reterr)
		reterr = client.IgnoreNotFound(reterr)
	}()
	return r.reconcileCache(ctx, img)
}

func (r *KVMImageReconciler) reconcileNormal(ctx context.Context, img *crawlv1.KVMImage) (ctrl.Result, error) {
	hosts := &crawlv1.KVMHostList{}
	if err := r.Client.List(ctx, hosts); err != nil {
		return ctrl.Result{}, err
	}
	var targets []string
	existing := map[string]bool{}
	for _, h := range hosts.Items {
		if h.DeletionTimestamp.IsZero() {
			existing[h.Name] = true
			if conditions.IsTrue(&h, crawlv1.ReadyCondition) {
				targets = append(targets, h.Name)
			}
		}
	}
	slices.Sort(targets)
	// A download for an old checksum, or to a host no longer Ready, is
	// wasted bandwidth and an upload slot taken: stop it.
	r.stopJobs(img.Name, func(k imageJobKey) bool {
		return k.checksum == img.Spec.Checksum && slices.Contains(targets, k.host)
	})

	var requeue time.Duration
	var entries []crawlv1.KVMImageHostStatus
	ready := 0
	for _, host := range targets {
		entry, again := r.reconcileHost(ctx, img, host)
		entries = append(entries, entry)
		if entry.Phase == crawlv1.ImageHostVerified {
			ready++
		}
		if again > 0 && (requeue == 0 || again < requeue) {
			requeue = again
		}
	}
	// A host that is only not Ready for now (a missed health check) keeps
	// its entry as it was: the volume is still there, and dropping the entry
	// would lose its verdict and the bytes it uses until the host returns.
	// Only a KVMHost that is gone takes its entry with it.
	for _, prev := range img.Status.Hosts {
		if existing[prev.Host] && !slices.Contains(targets, prev.Host) {
			entries = append(entries, prev)
		}
	}
	slices.SortFunc(entries, func(a, b crawlv1.KVMImageHostStatus) int { return strings.Compare(a.Host, b.Host) })
	img.Status.Hosts = entries
	img.Status.ReadyHosts, img.Status.TotalHosts = int32(ready), int32(len(targets))

	cond := metav1.Condition{Type: crawlv1.ReadyCondition}
	switch {
	case len(targets) == 0:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, crawlv1.ImageNoHostsReason, "no Ready KVMHost to cache on"
	case ready == len(targets):
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, crawlv1.ImageVerifiedReason, fmt.Sprintf("verified on %d hosts", ready)
	default:
		cond.Status, cond.Reason = metav1.ConditionFalse, crawlv1.ImagePendingReason
		cond.Message = fmt.Sprintf("verified on %d of %d hosts", ready, len(targets))
		for _, e := range entries {
			if e.Phase == crawlv1.ImageHostFailed {
				cond.Reason, cond.Message = crawlv1.ImageFailedReason, fmt.Sprintf("%s: %s", e.Host, e.Message)
				break
			}
		}
	}
	conditions.Set(img, cond)
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// reconcileHost starts or reports the caching job of img on host.
func (r *KVMImageReconciler) reconcileHost(ctx context.Context, img *crawlv1.KVMImage, host string) (crawlv1.KVMImageHostStatus, time.Duration) {
	prev := img.Status.HostStatus(host)
	entry := crawlv1.KVMImageHostStatus{Host: host, Phase: crawlv1.ImageHostPending}
	if prev != nil {
		entry = *prev
	}
	// A verified or permanently failed entry for the current checksum stands
	// until the checksum changes.
	// A failed entry is retried when the spec changes (e.g. a fixed URL).
	specChanged := img.Status.ObservedGeneration != img.Generation
	key := imageJobKey{image: img.Name, host: host, checksum: img.Spec.Checksum}
	if prev != nil && prev.Checksum == img.Spec.Checksum &&
		(prev.Phase == crawlv1.ImageHostVerified || prev.Phase == crawlv1.ImageHostFailed && !specChanged) {
		// A job a reconcile from a stale read started is not needed.
		r.dropJob(key)
		return entry, 0
	}

	job := r.startJob(ctx, key, kvm.ImageOf(img))
	done, total, finished, res, err := job.snapshot()
	setPhase := func(p crawlv1.ImageHostPhase) {
		if entry.Phase != p || entry.LastTransitionTime == nil {
			now := metav1.NewTime(r.Clock.Now())
			entry.LastTransitionTime = &now
		}
		entry.Phase = p
	}
	switch {
	case !finished:
		setPhase(crawlv1.ImageHostDownloading)
		entry.Verified, entry.Bytes, entry.TotalBytes = false, done, max(total, 0)
		entry.Message = fmt.Sprintf("%s of %s", humanBytes(uint64(done)), sizeOrUnknown(total))
		return entry, r.ProgressInterval
	case err == nil:
		setPhase(crawlv1.ImageHostVerified)
		entry.Verified, entry.Volume, entry.Bytes, entry.Checksum, entry.Message = true, res.Volume, res.Bytes, img.Spec.Checksum, ""
		entry.AllocatedBytes = res.Allocated
		r.Recorder.Eventf(img, "Normal", "Verified", "cached on %s as %s (%s)", host, res.Volume, humanBytes(uint64(res.Bytes)))
		r.dropJob(key)
		return entry, 0
	case provider.Class(err) == provider.ClassPermanent:
		setPhase(crawlv1.ImageHostFailed)
		entry.Verified, entry.Checksum, entry.Message = false, img.Spec.Checksum, err.Error()
		r.Recorder.Eventf(img, "Warning", "Failed", "%s: %v", host, err)
		r.dropJob(key)
		return entry, 0
	default:
		setPhase(crawlv1.ImageHostPending)
		entry.Verified, entry.Message = false, "retrying: "+err.Error()
		r.dropJob(key)
		return entry, 30 * time.Second
	}
}

func (r *KVMImageReconciler) startJob(ctx context.Context, key imageJobKey, img provider.Image) *imageJob {
	r.jobsMu.Lock()
	defer r.jobsMu.Unlock()
	if j, ok := r.jobs[key]; ok {
		return j
	}
	jobCtx, cancel := context.WithCancel(logf.IntoContext(r.JobContext, logf.FromContext(ctx).WithValues("host", key.host)))
	j := &imageJob{total: -1, cancel: cancel}
	r.jobs[key] = j
	go func() {
		res, err := r.Cacher.EnsureImage(jobCtx, key.host, img, func(done, total int64) {
			j.mu.Lock()
			j.done, j.total = done, total
			j.mu.Unlock()
		})
		j.mu.Lock()
		j.finished, j.result, j.err = true, res, err
		j.mu.Unlock()
		if jobCtx.Err() != nil {
			return // stopped: nobody waits for the result
		}
		obj := &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: key.image}}
		select {
		case r.finished <- event.GenericEvent{Object: obj}:
		case <-jobCtx.Done():
		}
	}()
	return j
}

// dropJob forgets a finished job.
func (r *KVMImageReconciler) dropJob(key imageJobKey) {
	r.jobsMu.Lock()
	defer r.jobsMu.Unlock()
	if j, ok := r.jobs[key]; ok {
		j.cancel()
		delete(r.jobs, key)
	}
}

// stopJobs cancels and forgets the jobs of image that keep (nil: none)
// rejects.
func (r *KVMImageReconciler) stopJobs(image string, keep func(imageJobKey) bool) {
	r.jobsMu.Lock()
	defer r.jobsMu.Unlock()
	for k, j := range r.jobs {
		if k.image == image && (keep == nil || !keep(k)) {
			j.cancel()
			delete(r.jobs, k)
		}
	}
}

func sizeOrUnknown(total int64) string {
	if total < 0 {
		return "unknown size"
	}
	return humanBytes(uint64(total))
}
