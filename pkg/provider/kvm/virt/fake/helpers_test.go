package fake_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

const ns = "https://proxy.crawl.example.com/xmlns/instance/1"

// dom describes a test domain; xml renders it.
type dom struct {
	name, uuid string
	efi        bool
	nvramElem  bool
	metadata   string // inner XML of <metadata>
	mac        string // adds a NIC on network "default" ("" = none; "auto" = let libvirt pick)
	agent      bool   // adds the guest agent channel
	rootNS     string // extra attributes on <domain>
}

func (d dom) xml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "<domain type='kvm'%s>\n  <name>%s</name>\n", d.rootNS, d.name)
	if d.uuid != "" {
		fmt.Fprintf(&b, "  <uuid>%s</uuid>\n", d.uuid)
	}
	if d.metadata != "" {
		fmt.Fprintf(&b, "  <metadata>%s</metadata>\n", d.metadata)
	}
	b.WriteString("  <memory unit='MiB'>256</memory>\n")
	switch {
	case d.efi:
		b.WriteString("  <os firmware='efi'><type arch='x86_64' machine='q35'>hvm</type></os>\n")
	case d.nvramElem:
		b.WriteString("  <os><type arch='x86_64'>hvm</type><loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE.fd</loader><nvram>/var/lib/libvirt/qemu/nvram/x_VARS.fd</nvram></os>\n")
	default:
		b.WriteString("  <os><type arch='x86_64'>hvm</type></os>\n")
	}
	b.WriteString("  <devices>\n")
	switch d.mac {
	case "":
	case "auto":
		b.WriteString("    <interface type='network'><source network='default'/><model type='virtio'/></interface>\n")
	default:
		fmt.Fprintf(&b, "    <interface type='network'><mac address='%s'/><source network='default'/><model type='virtio'/></interface>\n", d.mac)
	}
	if d.agent {
		b.WriteString("    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>\n")
	}
	b.WriteString("  </devices>\n</domain>\n")
	return b.String()
}

func mustDefine(t testing.TB, c virt.Client, d dom) libvirt.Domain {
	t.Helper()
	h, err := c.DomainDefineXMLFlags(d.xml(), 0)
	if err != nil {
		t.Fatalf("define %s: %v", d.name, err)
	}
	return h
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantErr checks err carries libvirt code and a message containing msg.
// code 0 means success is expected.
func wantErr(t testing.TB, err error, code libvirt.ErrorNumber, msg string) {
	t.Helper()
	if code == 0 {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("got success, want %v %q", code, msg)
	}
	got, ok := virt.ErrorCode(err)
	if !ok || got != code {
		t.Fatalf("got error %v (code %v, libvirt %v), want %v", err, got, ok, code)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Fatalf("error %q does not contain %q", err, msg)
	}
}

func newFake(t testing.TB, opts ...fake.Option) *fake.Fake {
	t.Helper()
	f := fake.New(opts...)
	f.AddNetwork("default")
	f.AddPool("default", 100<<30, true)
	t.Cleanup(func() { _ = f.Disconnect() })
	return f
}
