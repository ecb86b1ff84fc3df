//go:build cloudinit

// This test feeds VendorData's output to cloud-init's own user-data processor
// (cloudinit.user_data.UserDataProcessor, which also handles vendor-data) and
// checks that the user's vendor-data yields exactly the parts, types and
// bytes it yields on its own, after the guest-agent script. It needs a Python
// with the cloudinit package (Debian: apt-get install cloud-init) and fails
// without one:
//
//	go test -tags cloudinit ./pkg/provider/kvm/seed/
//
// CLOUDINIT_PYTHON picks the interpreter (default: python3 on PATH, then
// /usr/bin/python3); PYTHONPATH can point it at a cloud-init source tree.
package seed

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const cloudInitHarness = `
import sys
from cloudinit import helpers, util, version
from cloudinit.user_data import UserDataProcessor

d = sys.argv[1]
paths = helpers.Paths({"cloud_dir": d + "/cloud", "run_dir": d + "/run"})

def parts(blob):
    out = []
    for p in UserDataProcessor(paths).process(blob).walk():
        if p.get_content_maintype() == "multipart":
            continue
        body = util.fully_decoded_payload(p)
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogateescape")
        t = p.get_content_type()
        # Both mean "no handler": a bare document is text/x-not-multipart,
        # a part we declared is text/plain.
        out.append(("text/x-not-multipart" if t == "text/plain" else t, body))
    return out

script = open(d + "/script", "rb").read()
print("cloud-init", version.version_string())
bad = 0
for name in open(d + "/cases").read().split():
    alone = parts(open(d + "/" + name + ".user", "rb").read())
    combined = parts(open(d + "/" + name + ".combined", "rb").read())
    if combined[:1] != [("text/x-shellscript", script)] or combined[1:] != alone:
        bad += 1
        print("MISMATCH", name, "alone:", alone, "combined:", combined[1:])
    else:
        print("ok", name, [t for t, _ in alone])
sys.exit(1 if bad else 0)
`

func cloudInitPython(t *testing.T) string {
	candidates := []string{os.Getenv("CLOUDINIT_PYTHON"), "python3", "/usr/bin/python3"}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if err := exec.Command(c, "-c", "import cloudinit.user_data").Run(); err == nil {
			return c
		}
	}
	t.Fatal("no Python with the cloudinit package (apt-get install cloud-init, or set CLOUDINIT_PYTHON/PYTHONPATH)")
	return ""
}

func TestVendorDataThroughCloudInit(t *testing.T) {
	python := cloudInitPython(t)
	mimeDoc := "Content-Type: multipart/mixed; boundary=\"XYZ\"\nMIME-Version: 1.0\n\n" +
		"--XYZ\nContent-Type: text/cloud-config; charset=\"us-ascii\"\n\nruncmd: [mime1]\n\n" +
		"--XYZ\nContent-Type: text/x-shellscript\n\n#!/bin/sh\necho mime2\n--XYZ--\n"
	cases := map[string][]byte{
		"cloudconfig": []byte("#cloud-config\nruncmd:\n  - [echo, hi]\n"),
		"noeol":       []byte("#cloud-config\nruncmd: [ls]"),
		"script":      []byte("#!/bin/bash\necho vendor\n\n\n"),
		"jinja":       []byte("## template: jinja\n#cloud-config\nruncmd: [echo, '{{ v1.local_hostname }}']\n"),
		"boothook":    []byte("#cloud-boothook\n#!/bin/sh\necho boot\n"),
		"utf8":        []byte("#cloud-config\nwrite_files:\n- path: /etc/motd\n  content: \"héllo 日本 😀\\n\"\n"),
		"crlf":        []byte("#cloud-config\r\nruncmd: [ls]\r\n"),
		"trailingcr":  []byte("#!/bin/sh\necho x\r"),
		"gzip":        gzipped(t, "#cloud-config\nruncmd: [gz]\n"),
		"binary":      {0, 1, 2, 0xff, 0xfe, '\n'},
		"mime":        []byte(mimeDoc),
		"boundaryish": []byte("#cloud-config\n# From here\nFrom x\n--==proxy-operator-\n"),
	}

	dir := t.TempDir()
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	for name, data := range cases {
		names = append(names, name)
		write(name+".user", data)
		write(name+".combined", VendorData(true, data))
	}
	write("script", []byte(GuestAgentScript))
	write("cases", []byte(strings.Join(names, "\n")))

	cmd := exec.Command(python, "-c", cloudInitHarness, dir)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	t.Logf("%s", out.String())
	if err != nil {
		t.Fatalf("cloud-init does not see the user's vendor-data as it would alone: %v", err)
	}
}
