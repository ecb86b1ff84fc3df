package controllers

import (
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// specOrAnnotationChanged lets through what needs a reconcile: a new
// generation (spec changes and deletion) or annotations (skip-cleanup). Our
// own status writes do not: they would requeue every object at once after
// each reconcile, a hot loop of probes and provider calls. Periodic work is
// RequeueAfter's, provider changes come as events.
var specOrAnnotationChanged = predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{})

// ControllerConfig is the manager-wide controller configuration. The
// priority queue, on by default in controller-runtime v0.24, can deadlock
// on shutdown (kubernetes-sigs/controller-runtime#3538, fixed after
// v0.24.1), so a rollout or leader hand-over would wait out the grace
// period; the classic rate-limited queue does not.
func ControllerConfig() config.Controller {
	return config.Controller{UsePriorityQueue: ptr.To(false)}
}
