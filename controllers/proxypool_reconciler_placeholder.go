package controllers

import "sigs.k8s.io/controller-runtime/pkg/client"

// ProxyPoolReconciler is a placeholder for the ProxyPool controller's own
// type (proxypool_controller.go), so placement builds and is tested on its
// own. Delete this file when merging; placement uses only Client, which
// must read KVMHosts and Proxies from the manager's cache.
type ProxyPoolReconciler struct {
	Client client.Client
}
