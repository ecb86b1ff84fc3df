package domxml

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseMetadata: no input panics, and what parses writes back (XML) to
// an element that parses to the same Metadata, inside a domain too. The
// written form is what decides ownership on every later Get and Delete.
func FuzzParseMetadata(f *testing.F) {
	f.Add(Metadata{ManagedBy: ManagedBy, Namespace: "ns", Name: "p", UID: "u-1", Tag: "t"}.XML())
	f.Add("<instance><uid>u</uid><name>a&amp;b</name></instance>")
	f.Add("<instance xmlns='x'><uid> u </uid></instance>")
	f.Add("<instance><uid></uid></instance>")
	f.Add("<domain/>")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMetadata(s)
		if err != nil {
			return
		}
		if m.UID == "" {
			t.Fatalf("ParseMetadata(%q) accepted an empty uid", s)
		}
		back, err := ParseMetadata(m.XML())
		if err != nil {
			t.Fatalf("ParseMetadata(%q) = %+v, but its XML %q does not parse: %v", s, m, m.XML(), err)
		}
		if !validXMLText(m) {
			// encoding/xml drops characters XML cannot carry; such values
			// cannot round-trip and never come from a Kubernetes name or UID.
			return
		}
		if back != m {
			t.Fatalf("round trip of %+v gave %+v", m, back)
		}
		dom := "<domain type='kvm'><name>x</name><metadata>" + m.XML() + "</metadata></domain>"
		inDomain, found, err := MetadataFromDomainXML(dom)
		if err != nil || !found || inDomain != m {
			t.Fatalf("MetadataFromDomainXML(%q) = %+v, %v, %v; want %+v", dom, inDomain, found, err, m)
		}
	})
}

// FuzzMetadataFromDomainXML: any domain XML gives an answer, never a panic,
// and "found" always comes with a uid.
func FuzzMetadataFromDomainXML(f *testing.F) {
	f.Add("<domain><metadata>" + Metadata{UID: "u"}.XML() + "</metadata></domain>")
	f.Add("<domain><metadata><other xmlns='urn:x'/></metadata></domain>")
	f.Add("<domain><devices><instance xmlns='" + MetadataNS + "'><uid>u</uid></instance></devices></domain>")
	f.Add("<notdomain/>")
	f.Fuzz(func(t *testing.T, s string) {
		m, found, err := MetadataFromDomainXML(s)
		if found && (err != nil || m.UID == "") {
			t.Fatalf("MetadataFromDomainXML(%q) = %+v, found, %v", s, m, err)
		}
	})
}

func validXMLText(m Metadata) bool {
	for _, v := range []string{m.ManagedBy, m.Namespace, m.Name, m.UID, m.Tag} {
		if v != strings.TrimSpace(v) || !utf8.ValidString(v) {
			return false
		}
		for _, r := range v {
			if r == '\uFFFD' || (r < 0x20 && r != '\t' && r != '\n' && r != '\r') || (r >= 0xD800 && r <= 0xDFFF) || r == 0xFFFE || r == 0xFFFF {
				return false
			}
		}
		if strings.Contains(v, "\r") {
			return false // XML normalises CR and CRLF to LF
		}
	}
	return true
}
