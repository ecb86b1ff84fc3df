//go:build cloudinit

// This test feeds VendorData's and MachineVendorData's output to cloud-init's
// own user-data processor (cloudinit.user_data.UserDataProcessor, which also
// handles vendor-data) and checks that it sees the operator's parts (the
// guest-agent script; the managed squid's boothook and script) with their
// types and bytes, then exactly the parts, types and bytes the user's
// vendor-data yields on its own. It needs a Python
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
	"strconv"
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider/guestsquid"
	"crawl.example.com/proxy-operator/pkg/squid"
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

print("cloud-init", version.version_string())
bad = 0
for name in open(d + "/cases").read().split():
    ops = []
    for i, t in enumerate(open(d + "/" + name + ".optypes").read().split()):
        ops.append((t, open(d + "/" + name + ".op" + str(i), "rb").read()))
    try:
        alone = parts(open(d + "/" + name + ".user", "rb").read())
    except FileNotFoundError:
        alone = []
    combined = parts(open(d + "/" + name + ".combined", "rb").read())
    n = len(ops)
    if combined[:n] != ops or combined[n:] != alone:
        bad += 1
        print("MISMATCH", name, "operator parts:", [t for t, _ in combined[:n]], "want", [t for t, _ in ops],
              "alone:", alone, "combined:", combined[n:])
    else:
        print("ok", name, [t for t, _ in ops], [t for t, _ in alone])
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
	addCase := func(name string, user, combined []byte, ops []part) {
		names = append(names, name)
		if user != nil {
			write(name+".user", user)
		}
		write(name+".combined", combined)
		var types []string
		for i, p := range ops {
			types = append(types, p.contentType)
			write(name+".op"+strconv.Itoa(i), []byte(p.body))
		}
		write(name+".optypes", []byte(strings.Join(types, "\n")))
	}
	for name, data := range cases {
		addCase(name, data, VendorData(true, data), []part{guestAgentPart})
	}

	// The managed squid's parts: cloud-init must see a boothook (run in
	// its init stage) and a final-stage script, before the guest agent's
	// and the user's parts, alone or with any kind of user vendor-data.
	for _, name := range []string{"cloudconfig", "mime", "gzip", "boothook", "utf8"} {
		m := managedMachine()
		m.VendorData = cases[name]
		vd, err := MachineVendorData(m)
		if err != nil {
			t.Fatal(err)
		}
		addCase("squid-"+name, cases[name], vd, append(squidPartsOf(t, vd), guestAgentPart))
	}
	m := managedMachine()
	m.VendorData, m.InstallGuestAgent = nil, false
	vd, err := MachineVendorData(m)
	if err != nil {
		t.Fatal(err)
	}
	addCase("squid-only", nil, vd, squidPartsOf(t, vd))
	write("cases", []byte(strings.Join(names, "\n")))

	cmd := exec.Command(python, "-c", cloudInitHarness, dir)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err = cmd.Run()
	t.Logf("%s", out.String())
	if err != nil {
		t.Fatalf("cloud-init does not see the operator's and the user's vendor-data as intended: %v", err)
	}
}

// squidPartsOf returns the two squid parts as MachineVendorData wrote
// them (the password file's salt differs on every render).
func squidPartsOf(t *testing.T, vd []byte) []part {
	t.Helper()
	doc := parseMIME(t, vd)
	if len(doc.children) < 2 || doc.children[0].contentType != "text/cloud-boothook" || doc.children[1].contentType != "text/x-shellscript" {
		t.Fatalf("vendor-data does not start with squid's two parts:\n%.300s", vd)
	}
	return []part{
		{contentType: "text/cloud-boothook", body: string(doc.children[0].body)},
		{contentType: "text/x-shellscript", body: string(doc.children[1].body)},
	}
}

const boothookHarness = `
import sys
from cloudinit import helpers
from cloudinit.handlers.boot_hook import BootHookPartHandler

d = sys.argv[1]
class Datasource:
    def get_instance_id(self):
        return "iid-test"
paths = helpers.Paths({"cloud_dir": d + "/cloud", "run_dir": d + "/run"}, ds=Datasource())
payload = open(d + "/boothook", encoding="utf-8").read()
BootHookPartHandler(paths, Datasource()).handle_part(None, "text/cloud-boothook", "proxy-operator-squid-files.sh", payload, "always")
`

// TestSquidBoothookRunsUnderCloudInit hands the managed squid's boothook
// to cloud-init's own boothook handler (which strips "#cloud-boothook",
// writes the rest 0700 and executes it), sandboxed: the script's root and
// PATH lines point at a fake root and a systemctl stub. The files it
// writes must be the managed ones.
func TestSquidBoothookRunsUnderCloudInit(t *testing.T) {
	python := cloudInitPython(t)
	m := managedMachine()
	vd, err := MachineVendorData(m)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	root, bin := filepath.Join(dir, "root"), filepath.Join(dir, "bin")
	for _, d := range []string{root, bin} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte("#!/bin/sh\necho inactive\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "logger"), []byte(guestsquid.LoggerStub), 0o755); err != nil {
		t.Fatal(err)
	}
	body := string(squidPartsOf(t, vd)[0].body)
	body = strings.Replace(body, guestsquid.PathLine, "PATH="+bin+":/usr/bin:/bin; export PATH", 1)
	body = strings.Replace(body, guestsquid.RootLine, "root="+root, 1)
	if err := os.WriteFile(filepath.Join(dir, "boothook"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(python, "-c", boothookHarness, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("cloud-init's boothook handler: %v\n%s", err, out)
	}
	conf, err := os.ReadFile(filepath.Join(root, guestsquid.ConfPath))
	if err != nil {
		t.Fatalf("the boothook wrote no squid.conf (cloud-init said: %s): %v", out, err)
	}
	want, _, err := guestsquid.Render(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(conf, want.Conf) {
		t.Errorf("squid.conf differs from the managed one:\n%s", conf)
	}
	pw, err := os.ReadFile(filepath.Join(root, guestsquid.PasswordPath))
	if err != nil || !squid.PasswordFileMatches(pw, m.Squid.Auth) {
		t.Errorf("password file %q (%v) does not admit the credential", pw, err)
	}
}
