package controllers

import (
	"context"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// proxyScope is one reconcile of one Proxy: the Proxy, what the phases
// have found out so far, and the patcher that writes the Proxy once at the
// end. Each phase reads what the phases before it filled in.
type proxyScope struct {
	proxy *crawlv1.Proxy
	key   types.NamespacedName
	log   logr.Logger
	// patcher holds the Proxy as read (after the finalizer was added);
	// Reconcile's deferred patch writes what the phases changed.
	patcher *objectPatcher

	// provider and machine: spec.provider's provider and its view of the
	// Proxy (reconcileMachine).
	provider provider.Provider
	machine  *provider.Machine
	// creds: the Basic credential of a managed Proxy, nil for others
	// (reconcileCredentials).
	creds *credentials
	// stats: the operator's credential for the squid's traffic counters,
	// nil when they are not read (reconcileCredentials).
	stats *squid.Auth
	// instance: as read from the provider in this reconcile, nil when it
	// was not read (reconcileInstance).
	instance *provider.Instance

	// probeOnly: this reconcile does not read the instance (it was read
	// recently with no provider event since, or the provider cannot be
	// asked now); the phases that act on a read pass, and the proxy is
	// only probed.
	probeOnly bool
	// providerUnreachable: the provider could not be asked about an
	// instance last seen running; the next reconcile comes within the
	// provision poll interval to ask again.
	providerUnreachable bool

	// written: work that waits for nothing in status and so runs after
	// Reconcile's patch, not before it (afterWrite).
	written []func(context.Context)
}

// afterWrite runs fn once Reconcile has written the Proxy, so that what
// status waits for is not held up by it.
func (s *proxyScope) afterWrite(fn func(context.Context)) {
	s.written = append(s.written, fn)
}

func newProxyScope(ctx context.Context, c client.Client, p *crawlv1.Proxy) *proxyScope {
	return &proxyScope{proxy: p, key: client.ObjectKeyFromObject(p), log: logf.FromContext(ctx), patcher: newObjectPatcher(c, p)}
}

// reconcilePhase is one step of reconcileNormal. An error or a requeue ends the
// reconcile with it; a zero Result and no error hand on to the next phase.
// Every phase that stops asks to come back (a Proxy on its way to Ready
// has nothing else to wake it), so a zero Result never means "stop".
//
// Unlike Cluster API's Machine phases, which all run and merge their
// results, these stop at the first that cannot go on: each needs what the
// one before found (no credential is made for a Proxy that cannot be
// placed, no instance created without its credential).
type reconcilePhase func(ctx context.Context, s *proxyScope) (ctrl.Result, error)

// runPhases runs phases in order until one ends the reconcile.
func runPhases(ctx context.Context, s *proxyScope, phases ...reconcilePhase) (ctrl.Result, error) {
	for _, phase := range phases {
		if res, err := phase(ctx, s); ends(res, err) {
			return res, err
		}
	}
	return ctrl.Result{}, nil
}

// ends: a phase's outcome that ends the reconcile.
func ends(res ctrl.Result, err error) bool {
	return err != nil || !res.IsZero()
}
