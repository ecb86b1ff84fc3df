package conn

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"golang.org/x/crypto/ssh"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn/sshtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// testHost is an in-process KVM host: SSH server + libvirt behind it.
type testHost struct {
	srv    *sshtest.Server
	lv     *sshtest.Libvirt
	key    ssh.Signer
	keyPEM []byte
}

func newTestHost(t *testing.T) *testHost {
	t.Helper()
	key, keyPEM := sshtest.NewKey(t)
	lv := sshtest.NewLibvirt(t)
	srv := sshtest.NewServer(t, sshtest.Config{AuthorizedKeys: []ssh.PublicKey{key.PublicKey()}})
	return &testHost{srv: srv, lv: lv, key: key, keyPEM: keyPEM}
}

func (th *testHost) config(name string) HostConfig {
	return HostConfig{Name: name, Address: th.srv.Addr(), User: "root", SocketPath: th.lv.SocketPath()}
}

func (th *testHost) material(t *testing.T) *Material {
	t.Helper()
	m, err := ParseMaterial(th.keyPEM, th.srv.KnownHosts())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (th *testHost) loader(t *testing.T) MaterialLoader { return static(th.material(t)) }

func static(m *Material) MaterialLoader {
	return func(context.Context) (*Material, error) { return m, nil }
}

// countingDialer is the injectable TCP dialer, counting dials.
type countingDialer struct {
	n atomic.Int32
	d net.Dialer
}

func (c *countingDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c.n.Add(1)
	return c.d.DialContext(ctx, network, addr)
}

func (c *countingDialer) count() int { return int(c.n.Load()) }

// connectEvents records OnConnect calls.
type connectEvents struct {
	mu    sync.Mutex
	discs []<-chan struct{}
}

func (e *connectEvents) hook(_ string, _ virt.Client, disconnected <-chan struct{}) {
	e.mu.Lock()
	e.discs = append(e.discs, disconnected)
	e.mu.Unlock()
}

func (e *connectEvents) last(t *testing.T) <-chan struct{} {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		e.mu.Lock()
		n := len(e.discs)
		e.mu.Unlock()
		if n > 0 {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.discs[n-1]
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("OnConnect was not called")
	return nil
}

func newPool(t *testing.T, opts Options) *Pool {
	t.Helper()
	if opts.Logger.GetSink() == nil {
		opts.Logger = testLogger(t)
	}
	p := New(opts)
	t.Cleanup(p.Close)
	return p
}

// testLogger logs through t at V(1); it also fails the test if a log line
// contains key material.
func testLogger(t *testing.T) logr.Logger {
	return funcr.New(func(prefix, args string) {
		if strings.Contains(args, "PRIVATE KEY") {
			t.Errorf("key material logged: %s", args)
		}
		t.Log(prefix, args)
	}, funcr.Options{Verbosity: 1})
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(logr.NewContext(context.Background(), testLogger(t)), d)
	t.Cleanup(cancel)
	return ctx
}

func libVersion(ctx context.Context, p *Pool, host string) (uint64, error) {
	var v uint64
	err := p.Do(ctx, host, func(c virt.Client) error {
		var err error
		v, err = c.ConnectGetLibVersion()
		return err
	})
	return v, err
}

func mustLibVersion(t *testing.T, p *Pool, host string) {
	t.Helper()
	v, err := libVersion(testCtx(t, 10*time.Second), p, host)
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if v != sshtest.LibVersion {
		t.Fatalf("ConnectGetLibVersion = %d, want %d", v, sshtest.LibVersion)
	}
}

func waitClosed(t *testing.T, c <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(within):
		t.Fatalf("%s: not closed within %s", what, within)
	}
}

func ecdsaSigner(t *testing.T) ssh.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
