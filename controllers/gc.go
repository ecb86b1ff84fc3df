package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// OrphanCollector periodically deletes instances that carry our tag and
// this install's id but whose Proxy (by UID) no longer exists in this
// cluster. Instances without our tag are never listed; instances of another
// install, or of none (made before install ids), are never deleted: their
// Proxy lives, or lived, in a cluster this one cannot see. Instances whose
// Proxy exists are never touched; Delete itself re-checks identity on the
// instance.
type OrphanCollector struct {
	// Reader must read the API server directly, not a cache: a cache that
	// has not caught up would make a live Proxy look gone.
	Reader   client.Reader
	Registry *provider.Registry
	// Plugins are the providers' plug-ins (Plugins): where an orphan's
	// Event goes. Required.
	Plugins plugin.List
	Tag     string
	// InstallID is this install's id (ResolveInstallID), the one the
	// providers were built with.
	InstallID string
	Interval  time.Duration
	// CallTimeout bounds each provider call and owner lookup of a sweep;
	// default DefaultSweepCallTimeout.
	CallTimeout time.Duration
	// Recorder gets an OrphanDeleted Event per deleted instance (see
	// recordDeleted). Required.
	Recorder record.EventRecorder
	// VolumeGrace is how long a remembered Proxy's volumes must have been
	// unused and its Proxy gone before they are swept (see sweepVolumes);
	// default DefaultVolumeGrace.
	VolumeGrace time.Duration
	// Clock measures VolumeGrace; nil: the real clock.
	Clock clock.PassiveClock

	mu sync.Mutex
	// seen remembers, per kvm host, the Proxies whose domains ListByTag
	// returned with this install's id: the only owners whose leftover
	// volumes are provably ours.
	seen map[string]map[string]*seenOwner
}

// seenOwner is a Proxy this manager saw a domain of; since is when its
// volumes were first found unused with the Proxy gone (zero: not so at the
// last pass).
type seenOwner struct {
	owner provider.Owner
	since time.Time
}

// DefaultVolumeGrace outlasts any Create in flight by far (its calls are
// bounded by the provider call timeout), so a volume being made for a
// Proxy deleted meanwhile is not swept under it.
const DefaultVolumeGrace = 10 * time.Minute

// OrphanDeletedReason is the reason of the Event recorded per swept instance.
const OrphanDeletedReason = "OrphanDeleted"

// DefaultSweepCallTimeout bounds one list or delete of the sweep: long
// enough for a GCE delete operation, short enough that a wedged host delays
// the pass by minutes, not forever.
const DefaultSweepCallTimeout = 2 * time.Minute

// Start runs the sweep until ctx ends (a manager Runnable).
func (c *OrphanCollector) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("orphan-collector")
	ctx = logf.IntoContext(ctx, log)
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if n, err := c.Sweep(ctx); err != nil {
				log.Error(err, "orphan sweep incomplete", "deleted", n)
			} else if n > 0 {
				log.Info("orphan sweep", "deleted", n)
			}
		}
	}
}

// NeedLeaderElection: only the leader sweeps.
func (c *OrphanCollector) NeedLeaderElection() bool { return true }

// Sweep runs one pass over every constructed provider and returns how many
// orphans (instances, and volumes of kvm domains gone, see sweepVolumes) it
// deleted. Every provider call and owner lookup gets CallTimeout,
// so a host or cloud that does not answer costs the pass one deadline per
// call, never the pass: the other providers and hosts are still swept, and
// the remaining orphans of a host that let a delete run out of time wait for
// the next pass instead of a deadline each.
func (c *OrphanCollector) Sweep(ctx context.Context) (int, error) {
	log := logf.FromContext(ctx)
	// Without an install id nothing is provably ours.
	if err := provider.ValidateInstallID(c.InstallID); err != nil {
		return 0, fmt.Errorf("orphan sweep: %w", err)
	}
	if c.Recorder == nil {
		return 0, errors.New("orphan sweep: no event recorder")
	}
	if c.Plugins == nil {
		return 0, errors.New("orphan sweep: no provider plug-ins")
	}
	timeout := c.CallTimeout
	if timeout <= 0 {
		timeout = DefaultSweepCallTimeout
	}
	deleted := 0
	var errs []error
	for _, prov := range c.Registry.Constructed() {
		listCtx, cancel := context.WithTimeout(ctx, timeout)
		instances, err := prov.ListByTag(listCtx, c.Tag)
		cancel()
		if err != nil {
			// An unreachable host fails its part of this provider's
			// sweep, not the other hosts' or providers'.
			log.Error(err, "list tagged instances", "provider", prov.Name())
			errs = append(errs, fmt.Errorf("%s: %w", prov.Name(), err))
		}
		unanswered := map[string]bool{} // hosts where a call ran out of time
		vs, sweepsVolumes := prov.(plugin.VolumeSweeper)
		listed := map[string]map[string]bool{} // host -> UIDs listed this pass
		if sweepsVolumes {
			listed = c.remember(instances)
		}
		for _, inst := range instances {
			// ListByTag promised this install's only; a provider built
			// with another id (or none) must not make us delete.
			if inst.InstallID != c.InstallID {
				log.V(1).Info("skipping instance of another install", "provider", prov.Name(), "instance", inst.Name, "host", inst.Host, "install", inst.InstallID)
				continue
			}
			if unanswered[inst.Host] {
				continue
			}
			orphan, err := c.isOrphan(ctx, timeout, inst.Owner)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !orphan {
				continue
			}
			m := &provider.Machine{
				Namespace: inst.Owner.Namespace, Name: inst.Owner.Name, UID: inst.Owner.UID,
				ProviderID: inst.ProviderID, Host: inst.Host, Tag: c.Tag,
			}
			delCtx, cancel := context.WithTimeout(ctx, timeout)
			err = prov.Delete(delCtx, m)
			timedOut := delCtx.Err() == context.DeadlineExceeded
			cancel()
			if err != nil {
				log.Error(err, "delete orphan", "provider", prov.Name(), "instance", inst.Name, "host", inst.Host)
				errs = append(errs, fmt.Errorf("%s: delete orphan %s on %q: %w", prov.Name(), inst.Name, inst.Host, err))
				if timedOut {
					unanswered[inst.Host] = true
				}
				continue
			}
			deleted++
			log.Info("deleted orphan instance", "provider", prov.Name(), "instance", inst.Name, "host", inst.Host,
				"proxy", types.NamespacedName{Namespace: inst.Owner.Namespace, Name: inst.Owner.Name}, "uid", inst.Owner.UID)
			c.recordDeleted(ctx, timeout, prov.Name(), inst.Host, inst.Owner,
				fmt.Sprintf("deleted orphan %s instance %s on %s: its Proxy %s/%s (uid %s) no longer exists",
					prov.Name(), inst.Name, inst.Host, inst.Owner.Namespace, inst.Owner.Name, inst.Owner.UID))
		}
		if sweepsVolumes {
			n, err := c.sweepVolumes(ctx, timeout, prov.Name(), vs, listed, unanswered)
			deleted += n
			errs = append(errs, err)
		}
	}
	return deleted, errors.Join(errs...)
}

// remember records the owners of this install's listed domains and returns
// the listed UIDs per host.
func (c *OrphanCollector) remember(instances []provider.Instance) map[string]map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]map[string]*seenOwner{}
	}
	listed := map[string]map[string]bool{}
	for _, inst := range instances {
		if inst.InstallID != c.InstallID || inst.Owner.UID == "" || inst.Owner.Namespace == "" || inst.Owner.Name == "" {
			continue
		}
		if c.seen[inst.Host] == nil {
			c.seen[inst.Host] = map[string]*seenOwner{}
		}
		if c.seen[inst.Host][inst.Owner.UID] == nil {
			c.seen[inst.Host][inst.Owner.UID] = &seenOwner{owner: inst.Owner}
		}
		if listed[inst.Host] == nil {
			listed[inst.Host] = map[string]bool{}
		}
		listed[inst.Host][inst.Owner.UID] = true
	}
	return listed
}

// sweepVolumes deletes the volumes (proxy-<uid>-*) a domain of this install
// left behind when it was undefined outside the operator. Volumes carry no
// metadata, so a UID's volumes go only when (1) this manager saw a domain
// of that UID with this install's id on that host, (2) SweepVolumes finds
// no domain on the host mentioning the UID and no volume backed by them,
// (3) no Proxy with the UID exists, and (4) all three have held for
// VolumeGrace, measured from the first pass that found them. A UID never
// seen (another install's, or leaked while no manager ran) is never swept.
func (c *OrphanCollector) sweepVolumes(ctx context.Context, timeout time.Duration, providerName string, vs plugin.VolumeSweeper,
	listed map[string]map[string]bool, unanswered map[string]bool) (int, error) {
	log := logf.FromContext(ctx)
	grace := c.VolumeGrace
	if grace <= 0 {
		grace = DefaultVolumeGrace
	}
	clk := c.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	hosts := slices.Sorted(maps.Keys(c.seen))
	deleted := 0
	var errs []error
	for _, host := range hosts {
		if unanswered[host] {
			continue
		}
		owners := c.seen[host]
		// Whose Proxy is gone: asked outside the host's call, and only for
		// owners whose domain was not listed (a listed one protects its
		// volumes by itself).
		gone := map[string]bool{}
		for uid, o := range owners {
			if listed[host][uid] {
				continue
			}
			orphan, err := c.isOrphan(ctx, timeout, o.owner)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			gone[uid] = orphan
		}
		now := clk.Now()
		collect := func(uid string) bool {
			o := owners[uid]
			if o == nil || !gone[uid] {
				return false
			}
			if o.since.IsZero() {
				o.since = now
				return false
			}
			return now.Sub(o.since) >= grace
		}
		callCtx, cancel := context.WithTimeout(ctx, timeout)
		candidates, vols, err := vs.SweepVolumes(callCtx, host, collect)
		cancel()
		c.recordVolumes(ctx, timeout, providerName, vs, host, owners, vols)
		deleted += len(vols)
		if err != nil {
			log.Error(err, "sweep volumes", "provider", providerName, "host", host)
			errs = append(errs, fmt.Errorf("%s: sweep volumes on %q: %w", providerName, host, err))
			// Unproven this pass: the grace period starts again.
			for _, o := range owners {
				o.since = time.Time{}
			}
			continue
		}
		for uid, o := range owners {
			switch {
			case listed[host][uid]:
				o.since = time.Time{}
			case !slices.Contains(candidates, uid):
				// Nothing of it is left unused: forget it (forgetting only
				// ever keeps volumes).
				delete(owners, uid)
			case !gone[uid]:
				o.since = time.Time{}
			}
		}
		if len(owners) == 0 {
			delete(c.seen, host)
		}
	}
	return deleted, errors.Join(errs...)
}

// recordVolumes logs and records an Event per swept volume.
func (c *OrphanCollector) recordVolumes(ctx context.Context, timeout time.Duration, providerName string, vs plugin.VolumeSweeper,
	host string, owners map[string]*seenOwner, vols []string) {
	log := logf.FromContext(ctx)
	for _, vol := range vols {
		uid, _ := vs.VolumeOwnerUID(vol)
		o := provider.Owner{UID: uid}
		if so := owners[uid]; so != nil {
			o = so.owner
		}
		log.Info("deleted orphan volume", "provider", providerName, "host", host, "volume", vol,
			"proxy", types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, "uid", o.UID)
		c.recordDeleted(ctx, timeout, providerName, host, o,
			fmt.Sprintf("deleted orphan %s volume %s on %s: its domain is gone and its Proxy %s/%s (uid %s) no longer exists",
				providerName, vol, host, o.Namespace, o.Name, o.UID))
	}
}

// recordDeleted records an OrphanDeleted Event for a swept instance. Its
// Proxy is gone, so the Event goes where someone will look: on the KVMHost
// for a provider of the Hosts domain (cluster-scoped, it outlives the
// Proxy's namespace and is where an admin looks at a host's history), else
// on the gone Proxy itself, by reference, in its namespace (kubectl get
// events -n NS).
func (c *OrphanCollector) recordDeleted(ctx context.Context, timeout time.Duration, providerName, host string, owner provider.Owner, msg string) {
	if c.Plugins.DomainOf(providerName) == plugin.Hosts {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		kh := &crawlv1.KVMHost{}
		// The reference must carry the host's UID for kubectl describe to
		// list the Event.
		if err := c.Reader.Get(ctx, types.NamespacedName{Name: host}, kh); err == nil {
			c.Recorder.Eventf(kh, corev1.EventTypeNormal, OrphanDeletedReason, "%s", msg)
			return
		}
	}
	c.Recorder.Eventf(&corev1.ObjectReference{
		APIVersion: crawlv1.GroupVersion.String(), Kind: "Proxy",
		Namespace: owner.Namespace, Name: owner.Name, UID: types.UID(owner.UID),
	}, corev1.EventTypeNormal, OrphanDeletedReason, "%s", msg)
}

// isOrphan reports whether no Proxy with the owner's UID exists. An
// instance with no recorded owner UID is never an orphan: it is not
// provably ours to delete.
func (c *OrphanCollector) isOrphan(ctx context.Context, timeout time.Duration, o provider.Owner) (bool, error) {
	if o.UID == "" || o.Namespace == "" || o.Name == "" {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := &crawlv1.Proxy{}
	err := c.Reader.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, p)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, err
	}
	// Same name, another UID: the Proxy was recreated; the old instance is
	// an orphan, the new Proxy gets its own (UID-derived) instance.
	return string(p.UID) != o.UID, nil
}
