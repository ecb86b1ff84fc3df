package provider

import (
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/squid"
)

func TestManagedSquid(t *testing.T) {
	const password = "a-password-that-must-never-show"
	valid := func() *squid.Config {
		return &squid.Config{AllowedSourceCIDRs: []string{"192.0.2.0/24"}, Auth: squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: password}}
	}
	paths := squid.Paths{PasswordFile: "/etc/squid/auth/passwd"}

	if _, ok, err := ManagedSquid(&Machine{Port: 3128}, paths); ok || err != nil {
		t.Errorf("unmanaged: ok %v err %v, want neither", ok, err)
	}

	c, ok, err := ManagedSquid(&Machine{Port: 8080, Squid: valid()}, paths)
	if !ok || err != nil || c.Port != 8080 || c.Paths != paths {
		t.Errorf("managed: %+v ok %v err %v; want port 8080 and the provider's paths", c, ok, err)
	}
	m := &Machine{Port: 8080, Squid: valid()}
	m.Squid.Paths.PasswordFile = "/elsewhere"
	if c, _, _ := ManagedSquid(m, paths); c.Paths != paths {
		t.Errorf("the controller's paths won over the provider's: %+v", c.Paths)
	}
	if m.Squid.Paths.PasswordFile != "/elsewhere" {
		t.Error("ManagedSquid changed the Machine")
	}

	mismatch := valid()
	mismatch.Port = 3129
	if _, _, err := ManagedSquid(&Machine{Port: 3128, Squid: mismatch}, paths); Class(err) != ClassPermanent {
		t.Errorf("port mismatch: %v, want a permanent error", err)
	}

	bad := valid()
	bad.AllowedSourceCIDRs = []string{"10.0.0.1/8"}
	bad.Auth.Password = "short"
	_, _, err = ManagedSquid(&Machine{Squid: bad}, paths)
	if Class(err) != ClassPermanent || !strings.Contains(err.Error(), "spec.access.allowedSourceCIDRs[0]") || !strings.Contains(err.Error(), "spec.access.auth.password") {
		t.Errorf("invalid config: %v, want a permanent error naming the fields", err)
	}
	if strings.Contains(err.Error(), "short") {
		t.Errorf("error shows the password: %v", err)
	}
}
