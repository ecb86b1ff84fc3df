// Package envtestutil starts the real kube-apiserver + etcd (envtest) with the
// project's CRDs and, optionally, its admission webhooks, for every suite.
package envtestutil

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	kruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// Root is the repository root, found from this file's location so suites
// work from any package directory.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// AssetsError explains how to get the envtest binaries. Suites fail with it;
// they never skip.
func AssetsError() error {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return fmt.Errorf("KUBEBUILDER_ASSETS is not set: run `make test`, or `export KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)` (builds kube-apiserver and etcd into ~/.cache/proxy-operator/envtest once)")
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return fmt.Errorf("KUBEBUILDER_ASSETS=%s has no %s: run `hack/envtest-assets.sh` to provide it: %w", dir, bin, err)
		}
	}
	return nil
}

// New returns an Environment with the project's CRDs, and its webhooks when
// withWebhooks is set (envtest then generates serving certs and points the
// webhook configurations at a local port).
func New(withWebhooks bool) (*envtest.Environment, error) {
	if err := AssetsError(); err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(Root(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	// kube-apiserver derives its advertise address from the default route,
	// and a network namespace (the e2e's) may have none; it binds to
	// loopback anyway.
	env.ControlPlane.GetAPIServer().Configure().Set("advertise-address", "127.0.0.1")
	if withWebhooks {
		env.WebhookInstallOptions = envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(Root(), "config", "webhook")},
		}
	}
	return env, nil
}

// Scheme returns a scheme with client-go's types and this project's API.
func Scheme() *kruntime.Scheme {
	s := kruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(crawlv1.AddToScheme(s))
	return s
}
