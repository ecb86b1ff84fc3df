// Package metricsauth configures the manager's metrics server: HTTPS, and
// every request authenticated (TokenReview) and authorized
// (SubjectAccessReview for "get" on the non-resource URL /metrics) by the
// API server, as kubebuilder v4 scaffolds it.
package metricsauth

import (
	"crypto/tls"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// ServerOptions returns the metrics server options for bindAddress. secure
// false (--metrics-secure=false) serves plain HTTP to anyone who can reach
// the port; it exists for local runs and is not recommended. Without a
// certificate directory controller-runtime serves a self-signed certificate.
func ServerOptions(bindAddress string, secure bool, tlsOpts []func(*tls.Config)) metricsserver.Options {
	o := metricsserver.Options{BindAddress: bindAddress, SecureServing: secure, TLSOpts: tlsOpts}
	if secure {
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return o
}
