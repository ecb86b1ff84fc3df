package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// InstallIDNamespace is the namespace whose UID is the default install id:
// every cluster has it, it is never deleted, and its UID is random per
// cluster, so two clusters never share an id by accident.
const InstallIDNamespace = "kube-system"

// installIDWait bounds the wait for kube-system at start-up.
var installIDWait = 30 * time.Second

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
	// A control plane that just started may not have created kube-system
	// yet (or may not answer); a refusal is final.
	var err error
	_ = wait.PollUntilContextTimeout(ctx, time.Second, installIDWait, true, func(ctx context.Context) (bool, error) {
		err = r.Get(ctx, types.NamespacedName{Name: InstallIDNamespace}, ns)
		return err == nil || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err), nil
	})
	if err != nil {
		return "", fmt.Errorf("install id: read namespace %s (needs RBAC get on it, or set --install-id): %w", InstallIDNamespace, err)
	}
	id := string(ns.UID)
	if err := provider.ValidateInstallID(id); err != nil {
		return "", fmt.Errorf("install id from namespace %s: %w; set --install-id", InstallIDNamespace, err)
	}
	return id, nil
}
