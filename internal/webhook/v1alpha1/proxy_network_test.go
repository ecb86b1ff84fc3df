package v1alpha1

import (
	"testing"

	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func inClusterPool(name string) ipamv1.IPPoolReference {
	return ipamv1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: name}
}

func TestValidateProxyAddressPools(t *testing.T) {
	withPools := func(refs ...ipamv1.IPPoolReference) func(*crawlv1.Proxy) {
		return func(p *crawlv1.Proxy) { p.Spec.Network = &crawlv1.ProxyNetwork{AddressesFromPools: refs} }
	}
	cases := []struct {
		name    string
		mutate  func(*crawlv1.Proxy)
		wantErr string
	}{
		{"kvm with an in-cluster pool", withPools(inClusterPool("routed")), ""},
		{"kvm with a global in-cluster pool", withPools(ipamv1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "GlobalInClusterIPPool", Name: "g"}), ""},
		{"kvm with an Infoblox pool", withPools(ipamv1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InfobloxIPPool", Name: "ib"}), ""},
		{"an empty network is nothing to check", func(p *crawlv1.Proxy) { p.Spec.Network = &crawlv1.ProxyNetwork{} }, ""},
		{"a provider that takes no static address", func(p *crawlv1.Proxy) {
			withPools(inClusterPool("routed"))(p)
			p.Spec.Provider, p.Spec.Placement = crawlv1.ProviderKubernetes, crawlv1.ProxyPlacement{}
		}, "spec.network.addressesFromPools: Forbidden: provider kubernetes cannot boot an instance with a static address from an IPAM pool (only kvm can)"},
		{"gcp too", func(p *crawlv1.Proxy) {
			withPools(inClusterPool("routed"))(p)
			p.Spec.Provider, p.Spec.Placement = crawlv1.ProviderGCP, crawlv1.ProxyPlacement{}
		}, "spec.network.addressesFromPools: Forbidden: provider gcp"},
		{"two pools", withPools(inClusterPool("a"), inClusterPool("b")), "spec.network.addressesFromPools: Too many: 2: must have at most 1 item"},
		{"unknown kind", withPools(ipamv1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "IPPool", Name: "x"}), `spec.network.addressesFromPools[0].kind: Unsupported value: "IPPool"`},
		{"unknown group", withPools(ipamv1.IPPoolReference{APIGroup: "ipam.metal3.io", Kind: "IPPool", Name: "x"}), `spec.network.addressesFromPools[0].apiGroup: Unsupported value: "ipam.metal3.io"`},
		{"a group-version is not a group", withPools(ipamv1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io/v1alpha2", Kind: "InClusterIPPool", Name: "x"}), "spec.network.addressesFromPools[0].apiGroup: Unsupported value"},
		{"no name", withPools(ipamv1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}), "spec.network.addressesFromPools[0].name: Required value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := kvmProxy()
			tc.mutate(p)
			checkErrs(t, proxyWebhook(false).ValidateProxy(p).ToAggregate(), tc.wantErr)
		})
	}
}

func TestProxyNetworkIsImmutable(t *testing.T) {
	old := kvmProxy()
	old.Spec.Network = &crawlv1.ProxyNetwork{AddressesFromPools: []ipamv1.IPPoolReference{inClusterPool("a")}}
	for name, network := range map[string]*crawlv1.ProxyNetwork{
		"another pool": {AddressesFromPools: []ipamv1.IPPoolReference{inClusterPool("b")}},
		"removed":      nil,
	} {
		t.Run(name, func(t *testing.T) {
			p := old.DeepCopy()
			p.Spec.Network = network
			checkErrs(t, ValidateProxyUpdate(old, p).ToAggregate(), "spec.network: Forbidden: network is immutable")
		})
	}
	checkErrs(t, ValidateProxyUpdate(old, old.DeepCopy()).ToAggregate(), "")
}

func TestValidateKVMHostNameservers(t *testing.T) {
	h := &crawlv1.KVMHost{Spec: crawlv1.KVMHostSpec{Address: "hv:22", Nameservers: []string{"192.0.2.53", "2001:db8::53"}}}
	checkErrs(t, ValidateKVMHost(h).ToAggregate(), "")
	h.Spec.Nameservers = append(h.Spec.Nameservers, "dns.example")
	checkErrs(t, ValidateKVMHost(h).ToAggregate(), `spec.nameservers[2]: Invalid value: "dns.example": must be an IP address`)
}

// A pool template is judged as its replicas: a pool reference is admitted
// on kvm and refused, under the template's path, elsewhere.
func TestProxyPoolTemplateAddressPools(t *testing.T) {
	p := goodPool()
	p.Spec.Template.Spec.Network = &crawlv1.ProxyNetwork{AddressesFromPools: []ipamv1.IPPoolReference{inClusterPool("routed")}}
	checkErrs(t, poolWebhook().validate(p).ToAggregate(), "")

	p.Spec.Template.Spec.Network.AddressesFromPools[0].Kind = "IPPool"
	checkErrs(t, poolWebhook().validate(p).ToAggregate(), `spec.template.spec.network.addressesFromPools[0].kind: Unsupported value: "IPPool"`)

	p.Spec.Template.Spec.Network.AddressesFromPools[0].Kind = "InClusterIPPool"
	p.Spec.Template.Spec.Provider, p.Spec.Template.Spec.Placement = crawlv1.ProviderKubernetes, crawlv1.ProxyPlacement{}
	checkErrs(t, poolWebhook().validate(p).ToAggregate(), "spec.template.spec.network.addressesFromPools: Forbidden: provider kubernetes")
}
