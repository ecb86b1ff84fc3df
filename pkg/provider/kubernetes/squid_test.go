package kubernetes

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"crawl.example.com/proxy-operator/internal/testutil"
)

// squidUnderTest runs the container's command line (SquidCommand) against
// the real squid binary, with the rendered config, as close to the pod's
// security context as a process gets: an unprivileged uid (SquidUID when
// the test runs as root), no capabilities, no_new_privs, the config
// read-only and owned by someone else, and the state directory the only
// writable path. Like runc, it hands the container's stdout and stderr to
// that uid. The test fails (not skips) without squid: install Debian's
// squid package.
type squidUnderTest struct {
	root, conf, state string
	addr              string
	cmd               *exec.Cmd
	stdout, stderr    *os.File
}

func startSquid(t *testing.T) *squidUnderTest {
	t.Helper()
	bin, err := exec.LookPath("squid")
	if err != nil {
		for _, p := range []string{"/usr/sbin/squid", "/usr/local/sbin/squid"} {
			if _, err2 := os.Stat(p); err2 == nil {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		t.Fatalf("squid binary not found (apt-get install squid): %v", err)
	}

	// Not t.TempDir: its parent is 0700, closed to the squid user.
	root, err := os.MkdirTemp("", "squid-contract-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	s := &squidUnderTest{root: root}
	uid, gid := os.Getuid(), os.Getgid()
	asRoot := uid == 0
	if asRoot {
		uid, gid = int(SquidUID), int(SquidUID)
	}
	// The tree is traversable, the config readable, neither writable.
	if err := os.Chmod(s.root, 0o755); err != nil {
		t.Fatal(err)
	}
	s.state = filepath.Join(s.root, "state")
	if err := os.Mkdir(s.state, 0o700); err != nil {
		t.Fatal(err)
	}
	if asRoot {
		if err := os.Chown(s.state, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	port := testutil.FreePort(t)
	s.addr = fmt.Sprintf("127.0.0.1:%d", port)
	conf := SquidConfig{Port: int32(port), ListenAddress: "127.0.0.1", AllowedClients: []string{"127.0.0.1/32"},
		StateDir: s.state, Name: "test/squid"}.Render()
	s.conf = filepath.Join(s.root, "squid.conf")
	if err := os.WriteFile(s.conf, []byte(conf), 0o444); err != nil {
		t.Fatal(err)
	}

	argv := SquidCommand(s.conf)
	parse := s.command(t, bin, uid, gid, asRoot, append([]string{"-k", "parse"}, argv[1:]...)...)
	if out, err := parse.CombinedOutput(); err != nil {
		t.Fatalf("squid -k parse: %v\n%s", err, out)
	}

	for _, f := range []**os.File{&s.stdout, &s.stderr} {
		if *f, err = os.CreateTemp(s.root, "log"); err != nil {
			t.Fatal(err)
		}
		if asRoot {
			if err := (*f).Chown(uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.cmd = s.command(t, bin, uid, gid, asRoot, argv[1:]...)
	s.cmd.Stdout, s.cmd.Stderr = s.stdout, s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return s
		}
		select {
		case err := <-exited:
			t.Fatalf("squid exited: %v\nstderr:\n%s", err, s.log(s.stderr))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("squid not listening on %s: %v\nstderr:\n%s", s.addr, err, s.log(s.stderr))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// command runs squid with args as uid/gid when the test is root, through
// setpriv: no supplementary groups, no capabilities in any set, and
// no_new_privs (allowPrivilegeEscalation: false), as drop: [ALL] and the
// restricted level leave the container.
func (s *squidUnderTest) command(t *testing.T, bin string, uid, gid int, asRoot bool, args ...string) *exec.Cmd {
	t.Helper()
	var cmd *exec.Cmd
	if asRoot {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Fatalf("setpriv (util-linux) not found: %v", err)
		}
		cmd = exec.Command(setpriv, append([]string{
			fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", gid), "--clear-groups",
			"--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--", bin,
		}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	cmd.Dir = s.root
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	return cmd
}

func (s *squidUnderTest) log(f *os.File) string {
	b, _ := os.ReadFile(f.Name())
	return string(b)
}

// TestSquidRunsTheContainerCommandLineUnprivileged proves the entrypoint
// contract of docs/providers.md against a real squid: the command line
// and rendered config start it as an unprivileged user with a read-only
// config, it serves on the port and applies the access policy, it writes
// only to the state directory and the container log, and SIGTERM stops it
// within the pod's grace period.
func TestSquidRunsTheContainerCommandLineUnprivileged(t *testing.T) {
	s := startSquid(t)

	// Loopback destinations are forbidden by the policy: squid answers
	// 403 itself, so it runs, parsed the config and applies it.
	proxyURL, _ := url.Parse("http://" + s.addr)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
	resp, err := client.Get("http://127.0.0.1:9/forbidden")
	if err != nil {
		t.Fatalf("request through squid: %v\nstderr:\n%s", err, s.log(s.stderr))
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.HasPrefix(resp.Header.Get("X-Squid-Error"), "ERR_ACCESS_DENIED") {
		t.Errorf("loopback destination: %s, X-Squid-Error %q; want squid's 403 ERR_ACCESS_DENIED", resp.Status, resp.Header.Get("X-Squid-Error"))
	}
	// CONNECT only to 443.
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT example.com:22 HTTP/1.1\r\nHost: example.com:22\r\n\r\n")
	line, _ := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if !strings.Contains(line, " 403 ") {
		t.Errorf("CONNECT to port 22: %q, want 403", line)
	}

	// The pid file is in the state directory, and squid runs as the
	// unprivileged user.
	pid, err := os.ReadFile(filepath.Join(s.state, "squid.pid"))
	if err != nil {
		t.Errorf("no pid file in the state directory: %v", err)
	}
	if status, err := os.ReadFile(fmt.Sprintf("/proc/%s/status", strings.TrimSpace(string(pid)))); err == nil {
		for _, l := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(l, "Uid:") && strings.Fields(l)[1] == "0" {
				t.Errorf("squid runs as root: %s", l)
			}
			if strings.HasPrefix(l, "CapEff:") && strings.Fields(l)[1] != "0000000000000000" {
				t.Errorf("squid has capabilities: %s", l)
			}
		}
	}
	// The access log reached stdout.
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(s.log(s.stdout), "TCP_DENIED/403") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(s.log(s.stdout), "TCP_DENIED/403") {
		t.Errorf("access log not on stdout:\n%s", s.log(s.stdout))
	}

	// SIGTERM: gone within the pod's termination grace period (10s).
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for {
			if err := s.cmd.Process.Signal(syscall.Signal(0)); err != nil {
				close(done)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Errorf("squid still running 10s after SIGTERM")
	}
	t.Logf("squid stopped %s after SIGTERM", time.Since(start).Round(100*time.Millisecond))

	// Nothing but the state directory and the two logs was written.
	var written []string
	_ = filepath.Walk(s.root, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || p == s.conf || p == s.stdout.Name() || p == s.stderr.Name() || strings.HasPrefix(p, s.state+string(filepath.Separator)) {
			return nil
		}
		written = append(written, p)
		return nil
	})
	if len(written) > 0 {
		t.Errorf("squid wrote outside the state directory: %v", written)
	}
	if b, _ := os.ReadFile(s.conf); !bytes.Contains(b, []byte("pid_filename "+s.state)) {
		t.Error("config changed")
	}
	if strings.Contains(s.log(s.stderr), "FATAL") {
		t.Errorf("squid logged a FATAL:\n%s", s.log(s.stderr))
	}
}
