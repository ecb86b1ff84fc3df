//go:build libvirtschema

// Validates the generated XML against libvirt's own RelaxNG schemas with
// virt-xml-validate (Debian: apt-get install libvirt-clients libxml2-utils;
// the tool shells out to xmllint). Missing tools fail the test:
//
//	go test -tags libvirtschema ./pkg/provider/kvm/domxml/
package domxml

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func virtXMLValidate(t *testing.T, xml, schema string) {
	t.Helper()
	tool, err := exec.LookPath("virt-xml-validate")
	if err != nil {
		t.Fatal("virt-xml-validate not on PATH (apt-get install libvirt-clients libxml2-utils)")
	}
	if _, err := exec.LookPath("xmllint"); err != nil {
		t.Fatal("xmllint not on PATH, virt-xml-validate needs it (apt-get install libxml2-utils)")
	}
	path := filepath.Join(t.TempDir(), schema+".xml")
	if err := os.WriteFile(path, []byte(xml), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tool, path, schema).CombinedOutput()
	if err != nil {
		t.Errorf("virt-xml-validate %s: %v\n%s\n%s", schema, err, out, xml)
	}
}

func TestDomainSchema(t *testing.T) {
	for _, tc := range domainCases() {
		t.Run(tc.name, func(t *testing.T) {
			p := baseParams()
			tc.edit(&p)
			s, err := Domain(p)
			if err != nil {
				t.Fatal(err)
			}
			virtXMLValidate(t, s, "domain")
		})
	}
}

func TestVolumeSchema(t *testing.T) {
	overlay, err := OverlayVolume("proxy-u-disk.qcow2", 10<<30, "/var/lib/libvirt/images/image-x-0123456789ab.qcow2", FormatQCOW2)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := RawVolume("proxy-u-seed.iso", 47104)
	if err != nil {
		t.Fatal(err)
	}
	image, err := ImageVolume("image-x-0123456789ab.qcow2", 600<<20, FormatQCOW2)
	if err != nil {
		t.Fatal(err)
	}
	marker, err := RawVolume("image-x-0123456789ab.qcow2.verified", 0)
	if err != nil {
		t.Fatal(err)
	}
	for name, xml := range map[string]string{"overlay": overlay, "seed": seed, "image": image, "marker": marker} {
		t.Run(name, func(t *testing.T) { virtXMLValidate(t, xml, "storagevol") })
	}
}
