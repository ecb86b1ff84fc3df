package plugin_test

import (
	"testing"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/gcp"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// TestEgressModels: what each provider's plug-in says of its instances'
// egress, which placement and admission act on.
func TestEgressModels(t *testing.T) {
	spec := &crawlv1.ProxySpec{}
	for _, tc := range []struct {
		name   string
		pl     plugin.Plugin
		shares bool
	}{
		{"kvm: hosts decide", kvm.Plugin(), false},
		{"kubernetes: pods share their node's address", kubernetes.Plugin(), true},
		{"gcp with external IPs", gcp.Plugin(false), false},
		{"gcp behind Cloud NAT", gcp.Plugin(true), true},
		{"a plug-in that says nothing", plugin.Basic{Provider: "toy", In: plugin.Zones}, false},
	} {
		if got := plugin.SharedEgressOf(tc.pl, spec) != ""; got != tc.shares {
			t.Errorf("%s: shares %v, want %v", tc.name, got, tc.shares)
		}
	}
	for mode, want := range map[crawlv1.NetworkMode]string{"": "NAT", crawlv1.NetworkModeNetwork: "NAT", crawlv1.NetworkModeBridge: ""} {
		h := &crawlv1.KVMHost{Spec: crawlv1.KVMHostSpec{NetworkMode: mode}}
		if got := plugin.HostSharedBy(kvm.Plugin(), h); got != want {
			t.Errorf("kvm host in networkMode %q: shared by %q, want %q", mode, got, want)
		}
		if got := plugin.HostSharedBy(kubernetes.Plugin(), h); got != "" {
			t.Errorf("a plug-in outside the Hosts domain says a host is shared by %q", got)
		}
	}
}
