package squidtest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

func TestRunsInIsolatedNetworkNamespace(t *testing.T) { RequireOnlyLoopback(t) }

const proxyUID = 13 // Debian's proxy user

// placedDirs makes a read-only config directory (for /etc/squid) and a
// state directory owned by the proxy user (for /var/run/squid, a symlink
// into /run on Debian: the view must follow it).
func placedDirs(t *testing.T, conf string) (etc, state string) {
	t.Helper()
	dir := TempDir(t)
	etc, state = filepath.Join(dir, "etc-squid"), filepath.Join(dir, "state")
	for _, d := range []string{etc, state} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(state, proxyUID, proxyUID); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "squid.conf"), []byte(conf), 0o444); err != nil {
		t.Fatal(err)
	}
	return etc, state
}

func placedOptions(etc, state string) Options {
	return Options{
		ConfPath:     "/etc/squid/squid.conf",
		Mounts:       []Mount{{Source: etc, Target: "/etc/squid", ReadOnly: true}, {Source: state, Target: "/var/run/squid"}},
		ReadOnlyRoot: true,
		User:         &Credential{UID: proxyUID, GID: proxyUID},
		AccessLog:    "stdout",
		Listen:       "127.0.0.1:3128",
	}
}

// A placed squid sees its config where it was delivered, runs as the
// unprivileged user without capabilities, can write only to its mounts,
// and none of it shows on the host.
func TestPlacedSquidRunsInItsOwnView(t *testing.T) {
	const conf = "http_port 3128\nhttp_access deny all\npid_filename /var/run/squid/squid.pid\n" +
		"cache_log /dev/stderr\naccess_log stdio:/dev/stdout\ncoredump_dir /var/run/squid\nshutdown_lifetime 1 seconds\npinger_enable off\nnetdb_filename none\n"
	etc, state := placedDirs(t, conf)
	hostConf, _ := os.ReadFile("/etc/squid/squid.conf")
	o := placedOptions(etc, state)
	s := Start(t, o)

	if r := s.Request(t, "127.0.0.1", http.MethodGet, "http://192.0.2.1/", ""); r.Status != http.StatusForbidden {
		t.Errorf("status %d, want squid's 403", r.Status)
	}
	s.WaitForLogLine(t, "TCP_DENIED/403", "http://192.0.2.1/")
	if _, err := os.Stat(filepath.Join(state, "squid.pid")); err != nil {
		t.Errorf("pid file not in the state mount: %v", err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 1 && f[0] == "Uid:" && f[1] != "13":
			t.Errorf("squid runs as %s", l)
		case len(f) > 1 && (f[0] == "CapEff:" || f[0] == "CapBnd:") && f[1] != "0000000000000000":
			t.Errorf("squid has capabilities: %s", l)
		case len(f) > 1 && f[0] == "NoNewPrivs:" && f[1] != "1":
			t.Errorf("no_new_privs not set: %s", l)
		}
	}
	if after, _ := os.ReadFile("/etc/squid/squid.conf"); !bytes.Equal(after, hostConf) || bytes.Equal(after, []byte(conf)) {
		t.Error("the host's /etc/squid/squid.conf shows the placed config: the mount leaked")
	}
	if d := s.Stop(t, 10*time.Second); d <= 0 {
		t.Error("Stop reported no time")
	}
}

// The view is read-only but for its writable mounts: the proxy user may
// write /var/spool/squid on the host, not in the view.
func TestPlacedViewIsReadOnlyButForItsMounts(t *testing.T) {
	etc, state := placedDirs(t, "http_port 3128\n")
	o := placedOptions(etc, state)
	o.Dir = TempDir(t)
	s := &Squid{}
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/var/run/squid/written", true},
		{"/var/spool/squid/written", false},
		{"/etc/squid/written", false},
	} {
		out, err := s.command(t, o, []string{"sh", "-c", "echo x > " + tc.path}).CombinedOutput()
		if (err == nil) != tc.ok {
			t.Errorf("writing %s: err %v (%s), want success %v", tc.path, err, out, tc.ok)
		}
		if !tc.ok && !strings.Contains(string(out), "Read-only file system") {
			t.Errorf("writing %s failed for another reason: %s", tc.path, out)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "written")); err != nil {
		t.Errorf("write to the state mount did not reach its source: %v", err)
	}
	if _, err := os.Stat("/var/spool/squid/written"); err == nil {
		os.Remove("/var/spool/squid/written")
		t.Error("a write in the view reached the host")
	}
}

const openProxyEnv = "SQUIDTEST_OPEN_PROXY"

// CheckManagedPolicy must be able to fail: against an open proxy it does.
func TestCheckManagedPolicyFailsAnOpenProxy(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenProxyUnderPolicy$", "-test.v")
	cmd.Env = append(os.Environ(), openProxyEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("CheckManagedPolicy passed an open proxy:\n%s", out)
	}
	if testing.Verbose() {
		t.Logf("%s", out)
	}
	for _, want := range []string{
		"--- FAIL: TestOpenProxyUnderPolicy/allowed_source_with_the_credential_reaches_the_origin",
		"--- FAIL: TestOpenProxyUnderPolicy/a_source_outside_the_list",
		"--- FAIL: TestOpenProxyUnderPolicy/loopback,_metadata_and_private_destinations",
		"--- FAIL: TestOpenProxyUnderPolicy/CONNECT_goes_only_to_443",
		"--- FAIL: TestOpenProxyUnderPolicy/no_or_a_wrong_credential_gets_407",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

// TestOpenProxyUnderPolicy is run by TestCheckManagedPolicyFailsAnOpenProxy
// only; on its own it has nothing to check.
func TestOpenProxyUnderPolicy(t *testing.T) {
	if os.Getenv(openProxyEnv) == "" {
		return
	}
	dir := TempDir(t)
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("http_port 127.0.0.1:3128\nhttp_access allow all\naccess_log stdio:%s/access.log\ncache_log %s/cache.log\npid_filename %s/squid.pid\n", dir, dir, dir)
	s := Start(t, Options{Conf: []byte(conf), Dir: dir, Listen: "127.0.0.1:3128", AccessLog: filepath.Join(dir, "access.log")})
	CheckManagedPolicy(t, s, Policy{Client: "127.0.0.1", Stranger: "127.0.0.2", Username: "crawler", Password: "a-password-of-some-length", Origin: NewOrigin(t, "127.0.0.44:0")})
}

// An address added to lo is one a listener can bind and a client reach,
// IPv4 and IPv6, twice over.
func TestAddLoopbackAddress(t *testing.T) {
	for _, a := range []string{"34.118.224.1", "2600:1900:4000:1::5"} {
		addr := netip.MustParseAddr(a)
		AddLoopbackAddress(t, addr)
		AddLoopbackAddress(t, addr)
		o := NewOrigin(t, net.JoinHostPort(a, "0"))
		resp, err := http.Get("http://" + o.HostPort() + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent || len(o.Requests()) != 1 {
			t.Errorf("%s: %d, %d requests", a, resp.StatusCode, len(o.Requests()))
		}
	}
}

func TestOriginAnswersTheStatusItsPathNames(t *testing.T) {
	o := NewOrigin(t, "127.0.0.1:0")
	for path, want := range map[string]int{"/": http.StatusNoContent, "/429": http.StatusTooManyRequests, "/302": http.StatusFound, "/600": http.StatusNoContent, "/a": http.StatusNoContent} {
		resp, err := http.Get(o.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	if n := len(o.Requests()); n != 5 {
		t.Errorf("%d requests remembered, want 5", n)
	}
}
