package sshtest

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/remote"
)

// Procedure numbers served by Libvirt, for Handle.
const (
	ProcConnectOpen           = remote.ProcConnectOpen
	ProcConnectClose          = remote.ProcConnectClose
	ProcConnectGetHostname    = remote.ProcConnectGetHostname
	ProcAuthList              = remote.ProcAuthList
	ProcConnectGetLibVersion  = remote.ProcConnectGetLibVersion
	ProcStorageVolUpload      = remote.ProcStorageVolUpload
	ProcConnectListAllDomains = remote.ProcConnectListAllDomains
)

// What Libvirt reports about itself.
const (
	LibVersion = 10_000_000 // 10.0.0
	Hostname   = "sshtest-hypervisor"
)

// Handler answers one call: args is the XDR-encoded argument, the reply the
// XDR-encoded result. An error is sent as a libvirt error (a libvirt.Error
// keeps its code). ctx ends when the client's connection closes, so a
// handler may block to simulate a hung call.
type Handler func(ctx context.Context, args []byte) (reply []byte, err error)

// Libvirt is a minimal libvirt daemon on a unix socket. It answers what
// go-libvirt needs to connect (AuthList, ConnectOpen, ConnectClose), what a
// health check asks (ConnectGetLibVersion, ConnectGetHostname), and accepts
// StorageVolUpload streams, counting and discarding the bytes (for
// throughput benchmarks). Other procedures fail as unknown to libvirtd
// unless a Handler is registered. Calls are served concurrently
// (remote.Server, without a per-connection bound).
type Libvirt struct {
	srv  *remote.Server
	dir  string
	path string

	handlers sync.Map // uint32 → Handler
	opens    atomic.Int64
	uploaded atomic.Int64
}

// NewLibvirt listens on a fresh unix socket; tb's cleanup closes it.
func NewLibvirt(tb testing.TB) *Libvirt {
	tb.Helper()
	// Not tb.TempDir(): unix socket paths are limited to ~100 bytes.
	dir, err := os.MkdirTemp("", "lv")
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, "libvirt-sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		_ = os.RemoveAll(dir)
		tb.Fatal(err)
	}
	l := &Libvirt{dir: dir, path: path}
	l.srv = remote.NewServer(l, remote.Options{})
	l.srv.Serve(ln)
	tb.Cleanup(l.Close)
	return l
}

// SocketPath is the unix socket to forward to.
func (l *Libvirt) SocketPath() string { return l.path }

// Handle makes h answer proc, replacing the built-in answer if any.
func (l *Libvirt) Handle(proc uint32, h Handler) { l.handlers.Store(proc, h) }

// Opens counts ConnectOpen calls, i.e. libvirt connections made.
func (l *Libvirt) Opens() int { return int(l.opens.Load()) }

// Uploaded counts StorageVolUpload bytes received.
func (l *Libvirt) Uploaded() int64 { return l.uploaded.Load() }

// DropConns closes every client connection, like a libvirtd restart.
func (l *Libvirt) DropConns() { l.srv.DropConns() }

// Close stops serving and waits for its goroutines; blocked handlers see
// their context end.
func (l *Libvirt) Close() {
	l.srv.Close()
	_ = os.RemoveAll(l.dir)
}

// Open implements remote.Handler: every connection is served by l itself.
func (l *Libvirt) Open(context.Context, remote.Client) remote.Session { return l }

// Call implements remote.Session.
func (l *Libvirt) Call(ctx context.Context, proc uint32, args []byte) ([]byte, error) {
	if h, ok := l.handlers.Load(proc); ok {
		return h.(Handler)(ctx, args)
	}
	if proc == ProcConnectOpen {
		l.opens.Add(1)
	}
	if out, ok := remote.Handshake(proc); ok {
		return out, nil
	}
	switch proc {
	case ProcConnectGetLibVersion:
		return binary.BigEndian.AppendUint64(nil, LibVersion), nil
	case ProcConnectGetHostname:
		return remote.Marshal(Hostname)
	}
	return nil, remote.UnknownProcedure(proc)
}

// Upload implements remote.Uploader: it takes any upload and discards it.
func (l *Libvirt) Upload(_ context.Context, _ []byte, accept func(), data io.Reader) error {
	accept()
	_, err := io.Copy(uploadCounter{&l.uploaded}, data)
	return err
}

// uploadCounter counts bytes as they arrive, so a test sees an upload
// under way.
type uploadCounter struct{ n *atomic.Int64 }

func (c uploadCounter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}
