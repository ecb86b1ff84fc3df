package kubernetes

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// Plugin is the kubernetes provider's part in the operator's generic code
// (see package plugin): squid pods the provider spreads over nodes itself,
// all running the manager's squid image, each behind a NetworkPolicy that
// admits only spec.access.allowedSourceCIDRs, managed or not.
func Plugin() plugin.Plugin {
	return plugin.Basic{Provider: Name, In: plugin.Nodes, Rules: validate, Shared: sharedEgress, UnmanagedSources: true}
}

// sharedEgress: a squid pod leaves from its node's address, or the
// cluster's NAT: pods on one node (and often every pod) share it.
func sharedEgress(*crawlv1.ProxySpec) string {
	return "kubernetes squid pods leave from their node's address or the cluster's NAT, which pods share"
}

func validate(p *crawlv1.Proxy, _ plugin.Policy) field.ErrorList {
	if p.Spec.Placement.Image != "" {
		return field.ErrorList{field.Forbidden(field.NewPath("spec", "placement", "image"), "the kubernetes provider runs the manager's --kubernetes-squid-image")}
	}
	return nil
}
