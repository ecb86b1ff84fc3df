package provider

import (
	"strings"
	"testing"
)

func TestDNSLabel(t *testing.T) {
	for _, tc := range []struct {
		name, base, suffix string
		max                int
		want               string
	}{
		{"plain", "proxy-eu", "-1a2b3c4d", 63, "proxy-eu-1a2b3c4d"},
		{"lowercased", "Proxy-EU", "", 63, "proxy-eu"},
		{"runs become one dash", "proxy-a..b__c", "", 63, "proxy-a-b-c"},
		{"leading junk dropped", "..x", "", 63, "x"},
		{"trailing junk dropped", "x--", "-s", 63, "x-s"},
		{"non-ASCII is junk", "prö-xy", "", 63, "pr-xy"},
		{"cut to fit the suffix", strings.Repeat("a", 70), "-12345678", 63, strings.Repeat("a", 54) + "-12345678"},
		{"no dash left at the cut", strings.Repeat("a", 53) + "-b", "-12345678", 63, strings.Repeat("a", 53) + "-12345678"},
		{"other limit", "proxy-abcdef", "-1", 8, "proxy-1"},
		{"empty", "", "-1", 63, "-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := DNSLabel(tc.base, tc.suffix, tc.max)
			if got != tc.want {
				t.Errorf("DNSLabel(%q, %q, %d) = %q, want %q", tc.base, tc.suffix, tc.max, got, tc.want)
			}
			if len(got) > tc.max {
				t.Errorf("len %d > %d", len(got), tc.max)
			}
		})
	}
}

func TestUIDSuffix(t *testing.T) {
	a, b := UIDSuffix("uid-a"), UIDSuffix("uid-b")
	if len(a) != 9 || a[0] != '-' || a == b || a != UIDSuffix("uid-a") {
		t.Errorf("UIDSuffix: %q, %q", a, b)
	}
}
