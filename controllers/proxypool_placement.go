package controllers

import (
	"context"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// STUB: the placement work replaces this file (capacity-aware spread over
// KVMHosts, zones for gcp). Keep the signatures.

// PlacementBlocked says why a replica cannot be created now. Reason is
// crawlv1.PoolInsufficientCapacityReason or crawlv1.PoolSpreadUnsatisfiableReason.
type PlacementBlocked struct{ Reason, Message string }

// placeReplica places one new replica before it is created: it may set
// replica.Spec.Placement (host for kvm, zone for gcp) and labels. replicas
// are the pool's replicas in any state, those created earlier in the same
// reconcile included. nil, nil: create it; a PlacementBlocked: do not create
// it now.
//
// This stub keeps the template's placement.
func (r *ProxyPoolReconciler) placeReplica(_ context.Context, pool *crawlv1.ProxyPool, _ []crawlv1.Proxy, replica *crawlv1.Proxy) (*PlacementBlocked, error) {
	replica.Spec.Placement = *pool.Spec.Template.Spec.Placement.DeepCopy()
	return nil, nil
}
