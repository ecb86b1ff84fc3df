// Package squidtest runs Debian's squid for tests: every squid.conf the
// operator renders or delivers is judged by the real thing, not by reading
// it. It is the one runner for pkg/squid and the providers.
//
// Tests that use it run in a network namespace holding only lo (Main): they
// ask squid for 10.x, 169.254.169.254 and other private addresses and check
// that it refuses, and if a regression made squid try, the connection fails
// there instead of leaving the machine. A squid can also run as a provider
// runs it (Options.Mounts, ReadOnlyRoot, User): with its config at the
// delivered path, in a mount namespace of its own on a read-only view of
// the root, as an unprivileged user without capabilities, so a config is
// proven byte for byte as it is delivered.
//
// Needs root (network and mount namespaces, squid's switch to the proxy
// user) and Debian's squid package (make test-deps installs it); without
// them the tests fail rather than skip.
package squidtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const (
	netnsEnv = "SQUIDTEST_NETNS"
	execEnv  = "SQUIDTEST_EXEC"
)

// Main is the TestMain of a package whose tests run squid:
//
//	func TestMain(m *testing.M) { squidtest.Main(m) }
//
// It re-executes the test binary in a new network namespace with lo up and
// runs the tests there. The same binary is also the helper that places a
// squid in its mount namespace (see Options.Mounts).
func Main(m *testing.M) {
	if spec := os.Getenv(execEnv); spec != "" {
		// Only returns on failure.
		fmt.Fprintln(os.Stderr, "squidtest: placing squid in its mount namespace:", execInMountNamespace(spec))
		os.Exit(127)
	}
	if os.Getenv(netnsEnv) == "" {
		os.Exit(reexecInNetns())
	}
	if err := loopbackUp(); err != nil {
		fmt.Fprintln(os.Stderr, "bringing lo up in the test network namespace:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func reexecInNetns() int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Pdeathsig follows the forking thread: keep it alive while we wait.
	runtime.LockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	default:
		fmt.Fprintln(os.Stderr, "tests that run squid run in a network namespace of their own (needs root):", err)
		return 1
	}
}

// loopbackUp sets lo up, which gives it 127.0.0.1/8 and ::1.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// RequireOnlyLoopback fails unless the namespace holds only lo, up: a
// route out would make the refusal tests unsafe rather than merely wrong.
// Every package using Main has a test calling it.
func RequireOnlyLoopback(t testing.TB) {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ifaces) != 1 || ifaces[0].Name != "lo" || ifaces[0].Flags&net.FlagUp == 0 {
		t.Fatalf("interfaces %v, want only lo, up (is TestMain squidtest.Main?)", ifaces)
	}
}

// execSpec is what the helper process does before it becomes squid.
type execSpec struct {
	// Root is an empty directory the root's view is built on.
	Root         string
	ReadOnlyRoot bool
	Mounts       []Mount
	// Dir is the working directory inside the view.
	Dir  string
	Argv []string
	Env  []string
}

// execInMountNamespace runs in a child cloned with CLONE_NEWNS: it builds
// the view (a bind of / at spec.Root, read-only if asked, the system
// mounts squid uses, then spec.Mounts), chroots into it and execs Argv.
// Nothing it mounts is seen outside the namespace, which dies with squid.
func execInMountNamespace(raw string) error {
	var s execSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := bind("/", s.Root, s.ReadOnlyRoot); err != nil {
		return err
	}
	// Non-recursive above, so only what squid needs comes along.
	for _, sys := range []string{"/dev", "/dev/shm", "/proc"} {
		if err := bind(sys, filepath.Join(s.Root, sys), false); err != nil {
			return err
		}
	}
	for _, m := range s.Mounts {
		// Resolved on the host, whose tree the view mirrors: a symlink
		// (/var/run -> /run) must not lead out of the view.
		target, err := filepath.EvalSymlinks(m.Target)
		if err != nil {
			return fmt.Errorf("mount target %s must exist on the host: %w", m.Target, err)
		}
		if err := bind(m.Source, filepath.Join(s.Root, target), m.ReadOnly); err != nil {
			return err
		}
	}
	if err := unix.Chroot(s.Root); err != nil {
		return fmt.Errorf("chroot %s: %w", s.Root, err)
	}
	if err := os.Chdir(s.Dir); err != nil {
		return err
	}
	bin, err := exec.LookPath(s.Argv[0])
	if err != nil {
		return err
	}
	return unix.Exec(bin, s.Argv, s.Env)
}

func bind(source, target string, readOnly bool) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", source, target, err)
	}
	if !readOnly {
		return nil
	}
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("making %s read-only: %w", target, err)
	}
	return nil
}
