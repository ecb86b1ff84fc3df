//go:build bootorder

// This test boots a real guest from a managed Proxy's seed and checks, from
// the guest's own journal, that squid starts once and only after the
// boothook wrote its files: the first-boot promise of the managed squid
// (no default config served, no restart, so no flap). It needs
// qemu-system-x86 and a guest image with cloud-init and squid enabled, as
// test/e2e/infra/guest-image.sh builds it, and fails without them:
//
//	IMG=$(test/e2e/infra/guest-image.sh ~/.cache/proxy-operator/e2e-images)
//	SEED_BOOT_IMAGE=$IMG go test -tags bootorder -timeout 30m -v ./pkg/provider/kvm/seed/
//
// The guest has no network card at all (and the test runs in its network
// namespace holding only lo); TCG, 1 vCPU: minutes, not seconds.
package seed

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// bootUserData prints what the test judges to the serial console once the
// final stage's vendor scripts ran (runcmd comes after them), then powers
// off.
const bootUserData = `#cloud-config
runcmd:
  - - sh
    - -c
    - |
      sleep 10
      {
        echo "=== JOURNAL"
        journalctl -b -o short-monotonic --no-pager | grep -E 'proxy-operator\[|squid'

        echo "=== SQUID"
        systemctl show -p NRestarts squid
        head -1 /etc/squid/squid.conf
        stat -c '%U:%G %a %n' /etc/squid/passwd
        echo "=== END"
      } > /dev/ttyS0 2>&1
      poweroff
`

var journalLine = regexp.MustCompile(`^\[\s*([0-9]+\.[0-9]+)\] \S+ ([^\[:]+)(?:\[\d+\])?: (.*)$`)

type journalEntry struct {
	at       float64
	ident    string
	message  string
	original string
}

func TestManagedSquidStartsOnceAfterItsFiles(t *testing.T) {
	image := os.Getenv("SEED_BOOT_IMAGE")
	if image == "" {
		t.Fatal("SEED_BOOT_IMAGE is not set: the guest qcow2 of test/e2e/infra/guest-image.sh")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal("qemu-system-x86_64 not found (apt-get install qemu-system-x86)")
	}
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", image, disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	in, err := ForMachine(&provider.Machine{
		Namespace: "boot", Name: "order", UID: "6a1d0c9e-0000-4000-8000-0000000000b0", Port: 3128,
		UserData: []byte(bootUserData),
		Squid: &squid.Config{
			AllowedSourceCIDRs: []string{"192.0.2.0/24"},
			Auth:               squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: squid.GeneratePassword()},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	iso, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	seedPath, console := filepath.Join(dir, "seed.iso"), filepath.Join(dir, "console.log")
	if err := os.WriteFile(seedPath, iso, 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, qemu, "-machine", "pc,accel=tcg", "-m", "1024", "-smp", "1",
		"-display", "none", "-nic", "none", "-no-reboot", "-serial", "file:"+console,
		"-drive", "file="+disk+",if=virtio,format=qcow2",
		"-drive", "file="+seedPath+",if=ide,media=cdrom,format=raw,readonly=on")
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(console)
		t.Fatalf("qemu: %v\n%s\n--- console (tail):\n%s", err, out, tail(log, 4000))
	}
	t.Logf("guest booted, ran cloud-init and powered off in %s", time.Since(start).Round(time.Second))

	raw, err := os.ReadFile(console)
	if err != nil {
		t.Fatal(err)
	}
	// Serial output carries terminal colours and CRs.
	out := regexp.MustCompile("\x1b\\[[0-9;]*[A-Za-z]").ReplaceAllString(strings.ReplaceAll(string(raw), "\r", ""), "")
	journal, ok := section(out, "=== JOURNAL", "=== SQUID")
	state, ok2 := section(out, "=== SQUID", "=== END")
	if !ok || !ok2 {
		t.Fatalf("the guest did not report (user-data's runcmd did not run?):\n%s", tail([]byte(out), 6000))
	}
	t.Logf("guest journal:\n%s\n%s", journal, state)

	var entries []journalEntry
	for _, l := range strings.Split(journal, "\n") {
		if m := journalLine.FindStringSubmatch(l); m != nil {
			at, _ := strconv.ParseFloat(m[1], 64)
			entries = append(entries, journalEntry{at, m[2], m[3], l})
		}
	}
	find := func(ident, substr string) []journalEntry {
		var hits []journalEntry
		for _, e := range entries {
			if e.ident == ident && strings.Contains(e.message, substr) {
				hits = append(hits, e)
			}
		}
		return hits
	}
	wrote := find("proxy-operator", "wrote /etc/squid/squid.conf")
	starting := find("systemd", "Starting squid.service")
	started := find("systemd", "Started squid.service")
	switch {
	case len(wrote) != 1:
		t.Fatalf("the boothook wrote squid.conf %d times, want once", len(wrote))
	case len(starting) != 1 || len(started) != 1:
		t.Fatalf("squid.service started %d times (%d Started), want once", len(starting), len(started))
	case starting[0].at <= wrote[0].at:
		t.Fatalf("squid started at %.3fs, before the boothook wrote its config at %.3fs", starting[0].at, wrote[0].at)
	}
	if len(find("proxy-operator", "squid runs with the managed configuration")) != 1 {
		t.Error("the final-stage script did not find squid running the managed files")
	}
	for _, verb := range []string{"restarting", "starting squid", "could not"} {
		if hits := find("proxy-operator", verb); len(hits) > 0 {
			t.Errorf("the scripts did more than write the files: %s", hits[0].original)
		}
	}
	for _, want := range []string{"NRestarts=0\n", "# Generated by proxy-operator (pkg/squid)", "root:proxy 640 /etc/squid/passwd"} {
		if !strings.Contains(state, want) {
			t.Errorf("guest state lacks %q", want)
		}
	}
	t.Logf("boothook wrote squid.conf at %.1fs, squid.service starting at %.1fs and started at %.1fs (guest monotonic clock)",
		wrote[0].at, starting[0].at, started[0].at)
}

func section(s, from, to string) (string, bool) {
	_, after, ok := strings.Cut(s, from+"\n")
	if !ok {
		return "", false
	}
	body, _, ok := strings.Cut(after, to)
	return body, ok
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return bytes.TrimSpace(b)
}
