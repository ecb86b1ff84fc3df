package e2eutil

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// SSHCat copies file to remotePath on the hypervisor with the real OpenSSH
// client, `ssh host 'cat > remotePath' < file`, over the same sshd and
// address the operator dials, and returns the wall time: the baseline the
// operator's image upload is compared with.
// sshArgs go before the destination (e.g. "-c", "aes128-gcm@openssh.com").
func SSHCat(ctx context.Context, c Config, file, remotePath string, sshArgs ...string) (time.Duration, error) {
	host, port, err := net.SplitHostPort(c.Address)
	if err != nil {
		host, port = c.Address, "22"
	}
	kh, err := os.CreateTemp("", "e2e-known_hosts-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(kh.Name())
	_, _ = kh.Write(c.KnownHosts)
	_ = kh.Close()
	in, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	args := append([]string{"-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile=" + kh.Name(), "-o", "ConnectTimeout=10",
		"-i", c.KeyFile, "-p", port}, sshArgs...)
	args = append(args, c.User+"@"+host, "cat > '"+strings.ReplaceAll(remotePath, "'", `'\''`)+"'")
	cmd := exec.CommandContext(ctx, "ssh", args...)
	cmd.Stdin = in
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	if err != nil {
		return took, fmt.Errorf("ssh cat > %s: %w: %s", remotePath, err, strings.TrimSpace(stderr.String()))
	}
	return took, nil
}

var poolPathRE = regexp.MustCompile(`<path>([^<]+)</path>`)

// PoolPath returns the directory of pool on the hypervisor.
func PoolPath(ctx context.Context, h Host, pool string) (string, error) {
	out, err := Virsh(ctx, h, "pool-dumpxml", pool)
	if err != nil {
		return "", err
	}
	m := poolPathRE.FindStringSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("pool %s has no <path> in its XML", pool)
	}
	return m[1], nil
}
