// Package sshtest runs, in process, what a KVM host offers the operator: an
// SSH server that authenticates by public key and forwards
// direct-streamlocal@openssh.com channels to unix sockets (Server), and a
// minimal libvirt daemon to serve behind it (Libvirt). It is for tests and
// benchmarks of the conn package and its users.
package sshtest

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// NewKey returns a fresh Ed25519 key as a signer and as the unencrypted
// OpenSSH PEM an ssh-privatekey Secret entry holds.
func NewKey(tb testing.TB) (ssh.Signer, []byte) {
	tb.Helper()
	signer, pemBytes, err := GenerateKey()
	if err != nil {
		tb.Fatal(err)
	}
	return signer, pemBytes
}

// GenerateKey is NewKey for callers without a testing.TB (test/fakehv).
func GenerateKey() (ssh.Signer, []byte, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "sshtest")
	if err != nil {
		return nil, nil, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, nil, err
	}
	return signer, pem.EncodeToMemory(block), nil
}

// Config configures a Server.
type Config struct {
	// AuthorizedKeys may log in, as any user.
	AuthorizedKeys []ssh.PublicKey
	// HostKeys the server presents; one fresh Ed25519 key when empty.
	HostKeys []ssh.Signer
	// Forward opens the target of a direct-streamlocal channel; it dials
	// the unix socket at path when nil.
	Forward func(path string) (net.Conn, error)
}

// Server is an SSH server on 127.0.0.1. Its methods are safe for
// concurrent use.
type Server struct {
	ln       net.Listener
	hostKeys []ssh.Signer
	forward  func(path string) (net.Conn, error)
	cfg      *ssh.ServerConfig

	authorized atomic.Pointer[[]ssh.PublicKey]
	accepted   atomic.Int64
	sessions   atomic.Int64

	mu     sync.Mutex
	conns  map[*serverConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer starts a server; tb's cleanup closes it.
func NewServer(tb testing.TB, c Config) *Server {
	tb.Helper()
	s, err := Start(c)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Start is NewServer for callers without a testing.TB (test/fakehv); the
// caller closes the server.
func Start(c Config) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, hostKeys: c.HostKeys, forward: c.Forward, conns: map[*serverConn]struct{}{}}
	if len(s.hostKeys) == 0 {
		signer, _, err := GenerateKey()
		if err != nil {
			_ = ln.Close()
			return nil, err
		}
		s.hostKeys = []ssh.Signer{signer}
	}
	if s.forward == nil {
		s.forward = func(path string) (net.Conn, error) { return net.Dial("unix", path) }
	}
	s.SetAuthorizedKeys(c.AuthorizedKeys...)
	s.cfg = &ssh.ServerConfig{PublicKeyCallback: s.checkKey}
	for _, k := range s.hostKeys {
		s.cfg.AddHostKey(k)
	}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// HostKey is the first host key.
func (s *Server) HostKey() ssh.PublicKey { return s.hostKeys[0].PublicKey() }

// KnownHosts returns known_hosts lines for Addr, one per host key, in the
// [host]:port form OpenSSH uses for a non-22 port.
func (s *Server) KnownHosts() []byte {
	var b bytes.Buffer
	for _, k := range s.hostKeys {
		b.WriteString(knownhosts.Line([]string{knownhosts.Normalize(s.Addr())}, k.PublicKey()))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// SetAuthorizedKeys replaces the keys that may log in.
func (s *Server) SetAuthorizedKeys(keys ...ssh.PublicKey) {
	s.authorized.Store(&keys)
}

// Accepted counts TCP connections accepted so far.
func (s *Server) Accepted() int { return int(s.accepted.Load()) }

// Sessions counts SSH handshakes that succeeded (authenticated) so far.
func (s *Server) Sessions() int { return int(s.sessions.Load()) }

// DropConns closes every open connection, like an sshd restart.
func (s *Server) DropConns() {
	for _, c := range s.snapshot() {
		_ = c.Close()
	}
}

// Stall blackholes every open connection: the server stops reading it, so
// keepalives and RPCs go unanswered, as with a host that lost power. New
// connections are served normally.
func (s *Server) Stall() {
	for _, c := range s.snapshot() {
		c.stalled.Store(true)
	}
}

// Close stops the server, closes its connections and waits for its
// goroutines.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	_ = s.ln.Close()
	s.DropConns()
	s.wg.Wait()
}

func (s *Server) snapshot() []*serverConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	return cs
}

func (s *Server) checkKey(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	for _, k := range *s.authorized.Load() {
		if bytes.Equal(k.Marshal(), key.Marshal()) {
			return nil, nil
		}
	}
	return nil, fmt.Errorf("sshtest: key %s not authorized for %q", ssh.FingerprintSHA256(key), meta.User())
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.accepted.Add(1)
		c := &serverConn{Conn: nc, closed: make(chan struct{})}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

func (s *Server) serve(c *serverConn) {
	defer s.wg.Done()
	defer func() {
		_ = c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	sc, chans, reqs, err := ssh.NewServerConn(c, s.cfg)
	if err != nil {
		return
	}
	s.sessions.Add(1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// Global requests are keepalives; reply as OpenSSH does to
		// keepalive@openssh.com: "failure", which still proves liveness.
		for r := range reqs {
			if r.WantReply {
				_ = r.Reply(false, nil)
			}
		}
	}()
	for nc := range chans {
		s.handleChannel(nc)
	}
	_ = sc.Close()
}

// streamLocalMsg is the payload of a direct-streamlocal@openssh.com open
// (OpenSSH PROTOCOL, section 2.4).
type streamLocalMsg struct {
	SocketPath string
	Reserved0  string
	Reserved1  uint32
}

func (s *Server) handleChannel(nc ssh.NewChannel) {
	if nc.ChannelType() != "direct-streamlocal@openssh.com" {
		_ = nc.Reject(ssh.UnknownChannelType, "sshtest: only direct-streamlocal@openssh.com is served")
		return
	}
	var msg streamLocalMsg
	if err := ssh.Unmarshal(nc.ExtraData(), &msg); err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, "sshtest: bad direct-streamlocal request")
		return
	}
	target, err := s.forward(msg.SocketPath)
	if err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	ch, creqs, err := nc.Accept()
	if err != nil {
		_ = target.Close()
		return
	}
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		ssh.DiscardRequests(creqs)
	}()
	// Either side ending ends both, as sshd does.
	go func() {
		defer s.wg.Done()
		_, _ = io.Copy(target, ch)
		_ = target.Close()
		_ = ch.Close()
	}()
	go func() {
		defer s.wg.Done()
		_, _ = io.Copy(ch, target)
		_ = ch.Close()
		_ = target.Close()
	}()
}

// serverConn lets Stall blackhole a connection.
type serverConn struct {
	net.Conn
	stalled   atomic.Bool
	closeOnce sync.Once
	closed    chan struct{}
}

func (c *serverConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.stalled.Load() {
		<-c.closed // swallow what arrived and never answer
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *serverConn) Close() error {
	err := net.ErrClosed
	c.closeOnce.Do(func() {
		close(c.closed)
		err = c.Conn.Close()
	})
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
