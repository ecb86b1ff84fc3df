package kubernetes

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// ensure creates obj, or on AlreadyExists reads the existing object into obj
// and checks it is m's. created says which.
func (p *Provider) ensure(ctx context.Context, m *provider.Machine, obj client.Object) (created bool, err error) {
	kind := kindOf(obj)
	k := client.ObjectKeyFromObject(obj)
	err = p.c.Create(ctx, obj)
	if err == nil {
		return true, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return false, classify(err, fmt.Sprintf("create %s %s", kind, k))
	}
	if err := p.r.Get(ctx, k, obj); err != nil {
		if apierrors.IsNotFound(err) {
			// Exists for the API server, not (yet) for our reader:
			// a lagging cache, or deleted in between.
			return false, provider.Transientf("kubernetes: %s %s exists but cannot be read yet", kind, k)
		}
		return false, classify(err, fmt.Sprintf("get %s %s", kind, k))
	}
	return false, checkOwner(obj, m)
}

// converge is ensure for an object whose content follows the Machine
// (ConfigMap, Secret, NetworkPolicy): an existing one of m's that is not
// same as want gets want's content (a Conflict is transient: the next call
// re-reads). A terminating one is left to go: the next Create recreates it.
func (p *Provider) converge(ctx context.Context, m *provider.Machine, want client.Object, same func(have, want client.Object) bool) error {
	have := want.DeepCopyObject().(client.Object)
	created, err := p.ensure(ctx, m, have)
	if err != nil || created {
		return err
	}
	if have.GetDeletionTimestamp() != nil {
		return provider.Transientf("kubernetes: %s %s/%s is being deleted; recreated once gone", kindOf(want), want.GetNamespace(), want.GetName())
	}
	if same(have, want) {
		return nil
	}
	switch h := have.(type) {
	case *corev1.ConfigMap:
		h.Data = want.(*corev1.ConfigMap).Data
		if h.Annotations == nil {
			h.Annotations = map[string]string{}
		}
		h.Annotations[AnnotationDeniedDestinations] = want.GetAnnotations()[AnnotationDeniedDestinations]
	case *corev1.Secret:
		h.Data = want.(*corev1.Secret).Data
	case *networkingv1.NetworkPolicy:
		h.Spec = want.(*networkingv1.NetworkPolicy).Spec
	}
	log.FromContext(ctx).Info("updating what the proxy runs with", "object", kindOf(want)+" "+want.GetNamespace()+"/"+want.GetName())
	return classify(p.c.Update(ctx, have), fmt.Sprintf("update %s %s/%s", kindOf(want), want.GetNamespace(), want.GetName()))
}

// getFresh reads through the cache and, on a miss, through the API reader:
// the cache holds only our labelled objects (and may lag a create), so a
// miss there does not prove the name is free — a foreign object without our
// labels must still be seen, and refused, rather than read as "gone".
func (p *Provider) getFresh(ctx context.Context, k types.NamespacedName, obj client.Object) error {
	if uncached(obj) {
		return p.r.Get(ctx, k, obj)
	}
	err := p.c.Get(ctx, k, obj)
	if apierrors.IsNotFound(err) {
		return p.r.Get(ctx, k, obj)
	}
	return err
}

// uncached objects are read through the API reader only: reading them
// through a manager's cache would start an informer on every Secret (or
// NetworkPolicy) of the cluster.
func uncached(obj client.Object) bool {
	switch obj.(type) {
	case *corev1.Secret, *networkingv1.NetworkPolicy:
		return true
	}
	return false
}

func (p *Provider) deleteOne(ctx context.Context, m *provider.Machine, k types.NamespacedName, obj client.Object) error {
	kind := kindOf(obj)
	if err := p.getFresh(ctx, k, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return classify(err, fmt.Sprintf("get %s %s", kind, k))
	}
	if err := checkOwner(obj, m); err != nil {
		return err
	}
	if obj.GetDeletionTimestamp() != nil {
		return nil
	}
	var opts []client.DeleteOption
	if uid := obj.GetUID(); uid != "" {
		opts = append(opts, client.Preconditions{UID: &uid})
	}
	if err := p.c.Delete(ctx, obj, opts...); err != nil && !apierrors.IsNotFound(err) {
		// A failed UID precondition is a Conflict: classified transient,
		// the next call re-reads and re-checks.
		return classify(err, fmt.Sprintf("delete %s %s", kind, k))
	}
	return nil
}
