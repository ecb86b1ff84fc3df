package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/image"
)

// KVMImageFinalizer holds a deleted KVMImage until its cached volumes are
// gone from every Ready host, or are another image's.
const KVMImageFinalizer = "crawl.example.com/image-cache"

// ImagePruner deletes cached images nobody wants or uses; *kvm.Provider
// implements it. An ImageCacher without it gets no finalizer and no pruning.
type ImagePruner interface {
	PruneImages(ctx context.Context, host string, keep func(digest string) bool) (image.PruneResult, error)
}

const (
	// imagePruneInterval paces the prune pass a Ready image makes: volumes
	// of superseded checksums become prunable when their last VM goes,
	// which no event of ours announces.
	imagePruneInterval = 10 * time.Minute
	// A deleted image whose volume still backs a VM disk looks again after
	// a quarter of the time it has waited, within these bounds: soon after
	// the last Proxy goes, and cheaply for long-lived VMs.
	imageInUseMinRetry = 5 * time.Second
	imageInUseMaxRetry = 5 * time.Minute
)

// +kubebuilder:rbac:groups=crawl.example.com,resources=kvmimages/finalizers,verbs=update
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies,verbs=get;list;watch

func (r *KVMImageReconciler) pruner() ImagePruner {
	p, _ := r.Cacher.(ImagePruner)
	return p
}

// reconcileCache is reconcileNormal with the cache's bookkeeping around it:
// the finalizer, the checksum history (spec.retain) and, once the current
// checksum is verified everywhere, a prune pass on each of its hosts that
// has had none for imagePruneInterval. A pass is pool-wide, so however many
// images a host caches it makes one per interval; a changed checksum makes
// its hosts due at once.
func (r *KVMImageReconciler) reconcileCache(ctx context.Context, img *crawlv1.KVMImage) (ctrl.Result, error) {
	pr := r.pruner()
	if pr == nil {
		return r.reconcileNormal(ctx, img)
	}
	controllerutil.AddFinalizer(img, KVMImageFinalizer)
	if recordChecksum(img) {
		for _, h := range img.Status.Hosts {
			r.prunes.forget(h.Host)
		}
	}
	res, err := r.reconcileNormal(ctx, img)
	if err != nil || !conditions.IsTrue(img, crawlv1.ReadyCondition) {
		return res, err
	}
	now := r.Clock.Now()
	var due []string
	for _, h := range img.Status.Hosts {
		if r.prunes.due(h.Host, now) {
			due = append(due, h.Host)
		}
	}
	if len(due) == 0 {
		return requeueSooner(res, imagePruneInterval), nil
	}
	keep, err := r.wantedDigests(ctx, "")
	if err != nil {
		return res, err
	}
	log := logf.FromContext(ctx)
	for _, host := range due {
		// A failed pass is retried at the next interval: it frees space,
		// it does not make the image less Ready.
		pruned, err := pr.PruneImages(ctx, host, keep)
		if err != nil {
			log.Error(err, "Pruning the image cache failed", "host", host)
			continue
		}
		r.prunes.done(host, now)
		if len(pruned.Deleted) > 0 {
			log.Info("Pruned image cache", "host", host, "volumes", strings.Join(pruned.Deleted, ","))
		}
	}
	return requeueSooner(res, imagePruneInterval), nil
}

// reconcileDelete prunes a deleted image's volumes from every Ready host and
// then releases it. A volume still backing a VM disk holds the finalizer;
// one another live KVMImage (or a Proxy's image URL) names is that one's and
// does not. A host that is not Ready is skipped: a later prune pass there
// collects what is left.
func (r *KVMImageReconciler) reconcileDelete(ctx context.Context, img *crawlv1.KVMImage) (ctrl.Result, error) {
	pr := r.pruner()
	if pr == nil || !controllerutil.ContainsFinalizer(img, KVMImageFinalizer) {
		return ctrl.Result{}, nil
	}
	log := logf.FromContext(ctx)
	keep, err := r.wantedDigests(ctx, img.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	mine := map[string]bool{}
	for _, c := range append([]string{img.Spec.Checksum}, img.Status.Checksums...) {
		if d, err := image.ParseChecksum(c); err == nil {
			mine[d] = true
		}
	}
	hosts := &crawlv1.KVMHostList{}
	if err := r.Client.List(ctx, hosts); err != nil {
		return ctrl.Result{}, err
	}
	var errs []error
	var inUse []string
	for _, h := range hosts.Items {
		if !conditions.IsTrue(&h, crawlv1.ReadyCondition) {
			log.Info("Host not Ready; its copy is left to a later prune pass", "host", h.Name)
			continue
		}
		res, err := pr.PruneImages(ctx, h.Name, keep)
		if err != nil {
			errs = append(errs, fmt.Errorf("host %s: %w", h.Name, err))
		}
		for _, d := range res.InUse {
			if mine[d] {
				inUse = append(inUse, h.Name)
				break
			}
		}
		if len(res.Deleted) > 0 {
			log.Info("Deleted cached image volumes", "host", h.Name, "volumes", strings.Join(res.Deleted, ","))
		}
	}
	if len(errs) > 0 {
		return ctrl.Result{}, kerrors.NewAggregate(errs)
	}
	if len(inUse) > 0 {
		r.Recorder.Eventf(img, "Normal", "ImageInUse", "cached volume still backs VM disks on %s; deleting it once they are gone", strings.Join(inUse, ", "))
		waited := r.Clock.Now().Sub(img.DeletionTimestamp.Time)
		return ctrl.Result{RequeueAfter: min(max(waited/4, imageInUseMinRetry), imageInUseMaxRetry)}, nil
	}
	helper := newObjectPatcher(r.Client, img)
	controllerutil.RemoveFinalizer(img, KVMImageFinalizer)
	var res ctrl.Result
	var werr error
	helper.finish(ctx, img, &res, &werr)
	return res, client.IgnoreNotFound(werr)
}

// recordChecksum puts the current checksum first in status.checksums and
// trims the list to spec.retain; it reports whether the list changed (what
// the pool should hold did).
func recordChecksum(img *crawlv1.KVMImage) (changed bool) {
	retain := max(int(img.Spec.Retain), 1)
	list := slices.DeleteFunc(slices.Clone(img.Status.Checksums), func(c string) bool { return strings.EqualFold(c, img.Spec.Checksum) })
	list = append([]string{img.Spec.Checksum}, list...)
	list = list[:min(len(list), retain)]
	changed = !slices.Equal(list, img.Status.Checksums)
	img.Status.Checksums = list
	return changed
}

// wantedDigests returns the digests that must stay cached: every retained
// checksum of each KVMImage not being deleted (except), and the checksum of
// every Proxy that names an image URL. Proxies using a KVMImage are covered
// by it; a VM's disk protects its image by itself (Prune checks chains).
func (r *KVMImageReconciler) wantedDigests(ctx context.Context, except string) (func(string) bool, error) {
	want := map[string]bool{}
	add := func(c string) {
		if d, err := image.ParseChecksum(c); err == nil {
			want[d] = true
		}
	}
	images := &crawlv1.KVMImageList{}
	if err := r.Client.List(ctx, images); err != nil {
		return nil, err
	}
	for _, i := range images.Items {
		if i.Name == except || !i.DeletionTimestamp.IsZero() {
			continue
		}
		add(i.Spec.Checksum)
		for _, c := range i.Status.Checksums[:min(len(i.Status.Checksums), max(int(i.Spec.Retain), 1))] {
			add(c)
		}
	}
	proxies := &crawlv1.ProxyList{}
	if err := r.Client.List(ctx, proxies); err != nil {
		return nil, err
	}
	for _, p := range proxies.Items {
		if crawlv1.IsImageURL(p.Spec.Placement.Image) {
			add(p.Spec.Placement.ImageChecksum)
		}
	}
	return func(d string) bool { return want[d] }, nil
}

func requeueSooner(res ctrl.Result, d time.Duration) ctrl.Result {
	if res.RequeueAfter == 0 || d < res.RequeueAfter {
		res.RequeueAfter = d
	}
	return res
}

// pruneClock remembers when each host last had a prune pass. The zero value
// is ready; the times are lost on restart, which costs one pass.
type pruneClock struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (c *pruneClock) due(host string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.last[host]
	return !ok || now.Sub(t) >= imagePruneInterval
}

func (c *pruneClock) done(host string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]time.Time{}
	}
	c.last[host] = now
}

func (c *pruneClock) forget(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.last, host)
}
