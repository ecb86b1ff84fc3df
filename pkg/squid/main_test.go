package squid

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const netnsEnv = "PKG_SQUID_TEST_NETNS"

// TestMain runs the package's tests in a network namespace of their own
// that holds only lo. The tests ask squid for 10.x, 169.254.169.254 and
// other private addresses and check that it refuses; if a regression made
// squid try, the connection fails here instead of leaving the machine.
// Needs root (CAP_SYS_ADMIN), as does squid's switch to the proxy user.
func TestMain(m *testing.M) {
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
		fmt.Fprintln(os.Stderr, "pkg/squid tests run in a network namespace of their own (needs root):", err)
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

// The namespace must really be empty: a route out would make the refusal
// tests unsafe rather than merely wrong.
func TestRunsInIsolatedNetworkNamespace(t *testing.T) {
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ifaces) != 1 || ifaces[0].Name != "lo" || ifaces[0].Flags&net.FlagUp == 0 {
		t.Fatalf("interfaces %v, want only lo, up", ifaces)
	}
}
