package e2eutil

import (
	"reflect"
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
)

const (
	uidA    = "0b7e6f1a-1111-4c1e-9d3e-000000000001"
	uidGone = "0b7e6f1a-1111-4c1e-9d3e-000000000002"
	digest  = "4c865258df23180a84f2a291c6ac4e09e10f441ff68eed90b75dc4d173ea3cd0"
	digest2 = "5c865258df23180a84f2a291c6ac4e09e10f441ff68eed90b75dc4d173ea3cd0"
	digest3 = "6c865258df23180a84f2a291c6ac4e09e10f441ff68eed90b75dc4d173ea3cd0"
)

func domainXML(name, uuid, uid string) string {
	md := ""
	if uid != "" {
		md = "<metadata>" + domxml.Metadata{Namespace: "ns", Name: strings.TrimPrefix(name, "ns."), UID: uid, Tag: "t", InstallID: "i"}.XML() + "</metadata>"
	}
	return "<domain type='qemu'>\n  <name>" + name + "</name>\n  <uuid>" + uuid + "</uuid>\n  " + md + "\n</domain>"
}

func TestParseInventoryAndAudit(t *testing.T) {
	out := strings.Join([]string{
		"@@domain ns.squid-1",
		"@@state running",
		domainXML("ns.squid-1", "11111111-2222-3333-4444-555555555555", uidA),
		"@@domain ns.squid-old",
		"@@state shut off",
		domainXML("ns.squid-old", "11111111-2222-3333-4444-666666666666", uidGone),
		"@@domain ns.foreign",
		"@@state paused",
		domainXML("ns.foreign", "11111111-2222-3333-4444-777777777777", ""),
		"@@pool e2e",
		"@@vol image-sha256_" + digest + ".qcow2",
		"@@vol image-sha256_" + digest + ".qcow2.sha256",
		"@@vol image-sha256_" + digest + ".qcow2.held-by-0b7e6f1a-aaaa",
		"@@vol image-sha256_" + digest + ".qcow2.held-by-_",
		"@@vol image-sha256_" + digest2 + ".qcow2",
		"@@vol image-sha256_" + digest3 + ".raw.held-by-0b7e6f1a-aaaa",
		"@@vol " + domxml.DiskVolumeName(uidA),
		"@@vol " + domxml.SeedVolumeName(uidA),
		"@@vol " + domxml.DiskVolumeName(uidGone),
		"@@vol foreign-data.img",
		"@@vol stray.img",
		"@@nvram",
		"@@file ns.squid-1_VARS.fd",
		"@@file ns.deleted_VARS.fd",
		"@@end",
		"",
	}, "\n")
	inv, err := parseInventory(out)
	if err != nil {
		t.Fatal(err)
	}
	if d := inv.Domains["ns.squid-1"]; d.UUID != "11111111-2222-3333-4444-555555555555" || d.State != "running" || d.Metadata == nil || d.Metadata.UID != uidA {
		t.Fatalf("ns.squid-1 parsed as %+v", d)
	}
	if d := inv.Domains["ns.foreign"]; d.Metadata != nil || d.State != "paused" {
		t.Fatalf("ns.foreign parsed as %+v", d)
	}
	if len(inv.Volumes["e2e"]) != 11 || len(inv.NVRAM) != 2 {
		t.Fatalf("volumes %v, nvram %v", inv.Volumes, inv.NVRAM)
	}

	foreign := Foreign{
		Domains: map[string]DomainRecord{"ns.foreign": {UUID: "11111111-2222-3333-4444-777777777777", State: "paused"}},
		Volumes: map[string][]string{"e2e": {"foreign-data.img", "foreign-gone.img"}},
	}
	a := inv.Audit([]ProxyRef{{Domain: "ns.squid-1", UID: uidA}}, foreign)
	want := Audit{
		LeakedDomains: []string{"ns.squid-old"},
		LeakedVolumes: []string{"e2e/image-sha256_" + digest2 + ".qcow2 (no marker: never verified)",
			"e2e/image-sha256_" + digest3 + ".raw.held-by-0b7e6f1a-aaaa (claim without its image)",
			"e2e/" + domxml.DiskVolumeName(uidGone), "e2e/stray.img"},
		LeakedNVRAM:    []string{"ns.deleted_VARS.fd"},
		ForeignTouched: []string{"volume e2e/foreign-gone.img: gone"},
	}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("audit:\n got %#v\nwant %#v", a, want)
	}
	if a.Leaks() != 6 {
		t.Errorf("Leaks() = %d, want 6", a.Leaks())
	}

	// The foreign domain changed (resumed) is touched; a Proxy's domain
	// under another name than its own is a leak.
	foreign.Domains["ns.foreign"] = DomainRecord{UUID: "11111111-2222-3333-4444-777777777777", State: "running"}
	a = inv.Audit([]ProxyRef{{Domain: "ns.other", UID: uidA}, {Domain: "ns.squid-old", UID: uidGone}}, foreign)
	if !reflect.DeepEqual(a.LeakedDomains, []string{"ns.squid-1"}) {
		t.Errorf("leaked domains %v, want ns.squid-1 (its UID's Proxy has another name)", a.LeakedDomains)
	}
	if len(a.ForeignTouched) != 2 || !strings.Contains(a.ForeignString(), "paused") {
		t.Errorf("foreign touched: %s", a.ForeignString())
	}
}

func TestParseInventoryIncomplete(t *testing.T) {
	if _, err := parseInventory("@@domain a\n@@state running\n<domain>"); err == nil {
		t.Fatal("an inventory cut short must be an error, not an empty host")
	}
}

func TestDomainsOf(t *testing.T) {
	inv := Inventory{Domains: map[string]DomainRecord{
		"ns.b":       {Metadata: &domxml.Metadata{UID: uidA}},
		"ns.a":       {Metadata: &domxml.Metadata{UID: uidA}},
		"ns.other":   {Metadata: &domxml.Metadata{UID: uidGone}},
		"ns.foreign": {},
	}}
	if got, want := inv.DomainsOf(uidA), []string{"ns.a", "ns.b"}; !reflect.DeepEqual(got, want) {
		t.Errorf("DomainsOf(uidA) = %v, want %v", got, want)
	}
	if got := inv.DomainsOf("no-such-uid"); len(got) != 0 {
		t.Errorf("DomainsOf(no-such-uid) = %v, want none", got)
	}
}
