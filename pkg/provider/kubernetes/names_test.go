package kubernetes

import (
	"regexp"
	"strings"
	"testing"
)

var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestObjectName(t *testing.T) {
	for _, name := range []string{"a", "eu.egress.1", strings.Repeat("x", 253), "UPPER_case"} {
		n := ObjectName(name, uid)
		if len(n) > 63 || !dns1123.MatchString(n) || !strings.HasPrefix(n, "proxy-") {
			t.Errorf("ObjectName(%q) = %q: not a DNS-1123 label", name, n)
		}
	}
	long := strings.Repeat("x", 100)
	if ObjectName(long, "a") == ObjectName(long, "b") {
		t.Error("same name, different uid: collision")
	}
	// Existing pods are found by these names: they must never change.
	if got := ObjectName("Eu.Egress_1", "u1"); got != "proxy-eu-egress-1-bb82030d" {
		t.Errorf("ObjectName changed: %q", got)
	}
	if got := ObjectName(strings.Repeat("a", 52)+"-b", "u2"); got != "proxy-"+strings.Repeat("a", 48)+"-6ca202c8" {
		t.Errorf("ObjectName changed: %q", got)
	}
	if got := ObjectName("eu-egress", uid); !strings.HasPrefix(got, "proxy-eu-egress-") {
		t.Errorf("ObjectName = %q", got)
	}
}
