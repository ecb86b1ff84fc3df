package provider

import (
	"strings"
	"testing"
)

func TestValidateInstallID(t *testing.T) {
	for _, ok := range []string{"a", "9", "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "staging", strings.Repeat("a", 63)} {
		if err := ValidateInstallID(ok); err != nil {
			t.Errorf("ValidateInstallID(%q): %v", ok, err)
		}
	}
	// Each of these would be rewritten (lossily) by a GCE or Kubernetes
	// label, or is not a label value at all.
	for _, bad := range []string{"", "Staging", "-a", "a-", "a_b", "a.b", "a b", strings.Repeat("a", 64)} {
		if err := ValidateInstallID(bad); err == nil {
			t.Errorf("ValidateInstallID(%q) accepted", bad)
		}
	}
}
