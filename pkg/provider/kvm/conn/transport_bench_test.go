package conn_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"golang.org/x/crypto/ssh"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn/sshtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/image"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// BenchmarkUploadVsRawSSH puts the image upload path next to the raw SSH
// link it runs over, in one run, on loopback, everything in this process:
//
//	libvirt-upload   conn.Pool → sshtest.Server (direct-streamlocal) →
//	                 sshtest.Libvirt: StorageVolUpload through go-libvirt
//	                 in stream messages of image.StreamChunk, as
//	                 image.Cache sends them to a real host.
//	libvirt-upload-4M  the same with go-libvirt's largest messages (4 MiB,
//	                 what the cache sent before; one Read of the in-memory
//	                 body fills go-libvirt's buffer). sshtest.Libvirt is
//	                 not libvirtd: this shows only what the message size
//	                 costs the client and the SSH link, not what libvirtd
//	                 makes of it (see docs/performance.md §1).
//	ssh-cat          a session channel running "cat >/dev/null" on a tiny
//	                 x/crypto/ssh server defined below (sshtest has no
//	                 sessions): the `ssh host 'cat >/dev/null'` baseline.
//	ssh-fwd-discard  the same sshtest.Server, a direct-streamlocal channel to
//	                 a unix socket that discards: the forwarded socket
//	                 without libvirt's framing.
//	unix-libvirt     go-libvirt straight on sshtest.Libvirt's unix socket, no
//	                 SSH: what the libvirt stream protocol costs by itself.
//
// Every iteration moves benchUploadSize bytes through each path (the order
// rotates per iteration); each transfer is timed to the point where the
// receiver has every byte (libvirt's end-of-stream confirmation, the
// session's exit-status, the discard socket's ack). Both SSH servers and
// all clients are x/crypto/ssh with default configs (cipher preference
// aes128-gcm@openssh.com first), and every server reads its channel 32 KiB
// at a time, so the links are alike. Client and server share the machine's
// cores: absolute MB/s is what they do encrypting and decrypting at once,
// and the ratios are the point.
func BenchmarkUploadVsRawSSH(b *testing.B) {
	const size = benchUploadSize
	data := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	key, keyPEM := sshtest.NewKey(b)

	lv := sshtest.NewLibvirt(b)
	sink := newDiscardSocket(b)
	srv := sshtest.NewServer(b, sshtest.Config{AuthorizedKeys: []ssh.PublicKey{key.PublicKey()}})
	exec := newExecServer(b, key.PublicKey())

	// (a) the pool, as the provider uses it.
	m, err := conn.ParseMaterial(keyPEM, srv.KnownHosts())
	if err != nil {
		b.Fatal(err)
	}
	pool := conn.New(conn.Options{})
	b.Cleanup(pool.Close)
	if err := pool.Set(conn.HostConfig{Name: "hv1", Address: srv.Addr(), User: "root", SocketPath: lv.SocketPath()},
		func(context.Context) (*conn.Material, error) { return m, nil }); err != nil {
		b.Fatal(err)
	}
	vol := libvirt.StorageVol{Pool: "default", Name: "image.raw", Key: "image.raw"}
	uploadWith := func(body func() io.Reader) func() error {
		return func() error {
			return pool.Do(context.Background(), "hv1", func(c virt.Client) error {
				return c.StorageVolUpload(vol, body(), 0, size, 0)
			})
		}
	}
	upload := uploadWith(func() io.Reader { return chunkReader{bytes.NewReader(data)} })
	upload4M := uploadWith(func() io.Reader { return bytes.NewReader(data) })

	// (b) ssh-cat: one SSH connection, a new session per transfer.
	execClient := dialSSH(b, exec.addr(), key, exec.hostKey.PublicKey())
	cat := func() error {
		s, err := execClient.NewSession()
		if err != nil {
			return err
		}
		defer s.Close()
		stdin, err := s.StdinPipe()
		if err != nil {
			return err
		}
		if err := s.Start("cat >/dev/null"); err != nil {
			return err
		}
		if _, err := io.Copy(stdin, bytes.NewReader(data)); err != nil {
			return err
		}
		if err := stdin.Close(); err != nil {
			return err
		}
		return s.Wait()
	}

	// (c) ssh-fwd-discard: one forwarded channel kept open, like the pool's.
	fwdClient := dialSSH(b, srv.Addr(), key, srv.HostKey())
	fwd, err := fwdClient.Dial("unix", sink.path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = fwd.Close() })
	discard := func() error { return sink.send(fwd, data) }

	// (d) unix-libvirt: no SSH at all.
	uc, err := net.Dial("unix", lv.SocketPath())
	if err != nil {
		b.Fatal(err)
	}
	direct := libvirt.NewWithDialer(dialers.NewAlreadyConnected(uc))
	if err := direct.ConnectToURI(libvirt.QEMUSystem); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = direct.Disconnect() })
	unixUpload := func() error { return direct.StorageVolUpload(vol, chunkReader{bytes.NewReader(data)}, 0, size, 0) }

	paths := []struct {
		name string
		run  func() error
		took time.Duration
	}{
		{name: "libvirt-upload", run: upload},
		{name: "libvirt-upload-4M", run: upload4M},
		{name: "ssh-cat", run: cat},
		{name: "ssh-fwd-discard", run: discard},
		{name: "unix-libvirt", run: unixUpload},
	}
	// Warm up: dial the pool's link, fault in the buffers.
	for _, p := range paths {
		if err := p.run(); err != nil {
			b.Fatalf("%s: %v", p.name, err)
		}
	}
	lvBefore, catBefore, sinkBefore := lv.Uploaded(), exec.received.Load(), sink.received.Load()

	iters := 0
	for b.Loop() {
		for k := range paths {
			p := &paths[(iters+k)%len(paths)]
			start := time.Now()
			if err := p.run(); err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			p.took += time.Since(start)
		}
		iters++
	}

	// Every byte arrived where it was sent (not a timing check).
	if got, want := lv.Uploaded()-lvBefore, int64(3*size*iters); got != want {
		b.Fatalf("libvirt received %d bytes, want %d", got, want)
	}
	if got, want := exec.received.Load()-catBefore, int64(size*iters); got != want {
		b.Fatalf("ssh-cat server received %d bytes, want %d", got, want)
	}
	if got, want := sink.received.Load()-sinkBefore, int64(size*iters); got != want {
		b.Fatalf("discard socket received %d bytes, want %d", got, want)
	}

	mbps := map[string]float64{}
	for _, p := range paths {
		mbps[p.name] = float64(size) * float64(iters) / p.took.Seconds() / 1e6
		b.ReportMetric(mbps[p.name], p.name+"-MB/s")
	}
	b.ReportMetric(mbps["libvirt-upload"]/mbps["ssh-cat"], "upload/ssh-cat")
	b.ReportMetric(mbps["libvirt-upload"]/mbps["ssh-fwd-discard"], "upload/fwd-discard")
	b.ReportMetric(mbps["unix-libvirt"]/mbps["ssh-cat"], "unix-libvirt/ssh-cat")
	b.ReportMetric(mbps["libvirt-upload"]/mbps["libvirt-upload-4M"], "upload/upload-4M")
}

// chunkReader hands out image.StreamChunk bytes per Read, as the image
// cache's upload stream does.
type chunkReader struct{ r io.Reader }

func (c chunkReader) Read(p []byte) (int, error) {
	return c.r.Read(p[:min(len(p), image.StreamChunk)])
}

const benchUploadSize = 32 << 20

func dialSSH(b *testing.B, addr string, key ssh.Signer, hostKey ssh.PublicKey) *ssh.Client {
	b.Helper()
	c, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{
		User:            "root",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: ssh.FixedHostKey(hostKey),
		Timeout:         10 * time.Second,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// discardSocket is a unix socket that reads frames (an 8-byte big-endian
// length, then that many bytes), throws the bytes away and acks each frame
// with one byte, so the sender knows they all arrived.
type discardSocket struct {
	path     string
	ln       net.Listener
	received atomic.Int64
	wg       sync.WaitGroup
}

func newDiscardSocket(b *testing.B) *discardSocket {
	b.Helper()
	dir, err := os.MkdirTemp("", "sink") // short: unix socket paths are limited
	if err != nil {
		b.Fatal(err)
	}
	d := &discardSocket{path: filepath.Join(dir, "sock")}
	if d.ln, err = net.Listen("unix", d.path); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for {
			c, err := d.ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				d.serve(c)
			}()
		}
	}()
	b.Cleanup(func() {
		_ = d.ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		d.wg.Wait()
		_ = os.RemoveAll(dir)
	})
	return d
}

func (d *discardSocket) serve(c net.Conn) {
	var hdr [8]byte
	buf := make([]byte, 64<<10)
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		// 64 KiB reads, like sshtest.Libvirt's buffered reader.
		n, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, io.LimitReader(c, int64(binary.BigEndian.Uint64(hdr[:]))), buf)
		d.received.Add(n)
		if err != nil || n != int64(binary.BigEndian.Uint64(hdr[:])) {
			return
		}
		if _, err := c.Write([]byte{1}); err != nil {
			return
		}
	}
}

// send writes one frame on c and waits for its ack.
func (d *discardSocket) send(c net.Conn, data []byte) error {
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], uint64(len(data)))
	if _, err := c.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := c.Write(data); err != nil {
		return err
	}
	var ack [1]byte
	_, err := io.ReadFull(c, ack[:])
	return err
}

// execServer is the smallest SSH server that runs `cat >/dev/null`: every
// session's exec request is accepted, its stdin is read to EOF and
// discarded, then exit-status 0 is sent and the channel closed, as sshd
// does once cat exits.
type execServer struct {
	ln       net.Listener
	hostKey  ssh.Signer
	cfg      *ssh.ServerConfig
	received atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newExecServer(b *testing.B, authorized ssh.PublicKey) *execServer {
	b.Helper()
	hostKey, _ := sshtest.NewKey(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := &execServer{ln: ln, hostKey: hostKey}
	s.cfg = &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if bytes.Equal(k.Marshal(), authorized.Marshal()) {
			return nil, nil
		}
		return nil, errors.New("not authorized")
	}}
	s.cfg.AddHostKey(hostKey)
	s.wg.Add(1)
	go s.accept()
	b.Cleanup(func() {
		_ = s.ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *execServer) addr() string { return s.ln.Addr().String() }

func (s *execServer) accept() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, nc)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(nc)
	}
}

func (s *execServer) serve(nc net.Conn) {
	defer s.wg.Done()
	defer nc.Close()
	sc, chans, reqs, err := ssh.NewServerConn(nc, s.cfg)
	if err != nil {
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for newCh := range chans {
		if newCh.ChannelType() != "session" {
			_ = newCh.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, creqs, err := newCh.Accept()
		if err != nil {
			continue
		}
		s.wg.Add(1)
		go s.session(ch, creqs)
	}
}

func (s *execServer) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer s.wg.Done()
	for req := range reqs {
		if req.Type != "exec" {
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
			continue
		}
		var cmd struct{ Command string }
		if err := ssh.Unmarshal(req.Payload, &cmd); err != nil || cmd.Command != "cat >/dev/null" {
			_ = req.Reply(false, nil)
			continue
		}
		_ = req.Reply(true, nil)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			// 32 KiB reads, as sshtest's forwarding loop (io.Copy) reads
			// its channel, so both servers do the same work per byte
			// (io.Discard's own ReadFrom would read 8 KiB at a time).
			n, _ := io.CopyBuffer(struct{ io.Writer }{io.Discard}, struct{ io.Reader }{ch}, make([]byte, 32<<10))
			s.received.Add(n)
			_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{0}))
			_ = ch.Close()
		}()
	}
}
