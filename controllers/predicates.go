package controllers

import "sigs.k8s.io/controller-runtime/pkg/predicate"

// specOrAnnotationChanged lets through what needs a reconcile: a new
// generation (spec changes and deletion) or annotations (skip-cleanup). Our
// own status writes do not: they would requeue every object at once after
// each reconcile, a hot loop of probes and provider calls. Periodic work is
// RequeueAfter's, provider changes come as events.
var specOrAnnotationChanged = predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{})
