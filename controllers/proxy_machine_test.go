package controllers

import (
	"slices"
	"testing"

	"k8s.io/utils/ptr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
)

// A pool's replicas carry the pool's name to the provider, which spreads
// them over nodes (kubernetes); a Proxy of no pool spreads with nothing.
func TestMachineSpreadGroupIsThePool(t *testing.T) {
	p := &crawlv1.Proxy{}
	p.Labels = map[string]string{crawlv1.PoolNameLabel: "crawl-a"}
	if g := baseMachine(p, "t").SpreadGroup; g != "crawl-a" {
		t.Fatalf("SpreadGroup = %q, want the pool's name", g)
	}
	if g := baseMachine(&crawlv1.Proxy{}, "t").SpreadGroup; g != "" {
		t.Fatalf("SpreadGroup of a standalone Proxy = %q", g)
	}
}

// TestAttachSquidCarriesUnmanagedSources: a managed Proxy's sources travel
// in Machine.Squid; an unmanaged one's in Machine.AllowedSourceCIDRs (for
// the kubernetes provider's NetworkPolicy), and a Machine reused across
// reconciles keeps nothing of an earlier spec.
func TestAttachSquidCarriesUnmanagedSources(t *testing.T) {
	r := &ProxyReconciler{}
	for _, tc := range []struct {
		name        string
		access      *crawlv1.ProxyAccess
		wantSquid   bool
		wantSources []string
	}{
		{"managed", &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.244.0.0/16"}, Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthNone}}, true, nil},
		{"unmanaged", &crawlv1.ProxyAccess{Managed: ptr.To(false), AllowedSourceCIDRs: []string{"10.244.3.0/24"}}, false, []string{"10.244.3.0/24"}},
		{"unmanaged without sources", &crawlv1.ProxyAccess{Managed: ptr.To(false)}, false, nil},
		{"stored before spec.access", nil, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &crawlv1.Proxy{Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Access: tc.access}}
			m := &provider.Machine{Port: 3128, AllowedSourceCIDRs: []string{"192.0.2.0/24"}}
			r.attachSquid(p, m, nil, nil)
			if (m.Squid != nil) != tc.wantSquid {
				t.Errorf("Squid %+v, want set %v", m.Squid, tc.wantSquid)
			}
			if tc.wantSquid && !slices.Equal(m.Squid.AllowedSourceCIDRs, tc.access.AllowedSourceCIDRs) {
				t.Errorf("Squid sources %v, want %v", m.Squid.AllowedSourceCIDRs, tc.access.AllowedSourceCIDRs)
			}
			if !slices.Equal(m.AllowedSourceCIDRs, tc.wantSources) {
				t.Errorf("AllowedSourceCIDRs %v, want %v", m.AllowedSourceCIDRs, tc.wantSources)
			}
		})
	}
}
