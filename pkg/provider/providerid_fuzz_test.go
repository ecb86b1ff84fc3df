package provider

import "testing"

// FuzzParseProviderID: any accepted ID prints back to a string that parses
// to the same parts, and an accepted kvm ID formats back to what it parsed
// to (status.providerID is written by one and read by the other).
func FuzzParseProviderID(f *testing.F) {
	for _, s := range []string{
		"kvm://hv1/0b8a1c52-7e57-4c3a-9d0e-5f1a2b3c4d5e",
		"kvm://hv1/0B8A1C52-7E57-4C3A-9D0E-5F1A2B3C4D5E",
		"kubernetes://ns/pod-1",
		"gce://project/zone-a/instance-1",
		"kvm:///x", "kvm://a//b", "://a/b", "kvm://a/", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseProviderID(s)
		if err == nil {
			if p.Scheme == "" || p.Location == "" || p.ID == "" {
				t.Fatalf("ParseProviderID(%q) = %+v: an empty part was accepted", s, p)
			}
			again, err := ParseProviderID(p.String())
			if err != nil || again != p {
				t.Fatalf("ParseProviderID(%q).String() = %q reparses to %+v, %v", s, p.String(), again, err)
			}
		}
		host, uuid, err := ParseKVMProviderID(s)
		if err != nil {
			return
		}
		h2, u2, err := ParseKVMProviderID(FormatKVMProviderID(host, uuid))
		if err != nil || h2 != host || u2 != uuid {
			t.Fatalf("kvm ID %q: format(%q, %q) reparses to %q, %q, %v", s, host, uuid, h2, u2, err)
		}
	})
}
