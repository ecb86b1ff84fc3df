package controllers

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// objectPatcher writes what a reconcile changed on one object: metadata
// (finalizers) guarded by the resourceVersion read, then all of status,
// conditions included, in one request.
//
// Cluster API's patch helper writes conditions and the rest of status in
// two requests, conditions first, so watchers could see Ready=True a moment
// before the endpoint it announces (or a KVMHost's libvirt version). One
// status request makes each written status a consistent snapshot.
//
// The status patch is a JSON merge patch, so lists such as conditions and a
// KVMImage's hosts are replaced whole: right only for status that this
// controller alone writes, which holds for every kind here, and only when
// the reconcile started from the latest status. A cached read can be one
// write behind; so the writes carry the resourceVersion the reconcile last
// saw (obj's: the one read, or the one its own earlier write in this
// reconcile returned, such as recordPlacement's) and a stale reconcile gets
// a conflict and runs again instead of putting back the older status.
type objectPatcher struct {
	c      client.Client
	before client.Object
}

func newObjectPatcher(c client.Client, obj client.Object) *objectPatcher {
	return &objectPatcher{c: c, before: obj.DeepCopyObject().(client.Object)}
}

// Patch writes obj's changes since newObjectPatcher. obj itself is not
// updated from the responses.
func (s *objectPatcher) Patch(ctx context.Context, obj client.Object) error {
	metaChanged, statusChanged, err := changes(s.before, obj)
	if err != nil {
		return err
	}
	// NotFound while deleting: the last finalizer went and the object with it.
	gone := func(err error) bool { return apierrors.IsNotFound(err) && !obj.GetDeletionTimestamp().IsZero() }
	from := s.before.DeepCopyObject().(client.Object)
	from.SetResourceVersion(obj.GetResourceVersion())
	if metaChanged {
		m := obj.DeepCopyObject().(client.Object)
		if err := s.c.Patch(ctx, m, client.MergeFromWithOptions(from, client.MergeFromWithOptimisticLock{})); err != nil {
			if gone(err) {
				return nil
			}
			return err
		}
		if !m.GetDeletionTimestamp().IsZero() && len(m.GetFinalizers()) == 0 {
			return nil // released: deleted now, no status to write
		}
		// The server's answer: the status to change, at the version the
		// metadata write produced.
		from = m
	}
	if statusChanged {
		st := obj.DeepCopyObject().(client.Object)
		if err := s.c.Status().Patch(ctx, st, client.MergeFromWithOptions(from, client.MergeFromWithOptimisticLock{})); err != nil && !gone(err) {
			return err
		}
	}
	return nil
}

// conflictRetry is how soon a reconcile whose write met a conflict runs
// again: long enough for the cache to see the newer object, far shorter
// than the error backoff, which grows with every conflict and would hold
// a busy object back for minutes.
const conflictRetry = 200 * time.Millisecond

// finish writes obj with Patch and folds the outcome into the reconcile's
// result. A conflict means the reconcile read a stale cache: its decisions
// are made again on a fresh read shortly, not counted as a failure.
func (s *objectPatcher) finish(ctx context.Context, obj client.Object, res *ctrl.Result, reterr *error) {
	err := s.Patch(ctx, obj)
	switch {
	case err == nil:
	case apierrors.IsConflict(err) && *reterr == nil:
		logf.FromContext(ctx).V(1).Info("not written: the object changed since it was read; reconciling again")
		*res = ctrl.Result{RequeueAfter: conflictRetry}
	default:
		*reterr = kerrors.NewAggregate([]error{*reterr, err})
	}
}

// changes reports whether anything outside status, and status, differ.
func changes(before, after client.Object) (meta, status bool, err error) {
	// Most reconciles of a steady fleet change nothing (a probe that finds
	// what status says); the typed comparison tells them apart without
	// converting both objects, which cost a third of the manager's CPU in
	// the steady state (BenchmarkChanges). Typed-equal objects serialize
	// alike, so this never hides a change the comparison below would see.
	if before.GetResourceVersion() == after.GetResourceVersion() && equality.Semantic.DeepEqual(before, after) {
		return false, false, nil
	}
	return changesAsWritten(before, after)
}

// changesAsWritten compares what would be written: the objects as JSON
// fields, so two values that serialize alike (times within one second, a
// nil and an empty list) are no change.
func changesAsWritten(before, after client.Object) (meta, status bool, err error) {
	b, err := runtime.DefaultUnstructuredConverter.ToUnstructured(before)
	if err != nil {
		return false, false, err
	}
	a, err := runtime.DefaultUnstructuredConverter.ToUnstructured(after)
	if err != nil {
		return false, false, err
	}
	status = !equality.Semantic.DeepEqual(b["status"], a["status"])
	delete(b, "status")
	delete(a, "status")
	// The version is the lock, not a change: the reconcile's own earlier
	// writes move it.
	for _, o := range []map[string]any{a, b} {
		if m, ok := o["metadata"].(map[string]any); ok {
			delete(m, "resourceVersion")
		}
	}
	return !equality.Semantic.DeepEqual(b, a), status, nil
}
