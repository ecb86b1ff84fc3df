package controllers

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
// write behind; so the status write carries the resourceVersion it builds
// on (the one read, or the one the metadata write produced) and a stale
// reconcile gets a conflict and runs again instead of putting back the
// older status.
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
	from := s.before
	if metaChanged {
		m := obj.DeepCopyObject().(client.Object)
		if err := s.c.Patch(ctx, m, client.MergeFromWithOptions(s.before, client.MergeFromWithOptimisticLock{})); err != nil {
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

// changes reports whether anything outside status, and status, differ.
func changes(before, after client.Object) (meta, status bool, err error) {
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
	return !equality.Semantic.DeepEqual(b, a), status, nil
}
