package deploy

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"crawl.example.com/proxy-operator/test/envtestutil"
)

// One control plane for the package, started by the first test that needs
// it and stopped by TestMain.
var (
	envOnce sync.Once
	testEnv *envtest.Environment
	envCfg  *rest.Config
	envErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if testEnv != nil {
		if err := testEnv.Stop(); err != nil && code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// apiServer returns a client of the envtest API server (CRDs installed, no
// webhooks) that records every warning the server sends. Without
// KUBEBUILDER_ASSETS the test fails with envtestutil.AssetsError's message.
func apiServer(t *testing.T) (client.Client, *warnings) {
	t.Helper()
	envOnce.Do(func() {
		testEnv, envErr = envtestutil.New(false)
		if envErr != nil {
			testEnv = nil
			return
		}
		envCfg, envErr = testEnv.Start()
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	scheme := envtestutil.Scheme()
	w := &warnings{}
	cfg := rest.CopyConfig(envCfg)
	cfg.WarningHandlerWithContext = w
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

// warnings collects the server's Warning headers: PodSecurity violations
// and unknown or duplicate fields (field validation defaults to Warn).
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

// take returns the warnings so far and forgets them.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.list
	w.list = nil
	return l
}

// dryRunApply server-side applies obj with dryRun=All: the API server runs
// defaulting, schema and CEL validation and admission, and stores nothing.
func dryRunApply(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
	return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj.DeepCopy()),
		client.DryRunAll, client.ForceOwnership, client.FieldOwner("test-deploy"))
}

// ensureNamespace creates ns for real (dry-run objects need it to exist).
func ensureNamespace(ctx context.Context, t *testing.T, c client.Client, ns *corev1.Namespace) {
	t.Helper()
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", ns.Name, err)
	}
}

// TestInstallDryRun sends every object of config/default and of
// config/certs-selfsigned to a real API server with dryRun=All. The install
// Namespace carries the "restricted" Pod Security labels, so the Deployment
// must come back without a PodSecurity warning; cert-manager's kinds are
// the only ones the server may not know, and only config/default has them.
func TestInstallDryRun(t *testing.T) {
	c, w := apiServer(t)
	ctx := t.Context()
	for _, dir := range []string{"config/default", selfSignedDir} {
		objs := kustomizeBuild(t, dir)
		nsObj := one(t, objs, "Namespace", installNamespace)
		ns := &corev1.Namespace{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(nsObj.Object, ns); err != nil {
			t.Fatal(err)
		}
		if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
			t.Errorf("%s: namespace %s does not enforce the restricted Pod Security Standard: %v", dir, ns.Name, ns.Labels)
		}
		ensureNamespace(ctx, t, c, ns)
		w.take()

		skipped := map[string]bool{}
		for _, o := range objs {
			if o.GetKind() == "Namespace" {
				continue
			}
			if o.GroupVersionKind().Group == "cert-manager.io" {
				skipped[o.GetKind()] = true
				continue
			}
			if err := dryRunApply(ctx, c, o); err != nil {
				t.Errorf("%s: %s %s: %v", dir, o.GetKind(), o.GetName(), err)
			}
			for _, msg := range w.take() {
				t.Errorf("%s: %s %s: server warning: %s", dir, o.GetKind(), o.GetName(), msg)
			}
		}
		if wantCertManager := dir == "config/default"; skipped["Certificate"] != wantCertManager || skipped["Issuer"] != wantCertManager {
			t.Errorf("%s: cert-manager kinds %v, want a Certificate and an Issuer: %v", dir, skipped, wantCertManager)
		}
	}
	objs := kustomizeBuild(t, "config/default")

	// The check above can fail: the same Deployment made to escalate
	// privileges draws a PodSecurity warning.
	dep := one(t, objs, "Deployment", "").DeepCopy()
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if err := unstructured.SetNestedField(containers[0].(map[string]any), true, "securityContext", "allowPrivilegeEscalation"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(dep.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
	if err := dryRunApply(ctx, c, dep); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(w.take(), "\n"); !strings.Contains(got, "allowPrivilegeEscalation") {
		t.Errorf("a privilege-escalating manager drew no PodSecurity warning (warnings: %q)", got)
	}
}

// namespaceOf returns a Namespace object for a namespaced rendered object,
// or nil.
func namespaceOf(o *unstructured.Unstructured) *corev1.Namespace {
	if o.GetNamespace() == "" {
		return nil
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.GetNamespace()}}
}
