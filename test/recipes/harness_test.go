// Package recipes runs the crawler recipes of docs/examples (Scrapy,
// requests, Crawlee) as a crawler team would, against real squids running
// the operator's rendered config, a list laid out as the kubelet lays out a
// mounted Secret, and an origin that tells a proxied request from a direct
// one by its source address.
//
// Like pkg/squid's, the tests run in a network namespace holding only lo
// (squidtest.Main; root): nothing a recipe sends can leave the machine.
package recipes

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/squid"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

func TestMain(m *testing.M) { squidtest.Main(m) }

func TestRunsInIsolatedNetworkNamespace(t *testing.T) { squidtest.RequireOnlyLoopback(t) }

const (
	// originAddr is where the sites live; squid admits it as a
	// destination exception, as a user would for a loopback site.
	originAddr = "127.0.0.44"
	// Each squid leaves from an egress address of its own
	// (tcp_outgoing_address), so the origin knows which proxy a request
	// came through; a direct request comes from 127.0.0.1.
	egressA = "127.0.0.7"
	egressB = "127.0.0.8"
)

// siteNames resolve to the origin through squid's resolver
// (squidtest.ServeDNS); a recipe that went direct could not resolve them.
var siteNames = []string{"banned.test", "www.banned.test", "notbanned.test", "expired.test"}

// hit is one request that reached the origin.
type hit struct {
	Source, Host, Path string
	At                 time.Time
}

// origin answers 200 to everything, after slowDelay for paths under
// /slow/, 403 (what a site that bans does) under /forbidden/, and records
// each request's source address.
type origin struct {
	addr      string
	port      int
	slowDelay time.Duration
	mu        sync.Mutex
	hits      []hit
}

func newOrigin(t *testing.T) *origin {
	t.Helper()
	l, err := net.Listen("tcp", originAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	o := &origin{addr: l.Addr().String(), port: l.Addr().(*net.TCPAddr).Port, slowDelay: 150 * time.Millisecond}
	srv := &http.Server{Handler: o, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return o
}

func (o *origin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	source, _, _ := net.SplitHostPort(r.RemoteAddr)
	o.mu.Lock()
	o.hits = append(o.hits, hit{Source: source, Host: r.Host, Path: r.URL.Path, At: time.Now()})
	o.mu.Unlock()
	if strings.HasPrefix(r.URL.Path, "/slow/") {
		time.Sleep(o.slowDelay)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if strings.HasPrefix(r.URL.Path, "/forbidden/") {
		w.WriteHeader(http.StatusForbidden)
	}
	fmt.Fprintln(w, "<!doctype html><title>ok</title>")
}

// under returns the hits whose path starts with prefix: each scenario
// uses a prefix of its own.
func (o *origin) under(prefix string) []hit {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []hit
	for _, h := range o.hits {
		if strings.HasPrefix(h.Path, prefix) {
			out = append(out, h)
		}
	}
	return out
}

// urls are n URLs on host (the origin's address when empty) under prefix.
func (o *origin) urls(host, prefix string, n int) []string {
	if host == "" {
		host = originAddr
	}
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("http://%s:%d%s%d", host, o.port, prefix, i)
	}
	return out
}

// proxy is a real squid running the operator's rendered config with a
// generated credential; URL is the line the pool would publish.
type proxy struct {
	Name, URL, Egress string
}

func startProxy(t *testing.T, name, egress string, originPort int) proxy {
	t.Helper()
	dir := squidtest.TempDir(t)
	if err := os.Chmod(dir, 0o777); err != nil { // squid writes as the proxy user
		t.Fatal(err)
	}
	auth := squid.Auth{Type: squid.AuthBasic, Username: name, Password: squid.GeneratePassword()}
	c := squid.Config{
		ListenAddress:                "127.0.0.1",
		Port:                         testutil.FreePort(t),
		AllowedSourceCIDRs:           []string{"127.0.0.1/32"},
		Auth:                         auth,
		AllowedPorts:                 []int{80, 443, originPort},
		AllowedDestinationExceptions: []string{originAddr + "/32"},
		Paths: squid.Paths{PasswordFile: filepath.Join(dir, "passwd"), PidFile: filepath.Join(dir, "squid.pid"),
			CacheLog: filepath.Join(dir, "cache.log"), AccessLog: filepath.Join(dir, "access.log"), CoredumpDir: dir},
	}
	conf, err := squid.Render(c)
	if err != nil {
		t.Fatal(err)
	}
	conf = append(conf, "dns_nameservers "+squidtest.DNSAddress+"\ntcp_outgoing_address "+egress+"\n"...)
	pw, err := squid.PasswordFile(auth)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.Paths.PasswordFile, pw, 0o644); err != nil {
		t.Fatal(err)
	}
	s := squidtest.Start(t, squidtest.Options{Conf: conf, Dir: dir, AccessLog: c.Paths.AccessLog, Listen: net.JoinHostPort(c.ListenAddress, strconv.Itoa(c.Port))})
	u := url.URL{Scheme: "http", User: url.UserPassword(auth.Username, auth.Password), Host: s.Addr}
	return proxy{Name: name, URL: u.String(), Egress: egress}
}

// ban is an entry of bannedDomains.
type ban struct {
	Domain    string `json:"domain"`
	ExpiresAt string `json:"expiresAt"`
}

// entry is an entry of proxies.json as the pool publishes it
// (controllers.PublishedProxy).
type entry struct {
	Name          string `json:"name"`
	URL           string `json:"url"`
	CreatedAt     string `json:"createdAt"`
	BannedDomains []ban  `json:"bannedDomains,omitempty"`
}

func (p proxy) entry(bans ...ban) entry {
	return entry{Name: p.Name, URL: p.URL, CreatedAt: time.Now().UTC().Format(time.RFC3339), BannedDomains: bans}
}

// secretDir is the list Secret as the kubelet mounts it
// (squidtest.KubeletDir: a change swaps ..data atomically).
type secretDir struct{ squidtest.KubeletDir }

// newSecretDir is the mount before anything is published: no files.
func newSecretDir(t *testing.T) *secretDir {
	return &secretDir{squidtest.KubeletDir{Dir: t.TempDir()}}
}

func (d *secretDir) path(key string) string { return filepath.Join(d.Dir, key) }

// publish writes proxies.json and proxies.txt for entries.
func (d *secretDir) publish(t *testing.T, entries ...entry) {
	t.Helper()
	if entries == nil {
		entries = []entry{}
	}
	js, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var txt strings.Builder
	for _, e := range entries {
		txt.WriteString(e.URL + "\n")
	}
	d.Write(t, map[string][]byte{"proxies.json": js, "proxies.txt": []byte(txt.String())}, 0o644)
}

// process is a recipe running, its output (stdout and stderr) in a file.
type process struct {
	cmd    *exec.Cmd
	out    string
	start  time.Time
	exited chan struct{}
	err    error
}

// startProcess starts cmd in a process group of its own, killed when the
// test ends.
func startProcess(t *testing.T, cmd *exec.Cmd) *process {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "output"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &process{cmd: cmd, out: f.Name(), start: time.Now(), exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	})
	return p
}

func (p *process) output() string { b, _ := os.ReadFile(p.out); return string(b) }

// wait returns the exit code, failing the test if the process runs
// longer than limit.
func (p *process) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(limit):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
		t.Fatalf("%s still running after %s:\n%s", p.cmd.Args[0], limit, p.output())
	}
	return p.cmd.ProcessState.ExitCode()
}

// waitUntil polls cond every 50 ms for up to limit while the process runs.
func (p *process) waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		select {
		case <-p.exited:
			t.Fatalf("exited (%v) before %s:\n%s", p.err, what, p.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s after %s:\n%s", what, limit, p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
