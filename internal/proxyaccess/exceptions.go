package proxyaccess

import (
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// GrantFlag is the manager flag that lets Proxy authors list exceptions
// inside operatorOnly.
const GrantFlag = "--allow-destination-exceptions"

// operatorOnly are the denied destinations whose exceptions are the
// operator's to grant, not a Proxy author's: what they reach is the
// machine the proxy runs on or the platform under it, never a crawl
// target. An exception there turns every client of the proxy, and every
// page that chooses a redirect, into a client of the metadata server (and
// its credentials) or of services listening on loopback. Other denied
// space (private ranges, CGNAT, ULA, documentation, ...) holds internal
// crawl targets and stays the author's, with an admission warning.
var operatorOnly = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), `"this network" (RFC 791): Linux connects 0.0.0.0 to the local host`},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback (RFC 1122)"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (RFC 3927), cloud metadata at 169.254.169.254"},
	{netip.MustParsePrefix("100.100.100.200/32"), "Alibaba Cloud's metadata server"},
	{netip.MustParsePrefix("::/128"), "the unspecified address (RFC 4291): connects to the local host"},
	{netip.MustParsePrefix("::1/128"), "loopback (RFC 4291)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local (RFC 4291)"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "EC2's IPv6 metadata server"},
}

// Grants are the operatorOnly ranges the operator lets Proxy authors list
// as exceptions (GrantFlag); nil grants nothing.
type Grants []netip.Prefix

// ParseGrants reads GrantFlag's comma-separated value: each entry a
// canonical CIDR that squid would take as an exception and that lies in
// operatorOnly space, since nothing else needs granting.
func ParseGrants(value string) (Grants, error) {
	var cidrs []string
	for _, s := range strings.Split(value, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cidrs = append(cidrs, s)
		}
	}
	if len(cidrs) == 0 {
		return nil, nil
	}
	c := squid.Config{AllowedSourceCIDRs: []string{"192.0.2.0/24"}, Auth: squid.Auth{Type: squid.AuthNone}, AllowedDestinationExceptions: cidrs}
	var msgs []string
	for _, e := range c.ValidateFields(nil) {
		if strings.HasPrefix(e.Field, "allowedDestinationExceptions[") {
			msgs = append(msgs, fmt.Sprintf("%q %s", e.BadValue, e.Detail))
		}
	}
	if len(msgs) > 0 {
		return nil, fmt.Errorf("%s: %s", GrantFlag, strings.Join(msgs, "; "))
	}
	out := make(Grants, 0, len(cidrs))
	for _, s := range cidrs {
		p := netip.MustParsePrefix(s) // validated above
		if len(operatorOnlyParts(p)) == 0 {
			return nil, fmt.Errorf("%s: %q needs no grant: only exceptions overlapping loopback, link-local or a metadata address do (%s); Proxy authors may list others themselves",
				GrantFlag, s, operatorOnlyList())
		}
		out = append(out, p)
	}
	return out, nil
}

// String is the flag's value.
func (g Grants) String() string {
	s := make([]string, len(g))
	for i, p := range g {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// covers reports whether one grant contains all of p.
func (g Grants) covers(p netip.Prefix) bool {
	for _, r := range g {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// operatorOnlyPart is where an exception reaches into one operatorOnly
// range.
type operatorOnlyPart struct {
	// in is the index of the range in operatorOnly.
	in int
	// part is the exception's share of it: the smaller of the two, since
	// prefixes nest or are disjoint.
	part netip.Prefix
}

func operatorOnlyParts(p netip.Prefix) []operatorOnlyPart {
	p = p.Masked()
	var out []operatorOnlyPart
	for i, o := range operatorOnly {
		switch {
		case !o.prefix.Overlaps(p):
		case o.prefix.Bits() >= p.Bits():
			out = append(out, operatorOnlyPart{i, o.prefix})
		default:
			out = append(out, operatorOnlyPart{i, p})
		}
	}
	return out
}

func operatorOnlyList() string {
	s := make([]string, len(operatorOnly))
	for i, o := range operatorOnly {
		s[i] = o.prefix.String()
	}
	return strings.Join(s, ", ")
}

// NeedsGrant returns the exceptions of a that only GrantFlag can admit
// (what a harness must pass the manager for the access it uses).
func NeedsGrant(a *crawlv1.ProxyAccess) []string {
	var out []string
	for _, s := range a.AllowedDestinationExceptions {
		if p, err := netip.ParsePrefix(s); err == nil && len(operatorOnlyParts(p)) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// validateExceptions refuses each exception that reaches into operatorOnly
// space beyond what grants cover.
func validateExceptions(a *crawlv1.ProxyAccess, grants Grants) field.ErrorList {
	path := AccessPath.Child("allowedDestinationExceptions")
	var errs field.ErrorList
	for i, s := range a.AllowedDestinationExceptions {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			continue // squid's validation names it
		}
		for _, o := range operatorOnlyParts(p) {
			if grants.covers(o.part) {
				continue
			}
			r := operatorOnly[o.in]
			errs = append(errs, field.Forbidden(path.Index(i), fmt.Sprintf(
				"%s overlaps %s, %s: exceptions there are the operator's to grant, not a Proxy author's; the manager admits them only when it runs with %s listing a range that contains %s",
				s, r.prefix, r.what, GrantFlag, o.part)))
		}
	}
	return errs
}

// Warnings are admission warnings about a's exceptions, named under path
// (spec.access, or a ProxyPool's template's): each opens internal space to
// every client of the proxy and to every redirect a crawled page chooses.
func Warnings(path *field.Path, a *crawlv1.ProxyAccess) []string {
	if a == nil {
		return nil
	}
	var out []string
	for i, s := range a.AllowedDestinationExceptions {
		out = append(out, fmt.Sprintf("%s is %s: every client of this proxy, and every page it fetches that redirects there, reaches it; keep exceptions to the internal targets you mean (docs/security.md)",
			path.Child("allowedDestinationExceptions").Index(i), s))
	}
	return out
}
