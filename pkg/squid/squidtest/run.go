package squidtest

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Binary returns the squid binary's path; the test fails without it.
func Binary(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("squid"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/squid", "/usr/local/sbin/squid"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("squid not found (Debian package squid; make test-deps installs it)")
	return ""
}

// ExpectedViaWarning is squid's complaint about every config with via off
// (HTTP/1.1 wants Via; the operator drops it on purpose).
const ExpectedViaWarning = "WARNING: HTTP requires the use of Via"

// Problems returns every line of squid's output that flags a problem. The
// exit status alone is not enough: squid 5.7 exits 0 after "FATAL:
// Authentication helper program ... No such file", and reports ignored
// ACL entries only as WARNINGs.
func Problems(output string) []string {
	var problems []string
	for _, l := range strings.Split(output, "\n") {
		if strings.Contains(l, ExpectedViaWarning) {
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

// ParseProblems runs squid -k parse on conf and returns what it flags.
func ParseProblems(t testing.TB, conf []byte) []string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "squid.conf")
	if err := os.WriteFile(file, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(Binary(t), "-k", "parse", "-f", file).CombinedOutput()
	problems := Problems(string(out))
	if err != nil {
		problems = append([]string{"squid -k parse: " + err.Error()}, problems...)
	}
	return problems
}

// RequireParses fails the test unless squid -k parse accepts conf cleanly.
func RequireParses(t testing.TB, conf []byte) {
	t.Helper()
	if problems := ParseProblems(t, conf); len(problems) > 0 {
		t.Fatalf("squid -k parse rejects the config:\n%s\n--- config:\n%s", strings.Join(problems, "\n"), conf)
	}
}

// TempDir returns a fresh directory every user may enter (t.TempDir's
// parent is 0700, closed to the proxy user squid runs as), removed after
// the test.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "squidtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Mount places Source (a host path) at Target (the path squid sees).
type Mount struct {
	Source, Target string
	ReadOnly       bool
}

// Credential is a uid and gid.
type Credential struct{ UID, GID int }

// Options say how one squid runs.
//
// Plain (no Mounts, no ReadOnlyRoot): Conf is written to Dir/squid.conf
// and squid reads it from there, as the test process.
//
// Placed (Mounts or ReadOnlyRoot): squid runs in a mount namespace of its
// own, chrooted into a view of the host's root (read-only with
// ReadOnlyRoot) with Mounts on top, and reads ConfPath, which the Mounts
// must provide: the config is used where and as it was delivered.
type Options struct {
	// Conf is squid.conf (plain runs).
	Conf []byte
	// Dir holds the run's files; default a fresh TempDir.
	Dir string
	// Listen is the host:port squid listens on, e.g. 127.0.0.1:3128;
	// Start waits until it accepts connections.
	Listen string
	// Command is the command line, squid first; default squid -N -f
	// <config>. squid -k parse runs with the same arguments first.
	Command []string
	// Parse is the squid -k parse command line run first, for a Command
	// that is not squid's own (a wrapper that starts it).
	Parse []string

	ConfPath     string
	Mounts       []Mount
	ReadOnlyRoot bool
	// User runs squid as this uid/gid with no supplementary groups, no
	// capabilities in any set and no_new_privs (setpriv): what a
	// restricted Pod Security context leaves a container. nil runs it as
	// the test (root), and squid switches to its effective user itself.
	User *Credential
	// AccessLog is the file squid's access log goes to, for
	// WaitForLogLine; "stdout" when it goes to squid's stdout.
	AccessLog string
}

func (o Options) placed() bool { return len(o.Mounts) > 0 || o.ReadOnlyRoot }

// Squid is one running squid.
type Squid struct {
	// Addr is where IPv4 clients connect, Addr6 IPv6 ones.
	Addr, Addr6 string
	Dir         string
	// Stdout and Stderr are files holding squid's output.
	Stdout, Stderr string
	accessLog      string
	cmd            *exec.Cmd
	exited         chan error
}

// Start checks the config with squid -k parse (no problems allowed), starts
// squid, and waits until it listens on o.Listen. squid (and its helpers,
// one process group) is killed when the test ends.
func Start(t testing.TB, o Options) *Squid {
	t.Helper()
	bin := Binary(t)
	if o.Dir == "" {
		o.Dir = TempDir(t)
	}
	if o.Listen == "" {
		t.Fatal("squidtest: Options.Listen is required")
	}
	if !o.placed() {
		if o.ConfPath == "" {
			o.ConfPath = filepath.Join(o.Dir, "squid.conf")
		}
		if err := os.WriteFile(o.ConfPath, o.Conf, 0o644); err != nil {
			t.Fatal(err)
		}
	} else if o.ConfPath == "" {
		t.Fatal("squidtest: a placed squid needs ConfPath (provided by its Mounts)")
	}
	if len(o.Command) == 0 {
		o.Command = []string{bin, "-N", "-f", o.ConfPath}
	}

	s := &Squid{Dir: o.Dir, exited: make(chan error, 1)}
	host, port, err := net.SplitHostPort(o.Listen)
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = o.Listen
	s.Addr6 = net.JoinHostPort("::1", port)
	if strings.Contains(host, ":") {
		s.Addr6 = o.Listen
	}

	if len(o.Parse) == 0 {
		o.Parse = append([]string{o.Command[0], "-k", "parse"}, o.Command[1:]...)
	}
	parse := s.command(t, o, o.Parse)
	out, err := parse.CombinedOutput()
	problems := Problems(string(out))
	if err != nil {
		problems = append([]string{"squid -k parse: " + err.Error()}, problems...)
	}
	if len(problems) > 0 {
		t.Fatalf("squid -k parse rejects the config:\n%s", strings.Join(problems, "\n"))
	}

	var files [2]*os.File
	for i, name := range []string{"stdout", "stderr"} {
		f, err := os.Create(filepath.Join(o.Dir, "squid."+name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// Like runc, hand the container's output to its user.
		if o.User != nil {
			if err := f.Chown(o.User.UID, o.User.GID); err != nil {
				t.Fatal(err)
			}
		}
		files[i] = f
	}
	s.Stdout, s.Stderr = files[0].Name(), files[1].Name()
	s.accessLog = o.AccessLog
	if o.AccessLog == "stdout" {
		s.accessLog = s.Stdout
	}

	s.cmd = s.command(t, o, o.Command)
	s.cmd.Stdout, s.cmd.Stderr = files[0], files[1]
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		err := <-s.exited
		s.exited <- err
	})

	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			conn.Close()
			return s
		}
		select {
		case err := <-s.exited:
			s.exited <- err
			t.Fatalf("squid exited (%v):\n%s", err, s.Output())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("squid not listening on %s after 20s:\n%s", s.Addr, s.Output())
		}
	}
}

// command is argv as o runs it: directly, or through this binary as the
// helper that builds the mount namespace, then setpriv when o.User is set.
func (s *Squid) command(t testing.TB, o Options, argv []string) *exec.Cmd {
	t.Helper()
	if o.User != nil {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Fatalf("setpriv (util-linux) not found: %v", err)
		}
		argv = append([]string{setpriv,
			"--reuid=" + strconv.Itoa(o.User.UID), "--regid=" + strconv.Itoa(o.User.GID), "--clear-groups",
			"--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"}, argv...)
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var cmd *exec.Cmd
	if !o.placed() {
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.Dir = o.Dir
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its helpers die with it
		return cmd
	}
	root, err := os.MkdirTemp(o.Dir, "root-")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := json.Marshal(execSpec{Root: root, ReadOnlyRoot: o.ReadOnlyRoot, Mounts: o.Mounts, Dir: "/", Argv: argv, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(exe)
	cmd.Env = []string{execEnv + "=" + string(spec)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Setpgid: true}
	return cmd
}

// Output is squid's stdout and stderr so far, for failure messages.
func (s *Squid) Output() string {
	out, _ := os.ReadFile(s.Stdout)
	errOut, _ := os.ReadFile(s.Stderr)
	return fmt.Sprintf("--- stdout:\n%s--- stderr:\n%s", out, errOut)
}

// ReadStdout and ReadStderr return what squid wrote there so far.
func (s *Squid) ReadStdout() string { b, _ := os.ReadFile(s.Stdout); return string(b) }
func (s *Squid) ReadStderr() string { b, _ := os.ReadFile(s.Stderr); return string(b) }

// Pid is squid's main process (the helper and setpriv exec into it).
func (s *Squid) Pid() int { return s.cmd.Process.Pid }

// Stop sends SIGTERM and returns how long squid took to exit, or fails
// the test after limit.
func (s *Squid) Stop(t testing.TB, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.exited:
		s.exited <- err
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("squid still running %s after SIGTERM", limit)
		return 0
	}
}

// WaitForLogLine waits for an access log line containing every word.
func (s *Squid) WaitForLogLine(t testing.TB, words ...string) string {
	t.Helper()
	if s.accessLog == "" {
		t.Fatal("squidtest: no Options.AccessLog to read")
	}
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
			t.Fatalf("no access log line with %q:\n%s", words, data)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// listeningLine is what squid logs each time it opens its port: once when
// it starts, once more after every reconfigure.
const listeningLine = "Accepting HTTP Socket connections"

// WaitListening waits until squid's cache log (the file at cacheLog, e.g.
// s.Stderr when cache_log is /dev/stderr) says it opened its port n times
// in all: n-1 reconfigures have completed.
func (s *Squid) WaitListening(t testing.TB, cacheLog string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, _ := os.ReadFile(cacheLog)
		if strings.Count(string(data), listeningLine) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("squid did not open its port %d times within 30s:\n%s", n, s.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Reconfigure sends squid SIGHUP, as squid -k reconfigure does, and waits
// until it listens again with the files re-read.
func (s *Squid) Reconfigure(t testing.TB, cacheLog string) {
	t.Helper()
	data, _ := os.ReadFile(cacheLog)
	n := strings.Count(string(data), listeningLine)
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.WaitListening(t, cacheLog, n+1)
}
