package e2eutil

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Host runs commands on the hypervisor, out of band from the operator: to
// check what the operator did there and to cut its SSH access.
type Host interface {
	// Run runs argv on the hypervisor and returns its stdout.
	Run(ctx context.Context, argv ...string) (string, error)
	// StopSSHD makes the hypervisor refuse SSH (established sessions end
	// too); StartSSHD makes it answer again, with the same host key.
	StopSSHD(ctx context.Context) error
	StartSSHD(ctx context.Context) error
	// LocalPath maps a path on the hypervisor to this machine's file
	// system, or "" when the hypervisor is remote.
	LocalPath(hostPath string) string
	// LogDir is a directory for logs about the hypervisor kept after the
	// run ("" when there is none).
	LogDir() string
}

// NewHost returns the Host for c: hypervisor.sh for the local test
// hypervisor, ssh otherwise.
func NewHost(c Config) Host {
	if c.Local() {
		return &LocalHost{Script: c.HypervisorSH, StateDir: c.StateDir}
	}
	return &SSHHost{Config: c}
}

// LocalHost is the test hypervisor of test/e2e/infra/hypervisor.sh, whose
// commands run inside its namespaces through `hypervisor.sh exec`, or its
// second hypervisor (HostB).
type LocalHost struct {
	Script   string
	StateDir string
	// hostB: this is the hypervisor's host B (`hypervisor.sh host-b`).
	hostB bool
}

func (h *LocalHost) Run(ctx context.Context, argv ...string) (string, error) {
	if h.hostB {
		return run(ctx, append([]string{h.Script, "host-b", h.StateDir, "exec", "--"}, argv...)...)
	}
	return run(ctx, append([]string{h.Script, "exec", h.StateDir, "--"}, argv...)...)
}

// HostBPool is host B's storage pool.
const HostBPool = "e2e-b"

// HostB starts the test hypervisor's second hypervisor (`hypervisor.sh
// host-b up`: a libvirtd of its own, pool HostBPool, behind the same sshd,
// its guests on the host's bridge) and returns it, its commands running
// where its libvirtd does, and its libvirt socket, a KVMHost's socketPath.
// Libvirtd and the sshd commands act on the host's daemons, not host B's.
func (h *LocalHost) HostB(ctx context.Context) (*LocalHost, string, error) {
	out, err := run(ctx, h.Script, "host-b", h.StateDir, "up")
	if err != nil {
		return nil, "", err
	}
	return &LocalHost{Script: h.Script, StateDir: h.StateDir, hostB: true}, strings.TrimSpace(out), nil
}

func (h *LocalHost) StopSSHD(ctx context.Context) error {
	_, err := run(ctx, h.Script, "stop-sshd", h.StateDir)
	return err
}

func (h *LocalHost) StartSSHD(ctx context.Context) error {
	_, err := run(ctx, h.Script, "start-sshd", h.StateDir)
	return err
}

// LocalPath: the host's libvirt directories are bind mounts of STATE_DIR
// (host B's, of STATE_DIR/hostb).
func (h *LocalHost) LocalPath(p string) string {
	state := h.StateDir
	if h.hostB {
		state = filepath.Join(h.StateDir, "hostb")
	}
	for _, m := range []struct{ host, local string }{
		{"/var/lib/libvirt/", "libvirt/lib/"},
		{"/etc/libvirt/", "libvirt/etc/"},
		{"/var/log/", "varlog/"},
		{"/var/run/libvirt/", "libvirt/run/"},
		{"/run/libvirt/", "libvirt/run/"},
	} {
		if rest, ok := strings.CutPrefix(p, m.host); ok {
			return filepath.Join(state, m.local, rest)
		}
	}
	if strings.HasPrefix(p, h.StateDir+"/") {
		return p
	}
	return ""
}

// LogDir is STATE_DIR/logs, which `hypervisor.sh down` keeps.
func (h *LocalHost) LogDir() string { return filepath.Join(h.StateDir, "logs") }

// Libvirtd wedges (stop: SIGSTOP), thaws (cont), kills (kill: SIGKILL, its
// guests keep running) or starts the host's libvirtd (start waits until it
// answers).
func (h *LocalHost) Libvirtd(ctx context.Context, action string) error {
	_, err := run(ctx, h.Script, "libvirtd", h.StateDir, action)
	return err
}

// RotateHostKey gives the host's sshd a new host key and restarts it
// (sessions end); it returns the new public key ("ssh-ed25519 AAAA...").
func (h *LocalHost) RotateHostKey(ctx context.Context) (string, error) {
	out, err := run(ctx, h.Script, "rotate-host-key", h.StateDir)
	return strings.TrimSpace(out), err
}

// TmpfsPool makes (or resizes) directory pool name on a tmpfs of mib MiB
// that exists only in the host's mount namespace; it returns its path.
func (h *LocalHost) TmpfsPool(ctx context.Context, name string, mib int) (string, error) {
	if _, err := run(ctx, h.Script, "tmpfs-pool", h.StateDir, name, fmt.Sprint(mib)); err != nil {
		return "", err
	}
	return filepath.Join(h.StateDir, "run", "pools", name), nil
}

// SSHHost is a remote hypervisor reached with the ssh client. SSH outages
// run Config.SSHDStopCmd / SSHDStartCmd on this machine.
type SSHHost struct {
	Config Config
}

func (h *SSHHost) Run(ctx context.Context, argv ...string) (string, error) {
	host, port, err := net.SplitHostPort(h.Config.Address)
	if err != nil {
		host, port = h.Config.Address, "22"
	}
	kh, err := os.CreateTemp("", "e2e-known_hosts-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(kh.Name())
	_, _ = kh.Write(h.Config.KnownHosts)
	_ = kh.Close()
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return run(ctx, "ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile="+kh.Name(), "-o", "ConnectTimeout=10",
		"-i", h.Config.KeyFile, "-p", port, h.Config.User+"@"+host, "--", strings.Join(quoted, " "))
}

func (h *SSHHost) StopSSHD(ctx context.Context) error {
	if h.Config.SSHDStopCmd == "" {
		return errors.New("KVM_TEST_SSHD_STOP_CMD is not set: a remote hypervisor needs a command that makes its sshd refuse connections (see test/e2e/kind/run.sh)")
	}
	_, err := run(ctx, "sh", "-c", h.Config.SSHDStopCmd)
	return err
}

func (h *SSHHost) StartSSHD(ctx context.Context) error {
	if h.Config.SSHDStartCmd == "" {
		return errors.New("KVM_TEST_SSHD_START_CMD is not set")
	}
	_, err := run(ctx, "sh", "-c", h.Config.SSHDStartCmd)
	return err
}

func (h *SSHHost) LocalPath(string) string { return "" }
func (h *SSHHost) LogDir() string          { return "" }

func run(ctx context.Context, argv ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Virsh runs virsh against the hypervisor's system daemon.
func Virsh(ctx context.Context, h Host, args ...string) (string, error) {
	return h.Run(ctx, append([]string{"virsh", "-q", "-c", "qemu:///system"}, args...)...)
}

// Domains lists every domain's name, running or not.
func Domains(ctx context.Context, h Host) ([]string, error) {
	out, err := Virsh(ctx, h, "list", "--all", "--name")
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

// Volumes lists the volume names of pool.
func Volumes(ctx context.Context, h Host, pool string) ([]string, error) {
	if _, err := Virsh(ctx, h, "pool-refresh", pool); err != nil {
		return nil, err
	}
	out, err := Virsh(ctx, h, "vol-list", pool)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// DomainInfo is what the test reads from a domain's live XML.
type DomainInfo struct {
	UUID     string
	NVRAM    string // path on the host ("" for BIOS guests)
	SerialPT string // the serial console's pty ("" when not running)
	Disks    []string
}

// Domain reads dom's XML.
func Domain(ctx context.Context, h Host, dom string) (DomainInfo, error) {
	out, err := Virsh(ctx, h, "dumpxml", dom)
	if err != nil {
		return DomainInfo{}, err
	}
	var x struct {
		UUID string `xml:"uuid"`
		OS   struct {
			NVRAM string `xml:"nvram"`
		} `xml:"os"`
		Devices struct {
			Disks []struct {
				Source struct {
					File   string `xml:"file,attr"`
					Volume string `xml:"volume,attr"`
				} `xml:"source"`
			} `xml:"disk"`
			Serials []struct {
				Type   string `xml:"type,attr"`
				Source struct {
					Path string `xml:"path,attr"`
				} `xml:"source"`
			} `xml:"serial"`
		} `xml:"devices"`
	}
	if err := xml.Unmarshal([]byte(out), &x); err != nil {
		return DomainInfo{}, fmt.Errorf("domain %s XML: %w", dom, err)
	}
	info := DomainInfo{UUID: x.UUID, NVRAM: strings.TrimSpace(x.OS.NVRAM)}
	for _, d := range x.Devices.Disks {
		info.Disks = append(info.Disks, d.Source.File+d.Source.Volume)
	}
	for _, s := range x.Devices.Serials {
		if s.Type == "pty" && s.Source.Path != "" {
			info.SerialPT = s.Source.Path
			break
		}
	}
	return info, nil
}

// FileExists says whether path exists on the hypervisor.
func FileExists(ctx context.Context, h Host, path string) (bool, error) {
	out, err := h.Run(ctx, "sh", "-c", `if [ -e "$1" ]; then echo yes; else echo no; fi`, "sh", path)
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(out) == "yes", nil
}

// Present reports which of names are in have.
func Present(have, names []string) []string {
	var out []string
	for _, n := range names {
		if slices.Contains(have, n) {
			out = append(out, n)
		}
	}
	return out
}

// SerialCapture copies a local hypervisor domain's serial console (a pty,
// which has no log file) into a file, from as soon as the domain runs until
// it stops or Stop is called. The operator's domains log their console to
// the pty only; this is the boot log a failed run needs.
type SerialCapture struct {
	Path string

	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	note   string
}

// CaptureSerial starts capturing dom's console into path (appending). It
// waits (bounded by ctx) for the domain to exist with a pty.
func CaptureSerial(ctx context.Context, h Host, dom, path string) *SerialCapture {
	ctx, cancel := context.WithCancel(ctx)
	s := &SerialCapture{Path: path, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.setNote(s.capture(ctx, h, dom))
	}()
	return s
}

func (s *SerialCapture) setNote(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.note = err.Error()
	}
}

// Stop ends the capture and waits for it.
func (s *SerialCapture) Stop() {
	s.cancel()
	<-s.done
}

// Note says why the capture ended early, if it did.
func (s *SerialCapture) Note() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.note
}

func (s *SerialCapture) capture(ctx context.Context, h Host, dom string) error {
	var pty string
	for pty == "" {
		if info, err := Domain(ctx, h, dom); err == nil {
			pty = info.SerialPT
		}
		if pty != "" {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(300 * time.Millisecond):
		}
	}
	// The pty is in the devpts this process shares with the hypervisor's
	// mount namespace. Raw mode and no echo: nothing read may go back to
	// the guest as console input.
	f, err := os.OpenFile(pty, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return fmt.Errorf("serial capture: %w", err)
	}
	defer f.Close()
	if sc, err := f.SyscallConn(); err == nil {
		_ = sc.Control(func(fd uintptr) {
			if t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS); err == nil {
				t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
				t.Oflag &^= unix.OPOST
				t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
				t.Cflag &^= unix.CSIZE | unix.PARENB
				t.Cflag |= unix.CS8
				t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
				_ = unix.IoctlSetTermios(int(fd), unix.TCSETS, t)
			}
		})
	}
	out, err := os.OpenFile(s.Path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	fmt.Fprintf(out, "\n=== serial console of %s (%s), captured from %s ===\n", dom, pty, time.Now().Format(time.RFC3339))
	stop := context.AfterFunc(ctx, func() { _ = f.Close() })
	defer stop()
	_, err = io.Copy(out, f)
	if ctx.Err() != nil || errors.Is(err, os.ErrClosed) || errors.Is(err, unix.EIO) {
		return nil // stopped, or the domain went away (EIO on a closed pty)
	}
	return err
}

// Tail returns the last n lines of a file (a note when it is unreadable).
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%s: %v)\n", path, err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// GuestExec runs argv in dom's guest through its guest agent (guest-exec,
// then guest-exec-status every second until it exits or ctx ends) and
// returns its exit code and standard output.
func GuestExec(ctx context.Context, h Host, dom string, argv ...string) (int, string, error) {
	req, err := json.Marshal(map[string]any{"execute": "guest-exec", "arguments": map[string]any{
		"path": argv[0], "arg": argv[1:], "capture-output": true}})
	if err != nil {
		return 0, "", err
	}
	out, err := Virsh(ctx, h, "qemu-agent-command", dom, string(req))
	if err != nil {
		return 0, "", err
	}
	var started struct {
		Return struct {
			PID int `json:"pid"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(out), &started); err != nil {
		return 0, "", fmt.Errorf("guest-exec answer %q: %w", out, err)
	}
	status := fmt.Sprintf(`{"execute":"guest-exec-status","arguments":{"pid":%d}}`, started.Return.PID)
	for {
		out, err := Virsh(ctx, h, "qemu-agent-command", dom, status)
		if err != nil {
			return 0, "", err
		}
		var st struct {
			Return struct {
				Exited   bool   `json:"exited"`
				ExitCode int    `json:"exitcode"`
				OutData  string `json:"out-data"`
			} `json:"return"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return 0, "", fmt.Errorf("guest-exec-status answer %q: %w", out, err)
		}
		if st.Return.Exited {
			b, _ := base64.StdEncoding.DecodeString(st.Return.OutData)
			return st.Return.ExitCode, string(b), nil
		}
		select {
		case <-ctx.Done():
			return 0, "", fmt.Errorf("%s in %s: %w", strings.Join(argv, " "), dom, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// CutSSH ends every sshd in the host's network namespace at once with
// SIGKILL (the listener and every session, the operator's link included),
// then runs stop-sshd for the rest (the loopback forwarder). StopSSHD alone
// takes seconds on a loaded machine: too slow for a fault that must land
// inside one call of the operator.
func (h *LocalHost) CutSSH(ctx context.Context) error {
	var nsName string
	if b, err := os.ReadFile(filepath.Join(h.StateDir, "state.env")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "NETNS="); ok {
				nsName = v
			}
		}
	}
	var ns unix.Stat_t
	if nsName == "" || unix.Stat(filepath.Join("/run/netns", nsName), &ns) != nil {
		return fmt.Errorf("the host's network namespace (%q) is not there", nsName)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "sshd" {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc", p.Name(), "ns", "net"), &st) != nil || st.Dev != ns.Dev || st.Ino != ns.Ino {
			continue
		}
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	return h.StopSSHD(ctx)
}
