// Package proxyaccess turns a Proxy's spec.access into the squid.Config
// the providers render (pkg/squid), so the webhook validates with the same
// rules the renderer enforces and the Proxy controller builds
// Machine.Squid from one mapping.
package proxyaccess

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// AccessPath is where spec.access's fields are named in errors.
var AccessPath = field.NewPath("spec", "access")

// SquidConfig is the squid configuration of a managed Proxy: spec.access,
// the credential (Basic) and the port. probeSources (the manager's
// --probe-source-cidrs) join the allowed sources only with Basic, where a
// client from them still has to authenticate; with auth None they would
// admit every client of those ranges without credentials, so there the
// manager's source must be in allowedSourceCIDRs like any client's.
// Paths and ListenAddress stay empty: each provider fills its own.
func SquidConfig(a *crawlv1.ProxyAccess, port int32, cred squid.Auth, probeSources []string) squid.Config {
	c := squid.Config{
		Port:                         int(port),
		AllowedSourceCIDRs:           append([]string(nil), a.AllowedSourceCIDRs...),
		Auth:                         cred,
		ExtraDeniedDestinations:      append([]string(nil), a.ExtraDeniedDestinations...),
		AllowedDestinationExceptions: append([]string(nil), a.AllowedDestinationExceptions...),
		MaxConnectionsPerClient:      int(a.MaxConnectionsPerClient),
	}
	c.Auth.Type = AuthType(a)
	if c.Auth.Type == squid.AuthBasic {
		c.AllowedSourceCIDRs = append(c.AllowedSourceCIDRs, probeSources...)
	}
	for _, p := range a.AllowedPorts {
		c.AllowedPorts = append(c.AllowedPorts, int(p))
	}
	return c
}

// AuthType is spec.access.auth.type as squid's; Basic when auth is
// absent (what the webhook defaults).
func AuthType(a *crawlv1.ProxyAccess) squid.AuthType {
	if a == nil || a.Auth == nil || a.Auth.Type == "" {
		return squid.AuthBasic
	}
	return squid.AuthType(a.Auth.Type)
}

// UsesBasic reports whether p's managed squid authenticates clients with
// Basic, i.e. whether p has (or needs) credentials.
func UsesBasic(p *crawlv1.Proxy) bool {
	return p.IsManaged() && AuthType(p.Spec.Access) == squid.AuthBasic
}

// Validate returns the problems of a managed spec.access, named under
// spec.access, by the renderer's own rules (squid.Config.ValidateFields)
// and the operator's: exceptions reaching loopback, link-local or a
// metadata address only as far as grants (GrantFlag) allow. Admission and
// the Proxy controller both apply it, so a Proxy stored past the webhook
// is refused too. The credential is not part of the spec (it lives in a
// Secret the controller reads), so squid's username and password checks
// are left to the controller; the port is spec.port, validated on its own.
func Validate(a *crawlv1.ProxyAccess, grants Grants) field.ErrorList {
	c := SquidConfig(a, 0, squid.Auth{}, nil)
	var out field.ErrorList
	for _, e := range c.ValidateFields(AccessPath) {
		switch e.Field {
		case AccessPath.Child("auth", "username").String(), AccessPath.Child("auth", "password").String():
			continue
		}
		out = append(out, e)
	}
	return append(out, validateExceptions(a, grants)...)
}
