package seed

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type mimePart struct {
	contentType string
	encoding    string // Content-Transfer-Encoding as written
	raw         []byte // body as written
	body        []byte // body after transfer decoding
	children    []mimePart
}

// parseMIME splits a MIME entity with Go's parsers, which, like Python's,
// give the line break before a delimiter to the delimiter.
func parseMIME(t *testing.T, doc []byte) mimePart {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(doc))
	if err != nil {
		t.Fatalf("not a MIME entity: %v\n%s", err, doc)
	}
	raw, err := io.ReadAll(msg.Body)
	if err != nil {
		t.Fatal(err)
	}
	return parseEntity(t, msg.Header.Get("Content-Type"), msg.Header.Get("Content-Transfer-Encoding"), raw)
}

func parseEntity(t *testing.T, ctype, cte string, raw []byte) mimePart {
	t.Helper()
	mt, params, err := mime.ParseMediaType(ctype)
	if err != nil {
		t.Fatalf("Content-Type %q: %v", ctype, err)
	}
	p := mimePart{contentType: mt, encoding: cte, raw: raw, body: raw}
	if cte == "base64" {
		if p.body, err = base64.StdEncoding.DecodeString(strings.ReplaceAll(string(raw), "\n", "")); err != nil {
			t.Fatalf("base64 body: %v", err)
		}
	}
	if !strings.HasPrefix(mt, "multipart/") {
		return p
	}
	r := multipart.NewReader(bytes.NewReader(raw), params["boundary"])
	for {
		part, err := r.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("multipart: %v", err)
		}
		body, err := io.ReadAll(part)
		if err != nil {
			t.Fatal(err)
		}
		ct := part.Header.Get("Content-Type")
		if ct == "" {
			ct = "text/plain"
		}
		p.children = append(p.children, parseEntity(t, ct, part.Header.Get("Content-Transfer-Encoding"), body))
	}
	return p
}

func TestVendorDataPassThrough(t *testing.T) {
	tests := []struct {
		name    string
		install bool
		user    []byte
		want    []byte
	}{
		{"nothing", false, nil, nil},
		{"empty user vendor-data", false, []byte{}, nil},
		{"user vendor-data only", false, []byte("#cloud-config\nruncmd: [x]\n"), []byte("#cloud-config\nruncmd: [x]\n")},
		{"user binary only", false, []byte{0x1f, 0x8b, 0, 0xff}, []byte{0x1f, 0x8b, 0, 0xff}},
		{"agent only", true, nil, []byte(GuestAgentScript)},
		{"agent, empty user vendor-data", true, []byte{}, []byte(GuestAgentScript)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := VendorData(tt.install, tt.user); !bytes.Equal(got, tt.want) {
				t.Errorf("VendorData = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestVendorDataMultipart(t *testing.T) {
	userMIME := []byte("Content-Type: multipart/mixed; boundary=\"XYZ\"\nMIME-Version: 1.0\n\n" +
		"--XYZ\nContent-Type: text/cloud-config\n\nruncmd: [one]\n\n" +
		"--XYZ\nContent-Type: text/x-shellscript\n\n#!/bin/sh\necho two\n--XYZ--\n")
	tests := []struct {
		name     string
		user     []byte
		wantType string
		// raw: the user's bytes must appear verbatim in the document.
		raw bool
		// nested: the user's document is itself the part (MIME in MIME).
		nested bool
	}{
		{"cloud-config", []byte("#cloud-config\nruncmd:\n  - [echo, hi]\n"), "text/plain", true, false},
		{"no final newline", []byte("#cloud-config\nruncmd: [ls]"), "text/plain", true, false},
		{"shell script", []byte("#!/bin/bash\necho vendor\n\n\n"), "text/plain", true, false},
		{"jinja", []byte("## template: jinja\n#cloud-config\nruncmd: [echo, '{{ v1.local_hostname }}']\n"), "text/plain", true, false},
		{"boothook", []byte("#cloud-boothook\n#!/bin/sh\necho boot\n"), "text/plain", true, false},
		{"looks like our boundary", []byte("#cloud-config\n--==proxy-operator-\nFrom me\n"), "text/plain", true, false},
		{"utf-8 text", []byte("#cloud-config\nwrite_files:\n- content: \"héllo 日本 😀\"\n"), "text/plain", false, false},
		{"crlf text", []byte("#cloud-config\r\nruncmd: [ls]\r\n"), "text/plain", false, false},
		{"gzip", gzipped(t, "#cloud-config\nruncmd: [gz]\n"), "application/x-gzip", false, false},
		{"binary", []byte{0, 1, 2, 0xff, 0xfe, '\n'}, "text/plain", false, false},
		{"mime multipart", userMIME, "multipart/mixed", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			user := slices.Clone(tt.user)
			got := VendorData(true, user)
			if !bytes.Equal(user, tt.user) {
				t.Fatal("VendorData modified its input")
			}
			if !bytes.Equal(got, VendorData(true, user)) {
				t.Error("VendorData is not deterministic")
			}
			// cloud-init only reads a document as MIME when it says
			// mime-version in its first 4096 bytes.
			if !isMIME(got) || !bytes.HasPrefix(got, []byte("Content-Type: multipart/mixed;")) {
				t.Errorf("not a multipart/mixed document cloud-init recognises:\n%.200s", got)
			}

			doc := parseMIME(t, got)
			if doc.contentType != "multipart/mixed" || len(doc.children) != 2 {
				t.Fatalf("document %q with %d parts, want multipart/mixed with 2", doc.contentType, len(doc.children))
			}
			agent, part := doc.children[0], doc.children[1]
			if agent.contentType != "text/x-shellscript" || string(agent.body) != GuestAgentScript {
				t.Errorf("first part is %q and not the guest-agent script", agent.contentType)
			}
			if part.contentType != tt.wantType {
				t.Errorf("user part type = %q, want %q", part.contentType, tt.wantType)
			}
			if tt.raw && !bytes.Contains(got, tt.user) {
				t.Error("user's bytes do not appear verbatim")
			}
			switch {
			case tt.nested:
				if !bytes.Equal(part.raw, tt.user[bytes.Index(tt.user, []byte("\n\n"))+2:]) {
					t.Errorf("nested body = %q", part.raw)
				}
				inner := parseMIME(t, tt.user)
				if len(part.children) != len(inner.children) {
					t.Fatalf("nested parts = %d, want %d", len(part.children), len(inner.children))
				}
				for i := range inner.children {
					if part.children[i].contentType != inner.children[i].contentType || !bytes.Equal(part.children[i].body, inner.children[i].body) {
						t.Errorf("nested part %d = %+v, want %+v", i, part.children[i], inner.children[i])
					}
				}
			case tt.raw:
				if part.encoding != "7bit" || !bytes.Equal(part.raw, tt.user) {
					t.Errorf("user part (%s) = %q, want raw %q", part.encoding, part.raw, tt.user)
				}
			default:
				if part.encoding != "base64" || !bytes.Equal(part.body, tt.user) {
					t.Errorf("user part (%s) decodes to %q, want %q", part.encoding, part.body, tt.user)
				}
			}
		})
	}
}

func TestPickBoundary(t *testing.T) {
	part := []byte("x\n--==proxy-operator-abc-0==\n==proxy-operator-abc-1==")
	if got, want := pickBoundary("abc", []byte("#!/bin/sh\n"), part), "==proxy-operator-abc-2=="; got != want {
		t.Errorf("pickBoundary = %q, want %q", got, want)
	}
}

// TestGuestAgentScript runs the script under /bin/sh against stub commands.
// The script's PATH line is swapped for the stub directory alone, so no real
// package manager or service manager of the test machine is ever called.
func TestGuestAgentScript(t *testing.T) {
	if !strings.Contains(GuestAgentScript, "\n"+scriptPathLine+"\n") {
		t.Fatal("script lost its PATH line")
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatalf("no sh on PATH: %v", err)
	}

	const (
		ok      = "exit 0"
		fail    = "exit 1"
		offline = "echo 'Temporary failure resolving' >&2; exit 100"
	)
	tests := []struct {
		name  string
		stubs map[string]string // command -> shell body
		want  []string          // calls logged, in order
	}{
		{"agent binary present", map[string]string{"qemu-ga": ok, "apt-get": ok, "systemctl": ok},
			[]string{"systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent"}},
		{"dpkg says installed", map[string]string{"dpkg-query": "echo 'install ok installed'", "apt-get": ok, "systemctl": ok},
			[]string{"dpkg-query -W -f=${Status} qemu-guest-agent", "systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent"}},
		{"rpm says installed", map[string]string{"rpm": ok, "dnf": ok, "systemctl": ok},
			[]string{"rpm -q qemu-guest-agent", "systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent"}},
		{"missing on debian", map[string]string{"dpkg-query": "echo 'unknown ok not-installed'; exit 1", "apt-get": ok, "systemctl": ok},
			[]string{
				"dpkg-query -W -f=${Status} qemu-guest-agent",
				"apt-get -q -o DPkg::Lock::Timeout=120 update",
				"apt-get -q -y -o DPkg::Lock::Timeout=120 install --no-install-recommends qemu-guest-agent",
				"systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent",
			}},
		{"removed but config left", map[string]string{"dpkg-query": "echo 'deinstall ok config-files'", "apt-get": ok, "systemctl": ok},
			[]string{
				"dpkg-query -W -f=${Status} qemu-guest-agent",
				"apt-get -q -o DPkg::Lock::Timeout=120 update",
				"apt-get -q -y -o DPkg::Lock::Timeout=120 install --no-install-recommends qemu-guest-agent",
				"systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent",
			}},
		{"missing on fedora", map[string]string{"rpm": fail, "dnf": ok, "yum": ok, "systemctl": ok},
			[]string{"rpm -q qemu-guest-agent", "dnf -q -y install qemu-guest-agent", "systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent"}},
		{"missing on el7", map[string]string{"rpm": fail, "yum": ok, "systemctl": ok},
			[]string{"rpm -q qemu-guest-agent", "yum -q -y install qemu-guest-agent", "systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent"}},
		{"missing on suse", map[string]string{"rpm": fail, "zypper": ok, "systemctl": ok},
			[]string{"rpm -q qemu-guest-agent", "zypper --non-interactive --quiet install qemu-guest-agent", "systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent"}},
		{"missing on alpine", map[string]string{"apk": ok, "rc-update": ok, "rc-service": ok},
			[]string{"apk add qemu-guest-agent", "rc-update add qemu-guest-agent default", "rc-service qemu-guest-agent start"}},
		{"sysv service", map[string]string{"qemu-ga": ok, "service": ok},
			[]string{"service qemu-guest-agent start"}},
		{"bounded by timeout when present", map[string]string{"timeout": `shift; "$@"`, "dnf": ok, "systemctl": ok},
			[]string{"timeout 300 dnf -q -y install qemu-guest-agent", "dnf -q -y install qemu-guest-agent", "systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent"}},
		{"offline: install fails, boot goes on", map[string]string{"apt-get": offline, "systemctl": ok},
			[]string{
				"apt-get -q -o DPkg::Lock::Timeout=120 update",
				"apt-get -q -y -o DPkg::Lock::Timeout=120 install --no-install-recommends qemu-guest-agent",
			}},
		{"update partly fails, install works", map[string]string{"apt-get": `[ "$3" = update ] && exit 100; exit 0`, "systemctl": ok},
			[]string{
				"apt-get -q -o DPkg::Lock::Timeout=120 update",
				"apt-get -q -y -o DPkg::Lock::Timeout=120 install --no-install-recommends qemu-guest-agent",
				"systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent",
			}},
		{"no package manager", map[string]string{"systemctl": ok}, nil},
		{"start fails", map[string]string{"qemu-ga": ok, "systemctl": fail},
			[]string{"systemctl enable qemu-guest-agent", "systemctl start qemu-guest-agent"}},
		{"no service manager", map[string]string{"qemu-ga": ok}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "bin")
			calls := filepath.Join(dir, "calls")
			if err := os.Mkdir(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, body := range tt.stubs {
				stub := "#!" + sh + "\necho \"" + name + " $*\" >>\"$CALLS\"\n" + body + "\n"
				if err := os.WriteFile(filepath.Join(bin, name), []byte(stub), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			script := strings.Replace(GuestAgentScript, scriptPathLine, "PATH="+bin+"; export PATH", 1)
			cmd := exec.Command(sh, "-c", script)
			cmd.Env = []string{"PATH=" + bin, "CALLS=" + calls}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("script failed (it must never fail the boot): %v\n%s", err, out)
			}
			var got []string
			if data, err := os.ReadFile(calls); err == nil {
				got = strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("calls:\n got %q\nwant %q\noutput:\n%s", got, tt.want, out)
			}
			if !strings.Contains(string(out), "proxy-operator: ") {
				t.Errorf("script logged nothing:\n%s", out)
			}
		})
	}
}
