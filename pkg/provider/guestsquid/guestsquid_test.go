package guestsquid

import (
	"bytes"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
)

const password = "correct-horse-battery-staple-42"

func managed() *provider.Machine {
	return &provider.Machine{
		Namespace: "crawl", Name: "eu-1", UID: "uid-1", Port: 3128,
		Squid: &squid.Config{
			AllowedSourceCIDRs: []string{"192.0.2.0/24"},
			Auth:               squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: password},
		},
	}
}

func TestRenderUsesTheGuestsPaths(t *testing.T) {
	f, ok, err := Render(managed())
	if err != nil || !ok {
		t.Fatalf("Render: ok %v, %v", ok, err)
	}
	for _, want := range []string{"http_port 3128\n", "auth_param basic program " + AuthHelper + " " + PasswordPath + "\n"} {
		if !bytes.Contains(f.Conf, []byte(want)) {
			t.Errorf("squid.conf lacks %q:\n%s", want, f.Conf)
		}
	}
	// squid's built-in pid file and logs: what Debian's unit and logrotate expect.
	for _, directive := range []string{"pid_filename", "cache_log", "access_log", "coredump_dir"} {
		if bytes.Contains(f.Conf, []byte("\n"+directive+" ")) {
			t.Errorf("squid.conf sets %s", directive)
		}
	}
	if !squid.PasswordFileMatches(f.Password, managed().Squid.Auth) {
		t.Errorf("password file %q does not admit the credential", f.Password)
	}

	if _, ok, err := Render(&provider.Machine{Port: 3128}); ok || err != nil {
		t.Errorf("unmanaged: ok %v, err %v", ok, err)
	}
	none := managed()
	none.Squid.Auth = squid.Auth{Type: squid.AuthNone}
	if f, _, err := Render(none); err != nil || f.Password != nil {
		t.Errorf("auth None: password file %q, err %v", f.Password, err)
	}
	bad := managed()
	bad.Squid.AllowedSourceCIDRs = nil
	if _, _, err := Render(bad); provider.Class(err) != provider.ClassPermanent || !strings.Contains(err.Error(), "spec.access.allowedSourceCIDRs") {
		t.Errorf("invalid config: %v", err)
	}
}

func TestScriptCarriesNoPasswordAndIsPlainASCII(t *testing.T) {
	f, _, err := Render(managed())
	if err != nil {
		t.Fatal(err)
	}
	for _, stage := range []Stage{Early, Final} {
		s := Script(f, stage)
		if strings.Contains(s, password) {
			t.Errorf("%s script holds the password in clear", stage)
		}
		for i, c := range []byte(s) {
			if c != '\n' && c != '\t' && (c < 0x20 || c > 0x7e) {
				t.Fatalf("%s script: byte %#x at %d is not printable ASCII", stage, c, i)
			}
		}
		if !strings.Contains(s, "\n"+PathLine+"\n") || !strings.Contains(s, "\n"+RootLine+"\n") {
			t.Errorf("%s script lost the lines tests swap", stage)
		}
		if Script(f, stage) != s {
			t.Errorf("%s script is not deterministic", stage)
		}
	}
}

// sandbox is a fake root and stub commands (first on PATH; coreutils are
// the host's). Stubs log their calls; the script's PATH and root lines are
// swapped so it touches nothing outside the fake root.
type sandbox struct {
	root, bin, calls string
}

func newSandbox(t *testing.T, stubs map[string]string) *sandbox {
	t.Helper()
	dir := t.TempDir()
	s := &sandbox{root: filepath.Join(dir, "root"), bin: filepath.Join(dir, "bin"), calls: filepath.Join(dir, "calls")}
	for _, d := range []string{s.root, s.bin, filepath.Join(s.root, "usr", "sbin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range stubs {
		stub := "#!/bin/sh\necho \"" + name + " $*\" >>\"$CALLS\"\n" + body + "\n"
		if err := os.WriteFile(filepath.Join(s.bin, name), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Not the host's syslog; what is logged is the script's stderr too.
	if err := os.WriteFile(filepath.Join(s.bin, "logger"), []byte(LoggerStub), 0o755); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *sandbox) run(t *testing.T, script string) (string, error) {
	t.Helper()
	script = strings.Replace(script, PathLine, "PATH="+s.bin+":/usr/bin:/bin; export PATH", 1)
	script = strings.Replace(script, RootLine, "root="+s.root, 1)
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=" + s.bin + ":/usr/bin:/bin", "CALLS=" + s.calls, "FAKEROOT=" + s.root}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (s *sandbox) callLog() []string {
	data, err := os.ReadFile(s.calls)
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

func (s *sandbox) write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(s.root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func (s *sandbox) read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.root, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func proxyGID(t *testing.T) int {
	g, err := user.LookupGroup("proxy")
	if err != nil {
		t.Fatalf("group proxy (Debian's base-passwd) not found: %v", err)
	}
	gid, _ := strconv.Atoi(g.Gid)
	return gid
}

// The stubs: systemctl answers is-active from $FAKEROOT/state; apt-get
// install plays the package: squid appears and its own squid.conf replaces
// ours, and it records whether policy-rc.d would let it start squid.
const (
	systemctlStub = `[ "$1" = is-active ] && { cat "$FAKEROOT/state" 2>/dev/null || echo inactive; }; exit 0`
	aptGetStub    = `case "$*" in *" install "*)
	if [ -x "$FAKEROOT/usr/sbin/policy-rc.d" ]; then "$FAKEROOT/usr/sbin/policy-rc.d" squid start; echo "policy-rc.d $?" >>"$CALLS"; fi
	printf '#!/bin/sh\n' > "$FAKEROOT/usr/sbin/squid"; chmod 755 "$FAKEROOT/usr/sbin/squid"
	echo "# the package's default" > "$FAKEROOT/etc/squid/squid.conf";;
esac; exit 0`
	offlineStub = `echo 'Temporary failure resolving' >&2; exit 100`
)

func TestScriptStages(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the script sets owner root and group proxy: run the tests as root (as make test does)")
	}
	f, _, err := Render(managed())
	if err != nil {
		t.Fatal(err)
	}
	installCalls := []string{
		"apt-get -q -o DPkg::Lock::Timeout=120 update",
		"apt-get -q -y -o DPkg::Lock::Timeout=120 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold install --no-install-recommends squid",
		"policy-rc.d 101",
	}
	tests := []struct {
		name       string
		stage      Stage
		squid      bool   // squid installed in the fake root
		state      string // what systemctl is-active says
		oldConf    string // squid.conf before, "" none
		stubs      map[string]string
		want       []string
		wantFail   bool
		wantPolicy string // an image's own policy-rc.d, kept as is
	}{
		{name: "early, first boot: files only, squid starts later", stage: Early, squid: true, state: "inactive",
			want: []string{"systemctl is-active squid"}},
		{name: "early, later boot: nothing changes", stage: Early, squid: true, state: "inactive", oldConf: "same",
			want: nil},
		{name: "early, squid already running an old config: restarted without waiting", stage: Early, squid: true, state: "active", oldConf: "# default\n",
			want: []string{"systemctl is-active squid", "systemctl --no-block restart squid"}},
		{name: "early, squid starting: restarted too", stage: Early, squid: true, state: "activating", oldConf: "# default\n",
			want: []string{"systemctl is-active squid", "systemctl --no-block restart squid"}},
		{name: "early, image without squid", stage: Early, state: "inactive",
			want: []string{"systemctl is-active squid"}},
		{name: "final, squid running with the files: left alone", stage: Final, squid: true, state: "active", oldConf: "same",
			want: []string{"systemctl enable squid", "systemctl is-active squid"}},
		{name: "final, squid stopped: started", stage: Final, squid: true, state: "inactive", oldConf: "same",
			want: []string{"systemctl enable squid", "systemctl is-active squid", "systemctl start squid"}},
		{name: "final, squid running other files: restarted once", stage: Final, squid: true, state: "active", oldConf: "# default\n",
			want: []string{"systemctl enable squid", "systemctl is-active squid", "systemctl restart squid"}},
		{name: "final, squid missing: installed without starting, files restored, then started", stage: Final, state: "inactive",
			want: append(slices.Clone(installCalls), "systemctl enable squid", "systemctl is-active squid", "systemctl start squid")},
		{name: "final, squid missing, the image's policy-rc.d kept", stage: Final, state: "inactive", wantPolicy: "#!/bin/sh\nexit 0\n",
			want: []string{installCalls[0], installCalls[1], "policy-rc.d 0", "systemctl enable squid", "systemctl is-active squid", "systemctl start squid"}},
		{name: "final, squid missing and offline: fails, nothing started", stage: Final, state: "inactive",
			stubs: map[string]string{"apt-get": offlineStub}, wantFail: true,
			want: installCalls[:2]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stubs := map[string]string{"systemctl": systemctlStub, "apt-get": aptGetStub}
			for k, v := range tt.stubs {
				stubs[k] = v
			}
			s := newSandbox(t, stubs)
			s.write(t, "state", tt.state+"\n", 0o644)
			if tt.squid {
				s.write(t, SquidBinary, "#!/bin/sh\n", 0o755)
			}
			switch tt.oldConf {
			case "":
			case "same":
				s.write(t, ConfPath, string(f.Conf), 0o644)
				s.write(t, PasswordPath, string(f.Password), 0o640)
			default:
				s.write(t, ConfPath, tt.oldConf, 0o644)
			}
			if tt.wantPolicy != "" {
				s.write(t, "usr/sbin/policy-rc.d", tt.wantPolicy, 0o755)
			}

			out, err := s.run(t, Script(f, tt.stage))
			if (err != nil) != tt.wantFail {
				t.Fatalf("script error %v, want failure %v:\n%s", err, tt.wantFail, out)
			}
			if got := s.callLog(); !slices.Equal(got, tt.want) {
				t.Errorf("calls:\n got %q\nwant %q\noutput:\n%s", got, tt.want, out)
			}
			if !tt.wantFail {
				if !bytes.Equal(s.read(t, ConfPath), f.Conf) || !bytes.Equal(s.read(t, PasswordPath), f.Password) {
					t.Errorf("files are not the managed ones:\n%s", s.read(t, ConfPath))
				}
				for path, want := range map[string]os.FileMode{ConfPath: 0o644, PasswordPath: 0o640} {
					fi, err := os.Stat(filepath.Join(s.root, path))
					if err != nil {
						t.Fatal(err)
					}
					st := fi.Sys().(*syscall.Stat_t)
					if fi.Mode().Perm() != want || st.Uid != 0 {
						t.Errorf("%s: mode %v uid %d, want %v root", path, fi.Mode().Perm(), st.Uid, want)
					}
					if path == PasswordPath && int(st.Gid) != proxyGID(t) {
						t.Errorf("%s: gid %d, want group proxy: squid's helper reads it as proxy", path, st.Gid)
					}
				}
			}
			policy, err := os.ReadFile(filepath.Join(s.root, "usr/sbin/policy-rc.d"))
			switch {
			case tt.wantPolicy != "" && string(policy) != tt.wantPolicy:
				t.Errorf("the image's policy-rc.d was changed: %q", policy)
			case tt.wantPolicy == "" && err == nil:
				t.Errorf("policy-rc.d left behind: %q", policy)
			}
			if leftovers, _ := filepath.Glob(filepath.Join(s.root, "etc/squid/*.tmp")); len(leftovers) > 0 {
				t.Errorf("temporary files left: %v", leftovers)
			}
		})
	}
}

// Without Basic auth nothing but squid.conf is written.
func TestScriptWithoutPassword(t *testing.T) {
	m := managed()
	m.Squid.Auth = squid.Auth{Type: squid.AuthNone}
	f, _, err := Render(m)
	if err != nil {
		t.Fatal(err)
	}
	s := newSandbox(t, map[string]string{"systemctl": systemctlStub})
	if out, err := s.run(t, Script(f, Early)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(s.root, PasswordPath)); !os.IsNotExist(err) {
		t.Errorf("password file written: %v", err)
	}
	if !bytes.Equal(s.read(t, ConfPath), f.Conf) {
		t.Error("squid.conf not written")
	}
}

// With the operator's Stats credential the guest gets the upstream counter
// squid.conf runs, executable and the embedded program byte for byte;
// without it, neither.
func TestScriptWritesTheCounterExecutable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the script sets owner root: run the tests as root (as make test does)")
	}
	m := managed()
	m.Squid.Stats = squid.Auth{Type: squid.AuthBasic, Username: "proxy-operator-stats", Password: password + "-stats"}
	f, _, err := Render(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f.Counter, squid.UpstreamCounter) || !bytes.Contains(f.Conf, []byte("\nlogfile_daemon "+CounterPath+"\n")) {
		t.Fatalf("counter %d bytes, squid.conf:\n%s", len(f.Counter), f.Conf)
	}
	for _, stage := range []Stage{Early, Final} {
		s := newSandbox(t, map[string]string{"systemctl": systemctlStub})
		s.write(t, SquidBinary, "#!/bin/sh\n", 0o755)
		if out, err := s.run(t, Script(f, stage)); err != nil {
			t.Fatalf("%s: %v\n%s", stage, err, out)
		}
		if !bytes.Equal(s.read(t, CounterPath), squid.UpstreamCounter) {
			t.Errorf("%s: %s is not the counter", stage, CounterPath)
		}
		fi, err := os.Stat(filepath.Join(s.root, CounterPath))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o755 || st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s: %s mode %v owner %d:%d, want 0755 root:root (squid runs it as proxy, who must not change it)", stage, CounterPath, fi.Mode().Perm(), st.Uid, st.Gid)
		}
	}

	without, _, err := Render(managed())
	if err != nil {
		t.Fatal(err)
	}
	s := newSandbox(t, map[string]string{"systemctl": systemctlStub})
	if out, err := s.run(t, Script(without, Early)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(s.root, CounterPath)); without.Counter != nil || !os.IsNotExist(err) {
		t.Errorf("without a Stats credential: counter %d bytes, file: %v", len(without.Counter), err)
	}
}
