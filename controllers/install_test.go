package controllers

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	"crawl.example.com/proxy-operator/test/envtestutil"
)

func TestResolveInstallID(t *testing.T) {
	ctx := context.Background()
	kubeSystem := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: "3f2504e0-4f89-41d3-9a0c-0305e82c3301"}}
	cluster := clientfake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(kubeSystem).Build()

	if id, err := ResolveInstallID(ctx, cluster, ""); err != nil || id != string(kubeSystem.UID) {
		t.Errorf("default = %q, %v; want the kube-system UID", id, err)
	}
	if id, err := ResolveInstallID(ctx, cluster, "staging"); err != nil || id != "staging" {
		t.Errorf("override = %q, %v; want staging", id, err)
	}
	if _, err := ResolveInstallID(ctx, cluster, "Staging_1"); err == nil || !strings.Contains(err.Error(), "--install-id") {
		t.Errorf("bad override: %v; want an error naming --install-id", err)
	}
	empty := clientfake.NewClientBuilder().WithScheme(envtestutil.Scheme()).Build()
	if _, err := ResolveInstallID(ctx, empty, ""); err == nil || !strings.Contains(err.Error(), "--install-id") {
		t.Errorf("unreadable kube-system: %v; want an error pointing at --install-id", err)
	}
}
