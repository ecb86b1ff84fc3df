// Package providers holds the envtest suite that runs the kubernetes and gcp
// providers through the real Proxy controller and orphan collector: a real
// kube-apiserver and etcd, the project's CRDs, a manager wired as main.go
// wires it, and the in-process Compute Engine fake (gcptest) behind the gcp
// provider. Envtest runs no kubelet and no scheduler, so the specs bind
// squid pods and write their status themselves, as those would.
//
// Run it with `export KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)`; without
// the binaries the suite fails, it never skips.
package providers
