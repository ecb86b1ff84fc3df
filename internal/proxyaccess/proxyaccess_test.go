package proxyaccess

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/squid"
)

func TestSquidConfigMapsAccess(t *testing.T) {
	a := &crawlv1.ProxyAccess{Managed: ptr.To(true), AllowedSourceCIDRs: []string{"10.244.0.0/16"},
		Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthBasic}, AllowedPorts: []int32{80, 443, 8080},
		ExtraDeniedDestinations: []string{"198.18.0.0/15"}, AllowedDestinationExceptions: []string{"10.9.0.1/32"}, MaxConnectionsPerClient: 32}
	cred := squid.Auth{Type: squid.AuthBasic, Username: "p", Password: squid.GeneratePassword()}
	c := SquidConfig(a, 3128, cred, []string{"192.0.2.7/32"})
	if c.Port != 3128 || c.Auth != cred || !slices.Equal(c.AllowedSourceCIDRs, []string{"10.244.0.0/16", "192.0.2.7/32"}) ||
		!slices.Equal(c.AllowedPorts, []int{80, 443, 8080}) || !slices.Equal(c.ExtraDeniedDestinations, a.ExtraDeniedDestinations) ||
		!slices.Equal(c.AllowedDestinationExceptions, a.AllowedDestinationExceptions) || c.MaxConnectionsPerClient != 32 {
		t.Fatalf("SquidConfig = %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("does not validate: %v", err)
	}
	// The caller's slice is not shared: appending probe sources must not
	// write into spec.access.
	if len(a.AllowedSourceCIDRs) != 1 {
		t.Fatalf("spec.access changed: %v", a.AllowedSourceCIDRs)
	}

	a.Auth.Type = crawlv1.ProxyAuthNone
	a.AllowedSourceCIDRs = []string{"10.244.1.0/24"}
	c = SquidConfig(a, 3128, squid.Auth{}, []string{"10.0.0.0/8"})
	if c.Auth.Type != squid.AuthNone || !slices.Equal(c.AllowedSourceCIDRs, []string{"10.244.1.0/24"}) {
		t.Fatalf("auth None: %+v; the probe sources must not be admitted without credentials", c)
	}
}

func TestValidateLeavesTheCredentialToTheController(t *testing.T) {
	a := &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8", "nope"}}
	errs := Validate(a, nil)
	if len(errs) != 1 || errs[0].Field != "spec.access.allowedSourceCIDRs[1]" {
		t.Fatalf("errors %v, want only spec.access.allowedSourceCIDRs[1]", errs.ToAggregate())
	}
	if strings.Contains(errs.ToAggregate().Error(), "password") {
		t.Fatal("admission complains about a password it cannot know")
	}
}
