package squid

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"crawl.example.com/proxy-operator/internal/testutil"
)

// The tests run Debian's squid (make test-deps installs it) and fail when
// it is missing: the point of this package is what real squid does.
func squidBinary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("squid")
	if err != nil {
		t.Fatalf("squid not found (Debian package squid; make test-deps installs it): %v", err)
	}
	return p
}

// squid warns about this on every config; HTTP/1.1 wants Via, we drop it.
const expectedViaWarning = "WARNING: HTTP requires the use of Via"

// parseProblems runs squid -k parse on conf and returns every line squid
// flags. The exit status alone is not enough: squid 5.7 exits 0 after
// "FATAL: Authentication helper program ... No such file", and reports
// ignored ACL entries only as WARNINGs.
func parseProblems(t testing.TB, conf []byte) []string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "squid.conf")
	if err := os.WriteFile(file, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(squidBinary(t), "-k", "parse", "-f", file).CombinedOutput()
	var problems []string
	if err != nil {
		problems = append(problems, "squid -k parse: "+err.Error())
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, expectedViaWarning) {
			continue
		}
		for _, word := range []string{"FATAL", "ERROR", "WARNING", "Bungled", "unrecognized"} {
			if strings.Contains(l, word) {
				problems = append(problems, l)
				break
			}
		}
	}
	return problems
}

func requireParses(t testing.TB, conf []byte) {
	t.Helper()
	if problems := parseProblems(t, conf); len(problems) > 0 {
		t.Fatalf("squid -k parse rejects the config:\n%s\n--- config:\n%s", strings.Join(problems, "\n"), conf)
	}
}

// The checker must be able to fail: nested ranges in the wrong order are
// only a WARNING to squid, and a FATAL does not change its exit status.
func TestParseProblemsCatchesWarningsAndFatals(t *testing.T) {
	for name, conf := range map[string]string{
		"nested ranges":     "http_port 3128\nacl a dst 10.1.0.0/16 10.0.0.0/8\nhttp_access deny a\nhttp_access deny all\n",
		"missing helper":    "http_port 3128\nauth_param basic program /nonexistent/helper /x\nacl u proxy_auth REQUIRED\nhttp_access deny !u\nhttp_access deny all\n",
		"unknown directive": "http_port 3128\nallow_everything on\n",
	} {
		if len(parseProblems(t, []byte(conf))) == 0 {
			t.Errorf("%s: no problem reported", name)
		}
	}
}

func TestRenderedConfigsParse(t *testing.T) {
	for name, change := range map[string]func(*Config){
		"defaults":      func(*Config) {},
		"auth None":     func(c *Config) { c.Auth = Auth{Type: AuthNone} },
		"IPv6 listen":   func(c *Config) { c.ListenAddress = "::1"; c.Port = 8080 },
		"IPv4 listen":   func(c *Config) { c.ListenAddress = "192.0.2.10" },
		"mixed sources": func(c *Config) { c.AllowedSourceCIDRs = []string{"0.0.0.0/0", "2000::/3", "fc00::/7", "192.0.2.0/24"} },
		"many sources": func(c *Config) {
			c.AllowedSourceCIDRs = nil
			for i := range 200 {
				c.AllowedSourceCIDRs = append(c.AllowedSourceCIDRs, fmt.Sprintf("198.51.%d.%d/32", i/100, i%100))
			}
		},
		"ports":     func(c *Config) { c.AllowedPorts = []int{443, 8443, 8080, 80, 1, 65535} },
		"HTTP only": func(c *Config) { c.AllowedPorts = []int{80} },
		"many ports": func(c *Config) { // one line would pass squid's 8 KiB line buffer
			for p := 1; p <= 2000; p++ {
				c.AllowedPorts = append(c.AllowedPorts, p)
			}
		},
		"extra nested in defaults": func(c *Config) {
			c.ExtraDeniedDestinations = []string{"10.96.0.0/12", "10.244.0.0/16", "172.20.0.0/16", "fd00:10::/64", "198.18.0.0/15"}
		},
		"exceptions": func(c *Config) {
			c.AllowedDestinationExceptions = []string{"127.0.0.1/32", "10.20.30.40/32", "192.168.0.0/17", "fd00::1/128", "169.254.1.0/24"}
			c.ExtraDeniedDestinations = []string{"10.96.0.0/12"}
		},
		"connection cap": func(c *Config) { c.MaxConnectionsPerClient = 1 },
		"all paths": func(c *Config) {
			c.Paths = Paths{PasswordFile: "/run/squid/passwd", PidFile: "/run/squid/squid.pid", CacheLog: "/var/log/squid/cache.log", AccessLog: "/dev/stdout", CoredumpDir: "/var/spool/squid"}
		},
		"no access log": func(c *Config) { c.Paths.AccessLog = "none" },
	} {
		t.Run(name, func(t *testing.T) {
			c := baseConfig()
			change(&c)
			conf, err := Render(c)
			if err != nil {
				t.Fatal(err)
			}
			requireParses(t, conf)
		})
	}
}

// runningSquid is one squid -N on 127.0.0.1 with all its files in dir.
type runningSquid struct {
	addr      string // where IPv4 clients (and the readiness check) connect
	addr6     string // where IPv6 clients connect
	dir       string
	accessLog string
}

// startSquid renders c for loopback (127.0.0.1 unless c says otherwise), starts squid and waits for its port.
// Helpers run as the proxy user when the test runs as root, so dir is
// world-writable. The one addition to the rendered config keeps name
// lookups on loopback: squid asks testDNSAddress (serveDNS) for names not
// in /etc/hosts.
func startSquid(t *testing.T, c Config) *runningSquid {
	t.Helper()
	bin := squidBinary(t)
	dir, err := os.MkdirTemp("", "squid-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if c.ListenAddress == "" {
		c.ListenAddress = "127.0.0.1"
	}
	c.Port = testutil.FreePort(t)
	c.Paths = Paths{
		PasswordFile: filepath.Join(dir, "passwd"), PidFile: filepath.Join(dir, "squid.pid"),
		CacheLog: filepath.Join(dir, "cache.log"), AccessLog: filepath.Join(dir, "access.log"), CoredumpDir: dir,
	}
	conf, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	requireParses(t, conf)
	conf = append(conf, "dns_nameservers "+testDNSAddress+"\n"...)
	if c.Auth.Type == AuthBasic {
		pw, err := PasswordFile(c.Auth)
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
		<-exited
	})
	s := &runningSquid{addr: fmt.Sprintf("127.0.0.1:%d", c.Port), addr6: fmt.Sprintf("[::1]:%d", c.Port), dir: dir, accessLog: c.Paths.AccessLog}
	if c.ListenAddress == "::1" {
		s.addr = s.addr6
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			conn.Close()
			return s
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
			t.Fatalf("squid not listening on %s after 20s:\n%s\n%s", s.addr, out.String(), cacheLog)
		}
	}
}

// proxyResponse is what squid answered to one request.
type proxyResponse struct {
	status     int
	squidError string // X-Squid-Error: which of squid's refusals it was
	server     string
}

// dial connects to squid from source (an address on lo).
func (s *runningSquid) dial(t *testing.T, source string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	addr := s.addr
	if netip.MustParseAddr(source).Is6() {
		addr = s.addr6
	}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	return conn
}

// roundTrip sends one proxy request on conn: a GET with an absolute URL,
// or CONNECT host:port. userpass "" sends no Proxy-Authorization.
func roundTrip(t *testing.T, conn net.Conn, method, target, userpass string, keepAlive bool) proxyResponse {
	t.Helper()
	host := target
	if method != http.MethodConnect {
		host = strings.SplitN(strings.TrimPrefix(target, "http://"), "/", 2)[0]
	}
	var req strings.Builder
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, target, host)
	if userpass != "" {
		fmt.Fprintf(&req, "Proxy-Authorization: Basic %s\r\n", base64.StdEncoding.EncodeToString([]byte(userpass)))
	}
	if !keepAlive {
		req.WriteString("Connection: close\r\n")
	}
	req.WriteString("\r\n")
	if _, err := conn.Write([]byte(req.String())); err != nil {
		t.Fatal(err)
	}
	r, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	if method != http.MethodConnect || r.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return proxyResponse{status: r.StatusCode, squidError: r.Header.Get("X-Squid-Error"), server: r.Header.Get("Server")}
}

// request sends one request on a new connection from source.
func (s *runningSquid) request(t *testing.T, source, method, target, userpass string) proxyResponse {
	t.Helper()
	conn := s.dial(t, source)
	defer conn.Close()
	return roundTrip(t, conn, method, target, userpass, false)
}

// waitForLogLine waits for an access.log line containing every word.
func (s *runningSquid) waitForLogLine(t *testing.T, words ...string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		data, _ := os.ReadFile(s.accessLog)
		for _, l := range strings.Split(string(data), "\n") {
			all := true
			for _, w := range words {
				all = all && strings.Contains(l, w)
			}
			if all {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no access.log line with %q:\n%s", words, data)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
