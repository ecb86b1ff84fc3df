package controllers

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
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
	Recorder  record.EventRecorder
}

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
// orphans it deleted.
func (c *OrphanCollector) Sweep(ctx context.Context) (int, error) {
	log := logf.FromContext(ctx)
	// Without an install id nothing is provably ours.
	if err := provider.ValidateInstallID(c.InstallID); err != nil {
		return 0, fmt.Errorf("orphan sweep: %w", err)
	}
	deleted := 0
	var firstErr error
	for _, prov := range c.Registry.Constructed() {
		instances, err := prov.ListByTag(ctx, c.Tag)
		if err != nil {
			// An unreachable host fails this provider's sweep, not the others.
			log.Error(err, "list tagged instances", "provider", prov.Name())
			firstErr = cmpErr(firstErr, err)
		}
		for _, inst := range instances {
			// ListByTag promised this install's only; a provider built
			// with another id (or none) must not make us delete.
			if inst.InstallID != c.InstallID {
				log.V(1).Info("skipping instance of another install", "provider", prov.Name(), "instance", inst.Name, "host", inst.Host, "install", inst.InstallID)
				continue
			}
			orphan, err := c.isOrphan(ctx, inst.Owner)
			if err != nil {
				firstErr = cmpErr(firstErr, err)
				continue
			}
			if !orphan {
				continue
			}
			m := &provider.Machine{
				Namespace: inst.Owner.Namespace, Name: inst.Owner.Name, UID: inst.Owner.UID,
				ProviderID: inst.ProviderID, Host: inst.Host, Tag: c.Tag,
			}
			if err := prov.Delete(ctx, m); err != nil {
				log.Error(err, "delete orphan", "provider", prov.Name(), "instance", inst.Name, "host", inst.Host)
				firstErr = cmpErr(firstErr, err)
				continue
			}
			deleted++
			log.Info("deleted orphan instance", "provider", prov.Name(), "instance", inst.Name, "host", inst.Host,
				"proxy", types.NamespacedName{Namespace: inst.Owner.Namespace, Name: inst.Owner.Name}, "uid", inst.Owner.UID)
		}
	}
	return deleted, firstErr
}

// isOrphan reports whether no Proxy with the owner's UID exists. An
// instance with no recorded owner UID is never an orphan: it is not
// provably ours to delete.
func (c *OrphanCollector) isOrphan(ctx context.Context, o provider.Owner) (bool, error) {
	if o.UID == "" || o.Namespace == "" || o.Name == "" {
		return false, nil
	}
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

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
