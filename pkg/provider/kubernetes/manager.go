package kubernetes

import (
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// Timings of the cluster range watch.
const (
	// rangeSettle lets a burst of changes (nodes joining together) end
	// before the ranges are read, so they cause one pass, not one each.
	rangeSettle = time.Second
	// rangeResync re-reads the ranges (the kubernetes Service has no
	// informer) and re-checks every ConfigMap against them: it also
	// catches a Proxy created while the ranges changed, whose ConfigMap
	// the cache had not shown yet. A pass that finds nothing to do reads
	// only the cache and one Service.
	rangeResync = time.Minute
	// rangeRetry follows a pass that failed.
	rangeRetry = 5 * time.Second
	// syncWarning is how long the informers may take to sync before the
	// watch says what it is waiting for.
	syncWarning = 30 * time.Second
)

// NewForManager is the provider as a manager runs it (main.go and the test
// harnesses): reading through mgr's cache and API reader, refusing the
// cluster's own ranges (ClusterRanges over mgr's cache, beside
// opts.ExtraClusterRanges) and keeping every Proxy's deny list current as
// they change, in place (applyClusterRanges). The watch runs on the
// leader, like the controllers that call Create. mgr's cache must be
// configured with CacheByObject.
func NewForManager(mgr manager.Manager, opts Options) (provider.Provider, error) {
	opts.APIReader = mgr.GetAPIReader()
	opts.ClusterRanges = NewClusterRanges(mgr.GetClient(), mgr.GetAPIReader())
	p := New(mgr.GetClient(), opts).(*Provider)
	if err := mgr.Add(&rangeWatch{p: p, cache: mgr.GetCache()}); err != nil {
		return nil, err
	}
	return p, nil
}

// rangeWatch refreshes the provider's ClusterRanges when a Node or a
// ServiceCIDR changes what it contributes (and every rangeResync), and
// applies them to every Proxy.
type rangeWatch struct {
	p     *Provider
	cache cache.Cache
}

// NeedLeaderElection: it writes ConfigMaps and NetworkPolicies.
func (w *rangeWatch) NeedLeaderElection() bool { return true }

func (w *rangeWatch) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("cluster-ranges")
	ctx = log.IntoContext(ctx, logger)
	poke := make(chan struct{}, 1)
	kick := func() {
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		DeleteFunc: func(any) { kick() },
		UpdateFunc: func(old, cur any) {
			if !slices.Equal(rangeValues(old), rangeValues(cur)) {
				kick()
			}
		},
	}
	var informers []cache.Informer
	for _, obj := range []client.Object{&corev1.Node{}, &networkingv1.ServiceCIDR{}} {
		inf, err := w.cache.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
		if meta.IsNoMatchError(err) {
			logger.Info("the cluster does not serve the ServiceCIDR API: of the Service range only the kubernetes Service's address is refused; name the range in --kubernetes-cluster-ranges")
			continue
		}
		if err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
		informers = append(informers, inf)
	}
	for !w.synced(ctx, informers) {
		if ctx.Err() != nil {
			return nil
		}
		logger.Info("WARNING: the Node and ServiceCIDR informers have not synced yet; kubernetes Proxies are not created until they have (the manager needs list and watch on nodes and servicecidrs)")
	}

	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-poke:
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(rangeSettle):
			}
		case <-timer.C:
		}
		next := rangeResync
		if err := w.pass(ctx); err != nil {
			logger.Error(err, "keeping the proxies' deny lists current; trying again", "after", rangeRetry)
			next = rangeRetry
		}
		timer.Reset(next)
	}
}

// synced waits up to syncWarning for every informer.
func (w *rangeWatch) synced(ctx context.Context, informers []cache.Informer) bool {
	wait, cancel := context.WithTimeout(ctx, syncWarning)
	defer cancel()
	var synced []toolscache.InformerSynced
	for _, inf := range informers {
		synced = append(synced, inf.HasSynced)
	}
	return toolscache.WaitForCacheSync(wait.Done(), synced...)
}

// pass reads the ranges and applies them.
func (w *rangeWatch) pass(ctx context.Context) error {
	ranges, changed, skipped, err := w.p.opts.ClusterRanges.Refresh(ctx)
	if err != nil {
		return err
	}
	if changed {
		log.FromContext(ctx).Info("the cluster's own ranges, refused by every kubernetes Proxy", "ranges", formatPrefixes(ranges),
			"extra", formatPrefixes(w.p.opts.ExtraClusterRanges), "notAddresses", skipped)
	}
	updated, err := w.p.applyClusterRanges(ctx, ranges)
	if updated > 0 {
		log.FromContext(ctx).Info("updated the proxies' deny lists in place (ConfigMap, NetworkPolicy)", "proxies", updated)
	}
	return err
}
