package fake

import (
	"strings"
	"testing"
)

// parseDomainDoc is the define-time parse of every domain XML the fake is
// given: the root, and <metadata>'s children as libvirt sanitizes them.
func TestParseDomainDoc(t *testing.T) {
	const ns = "urn:example:proxy"
	for _, tc := range []struct {
		name, doc string
		wantRoot  string
		wantMeta  []string // nil: no <metadata>
		errHas    string
	}{
		{name: "no metadata", doc: `<domain><name>a</name></domain>`, wantRoot: "domain"},
		{name: "empty metadata is seen", doc: `<domain><metadata/></domain>`, wantRoot: "domain", wantMeta: []string{}},
		{name: "prefixed root", doc: `<x:domain xmlns:x="urn:x"/>`, wantRoot: "x:domain"},
		{
			name:     "first element per namespace, none without",
			doc:      `<domain><metadata><a xmlns="` + ns + `">1</a><b xmlns="` + ns + `">2</b><plain/><o:c xmlns:o="urn:o"/></metadata></domain>`,
			wantRoot: "domain",
			wantMeta: []string{`<a xmlns="` + ns + `">1</a>`, `<o:c xmlns:o="urn:o"/>`},
		},
		{
			name:     "prefix from domain declared on the child",
			doc:      `<domain xmlns:p="` + ns + `"><metadata><p:i><p:uid>u</p:uid></p:i></metadata></domain>`,
			wantRoot: "domain",
			wantMeta: []string{`<p:i xmlns:p="` + ns + `"><p:uid>u</p:uid></p:i>`},
		},
		{
			name:     "metadata deeper than a child of domain is not the domain's",
			doc:      `<domain><devices><metadata><a xmlns="` + ns + `"/></metadata></devices></domain>`,
			wantRoot: "domain",
		},
		{name: "undefined prefix", doc: `<domain><metadata><p:i/></metadata></domain>`, errHas: `namespace prefix "p" is not defined`},
		{name: "unclosed", doc: `<domain><name>a</name>`, errHas: "premature end of data"},
		{name: "no element", doc: ` `, errHas: "start tag expected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, meta, err := parseDomainDoc(tc.doc)
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("parseDomainDoc error = %v, want one saying %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if root != tc.wantRoot {
				t.Errorf("root = %q, want %q", root, tc.wantRoot)
			}
			if (meta == nil) != (tc.wantMeta == nil) {
				t.Fatalf("metadata seen = %v, want %v", meta != nil, tc.wantMeta != nil)
			}
			var got []string
			for _, m := range meta {
				got = append(got, m.String())
			}
			if strings.Join(got, "|") != strings.Join(tc.wantMeta, "|") {
				t.Errorf("metadata =\n%q\nwant\n%q", got, tc.wantMeta)
			}
		})
	}
}
