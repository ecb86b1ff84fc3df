package controllers

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	clientfake "sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"crawl.example.com/proxy-operator/test/envtestutil"
)

func TestResolveInstallID(t *testing.T) {
	ctx := context.Background()
	defer func(d time.Duration) { installIDWait = d }(installIDWait)
	installIDWait = 3 * time.Second
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

	// A control plane still starting: kube-system appears a moment later.
	starting := clientfake.NewClientBuilder().WithScheme(envtestutil.Scheme()).Build()
	go func() {
		time.Sleep(200 * time.Millisecond)
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: kubeSystem.UID}}
		if err := starting.Create(ctx, ns); err != nil {
			t.Error(err)
		}
	}()
	if id, err := ResolveInstallID(ctx, starting, ""); err != nil || id != string(kubeSystem.UID) {
		t.Errorf("starting control plane = %q, %v; want the kube-system UID once it exists", id, err)
	}

	// No RBAC: refused at once, pointing at the way out.
	forbidden := clientfake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "kube-system", nil)
		},
	}).Build()
	start := time.Now()
	if _, err := ResolveInstallID(ctx, forbidden, ""); err == nil || !strings.Contains(err.Error(), "--install-id") {
		t.Errorf("forbidden: %v; want an error pointing at --install-id", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("forbidden took %s, want a refusal at once", d)
	}

	// Never there: given up after the wait.
	installIDWait = 100 * time.Millisecond
	empty := clientfake.NewClientBuilder().WithScheme(envtestutil.Scheme()).Build()
	if _, err := ResolveInstallID(ctx, empty, ""); err == nil || !apierrors.IsNotFound(err) {
		t.Errorf("missing kube-system: %v; want NotFound", err)
	}
}
