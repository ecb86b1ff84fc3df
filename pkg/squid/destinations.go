package squid

import (
	"net/netip"
	"slices"
	"strings"
)

// The default deny list is every block that IANA's special-purpose address
// registries (iana-ipv4-special-registry, iana-ipv6-special-registry) mark
// not globally reachable, plus the IPv6 spellings of denied IPv4 addresses
// (NAT64, 6to4, Teredo, IPv4-compatible), in two disjoint sets:
//
//   - DefaultDeniedDestinations: space where hosts of a private network
//     live. AllowedDestinationExceptions may lift part of it for a target
//     that really is internal.
//   - alwaysDenied: space that stands for other addresses (translation and
//     tunnel prefixes) or for no host at all. No exception lifts it, so an
//     exception never re-opens a denied address under another spelling;
//     exceptions are written in the plain form.
//
// Registry blocks that are globally reachable are public services, not
// internal targets, and stay allowed: AS112 (192.31.196.0/24 RFC 7535,
// 192.175.48.0/24 and 2620:4f:8000::/48 RFC 7534), AMT 192.52.193.0/24
// (RFC 7450), NAT64's 64:ff9b::/96 (RFC 6052; only its spellings of denied
// IPv4 are denied, see nat64Spellings). The exceptions, inside blocks
// denied whole, are named at those blocks. IPv4-mapped ::ffff:0:0/96
// (RFC 4291) is not listed: squid judges a mapped address as the IPv4
// address it maps, and an IPv6 entry covering that range makes squid drop
// IPv4 entries (v4MappedRange).

// DefaultDeniedDestinations are refused unless AllowedDestinationExceptions
// carves an address out (see above for what no exception lifts).
var DefaultDeniedDestinations = []string{
	// IPv4 registry, Globally Reachable False.
	"0.0.0.0/8",       // "This network", RFC 791 §3.2 (0.0.0.0/32: RFC 1122 §3.2.1.3); Linux connects 0.0.0.0 to the local host
	"10.0.0.0/8",      // Private-Use, RFC 1918
	"100.64.0.0/10",   // Shared Address Space (carrier-grade NAT), RFC 6598
	"127.0.0.0/8",     // Loopback, RFC 1122 §3.2.1.3 (a superset of squid's to_localhost)
	"169.254.0.0/16",  // Link Local, RFC 3927 (squid's to_linklocal): cloud metadata at 169.254.169.254
	"172.16.0.0/12",   // Private-Use, RFC 1918
	"192.0.2.0/24",    // Documentation (TEST-NET-1), RFC 5737: lab networks use it
	"192.168.0.0/16",  // Private-Use, RFC 1918
	"198.18.0.0/15",   // Benchmarking, RFC 2544 (the range corrected by RFC 6815): labs, and fake-IP DNS resolvers hand it out
	"198.51.100.0/24", // Documentation (TEST-NET-2), RFC 5737
	"203.0.113.0/24",  // Documentation (TEST-NET-3), RFC 5737
	// Reserved, RFC 1112 §4, with Limited Broadcast 255.255.255.255/32
	// (RFC 919 §7, RFC 8190) inside: some clusters number pods here.
	"240.0.0.0/4",

	// IPv6 registry, Globally Reachable False.
	"::/128",        // Unspecified Address, RFC 4291
	"::1/128",       // Loopback Address, RFC 4291
	"2001:db8::/32", // Documentation, RFC 3849
	"3fff::/20",     // Documentation, RFC 9637
	"fc00::/7",      // Unique-Local, RFC 4193 (RFC 8190)
	"fe80::/10",     // Link-Local Unicast, RFC 4291
}

// alwaysDeniedBlocks are the fixed part of alwaysDenied; the rest is
// computed from the IPv4 entries (alwaysDeniedSpellings).
var alwaysDeniedBlocks = []string{
	// IPv4 registry.
	//
	// IETF Protocol Assignments, RFC 6890 §2.1, denied whole: DS-Lite's
	// service continuity prefix 192.0.0.0/29 (RFC 7335), the dummy address
	// 192.0.0.8 (RFC 7600) and NAT64/DNS64 discovery 192.0.0.170-171
	// (RFC 8880, RFC 7050) are not reachable; the two globally reachable
	// members, Port Control Protocol anycast 192.0.0.9 (RFC 7723) and TURN
	// anycast 192.0.0.10 (RFC 8155), are protocol relays, not web servers.
	"192.0.0.0/24",
	// 6to4 Relay Anycast, RFC 3068, deprecated by RFC 7526 (its registry
	// row has no reachability), with the 6a44 relay 192.88.99.2/32
	// (RFC 6751, not globally reachable) inside: a relay, not an origin.
	"192.88.99.0/24",
	// Multicast, RFC 5771 (not a special-purpose block): TCP reaches no
	// group, so nothing is crawled there; refused by ACL rather than by a
	// failed connect.
	"224.0.0.0/4",

	// IPv6 registry.
	//
	// IPv4-IPv6 translation for local use, RFC 8215, not globally
	// reachable, denied whole: each network picks where in the /48 the
	// IPv4 address sits (RFC 6052 §2.2), so squid cannot tell which IPv4
	// address one of these stands for. Translation for crawling uses the
	// well-known 64:ff9b::/96 (see nat64Spellings).
	"64:ff9b:1::/48",
	"100::/64",       // Discard-Only Address Block, RFC 6666
	"100:0:0:1::/64", // Dummy IPv6 Prefix, RFC 9780
	// IETF Protocol Assignments, RFC 2928, denied whole. Inside: Teredo
	// 2001::/32 (RFC 4380, reachability N/A; it embeds the server's IPv4
	// address in bits 32-63 and the client's, inverted, in the last 32:
	// 2001:0:4136:e378:8000:63bf:5601:5601 is a path to 169.254.169.254),
	// benchmarking 2001:2::/48 (RFC 5180), the deprecated ORCHID
	// 2001:10::/28 (RFC 4843). Its globally reachable members are protocol
	// anycast (PCP 2001:1::1 RFC 7723, TURN 2001:1::2 RFC 8155, DNS-SD SRP
	// 2001:1::3 RFC 9665), AMT relays 2001:3::/32 (RFC 7450), AS112
	// 2001:4:112::/48 (RFC 7535) and identifiers that are not locators
	// (ORCHIDv2 2001:20::/28 RFC 7343, drone DETs 2001:30::/28 RFC 9374):
	// none is a web server. The block ends at 2001:1ff:ffff:...; ordinary
	// 2001: space (2001:4860::/32 and the like) lies outside it.
	"2001::/23",
	// 6to4, RFC 3056 (reachability N/A): embeds an IPv4 address in bits
	// 16-47 (2002:a9fe:a9fe:: is 169.254.169.254). Denied whole rather
	// than per embedded range: its relays are deprecated (RFC 7526) and
	// web sites publish native addresses, so no crawl target needs it.
	"2002::/16",
	"5f00::/16", // Segment Routing (SRv6) SIDs, RFC 9602: segment identifiers, not hosts
	"ff00::/8",  // Multicast, RFC 4291 §2.7 (not a special-purpose block), as 224.0.0.0/4
}

var (
	defaultDenied = mustPrefixes(DefaultDeniedDestinations)
	alwaysDenied  = normalize(append(mustPrefixes(alwaysDeniedBlocks), alwaysDeniedSpellings()...))

	// RFC 6052's well-known prefix: 64:ff9b::a9fe:a9fe is 169.254.169.254
	// behind a NAT64 translator.
	nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96")
	// IPv4-compatible addresses (RFC 4291 §2.5.5.1, deprecated): Linux
	// tunnels ::/96 to the embedded IPv4 address when a sit interface is
	// up, so ::a9fe:a9fe can reach 169.254.169.254.
	ipv4Compatible = netip.MustParsePrefix("::/96")
)

// alwaysDeniedSpellings are the IPv6 forms of the denied IPv4 ranges that
// no block above covers: their NAT64 spellings, and the IPv4-compatible
// range. RFC 6052 §3.1 forbids translating non-global IPv4 addresses under
// the well-known prefix, so denying their spellings costs nothing, while
// 64:ff9b::/96 itself stays open: on an IPv6-only network with DNS64 it is
// how every IPv4-only site is reached. Of ::/96, :: and ::1 are left to
// DefaultDeniedDestinations, where exceptions may lift them as before.
func alwaysDeniedSpellings() []netip.Prefix {
	var v4 []netip.Prefix
	for _, p := range slices.Concat(defaultDenied, mustPrefixes(alwaysDeniedBlocks)) {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		}
	}
	out := nat64Spellings(v4)
	compat := []netip.Prefix{ipv4Compatible}
	for _, d := range defaultDenied {
		var rest []netip.Prefix
		for _, c := range compat {
			rest = append(rest, subtract(c, d)...)
		}
		compat = rest
	}
	return append(out, compat...)
}

// nat64Spellings returns each IPv4 prefix's range under 64:ff9b::/96.
func nat64Spellings(v4 []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range v4 {
		if !p.Addr().Is4() {
			continue
		}
		b := nat64WellKnown.Addr().As16()
		a4 := p.Addr().As4()
		copy(b[12:], a4[:])
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(b), nat64WellKnown.Bits()+p.Bits()))
	}
	return out
}

// DeniedDestinations returns what c's squid.conf refuses by its own list
// (denied_destinations): the default list less the exceptions, the ranges
// no exception lifts, and the extra list with its NAT64 spellings. A
// provider that enforces the same list elsewhere (a NetworkPolicy) takes
// it from here.
func (c Config) DeniedDestinations() ([]netip.Prefix, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return deniedDestinations(mustPrefixes(c.ExtraDeniedDestinations), mustPrefixes(c.AllowedDestinationExceptions)), nil
}

// WithNAT64Spellings returns ranges and the NAT64 spelling (64:ff9b::/96)
// of each IPv4 one, normalised: what to refuse so that a translating
// network does not reach an IPv4 range by its IPv6 name.
func WithNAT64Spellings(ranges []netip.Prefix) []netip.Prefix {
	return normalize(slices.Concat(ranges, nat64Spellings(ranges)))
}

// fileDeniedPlaceholder is always in a denied destinations file: squid
// warns about an ACL without entries, and 0.0.0.0 (which Linux connects to
// the local host) is refused by the default list anyway.
var fileDeniedPlaceholder = netip.MustParsePrefix("0.0.0.0/32")

// DeniedDestinationsFile is the file Paths.DeniedDestinationsFile names,
// refusing ranges as given (normalised; WithNAT64Spellings adds their
// NAT64 spellings): one entry a line, as squid reads a quoted ACL file.
func DeniedDestinationsFile(ranges []netip.Prefix) []byte {
	var b strings.Builder
	b.WriteString("# Generated by proxy-operator (pkg/squid); squid re-reads it on reconfigure.\n")
	for _, w := range ipWords(append([]netip.Prefix{fileDeniedPlaceholder}, ranges...)) {
		b.WriteString(w + "\n")
	}
	return []byte(b.String())
}
