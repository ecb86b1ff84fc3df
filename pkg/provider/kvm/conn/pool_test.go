package conn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	testclock "k8s.io/utils/clock/testing"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn/sshtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

func TestDoDialsLazilyAndReusesTheLink(t *testing.T) {
	th := newTestHost(t)
	var d countingDialer
	p := newPool(t, Options{Dial: d.Dial})
	if err := p.Set(th.config("hv1"), th.loader(t)); err != nil {
		t.Fatal(err)
	}
	if d.count() != 0 || th.srv.Accepted() != 0 {
		t.Fatalf("Set dialed: dials=%d accepted=%d", d.count(), th.srv.Accepted())
	}

	mustLibVersion(t, p, "hv1")
	var host string
	err := p.Do(testCtx(t, 5*time.Second), "hv1", func(c virt.Client) error {
		var err error
		host, err = c.ConnectGetHostname()
		return err
	})
	if err != nil || host != sshtest.Hostname {
		t.Fatalf("ConnectGetHostname = %q, %v", host, err)
	}

	// Concurrent calls share the one link.
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := libVersion(testCtx(t, 5*time.Second), p, "hv1"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if d.count() != 1 || th.lv.Opens() != 1 {
		t.Fatalf("dials=%d libvirt opens=%d, want 1 and 1", d.count(), th.lv.Opens())
	}
}

func TestUnknownHostIsPermanentNotConfigured(t *testing.T) {
	p := newPool(t, Options{})
	err := p.Do(context.Background(), "nope", func(virt.Client) error { t.Error("fn called"); return nil })
	if !errors.Is(err, ErrHostNotConfigured) || provider.Class(err) != provider.ClassPermanent {
		t.Fatalf("err = %v (class %s), want permanent ErrHostNotConfigured", err, provider.Class(err))
	}
	if got := err.Error(); got != `host "nope" is not configured` {
		t.Fatalf("message = %q", got)
	}
	if _, ok := DialStage(err); ok {
		t.Fatal("not-configured reported as a dial failure")
	}
}

// stubLibvirt is a fake libvirt client: it takes the forwarded socket but
// speaks no protocol, and reports disconnection when the socket ends.
type stubLibvirt struct {
	virt.Client // nil: only the methods below are implemented
	dialer      socket.Dialer
	connectErr  error
	disc        chan struct{}
}

func (s *stubLibvirt) ConnectToURI(libvirt.ConnectURI) error {
	if s.connectErr != nil {
		return s.connectErr
	}
	c, err := s.dialer.Dial()
	if err != nil {
		return err
	}
	go func() {
		_, _ = io.Copy(io.Discard, c)
		close(s.disc)
	}()
	return nil
}

func (s *stubLibvirt) Disconnected() <-chan struct{}         { return s.disc }
func (s *stubLibvirt) ConnectGetLibVersion() (uint64, error) { return 42, nil }

func TestDialStages(t *testing.T) {
	closedPort := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}
	// silentPort accepts TCP connections and never says a word.
	silentPort := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var conns []net.Conn
		var mu sync.Mutex
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		}()
		t.Cleanup(func() {
			ln.Close()
			<-done
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
		})
		return ln.Addr().String()
	}
	failingLoader := func(err error) func(*testing.T, *testHost) MaterialLoader {
		return func(*testing.T, *testHost) MaterialLoader {
			return func(context.Context) (*Material, error) { return nil, err }
		}
	}

	tests := []struct {
		name   string
		setup  func(t *testing.T, th *testHost, cfg *HostConfig, opts *Options)
		loader func(t *testing.T, th *testHost) MaterialLoader
		stage  string
		class  provider.ErrorClass
		msg    []string
		noTCP  bool
	}{
		{
			name:   "material missing (transient loader error)",
			loader: failingLoader(provider.Transientf("secret kvm/hv1-ssh not found")),
			stage:  StageSSHMaterialMissing, class: provider.ClassTransient,
			msg: []string{"ssh key material not available", "secret kvm/hv1-ssh not found"}, noTCP: true,
		},
		{
			name:   "material missing (unclassed loader error)",
			loader: failingLoader(errors.New("api server unavailable")),
			stage:  StageSSHMaterialMissing, class: provider.ClassTransient,
			msg: []string{"api server unavailable"}, noTCP: true,
		},
		{
			name:   "material missing (NotFound loader error is not an instance NotFound)",
			loader: failingLoader(provider.NotFoundf("secret kvm/hv1-ssh not found")),
			stage:  StageSSHMaterialMissing, class: provider.ClassTransient,
			msg: []string{"secret kvm/hv1-ssh not found"}, noTCP: true,
		},
		{
			name: "material invalid (key does not parse)",
			loader: func(t *testing.T, th *testHost) MaterialLoader {
				return func(context.Context) (*Material, error) {
					return ParseMaterial([]byte("not a key"), th.srv.KnownHosts())
				}
			},
			stage: StageSSHMaterialInvalid, class: provider.ClassPermanent,
			msg: []string{"ssh key material invalid", "ssh-privatekey does not parse"}, noTCP: true,
		},
		{
			name:   "material invalid (loader returned nothing)",
			loader: func(*testing.T, *testHost) MaterialLoader { return static(nil) },
			stage:  StageSSHMaterialInvalid, class: provider.ClassPermanent, noTCP: true,
		},
		{
			name:  "tcp refused",
			setup: func(t *testing.T, _ *testHost, cfg *HostConfig, _ *Options) { cfg.Address = closedPort(t) },
			stage: StageTCPUnreachable, class: provider.ClassTransient,
			msg: []string{"tcp connect to 127.0.0.1:", "connection refused"},
		},
		{
			name: "tcp dialer error",
			setup: func(_ *testing.T, _ *testHost, _ *HostConfig, o *Options) {
				o.Dial = func(context.Context, string, string) (net.Conn, error) {
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.EHOSTUNREACH}
				}
			},
			stage: StageTCPUnreachable, class: provider.ClassTransient, msg: []string{"no route to host"},
		},
		{
			name: "ssh auth rejected",
			setup: func(t *testing.T, th *testHost, _ *HostConfig, _ *Options) {
				other, _ := sshtest.NewKey(t)
				th.srv.SetAuthorizedKeys(other.PublicKey())
			},
			stage: StageSSHHandshakeFailed, class: provider.ClassTransient,
			msg: []string{"ssh handshake with 127.0.0.1:", "unable to authenticate"},
		},
		{
			name: "ssh handshake timeout",
			setup: func(t *testing.T, _ *testHost, cfg *HostConfig, o *Options) {
				cfg.Address = silentPort(t)
				o.HandshakeTimeout = 200 * time.Millisecond
			},
			stage: StageSSHHandshakeFailed, class: provider.ClassTransient, msg: []string{"dial timed out after 200ms"},
		},
		{
			name: "libvirt socket missing",
			setup: func(_ *testing.T, _ *testHost, cfg *HostConfig, _ *Options) {
				cfg.SocketPath = "/nonexistent/libvirt-sock"
			},
			stage: StageLibvirtConnectFailed, class: provider.ClassTransient,
			msg: []string{"libvirt connect over ssh to 127.0.0.1:", "opening /nonexistent/libvirt-sock over ssh"},
		},
		{
			name: "libvirt refuses ConnectOpen",
			setup: func(_ *testing.T, th *testHost, _ *HostConfig, _ *Options) {
				th.lv.Handle(sshtest.ProcConnectOpen, func(context.Context, []byte) ([]byte, error) {
					return nil, libvirt.Error{Code: uint32(libvirt.ErrAuthFailed), Message: "authentication failed: access denied"}
				})
			},
			stage: StageLibvirtConnectFailed, class: provider.ClassTransient, msg: []string{"access denied"},
		},
		{
			name: "libvirt never answers ConnectOpen",
			setup: func(_ *testing.T, th *testHost, _ *HostConfig, o *Options) {
				o.HandshakeTimeout = 200 * time.Millisecond
				th.lv.Handle(sshtest.ProcConnectOpen, func(ctx context.Context, _ []byte) ([]byte, error) {
					<-ctx.Done()
					return nil, ctx.Err()
				})
			},
			stage: StageLibvirtConnectFailed, class: provider.ClassTransient, msg: []string{"dial timed out after 200ms"},
		},
		{
			name: "fake libvirt fails to connect",
			setup: func(_ *testing.T, _ *testHost, _ *HostConfig, o *Options) {
				o.NewLibvirt = func(_ string, d socket.Dialer) Libvirt {
					return &stubLibvirt{dialer: d, connectErr: errors.New("stub: connect refused"), disc: make(chan struct{})}
				}
			},
			stage: StageLibvirtConnectFailed, class: provider.ClassTransient, msg: []string{"stub: connect refused"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := newTestHost(t)
			cfg := th.config("hv1")
			var d countingDialer
			opts := Options{Dial: d.Dial, KeepaliveInterval: -1}
			if tt.setup != nil {
				tt.setup(t, th, &cfg, &opts)
			}
			loader := th.loader(t)
			if tt.loader != nil {
				loader = tt.loader(t, th)
			}
			p := newPool(t, opts)
			if err := p.Set(cfg, loader); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err := libVersion(testCtx(t, 10*time.Second), p, "hv1")
			if elapsed := time.Since(start); elapsed > 5*time.Second {
				t.Errorf("dial took %s", elapsed)
			}
			if stage, ok := DialStage(err); !ok || stage != tt.stage {
				t.Fatalf("DialStage(%v) = %q, %v; want %q", err, stage, ok, tt.stage)
			}
			if c := provider.Class(err); c != tt.class {
				t.Errorf("class = %s, want %s", c, tt.class)
			}
			if errors.Unwrap(err) == nil {
				t.Error("dial error does not unwrap to its cause")
			}
			for _, m := range tt.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not contain %q", err, m)
				}
			}
			if !strings.HasPrefix(err.Error(), `kvm host "hv1": `) {
				t.Errorf("error %q does not name the host", err)
			}
			if tt.noTCP && d.count() != 0 {
				t.Errorf("dialed TCP without material")
			}
		})
	}
}

func TestHostKeyChecking(t *testing.T) {
	tests := []struct {
		name       string
		knownHosts func(t *testing.T, th *testHost) []byte
		msg        string
	}{
		{
			name: "mismatch",
			knownHosts: func(t *testing.T, th *testHost) []byte {
				other, _ := sshtest.NewKey(t)
				return []byte(knownhosts.Line([]string{knownhosts.Normalize(th.srv.Addr())}, other.PublicKey()) + "\n")
			},
			msg: "host key mismatch for [127.0.0.1]:",
		},
		{
			name: "unknown host",
			knownHosts: func(t *testing.T, th *testHost) []byte {
				other, _ := sshtest.NewKey(t)
				return []byte(knownhosts.Line([]string{"hv-other.example"}, other.PublicKey()) + "\n")
			},
			msg: "is not in known_hosts",
		},
		{
			// The right key without the port does not vouch for a non-22 port.
			name: "entry without [host]:port form",
			knownHosts: func(t *testing.T, th *testHost) []byte {
				return []byte(knownhosts.Line([]string{"127.0.0.1"}, th.srv.HostKey()) + "\n")
			},
			msg: "is not in known_hosts",
		},
		{
			name: "revoked",
			knownHosts: func(t *testing.T, th *testHost) []byte {
				return []byte("@revoked * " + string(ssh.MarshalAuthorizedKey(th.srv.HostKey())) +
					knownhosts.Line([]string{knownhosts.Normalize(th.srv.Addr())}, th.srv.HostKey()) + "\n")
			},
			msg: "is revoked",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := newTestHost(t)
			m, err := ParseMaterial(th.keyPEM, tt.knownHosts(t, th))
			if err != nil {
				t.Fatal(err)
			}
			p := newPool(t, Options{KeepaliveInterval: -1})
			if err := p.Set(th.config("hv1"), static(m)); err != nil {
				t.Fatal(err)
			}
			for range 2 { // and no insecure fallback on retry
				_, err = libVersion(testCtx(t, 10*time.Second), p, "hv1")
				if stage, _ := DialStage(err); stage != StageSSHHandshakeFailed {
					t.Fatalf("stage = %q (%v), want %s", stage, err, StageSSHHandshakeFailed)
				}
				if !strings.Contains(err.Error(), tt.msg) {
					t.Fatalf("error %q does not contain %q", err, tt.msg)
				}
			}
			if th.srv.Sessions() != 0 {
				t.Fatalf("server saw %d authenticated sessions, want 0", th.srv.Sessions())
			}
		})
	}
}

func TestHostKeyAlgorithmFollowsKnownHosts(t *testing.T) {
	// x/crypto prefers ECDSA; the host also has Ed25519, the only key in
	// known_hosts. The dial must ask for Ed25519.
	ed, _ := sshtest.NewKey(t)
	ec := ecdsaSigner(t)
	key, keyPEM := sshtest.NewKey(t)
	lv := sshtest.NewLibvirt(t)
	srv := sshtest.NewServer(t, sshtest.Config{AuthorizedKeys: []ssh.PublicKey{key.PublicKey()}, HostKeys: []ssh.Signer{ec, ed}})
	kh := knownhosts.Line([]string{knownhosts.Normalize(srv.Addr())}, ed.PublicKey()) + "\n"
	m, err := ParseMaterial(keyPEM, []byte(kh))
	if err != nil {
		t.Fatal(err)
	}
	p := newPool(t, Options{KeepaliveInterval: -1})
	if err := p.Set(HostConfig{Name: "hv1", Address: srv.Addr(), User: "root", SocketPath: lv.SocketPath()}, static(m)); err != nil {
		t.Fatal(err)
	}
	mustLibVersion(t, p, "hv1")
}

func TestMaterialHealsWithoutRestart(t *testing.T) {
	th := newTestHost(t)
	dir := t.TempDir()
	p := newPool(t, Options{KeepaliveInterval: -1})
	if err := p.Set(th.config("hv1"), FileMaterial(dir)); err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(stage string, class provider.ErrorClass) {
		t.Helper()
		_, err := libVersion(testCtx(t, 10*time.Second), p, "hv1")
		if got, _ := DialStage(err); got != stage || provider.Class(err) != class {
			t.Fatalf("err = %v (stage %q, class %s), want %s/%s", err, got, provider.Class(err), stage, class)
		}
	}

	expect(StageSSHMaterialMissing, provider.ClassTransient) // Secret not there yet
	write(PrivateKeyFile, []byte("-----BEGIN OPENSSH PRIVATE KEY-----\ngarbage\n-----END OPENSSH PRIVATE KEY-----\n"))
	expect(StageSSHMaterialMissing, provider.ClassTransient) // known_hosts still missing
	write(KnownHostsFile, th.srv.KnownHosts())
	expect(StageSSHMaterialInvalid, provider.ClassPermanent) // key garbage
	write(PrivateKeyFile, th.keyPEM)
	mustLibVersion(t, p, "hv1")
}

func TestRotatedKnownHostsRefusesTheOldHostKeyAtNextDial(t *testing.T) {
	th := newTestHost(t)
	dir := t.TempDir()
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(PrivateKeyFile, th.keyPEM)
	write(KnownHostsFile, th.srv.KnownHosts())
	var d countingDialer
	p := newPool(t, Options{Dial: d.Dial, KeepaliveInterval: -1})
	if err := p.Set(th.config("hv1"), FileMaterial(dir)); err != nil {
		t.Fatal(err)
	}
	mustLibVersion(t, p, "hv1")

	// The admin replaces the (compromised) host key in known_hosts; the
	// server still presents the old one. The link drops (as links do): the
	// redial must check against what known_hosts says now.
	replacement, _ := sshtest.NewKey(t)
	write(KnownHostsFile, []byte(knownhosts.Line([]string{knownhosts.Normalize(th.srv.Addr())}, replacement.PublicKey())+"\n"))
	th.srv.DropConns()
	var err error
	testutil.WaitFor(t, func() bool {
		_, err = libVersion(testCtx(t, 5*time.Second), p, "hv1")
		if err == nil && d.count() > 1 {
			t.Fatal("the redial trusted a host key no longer in known_hosts")
		}
		stage, _ := DialStage(err)
		return stage != "" // a redial happened (before it: the dropped link's transport errors)
	})
	if stage, _ := DialStage(err); stage != StageSSHHandshakeFailed || !strings.Contains(err.Error(), "host key mismatch") {
		t.Fatalf("err = %v (stage %q), want %s with a host key mismatch", err, stage, StageSSHHandshakeFailed)
	}
	if n := th.srv.Sessions(); n != 1 {
		t.Fatalf("server saw %d authenticated sessions, want only the first one", n)
	}
}

func TestRotatedClientKeyUsedAtNextDial(t *testing.T) {
	th := newTestHost(t)
	key2, key2PEM := sshtest.NewKey(t)
	var loads atomic.Int32
	var current atomic.Pointer[[]byte]
	current.Store(&th.keyPEM)
	loader := func(context.Context) (*Material, error) {
		loads.Add(1)
		return ParseMaterial(*current.Load(), th.srv.KnownHosts())
	}
	var d countingDialer
	p := newPool(t, Options{Dial: d.Dial, KeepaliveInterval: -1})
	if err := p.Set(th.config("hv1"), loader); err != nil {
		t.Fatal(err)
	}
	mustLibVersion(t, p, "hv1")
	mustLibVersion(t, p, "hv1")
	if n := loads.Load(); n != 1 {
		t.Fatalf("loads = %d with one link, want 1 (material is read per dial, not per call)", n)
	}

	// The key is rotated: the server only accepts key2 and the Secret has
	// it. The redial uses key2 at once, with no failed handshake first.
	th.srv.SetAuthorizedKeys(key2.PublicKey())
	current.Store(&key2PEM)
	th.srv.DropConns()
	testutil.WaitFor(t, func() bool {
		_, err := libVersion(testCtx(t, 5*time.Second), p, "hv1")
		if stage, _ := DialStage(err); stage != "" {
			t.Fatalf("redial failed with the rotated key: %v", err)
		}
		return err == nil && d.count() == 2
	})
	if n := loads.Load(); n != 2 {
		t.Fatalf("loads = %d after one redial, want 2", n)
	}
}

func TestRedialAfterDrop(t *testing.T) {
	tests := []struct {
		name string
		drop func(th *testHost)
	}{
		{"sshd drops the connection", func(th *testHost) { th.srv.DropConns() }},
		{"libvirtd restarts", func(th *testHost) { th.lv.DropConns() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := newTestHost(t)
			var d countingDialer
			var ev connectEvents
			versions := make(chan uint64, 4)
			p := newPool(t, Options{Dial: d.Dial, KeepaliveInterval: -1,
				OnConnect: func(host string, c virt.Client, disc <-chan struct{}) {
					// What the provider does: (re)subscribe on every link.
					v, _ := c.ConnectGetLibVersion()
					versions <- v
					ev.hook(host, c, disc)
				}})
			if err := p.Set(th.config("hv1"), th.loader(t)); err != nil {
				t.Fatal(err)
			}
			mustLibVersion(t, p, "hv1")
			disc := ev.last(t)

			tt.drop(th)
			waitClosed(t, disc, 5*time.Second, "disconnected channel")
			mustLibVersion(t, p, "hv1")
			if d.count() != 2 {
				t.Fatalf("dials = %d, want 2", d.count())
			}
			for range 2 {
				if v := <-versions; v != sshtest.LibVersion {
					t.Fatalf("OnConnect client got version %d", v)
				}
			}
		})
	}
}

func TestKeepalive(t *testing.T) {
	th := newTestHost(t)
	var d countingDialer
	var ev connectEvents
	const interval, maxMissed = 20 * time.Millisecond, 3
	p := newPool(t, Options{Dial: d.Dial, OnConnect: ev.hook, KeepaliveInterval: interval, KeepaliveMaxMissed: maxMissed})
	if err := p.Set(th.config("hv1"), th.loader(t)); err != nil {
		t.Fatal(err)
	}
	mustLibVersion(t, p, "hv1")
	disc := ev.last(t)

	// Answered keepalives keep an idle link.
	time.Sleep(10 * interval)
	select {
	case <-disc:
		t.Fatal("healthy link dropped")
	default:
	}

	// The host goes silent (blackhole): the link is closed after maxMissed
	// unanswered intervals, without any call noticing.
	start := time.Now()
	th.srv.Stall()
	waitClosed(t, disc, 2*time.Second, "link of a stalled host")
	t.Logf("stalled link dropped after %s", time.Since(start))
	if d.count() != 1 {
		t.Fatalf("dials = %d", d.count())
	}
	mustLibVersion(t, p, "hv1") // redials
	if d.count() != 2 {
		t.Fatalf("dials = %d, want 2", d.count())
	}
}

func TestAbandonedCallKeepsTheLink(t *testing.T) {
	th := newTestHost(t)
	entered := make(chan struct{}, 2)
	th.lv.Handle(sshtest.ProcConnectListAllDomains, func(ctx context.Context, _ []byte) ([]byte, error) {
		entered <- struct{}{}
		<-ctx.Done() // hangs until the connection ends
		return nil, ctx.Err()
	})
	var d countingDialer
	var ev connectEvents
	p := newPool(t, Options{Dial: d.Dial, OnConnect: ev.hook, KeepaliveInterval: -1})
	if err := p.Set(th.config("hv1"), th.loader(t)); err != nil {
		t.Fatal(err)
	}
	mustLibVersion(t, p, "hv1")
	disc := ev.last(t)

	// A call abandoned at its deadline (what virt.Instrument does) returns
	// promptly and leaves the link alone.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.Do(ctx, "hv1", func(c virt.Client) error {
		res := make(chan error, 1)
		go func() {
			_, _, err := c.ConnectListAllDomains(1, 0)
			res <- err
		}()
		select {
		case err := <-res:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Fatalf("abandoned call took %s", elapsed)
	}

	// An already-cancelled caller returns at once, without dialing.
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if err := p.Do(cctx, "hv1", func(virt.Client) error { t.Error("fn called"); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want Canceled", err)
	}

	// The hung call is still outstanding on the link; others multiplex
	// alongside it on the same link.
	mustLibVersion(t, p, "hv1")
	select {
	case <-disc:
		t.Fatal("link dropped")
	default:
	}
	if d.count() != 1 {
		t.Fatalf("dials = %d, want 1", d.count())
	}

	// So does an RPC abandoned at its own deadline (virt.Instrument's
	// per-RPC deadlines), whatever the caller's budget: a transient
	// DeadlineError, the link kept.
	<-entered // the first hung call
	clk := testclock.NewFakeClock(time.Now())
	res := make(chan error, 1)
	go func() {
		res <- p.Do(context.Background(), "hv1", func(c virt.Client) error {
			lv := virt.Instrument(context.Background(), c, virt.WithHost("hv1"), virt.WithDeadlines(virt.Deadlines{Clock: clk}))
			_, _, err := lv.ConnectListAllDomains(1, 0)
			return err
		})
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the RPC never reached the daemon")
	}
	clk.Step(virt.DefaultQueryDeadline)
	select {
	case err = <-res:
	case <-time.After(10 * time.Second):
		t.Fatal("the RPC was not abandoned at its deadline")
	}
	var de *virt.DeadlineError
	if !errors.As(err, &de) || de.RPC != virt.RPCConnectListAllDomains || provider.Class(err) != provider.ClassTransient {
		t.Fatalf("err = %v, want a transient DeadlineError", err)
	}
	mustLibVersion(t, p, "hv1")
	select {
	case <-disc:
		t.Fatal("link dropped after a deadline")
	default:
	}
	if d.count() != 1 {
		t.Fatalf("dials = %d after a deadline, want 1", d.count())
	}
}

func TestUploadDoesNotBlockHealthChecks(t *testing.T) {
	th := newTestHost(t)
	var d countingDialer
	// Keepalives tick during the upload; 50ms (a 150ms budget) was too
	// tight for -race on a loaded machine, where a reply queued behind
	// upload data dropped the link and the test hung on a blocked write.
	p := newPool(t, Options{Dial: d.Dial, KeepaliveInterval: 250 * time.Millisecond})
	if err := p.Set(th.config("hv1"), th.loader(t)); err != nil {
		t.Fatal(err)
	}

	const chunk, chunks = 1 << 20, 8
	body, feed := io.Pipe()
	uploaded := make(chan error, 1)
	go func() {
		err := p.Do(testCtx(t, time.Minute), "hv1", func(c virt.Client) error {
			vol := libvirt.StorageVol{Pool: "default", Name: "image.qcow2", Key: "/var/lib/libvirt/images/image.qcow2"}
			return c.StorageVolUpload(vol, body, 0, 0, 0)
		})
		// An upload that ends early stops reading: unblock the writes below,
		// or the test hangs instead of failing.
		body.CloseWithError(fmt.Errorf("upload ended: %w", err))
		uploaded <- err
	}()
	buf := bytes.Repeat([]byte{0xa5}, chunk)
	if _, err := feed.Write(buf); err != nil {
		t.Fatalf("feeding the upload: %v", err)
	}
	testutil.WaitFor(t, func() bool { return th.lv.Uploaded() > 0 })

	// Mid-upload, health checks get through on the same link at once.
	for range 3 {
		start := time.Now()
		if _, err := libVersion(testCtx(t, time.Second), p, "hv1"); err != nil {
			t.Fatalf("health check during upload: %v", err)
		}
		if elapsed := time.Since(start); elapsed > 500*time.Millisecond {
			t.Fatalf("health check took %s during upload", elapsed)
		}
	}
	for range chunks - 1 {
		if _, err := feed.Write(buf); err != nil {
			t.Fatalf("feeding the upload: %v", err)
		}
	}
	feed.Close()
	if err := <-uploaded; err != nil {
		t.Fatalf("upload: %v", err)
	}
	if got := th.lv.Uploaded(); got != chunk*chunks {
		t.Fatalf("uploaded %d bytes, want %d", got, chunk*chunks)
	}
	if d.count() != 1 {
		t.Fatalf("dials = %d, want 1", d.count())
	}
}

func TestSlowDialDoesNotDelayOtherCallers(t *testing.T) {
	th := newTestHost(t)
	var once sync.Once
	dialing := make(chan struct{})
	blackhole := func(ctx context.Context, _, _ string) (net.Conn, error) {
		once.Do(func() { close(dialing) })
		<-ctx.Done() // SYNs into the void
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
	}
	p := newPool(t, Options{Dial: blackhole, HandshakeTimeout: time.Minute})
	if err := p.Set(th.config("hv1"), th.loader(t)); err != nil {
		t.Fatal(err)
	}

	reconcile := make(chan error, 1)
	go func() {
		_, err := libVersion(testCtx(t, time.Minute), p, "hv1")
		reconcile <- err
	}()
	<-dialing

	// A health check waits for the reconcile's dial only as long as its own
	// timeout allows.
	start := time.Now()
	_, err := libVersion(testCtx(t, 100*time.Millisecond), p, "hv1")
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("health check err = %v, want DeadlineExceeded", err)
	}
	if _, ok := DialStage(err); ok {
		t.Fatalf("health check reported the other caller's dial: %v", err)
	}
	if elapsed > time.Second {
		t.Fatalf("health check took %s", elapsed)
	}

	// Removing the host aborts the stuck dial.
	p.Remove("hv1")
	select {
	case err := <-reconcile:
		if !errors.Is(err, ErrHostNotConfigured) {
			t.Fatalf("reconcile err = %v, want ErrHostNotConfigured", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Remove did not abort the dial")
	}
}

func TestDialBoundedByCallerContext(t *testing.T) {
	th := newTestHost(t)
	blackhole := func(ctx context.Context, _, _ string) (net.Conn, error) {
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
	}
	p := newPool(t, Options{Dial: blackhole})
	if err := p.Set(th.config("hv1"), th.loader(t)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := libVersion(testCtx(t, 100*time.Millisecond), p, "hv1")
	if stage, _ := DialStage(err); stage != StageTCPUnreachable || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want TCPUnreachable caused by the deadline", err)
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Fatalf("took %s", elapsed)
	}
}

func TestTransportErrorsDropTheLink(t *testing.T) {
	tests := []struct {
		err  error
		drop bool
	}{
		{io.EOF, true},
		{fmt.Errorf("reading reply: %w", io.ErrUnexpectedEOF), true},
		{libvirt.ErrInterrupted, true},
		{syscall.EINVAL, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{net.ErrClosed, true},
		{io.ErrClosedPipe, true},
		{nil, false},
		{virt.NewError(libvirt.ErrNoDomain, "Domain not found"), false},
		{&libvirt.Error{Code: uint32(libvirt.ErrOperationInvalid), Message: "domain is not running"}, false},
		{libvirt.ErrUnsupported, false},
		{provider.Transient(io.EOF), false},
		{provider.NotFoundf("gone"), false},
		{&provider.IdentityError{Kind: "domain", Name: "x", Mismatch: "uuid"}, false},
		{context.Canceled, false},
		{fmt.Errorf("DomainCreate: %w", context.DeadlineExceeded), false},
		{errors.New("xml: syntax error"), false},
	}
	for _, tt := range tests {
		if got := isTransportError(tt.err); got != tt.drop {
			t.Errorf("isTransportError(%#v) = %v, want %v", tt.err, got, tt.drop)
		}
	}

	// And through Do.
	th := newTestHost(t)
	var d countingDialer
	var ev connectEvents
	p := newPool(t, Options{Dial: d.Dial, OnConnect: ev.hook, KeepaliveInterval: -1})
	if err := p.Set(th.config("hv1"), th.loader(t)); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 10*time.Second)
	noDomain := virt.NewError(libvirt.ErrNoDomain, "Domain not found")
	if err := p.Do(ctx, "hv1", func(virt.Client) error { return noDomain }); err != noDomain { //nolint:errorlint // identity: Do hands back fn's error itself, not a wrap of it
		t.Fatalf("Do changed fn's error: %v", err)
	}
	disc := ev.last(t)
	if err := p.Do(ctx, "hv1", func(virt.Client) error { return io.EOF }); err != io.EOF { //nolint:errorlint // identity, as above
		t.Fatalf("Do changed fn's error: %v", err)
	}
	waitClosed(t, disc, time.Second, "link after a transport error")
	mustLibVersion(t, p, "hv1")
	if d.count() != 2 {
		t.Fatalf("dials = %d, want 2 (libvirt error kept the link, EOF dropped it)", d.count())
	}
}

func TestFakeLibvirt(t *testing.T) {
	th := newTestHost(t)
	var made atomic.Int32
	p := newPool(t, Options{KeepaliveInterval: -1, NewLibvirt: func(_ string, d socket.Dialer) Libvirt {
		made.Add(1)
		return &stubLibvirt{dialer: d, disc: make(chan struct{})}
	}})
	if err := p.Set(th.config("hv1"), th.loader(t)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		v, err := libVersion(testCtx(t, 5*time.Second), p, "hv1")
		if err != nil || v != 42 {
			t.Fatalf("got %d, %v from the fake", v, err)
		}
	}
	if made.Load() != 1 {
		t.Fatalf("NewLibvirt called %d times, want 1", made.Load())
	}
}

func TestSetAndRemove(t *testing.T) {
	th := newTestHost(t)
	var d countingDialer
	var ev connectEvents
	p := newPool(t, Options{Dial: d.Dial, OnConnect: ev.hook, KeepaliveInterval: -1})
	cfg := th.config("hv1")
	if err := p.Set(cfg, th.loader(t)); err != nil {
		t.Fatal(err)
	}
	mustLibVersion(t, p, "hv1")
	disc1 := ev.last(t)

	// Every reconcile calls Set with the same config: the link stays.
	if err := p.Set(cfg, th.loader(t)); err != nil {
		t.Fatal(err)
	}
	mustLibVersion(t, p, "hv1")
	if d.count() != 1 {
		t.Fatalf("unchanged Set redialed: dials = %d", d.count())
	}

	// New credentials: the old link goes, the next call dials with them.
	cfg.MaterialRevision = "kvm/hv1-ssh@42"
	if err := p.Set(cfg, th.loader(t)); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, disc1, time.Second, "link after a config change")
	mustLibVersion(t, p, "hv1")
	if d.count() != 2 {
		t.Fatalf("dials = %d, want 2", d.count())
	}
	disc2 := ev.last(t)

	if err := p.Set(th.config("hv0"), th.loader(t)); err != nil {
		t.Fatal(err)
	}
	if got := p.Hosts(); !slices.Equal(got, []string{"hv0", "hv1"}) {
		t.Fatalf("Hosts = %v", got)
	}
	p.Remove("hv1")
	waitClosed(t, disc2, time.Second, "link of a removed host")
	if _, err := libVersion(context.Background(), p, "hv1"); !errors.Is(err, ErrHostNotConfigured) {
		t.Fatalf("err = %v, want ErrHostNotConfigured", err)
	}
	if got := p.Hosts(); !slices.Equal(got, []string{"hv0"}) {
		t.Fatalf("Hosts = %v", got)
	}
	p.Remove("never-there")
}

func TestSetValidates(t *testing.T) {
	p := newPool(t, Options{})
	loader := static(&Material{})
	tests := []struct {
		name   string
		cfg    HostConfig
		loader MaterialLoader
	}{
		{"no name", HostConfig{Address: "hv", User: "root"}, loader},
		{"no user", HostConfig{Name: "hv1", Address: "hv"}, loader},
		{"no address", HostConfig{Name: "hv1", User: "root"}, loader},
		{"bad port", HostConfig{Name: "hv1", Address: "hv:ssh", User: "root"}, loader},
		{"no loader", HostConfig{Name: "hv1", Address: "hv", User: "root"}, nil},
	}
	for _, tt := range tests {
		if err := p.Set(tt.cfg, tt.loader); provider.Class(err) != provider.ClassPermanent {
			t.Errorf("%s: err = %v, want permanent", tt.name, err)
		}
	}
	if len(p.Hosts()) != 0 {
		t.Fatalf("invalid configs added: %v", p.Hosts())
	}
}

func TestNormalizeAddress(t *testing.T) {
	tests := []struct{ in, want string }{
		{"hv1", "hv1:22"},
		{"hv1.lan:2222", "hv1.lan:2222"},
		{"10.0.0.5", "10.0.0.5:22"},
		{" 10.0.0.5:22 ", "10.0.0.5:22"},
		{"fe80::1", "[fe80::1]:22"},
		{"[fe80::1]", "[fe80::1]:22"},
		{"[fe80::1]:2222", "[fe80::1]:2222"},
		{"", ""},
		{":22", ""},
		{"hv1:0", ""},
		{"hv1:70000", ""},
		{"[fe80::1", ""},
	}
	for _, tt := range tests {
		got, err := normalizeAddress(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("normalizeAddress(%q) = %q, want error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("normalizeAddress(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()

	th := newTestHost(t)
	hookReturned := make(chan struct{})
	p := New(Options{
		KeepaliveInterval: 10 * time.Millisecond,
		OnConnect: func(_ string, _ virt.Client, disc <-chan struct{}) {
			<-disc // e.g. an event loop
			close(hookReturned)
		},
	})
	if err := p.Set(th.config("hv1"), th.loader(t)); err != nil {
		t.Fatal(err)
	}
	mustLibVersion(t, p, "hv1")
	time.Sleep(50 * time.Millisecond) // let keepalives run
	p.Close()
	select {
	case <-hookReturned:
	default:
		t.Fatal("Close returned before OnConnect did")
	}
	if _, err := libVersion(context.Background(), p, "hv1"); err == nil {
		t.Fatal("Do after Close succeeded")
	}
	if err := p.Set(th.config("hv1"), th.loader(t)); err == nil {
		t.Fatal("Set after Close succeeded")
	}
	p.Close() // idempotent
	th.srv.Close()
	th.lv.Close()

	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			var b bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkUpload measures StorageVolUpload throughput through the SSH
// forward (in-process sshd and libvirt on loopback).
func BenchmarkUpload(b *testing.B) {
	key, keyPEM := sshtest.NewKey(b)
	lv := sshtest.NewLibvirt(b)
	srv := sshtest.NewServer(b, sshtest.Config{AuthorizedKeys: []ssh.PublicKey{key.PublicKey()}})
	m, err := ParseMaterial(keyPEM, srv.KnownHosts())
	if err != nil {
		b.Fatal(err)
	}
	p := New(Options{})
	b.Cleanup(p.Close)
	if err := p.Set(HostConfig{Name: "hv1", Address: srv.Addr(), User: "root", SocketPath: lv.SocketPath()}, static(m)); err != nil {
		b.Fatal(err)
	}
	const size = 32 << 20
	data := bytes.Repeat([]byte{0x5a}, size)
	vol := libvirt.StorageVol{Pool: "default", Name: "image.qcow2", Key: "image.qcow2"}
	b.SetBytes(size)
	for b.Loop() {
		err := p.Do(context.Background(), "hv1", func(c virt.Client) error {
			return c.StorageVolUpload(vol, bytes.NewReader(data), 0, size, 0)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
