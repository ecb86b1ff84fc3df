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
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider/guestsquid"
)

// FuzzBuildUserData: whatever bytes a user puts in user-data (and
// vendor-data) come back byte for byte when the ISO is read by xorriso
// (libisofs), a reader independent of the library that wrote it. The
// operator promises never to parse or rewrite user content.
func FuzzBuildUserData(f *testing.F) {
	xorriso, err := exec.LookPath("xorriso")
	if err != nil {
		f.Fatal("xorriso not on PATH (apt-get install xorriso, or make test-deps)")
	}
	f.Add([]byte("#cloud-config\npackages: [squid]\n"), []byte("#!/bin/sh\necho hi\n"))
	f.Add([]byte{}, []byte{})
	f.Add([]byte("\x1f\x8b\x08\x00binary\x00\xff"), []byte("Content-Type: multipart/mixed; boundary=x\n\n--x--\n"))
	f.Add(bytes.Repeat([]byte("a"), 2048), bytes.Repeat([]byte{0}, 2049))
	f.Fuzz(func(t *testing.T, userData, vendorData []byte) {
		iso, err := Build(Input{InstanceID: "uid-fuzz", Hostname: "p", UserData: userData, VendorData: vendorData})
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "seed.iso")
		if err := os.WriteFile(path, iso, 0o600); err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string][]byte{UserDataFile: userData, VendorDataFile: vendorData} {
			out := filepath.Join(dir, name)
			cmd := exec.Command(xorriso, "-abort_on", "FAILURE", "-indev", path, "-osirrox", "on", "-extract", "/"+name, out)
			if msg, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("xorriso -extract /%s: %v\n%s", name, err, msg)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s read back by xorriso: %d bytes, want the %d given (first difference at %d)", name, len(got), len(want), firstDiff(got, want))
			}
		}
	})
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// FuzzComposeVendorData: whatever the user's vendor-data, the composed
// document splits (MIME, at the top level) into the operator's parts
// unchanged, then one part holding the user's bytes: the boundary never
// occurs in any part. A user document cloud-init would read as MIME is
// embedded verbatim as a nested entity, whose headers are cloud-init's
// (Python's lenient parser) to read: only its verbatim presence before
// the closing delimiter is checked.
func FuzzComposeVendorData(f *testing.F) {
	files := guestsquid.Files{Conf: []byte("http_port 3128\nhttp_access deny all\n"), Password: []byte("crawler:$2a$10$abcdefghijklmnopqrstuv\n")}
	parts := append(squidParts(files), guestAgentPart)
	f.Add([]byte("#cloud-config\nruncmd: [x]\n"))
	f.Add([]byte("Content-Type: multipart/mixed; boundary=x\nMIME-Version: 1.0\n\n--x\n\n#!/bin/sh\n--x--\n"))
	f.Add([]byte("\n--==proxy-operator-0-0==\n"))
	f.Add([]byte{0x1f, 0x8b, 0, 0xff})
	f.Fuzz(func(t *testing.T, user []byte) {
		doc := compose(parts, user)
		msg, err := mail.ReadMessage(bytes.NewReader(doc))
		if err != nil {
			t.Fatalf("not a MIME document: %v", err)
		}
		_, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
		if err != nil {
			t.Fatal(err)
		}
		r := multipart.NewReader(msg.Body, params["boundary"])
		var got [][]byte
		for !(isMIME(user) && len(got) == len(parts)) {
			p, err := r.NextRawPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("part %d: %v", len(got), err)
			}
			body, err := io.ReadAll(p)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) >= len(parts) && !isMIME(user) {
				if p.Header.Get("Content-Transfer-Encoding") == "base64" {
					body, err = base64.StdEncoding.DecodeString(strings.ReplaceAll(string(body), "\n", ""))
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			got = append(got, body)
		}
		want := len(parts)
		if len(user) > 0 && !isMIME(user) {
			want++
		}
		if len(got) != want {
			t.Fatalf("%d parts, want %d", len(got), want)
		}
		for i, p := range parts {
			if string(got[i]) != p.body {
				t.Fatalf("operator part %d changed", i)
			}
		}
		if len(user) > 0 && !isMIME(user) && !bytes.Equal(got[len(parts)], user) {
			t.Fatalf("user part = %q, want %q", got[len(parts)], user)
		}
		if isMIME(user) && !bytes.HasSuffix(doc, append(append([]byte("\n"), user...), "\n--"+params["boundary"]+"--\n"...)) {
			t.Fatal("the user's MIME document is not embedded verbatim as the last part")
		}
	})
}
