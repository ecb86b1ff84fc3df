// Package envtestutil starts the real kube-apiserver + etcd (envtest) with the
// project's CRDs and, optionally, its admission webhooks, for every suite.
package envtestutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	kruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
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
	ipamCRDs, err := IPAMCRDs()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     append([]string{filepath.Join(Root(), "config", "crd", "bases")}, ipamCRDs...),
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

// IPAMCRDs are Cluster API's IPAddressClaim and IPAddress CRDs, as the
// cluster-api module the operator builds against ships them (read in
// place from the module cache, never copied or edited), so the suites
// serve the IPAM contract a cluster with an IPAM provider serves.
func IPAMCRDs() ([]string, error) {
	const module = "sigs.k8s.io/cluster-api"
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module)
	cmd.Dir = Root()
	out, err := cmd.Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		return nil, fmt.Errorf("locating %s in the module cache for its IPAM CRDs (go mod download %s): %w", module, module, err)
	}
	var paths []string
	for _, kind := range []string{"ipaddressclaims", "ipaddresses"} {
		p := filepath.Join(dir, "core", "config", "crd", "bases", "ipam.cluster.x-k8s.io_"+kind+".yaml")
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("the IPAM CRD of %s: %w", module, err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// Scheme returns a scheme with client-go's types, this project's API and
// Cluster API's IPAM types (the IPAddressClaims of Proxies with a static
// address).
func Scheme() *kruntime.Scheme {
	s := kruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(crawlv1.AddToScheme(s))
	utilruntime.Must(ipamv1.AddToScheme(s))
	return s
}
