package v1alpha1

import (
	"context"
	"encoding/json"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Updates are ratcheted: a stored object that today's rules reject (stored
// with the webhooks off, or before a rule was tightened) must still be
// releasable, or removing its finalizer is refused and its deletion hangs.

// leftAlone reports whether an update is neither defaulted nor validated:
// the object is being deleted, or only its metadata (finalizers,
// annotations) changes.
func leftAlone(obj metav1.Object, oldSpec, newSpec any) bool {
	return obj.GetDeletionTimestamp() != nil || equality.Semantic.DeepEqual(oldSpec, newSpec)
}

// ratchet drops the errors the stored object already had: an update is
// refused only for what it makes invalid. A field changed to another bad
// value is a new error (the message carries the value).
func ratchet(errs, stored field.ErrorList) field.ErrorList {
	had := make(map[string]bool, len(stored))
	for _, e := range stored {
		had[e.Error()] = true
	}
	var out field.ErrorList
	for _, e := range errs {
		if !had[e.Error()] {
			out = append(out, e)
		}
	}
	return out
}

// storedObject decodes the stored object of an update into old; it reports
// false for other operations (and outside an admission request).
func storedObject(ctx context.Context, old any) (bool, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return false, nil //nolint:nilerr // no admission request: validated as a create
	}
	if req.Operation != admissionv1.Update || len(req.OldObject.Raw) == 0 {
		return false, nil
	}
	if err := json.Unmarshal(req.OldObject.Raw, old); err != nil {
		return false, fmt.Errorf("decoding the stored object: %w", err)
	}
	return true, nil
}
