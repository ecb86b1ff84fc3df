package controllers

import (
	"time"

	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ProxyPoolReconciler is a placeholder for the ProxyPool controller's own
// type (proxypool_controller.go), so placement builds and is tested on its
// own. Delete this file when merging; placement uses these fields.
type ProxyPoolReconciler struct {
	// Client reads KVMHosts and Proxies, from the manager's cache.
	Client client.Client
	// Clock tells when a running replica must be in its host's figures;
	// nil is the real clock.
	Clock clock.PassiveClock
	// HostCheckInterval is the manager's --provider-check-interval, the
	// check interval of KVMHosts without spec.checkInterval; 0 means
	// crawlv1.DefaultCheckInterval.
	HostCheckInterval time.Duration
}
