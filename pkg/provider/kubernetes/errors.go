package kubernetes

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// checkOwner refuses an object whose proxy-uid label is not m's.
func checkOwner(obj client.Object, m *provider.Machine) error {
	got, ok := obj.GetLabels()[LabelProxyUID]
	if ok && got == m.UID {
		return nil
	}
	mismatch := "no " + LabelProxyUID + " label"
	if ok {
		mismatch = fmt.Sprintf("%s %q != Proxy uid %q", LabelProxyUID, got, m.UID)
	}
	return &provider.IdentityError{Kind: strings.ToLower(kindOf(obj)), Name: obj.GetNamespace() + "/" + obj.GetName(), Mismatch: mismatch}
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *corev1.Pod:
		return "Pod"
	case *corev1.ConfigMap:
		return "ConfigMap"
	case *corev1.Secret:
		return "Secret"
	case *networkingv1.NetworkPolicy:
		return "NetworkPolicy"
	default:
		return fmt.Sprintf("%T", obj)
	}
}

// classify maps an API server error to the provider taxonomy.
func classify(err error, what string) error {
	if err == nil || provider.HasClass(err) {
		return err
	}
	wrapped := fmt.Errorf("kubernetes: %s: %w", what, err)
	switch {
	case apierrors.IsNotFound(err):
		return provider.NotFound(wrapped)
	case apierrors.IsConflict(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsInternalError(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsUnexpectedServerError(err),
		apierrors.IsAlreadyExists(err), apierrors.IsGone(err):
		return provider.Transient(wrapped)
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err),
		apierrors.IsUnauthorized(err), apierrors.IsMethodNotSupported(err),
		apierrors.IsNotAcceptable(err), apierrors.IsUnsupportedMediaType(err),
		apierrors.IsRequestEntityTooLargeError(err):
		// Forbidden covers RBAC, an exceeded ResourceQuota and a
		// terminating namespace: none is fixed by retrying.
		return provider.Permanent(wrapped)
	}
	// Network errors, context deadlines, unknown: retry with backoff.
	return provider.Transient(wrapped)
}
