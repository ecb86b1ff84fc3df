package squid

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// renderedDenied is the denied_destinations ACL of the config Render
// writes for c.
func renderedDenied(t *testing.T, c Config) func(netip.Addr) bool {
	t.Helper()
	conf, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	denied := mustPrefixes(aclEntries(conf, "denied_destinations"))
	return func(a netip.Addr) bool {
		return slices.ContainsFunc(denied, func(p netip.Prefix) bool { return p.Contains(a) })
	}
}

// Both sets are written by hand: each entry must be a canonical CIDR that
// squid takes as written, neither set may hold an entry inside another of
// its own (a stale duplicate), and no exception may be valid for a range
// that no exception lifts, so the two sets must not overlap.
func TestDeniedSetsAreWellFormedAndDisjoint(t *testing.T) {
	for name, list := range map[string][]string{"DefaultDeniedDestinations": DefaultDeniedDestinations, "alwaysDeniedBlocks": alwaysDeniedBlocks} {
		if _, errs := parsePrefixes(nil, list); len(errs) > 0 {
			t.Errorf("%s: %v", name, errs.ToAggregate())
		}
		if n := len(normalize(mustPrefixes(list))); n != len(list) {
			t.Errorf("%s: an entry lies inside another (%d entries, %d after normalize)", name, len(list), n)
		}
	}
	for _, d := range defaultDenied {
		for _, a := range alwaysDenied {
			if d.Overlaps(a) {
				t.Errorf("%s (exceptions may lift it) overlaps %s (none may)", d, a)
			}
		}
	}
}

// registryRows are the IANA IPv4 and IPv6 special-purpose registries
// (iana-ipv4-special-registry, iana-ipv6-special-registry) row by row, by
// their Globally Reachable column: a non-global block is denied from its
// first address to its last. Globally reachable rows stay open, except
// those inside a block denied whole (see alwaysDeniedBlocks). Written here
// from the registries, not from the code, so a block missing from the
// lists fails the tests.
var registryRows = []struct {
	block  string
	denied bool
}{
	// iana-ipv4-special-registry
	{"0.0.0.0/8", true}, {"0.0.0.0/32", true}, {"10.0.0.0/8", true}, {"100.64.0.0/10", true},
	{"127.0.0.0/8", true}, {"169.254.0.0/16", true}, {"172.16.0.0/12", true},
	{"192.0.0.0/24", true}, {"192.0.0.0/29", true}, {"192.0.0.8/32", true},
	{"192.0.0.9/32", true}, {"192.0.0.10/32", true}, // reachable, inside 192.0.0.0/24
	{"192.0.0.170/32", true}, {"192.0.0.171/32", true}, {"192.0.2.0/24", true},
	{"192.31.196.0/24", false}, {"192.52.193.0/24", false},
	{"192.88.99.0/24", true}, {"192.88.99.2/32", true}, {"192.168.0.0/16", true},
	{"192.175.48.0/24", false}, {"198.18.0.0/15", true}, {"198.51.100.0/24", true},
	{"203.0.113.0/24", true}, {"240.0.0.0/4", true}, {"255.255.255.255/32", true},
	// iana-ipv6-special-registry; 64:ff9b::/96 is open but for the
	// spellings of denied IPv4 (TestNAT64SpellingsAreDenied).
	{"::1/128", true}, {"::/128", true}, {"64:ff9b::808:808/128", false}, {"64:ff9b:1::/48", true},
	{"100::/64", true}, {"100:0:0:1::/64", true}, {"2001::/23", true}, {"2001::/32", true},
	{"2001:1::1/128", true}, {"2001:1::2/128", true}, {"2001:1::3/128", true}, // reachable, inside 2001::/23
	{"2001:2::/48", true}, {"2001:3::/32", true}, {"2001:4:112::/48", true}, {"2001:10::/28", true},
	{"2001:20::/28", true}, {"2001:30::/28", true}, {"2001:db8::/32", true}, {"2002::/16", true},
	{"2620:4f:8000::/48", false}, {"3fff::/20", true}, {"5f00::/16", true}, {"fc00::/7", true}, {"fe80::/10", true},
	// Not special-purpose blocks: multicast, IPv4-compatible IPv6.
	{"224.0.0.0/4", true}, {"ff00::/8", true}, {"::/96", true},
	// Ordinary space beside denied blocks stays open.
	{"11.0.0.0/8", false}, {"192.0.1.0/24", false}, {"2001:200::/23", false}, {"2001:4860::/32", false}, {"2003::/16", false},
}

func TestDefaultListCoversTheIANARegistries(t *testing.T) {
	isDenied := renderedDenied(t, baseConfig())
	for _, row := range registryRows {
		p := netip.MustParsePrefix(row.block)
		for _, a := range []netip.Addr{p.Addr(), squidtest.LastAddr(p)} {
			if isDenied(a) != row.denied {
				t.Errorf("%s (registry block %s): denied %v, want %v", a, row.block, isDenied(a), row.denied)
			}
		}
	}
}

// 64:ff9b::/96 stays open (it is how an IPv6-only network reaches IPv4
// sites) except for the NAT64 spelling of every denied IPv4 range,
// extraDeniedDestinations included.
func TestNAT64SpellingsAreDenied(t *testing.T) {
	c := baseConfig()
	c.ExtraDeniedDestinations = []string{"8.8.4.0/24"}
	isDenied := renderedDenied(t, c)
	nat64 := func(a netip.Addr) netip.Addr {
		b := netip.MustParseAddr("64:ff9b::").As16()
		v4 := a.As4()
		copy(b[12:], v4[:])
		return netip.AddrFrom16(b)
	}
	var v4 []netip.Prefix
	for _, p := range slices.Concat(defaultDenied, alwaysDenied, mustPrefixes(c.ExtraDeniedDestinations)) {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		}
	}
	if len(v4) < 15 {
		t.Fatalf("only %d IPv4 ranges denied: %v", len(v4), v4)
	}
	for _, p := range v4 {
		for _, a := range []netip.Addr{p.Addr(), squidtest.LastAddr(p)} {
			if !isDenied(nat64(a)) {
				t.Errorf("%s (%s) is not denied", nat64(a), a)
			}
		}
	}
	for _, a := range []string{"64:ff9b::808:808", "64:ff9b::b00:0", "64:ff9b::c000:100", "64:ff9b::808:3ff", "64:ff9b::808:500"} {
		if isDenied(netip.MustParseAddr(a)) {
			t.Errorf("%s (a global IPv4 address behind NAT64) is denied", a)
		}
	}
}

// Exceptions lift what a Proxy's network may really host, in the new
// ranges as in the old, and never a range that stands for other addresses
// or for no host: the error names the field and the range.
func TestExceptionsLiftOnlyTheDefaultList(t *testing.T) {
	for _, ok := range []string{"127.0.0.1/32", "::1/128", "::/128", "10.20.30.40/32", "198.18.0.0/24", "240.0.0.0/8", "192.0.2.7/32", "2001:db8:1::/48", "3fff::1/128", "fd00::/8"} {
		c := baseConfig()
		c.AllowedDestinationExceptions = []string{ok}
		if err := c.Validate(); err != nil {
			t.Errorf("exception %s: %v", ok, err)
			continue
		}
		isDenied := renderedDenied(t, c)
		if a := netip.MustParsePrefix(ok).Addr(); isDenied(a) {
			t.Errorf("exception %s: %s still denied", ok, a)
		}
	}
	for _, bad := range []struct{ exception, overlaps string }{
		{"64:ff9b::a9fe:a9fe/128", "64:ff9b::a9fe:0/112"},
		{"64:ff9b:1::a00:1/128", "64:ff9b:1::/48"},
		{"2002:a9fe:a9fe::/48", "2002::/16"},
		{"2001::/32", "2001::/23"},
		{"::a9fe:a9fe/128", "::8000:0/97"},
		{"::/96", "::2/127"},
		{"192.0.0.0/29", "192.0.0.0/24"},
		{"224.0.0.0/24", "224.0.0.0/4"},
		{"ff02::/16", "ff00::/8"},
	} {
		c := baseConfig()
		c.AllowedDestinationExceptions = []string{bad.exception}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "allowedDestinationExceptions[0]") || !strings.Contains(err.Error(), "overlaps "+bad.overlaps+", which no exception lifts") {
			t.Errorf("exception %s: %v, want refused as overlapping %s", bad.exception, err, bad.overlaps)
		}
	}
}

// docs/security.md's table of default denied destinations names every
// entry of both lists.
func TestSecurityDocListsTheDefaultDeniedRanges(t *testing.T) {
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range slices.Concat(DefaultDeniedDestinations, alwaysDeniedBlocks, []string{nat64WellKnown.String(), ipv4Compatible.String()}) {
		if !strings.Contains(string(doc), "`"+e+"`") {
			t.Errorf("docs/security.md does not list %s", e)
		}
	}
}
