package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// InstallIDNamespace is the namespace whose UID is the default install id:
// every cluster has it, it is never deleted, and its UID is random per
// cluster, so two clusters never share an id by accident.
const InstallIDNamespace = "kube-system"

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get,resourceNames=kube-system

// ResolveInstallID returns the id this install writes on its instances and
// sweeps by: override when set (--install-id, for two installs in one
// cluster), else the UID of the kube-system namespace. r must read the API
// server (the manager's API reader): it is called before caches start.
func ResolveInstallID(ctx context.Context, r client.Reader, override string) (string, error) {
	if override != "" {
		if err := provider.ValidateInstallID(override); err != nil {
			return "", fmt.Errorf("--install-id: %w", err)
		}
		return override, nil
	}
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, types.NamespacedName{Name: InstallIDNamespace}, ns); err != nil {
		return "", fmt.Errorf("install id: read namespace %s (needs RBAC get on it, or set --install-id): %w", InstallIDNamespace, err)
	}
	id := string(ns.UID)
	if err := provider.ValidateInstallID(id); err != nil {
		return "", fmt.Errorf("install id from namespace %s: %w; set --install-id", InstallIDNamespace, err)
	}
	return id, nil
}
