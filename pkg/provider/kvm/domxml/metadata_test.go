package domxml

import (
	"strings"
	"testing"
)

func TestParseMetadata(t *testing.T) {
	want := Metadata{ManagedBy: ManagedBy, Namespace: "default", Name: "web", UID: "6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11", Tag: "prod", InstallID: "c0ffee00-1d"}
	legacy := want
	legacy.InstallID = ""

	tests := []struct {
		name string
		in   string
		want Metadata
	}{
		{"as written", want.XML(), want},
		{"stripped, as DomainGetMetadata returns it", `<instance><managed-by>proxy-operator</managed-by><namespace>default</namespace>` +
			`<name>web</name><uid>6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11</uid><tag>prod</tag><install>c0ffee00-1d</install></instance>`, want},
		{"stripped and indented", "<instance>\n  <managed-by>proxy-operator</managed-by>\n  <namespace>default</namespace>\n" +
			"  <name>web</name>\n  <uid>6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11</uid>\n  <tag>prod</tag>\n</instance>\n", legacy},
		{"default namespace", `<instance xmlns="` + MetadataNS + `"><managed-by>proxy-operator</managed-by><namespace>default</namespace>` +
			`<name>web</name><uid>6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11</uid><tag>prod</tag></instance>`, legacy},
		{"prefixed, libvirt-indented", "<proxy:instance xmlns:proxy=\"" + MetadataNS + "\">\n" +
			"      <proxy:managed-by>proxy-operator</proxy:managed-by>\n      <proxy:namespace>default</proxy:namespace>\n" +
			"      <proxy:name>web</proxy:name>\n      <proxy:uid>6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11</proxy:uid>\n" +
			"      <proxy:tag>prod</proxy:tag>\n    </proxy:instance>", legacy},
		{"uid only", `<instance><uid>u</uid></instance>`, Metadata{UID: "u"}},
		{"escaped values", Metadata{UID: "u", Tag: `a<b>&"c' ]]>`, Name: "ünï"}.XML(), Metadata{UID: "u", Tag: `a<b>&"c' ]]>`, Name: "ünï"}},
		{"unknown children ignored", `<instance><uid>u</uid><future>x</future></instance>`, Metadata{UID: "u"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMetadata(tt.in)
			if err != nil {
				t.Fatalf("ParseMetadata(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseMetadataGarbage(t *testing.T) {
	for _, in := range []string{
		"",
		"   ",
		"garbage",
		"{\"uid\": \"u\"}",
		"<foo><uid>u</uid></foo>",
		"<instance/>",
		"<instance><uid>  </uid></instance>",
		"<instance><uid>u</uid>",
		"<instance><uid>u</instance>",
		"<domain><metadata>" + Metadata{UID: "u"}.XML() + "</metadata></domain>",
	} {
		if got, err := ParseMetadata(in); err == nil {
			t.Errorf("ParseMetadata(%q) = %+v, want error", in, got)
		}
	}
}

func TestMetadataFromDomainXML(t *testing.T) {
	ours := Metadata{ManagedBy: ManagedBy, Namespace: "ns", Name: "web", UID: "u-1", Tag: "t"}
	libosinfo := `<libosinfo:libosinfo xmlns:libosinfo="http://libosinfo.org/xmlns/libvirt/domain/1.0"><libosinfo:os id="http://debian.org/debian/12"/></libosinfo:libosinfo>`
	domain := func(metadata string) string {
		return "<domain type='kvm' id='3'>\n  <name>ns.web</name>\n  <uuid>6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11</uuid>\n" +
			metadata + "\n  <memory unit='KiB'>1048576</memory>\n  <devices/>\n</domain>\n"
	}
	tests := []struct {
		name  string
		in    string
		want  Metadata
		found bool
	}{
		{"ours", domain("<metadata>" + ours.XML() + "</metadata>"), ours, true},
		{"ours after another app's", domain("<metadata>\n    " + libosinfo + "\n    " + ours.XML() + "\n  </metadata>"), ours, true},
		{"ours, other prefix", domain(`<metadata><x:instance xmlns:x="` + MetadataNS + `"><x:uid>u-1</x:uid></x:instance></metadata>`), Metadata{UID: "u-1"}, true},
		{"no metadata", domain(""), Metadata{}, false},
		{"another app's only", domain("<metadata>" + libosinfo + "</metadata>"), Metadata{}, false},
		{"instance in another namespace", domain(`<metadata><o:instance xmlns:o="https://example.com/other"><o:uid>x</o:uid></o:instance></metadata>`), Metadata{}, false},
		{"instance without namespace", domain(`<metadata><instance><uid>x</uid></instance></metadata>`), Metadata{}, false},
		{"ours outside metadata", domain("<description>" + "</description><devices>" + ours.XML() + "</devices>"), Metadata{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found, err := MetadataFromDomainXML(tt.in)
			if err != nil {
				t.Fatalf("error: %v", err)
			}
			if found != tt.found || got != tt.want {
				t.Errorf("got %+v, %v; want %+v, %v", got, found, tt.want, tt.found)
			}
		})
	}

	for _, in := range []string{
		"",
		"garbage",
		"<volume><name>x</name></volume>",
		"<domain><metadata>",
		domain("<metadata>" + strings.Replace(ours.XML(), "<proxy:uid>u-1</proxy:uid>", "", 1) + "</metadata>"),
	} {
		if got, found, err := MetadataFromDomainXML(in); err == nil {
			t.Errorf("MetadataFromDomainXML(%q) = %+v, %v; want error", in, got, found)
		}
	}
}
