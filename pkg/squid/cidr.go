package squid

import (
	"net/netip"
	"slices"
)

// mustPrefixes parses CIDRs known to be valid (defaults, validated input).
func mustPrefixes(in []string) []netip.Prefix {
	out := make([]netip.Prefix, len(in))
	for i, s := range in {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func insideAny(p netip.Prefix, set []netip.Prefix) bool {
	for _, s := range set {
		if s.Bits() <= p.Bits() && s.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// Normalize sorts prefixes (IPv4 first) and drops every prefix contained
// in another: the form of every list the operator writes, and squid needs
// it (see normalize).
func Normalize(in []netip.Prefix) []netip.Prefix { return normalize(in) }

// normalize sorts prefixes (IPv4 first) and drops every prefix contained in
// another. squid needs this, not just for tidiness: when an IP ACL lists a
// range after one of its subnets, squid 5.7 keeps the subnet and ignores
// the larger range ("... is ignored to keep splay tree searching
// predictable"), so "10.1.0.0/16 10.0.0.0/8" would deny only 10.1/16.
func normalize(in []netip.Prefix) []netip.Prefix {
	s := slices.Clone(in)
	slices.SortFunc(s, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	// Sorted by address then length, a prefix's container (if any) is the
	// last one kept: anything kept in between would lie inside it too.
	out := s[:0]
	for _, p := range s {
		if n := len(out); n > 0 && out[n-1].Bits() <= p.Bits() && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// subtract returns p without the addresses of ex, as the fewest prefixes:
// p is halved until each half is inside ex (dropped) or disjoint (kept).
func subtract(p, ex netip.Prefix) []netip.Prefix {
	if !p.Overlaps(ex) {
		return []netip.Prefix{p}
	}
	if ex.Bits() <= p.Bits() {
		return nil // ex covers p
	}
	lo, hi := halves(p)
	return append(subtract(lo, ex), subtract(hi, ex)...)
}

// halves splits p into its two prefixes one bit longer.
func halves(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits()
	lo := netip.PrefixFrom(p.Addr(), bits+1)
	b := p.Addr().AsSlice()
	b[bits/8] |= 0x80 >> (bits % 8)
	a, _ := netip.AddrFromSlice(b)
	return lo, netip.PrefixFrom(a, bits+1)
}

// deniedDestinations is (default list minus exceptions) plus the ranges no
// exception lifts, plus the extra list and its NAT64 spellings (an IPv6-only
// network translating with the well-known prefix would otherwise reach an
// extra IPv4 range as 64:ff9b::<address>).
// Exceptions are subtracted from the list rather than allowed by a rule of
// their own: squid's dst ACL matches a host name when any of its addresses
// matches, so "deny denied !exceptions" would admit a name resolving to both
// an excepted and a denied address, and squid might then connect to the
// denied one.
func deniedDestinations(extra, exceptions []netip.Prefix) []netip.Prefix {
	denied := slices.Clone(defaultDenied)
	for _, ex := range exceptions {
		var next []netip.Prefix
		for _, d := range denied {
			next = append(next, subtract(d, ex)...)
		}
		denied = next
	}
	return normalize(slices.Concat(denied, alwaysDenied, extra, nat64Spellings(extra)))
}

// Aggregate is Normalize with adjacent halves merged into the prefix they
// make up, repeatedly: the same addresses in the fewest prefixes (a
// NetworkPolicy's except list stays short where subtraction cut a range
// into pieces that other entries fill again).
func Aggregate(in []netip.Prefix) []netip.Prefix {
	out := normalize(in)
	for {
		merged := false
		next := out[:0:0]
		for i := 0; i < len(out); i++ {
			p := out[i]
			if i+1 < len(out) && p.Bits() > 0 && p.Bits() == out[i+1].Bits() {
				parent := netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked()
				if lo, hi := halves(parent); lo == p && hi == out[i+1] {
					next = append(next, parent)
					merged = true
					i++
					continue
				}
			}
			next = append(next, p)
		}
		out = normalize(next)
		if !merged {
			return out
		}
	}
}
