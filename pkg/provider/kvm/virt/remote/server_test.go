package remote

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
)

// testDaemon answers ConnectGetHostname after gate opens and counts calls
// in flight; uploads go through upload.
type testDaemon struct {
	gate     chan struct{}
	inFlight atomic.Int32
	peak     atomic.Int32
	upload   func(accept func(), data io.Reader) error
}

func (d *testDaemon) Open(context.Context, Client) Session { return d }

func (d *testDaemon) Call(ctx context.Context, proc uint32, _ []byte) ([]byte, error) {
	if out, ok := Handshake(proc); ok {
		return out, nil
	}
	if proc != ProcConnectGetHostname {
		return nil, UnknownProcedure(proc)
	}
	n := d.inFlight.Add(1)
	defer d.inFlight.Add(-1)
	for p := d.peak.Load(); n > p; p = d.peak.Load() {
		if d.peak.CompareAndSwap(p, n) {
			break
		}
	}
	select {
	case <-d.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return Marshal(libvirt.ConnectGetHostnameRet{Hostname: "h"})
}

func (d *testDaemon) Upload(_ context.Context, _ []byte, accept func(), data io.Reader) error {
	return d.upload(accept, data)
}

func serveTest(t *testing.T, d *testDaemon, opts Options) *libvirt.Libvirt {
	t.Helper()
	a, b := net.Pipe()
	s := NewServer(d, opts)
	ln := &oneConn{c: b, done: make(chan struct{})}
	s.Serve(ln)
	t.Cleanup(s.Close)
	lv := libvirt.NewWithDialer(dialers.NewAlreadyConnected(a))
	if err := lv.ConnectToURI(libvirt.QEMUSystem); err != nil {
		t.Fatal(err)
	}
	return lv
}

// oneConn is a listener that hands out one connection.
type oneConn struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	return nil
}

func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

func TestMaxClientRequestsBoundsCallsInFlight(t *testing.T) {
	d := &testDaemon{gate: make(chan struct{})}
	lv := serveTest(t, d, Options{MaxClientRequests: 2})
	errs := make(chan error, 5)
	for range 5 {
		go func() { _, err := lv.ConnectGetHostname(); errs <- err }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for d.inFlight.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // room for a third to arrive, if it could
	if got := d.inFlight.Load(); got != 2 {
		t.Fatalf("%d calls in flight, want the bound 2", got)
	}
	close(d.gate)
	for range 5 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if p := d.peak.Load(); p != 2 {
		t.Errorf("peak %d calls in flight, want 2", p)
	}
}

func TestUnknownProcedureIsGoLibvirtsUnsupported(t *testing.T) {
	lv := serveTest(t, &testDaemon{gate: make(chan struct{})}, Options{})
	if _, err := lv.ConnectGetLibVersion(); !errors.Is(err, libvirt.ErrUnsupported) {
		t.Fatalf("got %v, want libvirt.ErrUnsupported", err)
	}
}

func TestUploadStream(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 3<<20)
	var abortSeen error
	tests := []struct {
		name   string
		upload func(accept func(), data io.Reader) error
		body   io.Reader
		code   libvirt.ErrorNumber // 0: success
		msg    string
	}{
		{
			name:   "taken whole",
			upload: func(accept func(), data io.Reader) error { accept(); _, err := io.Copy(io.Discard, data); return err },
		},
		{
			name: "refused before any data: the call's error",
			upload: func(func(), io.Reader) error {
				return libvirt.Error{Code: uint32(libvirt.ErrNoStorageVol), Message: "no vol"}
			},
			code: libvirt.ErrNoStorageVol, msg: "no vol",
		},
		{
			name: "failed mid-stream: the stream's error, with its code",
			upload: func(accept func(), data io.Reader) error {
				accept()
				_, _ = io.CopyN(io.Discard, data, 1<<20)
				return libvirt.Error{Code: uint32(libvirt.ErrSystemError), Message: "No space left on device"}
			},
			code: libvirt.ErrSystemError, msg: "No space left on device",
		},
		{
			name: "failed after the client finished",
			upload: func(accept func(), data io.Reader) error {
				accept()
				_, _ = io.Copy(io.Discard, data)
				return libvirt.Error{Code: uint32(libvirt.ErrOperationFailed), Message: "late"}
			},
			code: libvirt.ErrOperationFailed, msg: "late",
		},
		{
			name: "client aborts: the daemon sees an error, not EOF",
			upload: func(accept func(), data io.Reader) error {
				accept()
				_, abortSeen = io.Copy(io.Discard, data)
				return errors.New("aborted")
			},
			body: io.MultiReader(bytes.NewReader(body[:1<<20]), errReader{}),
			code: libvirt.ErrInternalError, msg: "aborted",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lv := serveTest(t, &testDaemon{gate: make(chan struct{}), upload: tt.upload}, Options{MaxClientRequests: 1})
			r := tt.body
			if r == nil {
				r = bytes.NewReader(body)
			}
			err := lv.StorageVolUpload(libvirt.StorageVol{Name: "v"}, r, 0, 0, 0)
			var le libvirt.Error
			switch {
			case tt.code == 0 && err != nil:
				t.Fatalf("upload: %v", err)
			case tt.code != 0 && (!errors.As(err, &le) || le.Code != uint32(tt.code) || !strings.Contains(le.Message, tt.msg)):
				t.Fatalf("got %v, want libvirt error %d %q", err, tt.code, tt.msg)
			}
			// The connection still serves, and the upload's request slot
			// was given back.
			if _, err := lv.ConnectGetLibVersion(); !errors.Is(err, libvirt.ErrUnsupported) {
				t.Fatalf("after the upload: %v", err)
			}
		})
	}
	if abortSeen == nil || !strings.Contains(abortSeen.Error(), "aborted by client") {
		t.Errorf("the aborted upload read %v, want the client's abort", abortSeen)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("source broke") }
