package seed

import (
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"crawl.example.com/proxy-operator/pkg/provider/guestsquid"
	"crawl.example.com/proxy-operator/pkg/squid"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// The package's tests run in a network namespace holding only lo: the squid
// test below asks for private destinations and checks the refusal.
func TestMain(m *testing.M) { squidtest.Main(m) }

func TestRunsInIsolatedNetworkNamespace(t *testing.T) { squidtest.RequireOnlyLoopback(t) }

// TestManagedVendorDataRunsInDebianSquid proves what a kvm guest runs:
// the seed ISO of a managed Proxy is built, its vendor-data read back, its
// boothook run against a fake root, and Debian's squid started the way
// squid.service starts it (as root, switching to proxy itself) on exactly
// the files the boothook wrote, at /etc/squid, with squid's built-in log,
// pid and spool paths in directories of the test, on a read-only view of
// the root. Then squidtest.CheckManagedPolicy: the password file's owner
// and mode are right only if squid's helper, running as proxy, can read it.
// With the operator's Stats credential, squid runs the upstream counter the
// boothook wrote (as proxy), which counts exactly the origin's answers, and
// squid's built-in access log is still written.
func TestManagedVendorDataRunsInDebianSquid(t *testing.T) {
	origin := squidtest.NewOrigin(t, "127.0.0.44:0")
	m := managedMachine()
	m.Squid = &squid.Config{
		AllowedSourceCIDRs:           []string{"127.0.0.1/32"},
		Auth:                         squid.Auth{Type: squid.AuthBasic, Username: "Crawler", Password: squidPassword},
		AllowedPorts:                 []int{80, 443, origin.Port()},
		AllowedDestinationExceptions: []string{origin.Host() + "/32"},
		Stats:                        squid.Auth{Type: squid.AuthBasic, Username: "proxy-operator-stats", Password: squidPassword + "-stats"},
	}
	in, err := ForMachine(m)
	if err != nil {
		t.Fatal(err)
	}
	iso, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	_, files := readISO(t, iso)

	dir := squidtest.TempDir(t)
	root := filepath.Join(dir, "guest")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	runBoothook(t, files[VendorDataFile], root)

	proxy, err := user.Lookup("proxy")
	if err != nil {
		t.Fatalf("user proxy (Debian's base-passwd) not found: %v", err)
	}
	uid, _ := strconv.Atoi(proxy.Uid)
	gid, _ := strconv.Atoi(proxy.Gid)
	mkdir := func(path string, owned bool) string {
		if err := os.MkdirAll(path, 0o755); err != nil {
			t.Fatal(err)
		}
		if owned {
			if err := os.Chown(path, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		return path
	}
	logs := mkdir(filepath.Join(dir, "log"), true)
	run := mkdir(filepath.Join(dir, "run"), false)
	mkdir(filepath.Join(run, "squid"), true) // squid.service's RuntimeDirectory
	spool := mkdir(filepath.Join(dir, "spool"), true)

	s := squidtest.Start(t, squidtest.Options{
		Dir:      dir,
		ConfPath: guestsquid.ConfPath,
		Mounts: []squidtest.Mount{
			{Source: filepath.Join(root, "etc", "squid"), Target: "/etc/squid", ReadOnly: true},
			{Source: logs, Target: "/var/log/squid"},
			{Source: run, Target: "/run"},
			{Source: spool, Target: "/var/spool/squid"},
			// The host has no CounterDir to mount on: its parent.
			{Source: filepath.Join(root, filepath.Dir(guestsquid.CounterDir)), Target: filepath.Dir(guestsquid.CounterDir), ReadOnly: true},
		},
		ReadOnlyRoot: true,
		AccessLog:    filepath.Join(logs, "access.log"),
		Listen:       "127.0.0.1:3128",
	})
	squidtest.CheckManagedPolicy(t, s, squidtest.Policy{
		Client: "127.0.0.1", Stranger: "127.0.0.2", Username: "Crawler", Password: squidPassword, Origin: origin,
	})
	if _, err := os.Stat(filepath.Join(run, "squid.pid")); err != nil {
		t.Errorf("squid's built-in pid file: %v", err)
	}

	// The origin answers 204 to all; squid's own refusals are not its.
	want := squid.UpstreamCounts{uint64(len(origin.Requests()))}
	var got squid.UpstreamCounts
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		r := s.Request(t, "127.0.0.1", http.MethodGet, squid.UpstreamURL(squid.UpstreamCountsPort(3128)), m.Squid.Stats.Username+":"+m.Squid.Stats.Password)
		if r.Status != http.StatusOK {
			continue
		}
		if got, err = squid.ParseUpstream(r.Body); err != nil {
			t.Fatalf("%v\n%s", err, r.Body)
		}
		if got == want {
			break
		}
	}
	if got != want || want[0] == 0 {
		t.Errorf("upstream counts %v, want %v\n%s", got, want, s.Output())
	}
	s.WaitForLogLine(t, origin.HostPort())
}
