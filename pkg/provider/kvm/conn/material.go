package conn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// Names of the two entries of an SSH Secret, and of the files when that
// Secret is mounted.
const (
	PrivateKeyFile = "ssh-privatekey"
	KnownHostsFile = "known_hosts"
)

// Material is what a dial authenticates with: the client key, and the host
// key check (strict, against known_hosts).
type Material struct {
	Signer          ssh.Signer
	HostKeyCallback ssh.HostKeyCallback
}

// MaterialLoader returns the material for a host. The pool calls it on
// every dial (never caching the result), so a rotated Secret or file is
// what the next dial trusts. Errors classed provider.ErrPermanent
// mean the material is there but unusable (SSHMaterialInvalid); any other
// error means it is not there yet (SSHMaterialMissing, transient), so a
// Secret created later is picked up by the next dial without a restart.
type MaterialLoader func(ctx context.Context) (*Material, error)

// The classification rule shared by every loader here: absent → transient,
// present but unusable → permanent.

// FileMaterial loads ssh-privatekey and known_hosts from dir (a mounted
// Secret). Files are re-read on every load, so a rotated Secret is seen.
func FileMaterial(dir string) MaterialLoader {
	return func(context.Context) (*Material, error) {
		key, err := readMaterialFile(dir, PrivateKeyFile)
		if err != nil {
			return nil, err
		}
		kh, err := readMaterialFile(dir, KnownHostsFile)
		if err != nil {
			return nil, err
		}
		return ParseMaterial(key, kh)
	}
}

func readMaterialFile(dir, name string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, provider.Transientf("%s not found in %s (is the Secret mounted?)", name, dir)
	}
	if err != nil {
		return nil, provider.Transient(fmt.Errorf("reading ssh material: %w", err))
	}
	return b, nil
}

// SecretMaterial parses the Data of an SSH Secret. A missing entry is
// transient (the Secret may be completed later); see ParseMaterial for the
// rest. Controllers' Secret-based loaders should use it rather than passing
// possibly-nil entries to ParseMaterial.
func SecretMaterial(data map[string][]byte) (*Material, error) {
	for _, k := range []string{PrivateKeyFile, KnownHostsFile} {
		if _, ok := data[k]; !ok {
			return nil, provider.Transientf("ssh Secret has no %q entry", k)
		}
	}
	return ParseMaterial(data[PrivateKeyFile], data[KnownHostsFile])
}

// ParseMaterial builds Material from an unencrypted private key (PEM or
// OpenSSH format) and known_hosts content. Every failure is permanent: the
// bytes are present but unusable (empty, unparsable, passphrase-protected,
// no host entries). Error messages never contain key bytes.
func ParseMaterial(privateKeyPEM, knownHosts []byte) (*Material, error) {
	signer, err := parsePrivateKey(privateKeyPEM)
	if err != nil {
		return nil, err
	}
	cb, err := parseKnownHosts(knownHosts)
	if err != nil {
		return nil, err
	}
	return &Material{Signer: signer, HostKeyCallback: cb}, nil
}

func parsePrivateKey(b []byte) (ssh.Signer, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, provider.Permanentf("%s is empty", PrivateKeyFile)
	}
	signer, err := ssh.ParsePrivateKey(b)
	var pm *ssh.PassphraseMissingError
	switch {
	case errors.As(err, &pm):
		return nil, provider.Permanentf("%s is passphrase-protected; an unencrypted key is required", PrivateKeyFile)
	case err != nil:
		return nil, provider.Permanentf("%s does not parse: %w", PrivateKeyFile, err)
	}
	return signer, nil
}

func parseKnownHosts(b []byte) (ssh.HostKeyCallback, error) {
	if !hasEntries(b) {
		return nil, provider.Permanentf("%s has no entries", KnownHostsFile)
	}
	// Like OpenSSH, knownhosts skips bad lines as long as one line is valid,
	// and fails when none is.
	cb, err := knownHostsCallback(b)
	if err != nil {
		return nil, provider.Permanentf("%s does not parse: %w", KnownHostsFile, err)
	}
	return cb, nil
}

// hasEntries reports whether known_hosts has any non-comment line.
func hasEntries(b []byte) bool {
	for line := range bytes.Lines(b) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return true
		}
	}
	return false
}

// knownHostsCallback runs knownhosts.New, which only reads files, on data.
// It hands the bytes over through a pipe (/dev/fd/N) so nothing is written
// to disk: the manager's root filesystem is usually read-only. Where
// /dev/fd does not exist it falls back to a temporary file.
func knownHostsCallback(data []byte) (ssh.HostKeyCallback, error) {
	r, w, err := os.Pipe()
	if err == nil {
		go func() {
			_, _ = w.Write(data) // fails with EPIPE if r is closed unread
			_ = w.Close()
		}()
		path := fmt.Sprintf("/dev/fd/%d", r.Fd())
		cb, err := knownhosts.New(path)
		_ = r.Close()
		if !errors.Is(err, fs.ErrNotExist) {
			return cb, renamePath(err, path)
		}
	}

	f, err := os.CreateTemp("", "known_hosts-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	cb, err := knownhosts.New(f.Name())
	return cb, renamePath(err, f.Name())
}

// renamePath makes "/dev/fd/7:3: illegal base64" read "known_hosts:3: ...".
func renamePath(err error, path string) error {
	if err == nil {
		return nil
	}
	return errors.New(strings.ReplaceAll(err.Error(), path, KnownHostsFile))
}
