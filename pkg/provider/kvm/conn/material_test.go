package conn

import (
	"context"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn/sshtest"
)

func TestParseMaterial(t *testing.T) {
	signer, keyPEM := sshtest.NewKey(t)
	hostKey, _ := sshtest.NewKey(t)
	kh := []byte("# hypervisors\n" + knownhosts.Line([]string{"[hv1.lan]:2222"}, hostKey.PublicKey()) + "\n")

	// A legacy encrypted PEM key (an OpenSSH one takes seconds of bcrypt to
	// make under -race); only the headers matter to the parser.
	encrypted := pem.EncodeToMemory(&pem.Block{
		Type:    "RSA PRIVATE KEY",
		Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-128-CBC,00112233445566778899AABBCCDDEEFF"},
		Bytes:   make([]byte, 64),
	})

	tests := []struct {
		name       string
		key, hosts []byte
		msg        string // empty: success
	}{
		{name: "valid", key: keyPEM, hosts: kh},
		{name: "empty key", key: []byte("\n"), hosts: kh, msg: "ssh-privatekey is empty"},
		{name: "garbage key", key: []byte("ssh-ed25519 AAAA not a private key"), hosts: kh, msg: "ssh-privatekey does not parse"},
		{name: "passphrase-protected key", key: encrypted, hosts: kh, msg: "passphrase-protected"},
		{name: "empty known_hosts", key: keyPEM, hosts: nil, msg: "known_hosts has no entries"},
		{name: "comment-only known_hosts", key: keyPEM, hosts: []byte("# nothing yet\n\n"), msg: "known_hosts has no entries"},
		{name: "garbage known_hosts", key: keyPEM, hosts: []byte("hv1 ssh-ed25519 !!!\n"), msg: "known_hosts does not parse: knownhosts: known_hosts: no valid entries, line 1"},
		{name: "one bad line among good ones", key: keyPEM, hosts: append([]byte("hv0 ssh-ed25519 !!!\n"), kh...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseMaterial(tt.key, tt.hosts)
			if tt.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(m.Signer.PublicKey().Marshal(), signer.PublicKey().Marshal()) {
					t.Fatal("wrong signer")
				}
				addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 2222}
				if err := m.HostKeyCallback("hv1.lan:2222", addr, hostKey.PublicKey()); err != nil {
					t.Fatalf("known host rejected: %v", err)
				}
				if err := m.HostKeyCallback("hv1.lan:22", addr, hostKey.PublicKey()); err == nil {
					t.Fatal("[host]:port entry accepted for port 22")
				}
				return
			}
			if provider.Class(err) != provider.ClassPermanent || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v (class %s), want permanent %q", err, provider.Class(err), tt.msg)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Fatalf("error leaks key material: %v", err)
			}
		})
	}
}

func TestFileMaterial(t *testing.T) {
	_, keyPEM := sshtest.NewKey(t)
	hostKey, _ := sshtest.NewKey(t)
	kh := []byte(knownhosts.Line([]string{"hv1"}, hostKey.PublicKey()) + "\n")

	tests := []struct {
		name  string
		files map[string][]byte
		class provider.ErrorClass
		msg   string
	}{
		{name: "nothing mounted", class: provider.ClassTransient, msg: "ssh-privatekey not found in"},
		{name: "no known_hosts", files: map[string][]byte{PrivateKeyFile: keyPEM}, class: provider.ClassTransient, msg: "known_hosts not found in"},
		{name: "empty known_hosts", files: map[string][]byte{PrivateKeyFile: keyPEM, KnownHostsFile: {}}, class: provider.ClassPermanent, msg: "no entries"},
		{name: "bad key", files: map[string][]byte{PrivateKeyFile: []byte("x"), KnownHostsFile: kh}, class: provider.ClassPermanent, msg: "does not parse"},
		{name: "complete", files: map[string][]byte{PrivateKeyFile: keyPEM, KnownHostsFile: kh}, class: provider.ClassNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, b := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			m, err := FileMaterial(dir)(context.Background())
			if c := provider.Class(err); c != tt.class || (err != nil && !strings.Contains(err.Error(), tt.msg)) {
				t.Fatalf("err = %v (class %s), want %s %q", err, c, tt.class, tt.msg)
			}
			if err == nil && (m.Signer == nil || m.HostKeyCallback == nil) {
				t.Fatal("incomplete material")
			}
		})
	}
}

func TestSecretMaterial(t *testing.T) {
	_, keyPEM := sshtest.NewKey(t)
	hostKey, _ := sshtest.NewKey(t)
	kh := []byte(knownhosts.Line([]string{"hv1"}, hostKey.PublicKey()) + "\n")

	if _, err := SecretMaterial(map[string][]byte{PrivateKeyFile: keyPEM}); provider.Class(err) != provider.ClassTransient {
		t.Fatalf("missing known_hosts entry: err = %v, want transient", err)
	}
	if _, err := SecretMaterial(map[string][]byte{PrivateKeyFile: keyPEM, KnownHostsFile: nil}); provider.Class(err) != provider.ClassPermanent {
		t.Fatalf("empty known_hosts entry: err = %v, want permanent", err)
	}
	if _, err := SecretMaterial(map[string][]byte{PrivateKeyFile: keyPEM, KnownHostsFile: kh}); err != nil {
		t.Fatal(err)
	}
}

func TestHostKeyMismatchKeepsKeyError(t *testing.T) {
	known, _ := sshtest.NewKey(t)
	presented, _ := sshtest.NewKey(t)
	m, err := ParseMaterial(mustKeyPEM(t), []byte(knownhosts.Line([]string{"hv1"}, known.PublicKey())+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 22}
	err = explainHostKey(m.HostKeyCallback)("hv1:22", addr, presented.PublicKey())
	var ke *knownhosts.KeyError
	if !errors.As(err, &ke) || len(ke.Want) != 1 {
		t.Fatalf("err = %v, want a wrapped *knownhosts.KeyError", err)
	}
	for _, want := range []string{"host key mismatch for hv1", ssh.FingerprintSHA256(presented.PublicKey()), ssh.FingerprintSHA256(known.PublicKey())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestKnownHostKeyAlgorithms(t *testing.T) {
	ed, _ := sshtest.NewKey(t)
	ec := ecdsaSigner(t)
	kh := knownhosts.Line([]string{"hv1"}, ed.PublicKey()) + "\n" +
		knownhosts.Line([]string{"hv2"}, ec.PublicKey()) + "\n" +
		knownhosts.Line([]string{"hv2"}, ed.PublicKey()) + "\n"
	m, err := ParseMaterial(mustKeyPEM(t), []byte(kh))
	if err != nil {
		t.Fatal(err)
	}
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 22}
	for host, want := range map[string][]string{
		"hv1:22": {ssh.KeyAlgoED25519},
		"hv2:22": {ssh.KeyAlgoECDSA256, ssh.KeyAlgoED25519},
		"hv3:22": nil, // unknown: leave x/crypto's defaults, the check fails anyway
	} {
		if got := knownHostKeyAlgorithms(m.HostKeyCallback, host, addr); !slices.Equal(got, want) {
			t.Errorf("%s: algorithms = %v, want %v", host, got, want)
		}
	}
}

func TestKnownHostsNeedsNoWritableDisk(t *testing.T) {
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing")) // the fallback would fail
	hostKey, _ := sshtest.NewKey(t)
	kh := knownhosts.Line([]string{"hv1"}, hostKey.PublicKey()) + "\n"
	big := strings.Repeat("# padding beyond a pipe buffer\n", 4096) + kh
	cb, err := knownHostsCallback([]byte(big))
	if err != nil {
		t.Fatal(err)
	}
	if err := cb("hv1:22", &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 22}, hostKey.PublicKey()); err != nil {
		t.Fatal(err)
	}
}

func mustKeyPEM(t *testing.T) []byte {
	_, b := sshtest.NewKey(t)
	return b
}
