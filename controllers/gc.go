package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
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
	Tag      string
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
}

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
// orphans it deleted. Every provider call and owner lookup gets CallTimeout,
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
			c.recordDeleted(ctx, timeout, prov.Name(), inst)
		}
	}
	return deleted, errors.Join(errs...)
}

// recordDeleted records an OrphanDeleted Event for a swept instance. Its
// Proxy is gone, so the Event goes where someone will look: on the KVMHost
// for a kvm domain (cluster-scoped, it outlives the Proxy's namespace and is
// where an admin looks at a host's history), else on the gone Proxy itself,
// by reference, in its namespace (kubectl get events -n NS).
func (c *OrphanCollector) recordDeleted(ctx context.Context, timeout time.Duration, providerName string, inst provider.Instance) {
	msg := fmt.Sprintf("deleted orphan %s instance %s on %s: its Proxy %s/%s (uid %s) no longer exists",
		providerName, inst.Name, inst.Host, inst.Owner.Namespace, inst.Owner.Name, inst.Owner.UID)
	if providerName == kvm.Name {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		host := &crawlv1.KVMHost{}
		// The reference must carry the host's UID for kubectl describe to
		// list the Event.
		if err := c.Reader.Get(ctx, types.NamespacedName{Name: inst.Host}, host); err == nil {
			c.Recorder.Eventf(host, corev1.EventTypeNormal, OrphanDeletedReason, "%s", msg)
			return
		}
	}
	c.Recorder.Eventf(&corev1.ObjectReference{
		APIVersion: crawlv1.GroupVersion.String(), Kind: "Proxy",
		Namespace: inst.Owner.Namespace, Name: inst.Owner.Name, UID: types.UID(inst.Owner.UID),
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
