package proxyprobe

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/squid"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// TestMain runs the package's tests in a network namespace holding only
// lo (as pkg/squid's do): the real squid below is asked for a name that
// must never be looked up and would refuse private destinations; if a
// regression made it try, nothing leaves the machine. Needs root.
func TestMain(m *testing.M) { squidtest.Main(m) }

// startSquid runs Debian's squid with the operator's rendered config for
// c on 127.0.0.1 and returns its port. The origin at originPort (on
// 127.0.0.1, which the default list denies) is made reachable the way a
// user would: an allowed port and a destination exception.
func startSquid(t *testing.T, c squid.Config, originPort int) int32 {
	t.Helper()
	bin, err := exec.LookPath("squid")
	if err != nil {
		t.Fatalf("squid not found (Debian package squid; make test-deps installs it): %v", err)
	}
	dir, err := os.MkdirTemp("", "proxyprobe-squid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil { // squid's helpers run as the proxy user
		t.Fatal(err)
	}
	c.ListenAddress = "127.0.0.1"
	c.Port = testutil.FreePort(t)
	c.AllowedPorts = []int{80, 443, originPort}
	c.AllowedDestinationExceptions = []string{"127.0.0.1/32"}
	c.Paths = squid.Paths{PasswordFile: filepath.Join(dir, "passwd"), PidFile: filepath.Join(dir, "squid.pid"),
		CacheLog: filepath.Join(dir, "cache.log"), AccessLog: "none", CoredumpDir: dir, UpstreamCounter: c.Paths.UpstreamCounter}
	conf, err := squid.Render(c)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing answers DNS here: a lookup would fail, never leave.
	conf = append(conf, "dns_nameservers 127.0.0.1\n"...)
	if users := c.PasswordUsers(); len(users) > 0 {
		pw, err := squid.PasswordFile(users...)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c.Paths.PasswordFile, pw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	confFile := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(confFile, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, "-N", "-f", confFile)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its helpers die with it
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Logf("squid stopped: %v", <-exited)
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port))
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			break
		}
		select {
		case err := <-exited:
			exited <- err
			cacheLog, _ := os.ReadFile(c.Paths.CacheLog)
			t.Fatalf("squid exited (%v):\n%s\n%s", err, out.String(), cacheLog)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cacheLog, _ := os.ReadFile(c.Paths.CacheLog)
			t.Fatalf("squid not listening on %s after 20s:\n%s\n%s", addr, out.String(), cacheLog)
		}
	}
	return int32(c.Port)
}

// echoOrigin answers with the caller's address, like a what-is-my-IP
// service.
func echoOrigin(t *testing.T) (probeURL string, port int) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintln(w, host)
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	port, _ = strconv.Atoi(u.Port())
	return srv.URL + "/ip", port
}

// TestProbeAgainstRealSquid: the probe's credential handling and the check
// without credentials, against squid running the operator's own config.
func TestProbeAgainstRealSquid(t *testing.T) {
	const user = "egress-1"
	pass := squid.GeneratePassword()
	probeURL, originPort := echoOrigin(t)
	basic := squid.Config{AllowedSourceCIDRs: []string{"127.0.0.1/32"}, Auth: squid.Auth{Type: squid.AuthBasic, Username: user, Password: pass}}
	port := startSquid(t, basic, originPort)
	probe := HTTP{URL: probeURL, Timeout: 5 * time.Second}
	ctx := context.Background()
	at := func(user, pass string) Target {
		return Target{Address: "127.0.0.1", Port: port, Username: user, Password: pass}
	}

	t.Run("with the credential: served, egress address recorded", func(t *testing.T) {
		r := probe.Probe(ctx, at(user, pass))
		if !r.OK || r.StatusCode != http.StatusOK || r.EgressAddress != "127.0.0.1" {
			t.Fatalf("%+v, want OK, 200, egress 127.0.0.1", r)
		}
	})
	t.Run("wrong password: 407", func(t *testing.T) {
		r := probe.Probe(ctx, at(user, squid.GeneratePassword()))
		if r.OK || r.StatusCode != http.StatusProxyAuthRequired {
			t.Fatalf("%+v, want a failure with 407", r)
		}
	})
	t.Run("without credentials: 407, before any destination check", func(t *testing.T) {
		if r := probe.ProbeWithoutCredentials(ctx, at(user, pass)); r.StatusCode != http.StatusProxyAuthRequired {
			t.Fatalf("probe URL: %+v, want 407", r)
		}
		if r := (TCP{Timeout: 5 * time.Second}).ProbeWithoutCredentials(ctx, at(user, pass)); r.StatusCode != http.StatusProxyAuthRequired {
			t.Fatalf("%s: %+v, want 407", AuthCheckURL, r)
		}
	})

	t.Run("manager's source not admitted: 403 even with the credential", func(t *testing.T) {
		other := basic
		other.AllowedSourceCIDRs = []string{"127.0.0.2/32"}
		port := startSquid(t, other, originPort)
		r := probe.Probe(ctx, Target{Address: "127.0.0.1", Port: port, Username: user, Password: pass})
		if r.OK || r.StatusCode != http.StatusForbidden {
			t.Fatalf("%+v, want a failure with 403", r)
		}
	})

	t.Run("auth None: served without credentials", func(t *testing.T) {
		none := squid.Config{AllowedSourceCIDRs: []string{"127.0.0.1/32"}, Auth: squid.Auth{Type: squid.AuthNone}}
		port := startSquid(t, none, originPort)
		r := probe.ProbeWithoutCredentials(ctx, Target{Address: "127.0.0.1", Port: port})
		if r.StatusCode != http.StatusOK {
			t.Fatalf("%+v, want 200: squid with auth None serves without credentials", r)
		}
	})
}

// TestStatsAgainstRealSquid: the operator's Stats credential reads the
// counters through the port, and they count the probe's requests; the
// upstream counter counts the probe's answer, which the probe says came
// from the origin, and not the 407 squid made; the clients' credential is
// refused without its password in the error.
func TestStatsAgainstRealSquid(t *testing.T) {
	crawler := squid.Auth{Type: squid.AuthBasic, Username: "egress-1", Password: squid.GeneratePassword()}
	stats := squid.Auth{Type: squid.AuthBasic, Username: "proxy-operator-stats", Password: squid.GeneratePassword()}
	probeURL, originPort := echoOrigin(t)
	// Not under t.TempDir, whose parent the proxy user cannot enter.
	counterDir, err := os.MkdirTemp("", "proxyprobe-counter-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(counterDir) })
	if err := os.Chmod(counterDir, 0o755); err != nil { // squid runs it as the proxy user
		t.Fatal(err)
	}
	counter := filepath.Join(counterDir, "upstream-counter")
	if err := os.WriteFile(counter, squid.UpstreamCounter, 0o755); err != nil {
		t.Fatal(err)
	}
	countsPort := testutil.FreePort(t)
	port := startSquid(t, squid.Config{AllowedSourceCIDRs: []string{"127.0.0.1/32"}, Auth: crawler, Stats: stats,
		UpstreamCountsPort: countsPort, Paths: squid.Paths{UpstreamCounter: counter}}, originPort)
	ctx := context.Background()
	at := func(a squid.Auth) Target {
		return Target{Address: "127.0.0.1", Port: port, Username: a.Username, Password: a.Password}
	}
	reader := HTTPStats{Timeout: 5 * time.Second, UpstreamCountsPort: countsPort}
	before, err := reader.ReadStats(ctx, at(stats))
	if err != nil {
		t.Fatal(err)
	}
	if r := (HTTP{URL: probeURL, Timeout: 5 * time.Second}).Probe(ctx, at(crawler)); !r.OK || !r.Upstream {
		t.Fatalf("probe: %+v, want OK from the origin", r)
	}
	if r := (TCP{Timeout: 5 * time.Second}).ProbeWithoutCredentials(ctx, at(crawler)); r.StatusCode != http.StatusProxyAuthRequired || r.Upstream {
		t.Fatalf("without credentials: %+v, want 407 from squid", r)
	}
	after, err := reader.ReadStats(ctx, at(stats))
	if err != nil {
		t.Fatal(err)
	}
	// The probe, the 407 and the client list read of before.
	if got := after.Requests - before.Requests; got != 4 {
		t.Errorf("requests moved by %d, want 4 (the counters read of before, its client list read, the probe, the 407)", got)
	}
	if got := after.Denied - before.Denied; got != 1 {
		t.Errorf("denials moved by %d, want 1", got)
	}
	_, err = reader.ReadStats(ctx, at(crawler))
	if err == nil || !strings.Contains(err.Error(), "status 403") {
		t.Fatalf("the clients' credential: %v, want a 403", err)
	}
	if strings.Contains(err.Error(), crawler.Password) {
		t.Fatal("password in the error")
	}

	// squid hands the daemon its log lines in batches.
	want := squid.UpstreamCounts{1}
	var u squid.UpstreamCounts
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if u, err = reader.ReadUpstream(ctx, at(stats)); err == nil && u == want {
			break
		}
	}
	if err != nil || u != want {
		t.Fatalf("upstream counts %v, %v; want %v: the probe's 200 alone", u, err, want)
	}
	if _, err := reader.ReadUpstream(ctx, at(crawler)); err == nil || !strings.Contains(err.Error(), "status 403") {
		t.Fatalf("the clients' credential reading the upstream counts: %v, want a 403", err)
	}
}
