package sshtest

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/digitalocean/go-libvirt"
)

// Remote protocol constants (libvirt's remote_protocol.x; go-libvirt keeps
// its copies internal).
const (
	program         = 0x20008086
	protocolVersion = 1

	typeCall   = 0
	typeReply  = 1
	typeStream = 3

	statusOK       = 0
	statusError    = 1
	statusContinue = 2

	headerSize = 4 + 24 // length word + header
	maxPacket  = 32 << 20
)

// Procedure numbers served by Libvirt, for Handle.
const (
	ProcConnectOpen           = 1
	ProcConnectClose          = 2
	ProcConnectGetHostname    = 59
	ProcAuthList              = 66
	ProcConnectGetLibVersion  = 157
	ProcStorageVolUpload      = 208
	ProcConnectListAllDomains = 273
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
// throughput benchmarks). Other procedures fail with VIR_ERR_NO_SUPPORT
// unless a Handler is registered. Calls are served concurrently.
type Libvirt struct {
	ln   net.Listener
	dir  string
	path string

	handlers sync.Map // uint32 → Handler
	opens    atomic.Int64
	uploaded atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
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
	l := &Libvirt{ln: ln, dir: dir, path: path, conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
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
func (l *Libvirt) DropConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		_ = c.Close()
	}
}

// Close stops serving and waits for its goroutines; blocked handlers see
// their context end.
func (l *Libvirt) Close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	_ = l.ln.Close()
	l.DropConns()
	l.wg.Wait()
	_ = os.RemoveAll(l.dir)
}

func (l *Libvirt) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			return
		}
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.serve(c)
	}
}

type header struct {
	Program, Version, Procedure, Type uint32
	Serial                            int32
	Status                            uint32
}

func (l *Libvirt) serve(c net.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls sync.WaitGroup
	defer func() {
		cancel()
		_ = c.Close()
		calls.Wait()
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
		l.wg.Done()
	}()

	var wmu sync.Mutex
	send := func(h header, payload []byte) {
		buf := make([]byte, headerSize, headerSize+len(payload))
		binary.BigEndian.PutUint32(buf[0:], uint32(headerSize+len(payload)))
		binary.BigEndian.PutUint32(buf[4:], h.Program)
		binary.BigEndian.PutUint32(buf[8:], h.Version)
		binary.BigEndian.PutUint32(buf[12:], h.Procedure)
		binary.BigEndian.PutUint32(buf[16:], h.Type)
		binary.BigEndian.PutUint32(buf[20:], uint32(h.Serial))
		binary.BigEndian.PutUint32(buf[24:], h.Status)
		wmu.Lock()
		defer wmu.Unlock()
		_, _ = c.Write(append(buf, payload...))
	}
	reply := func(call header, payload []byte, err error) {
		call.Type, call.Status = typeReply, statusOK
		if err != nil {
			call.Status, payload = statusError, encodeError(err)
		}
		send(call, payload)
	}

	r := bufio.NewReaderSize(c, 64<<10)
	for {
		h, payload, err := readPacket(r)
		if err != nil {
			return
		}
		switch {
		case h.Type == typeStream && h.Procedure == ProcStorageVolUpload:
			switch h.Status {
			case statusContinue:
				l.uploaded.Add(int64(len(payload)))
			case statusOK: // end of data: confirm
				send(header{program, protocolVersion, h.Procedure, typeStream, h.Serial, statusOK}, nil)
			default: // the client aborted: answer so it does not wait
				h.Type, h.Status = typeStream, statusError
				send(h, encodeError(errors.New("stream aborted by client")))
			}
		case h.Type != typeCall:
			// Nothing else is expected from a client.
		case h.Program != program:
			reply(h, nil, fmt.Errorf("sshtest: unknown program %#x", h.Program))
		default:
			if hd, ok := l.handlers.Load(h.Procedure); ok {
				calls.Add(1)
				go func(h header, args []byte) {
					defer calls.Done()
					out, err := hd.(Handler)(ctx, args)
					reply(h, out, err)
				}(h, payload)
				continue
			}
			// Built-ins answer in order, before the next packet is read, so
			// an upload's data never overtakes the call's reply.
			out, err := l.builtin(h.Procedure)
			reply(h, out, err)
		}
	}
}

func (l *Libvirt) builtin(proc uint32) ([]byte, error) {
	switch proc {
	case ProcAuthList:
		return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 1), 0), nil // [REMOTE_AUTH_NONE]
	case ProcConnectOpen:
		l.opens.Add(1)
		return nil, nil
	case ProcConnectClose, ProcStorageVolUpload:
		return nil, nil
	case ProcConnectGetLibVersion:
		return binary.BigEndian.AppendUint64(nil, LibVersion), nil
	case ProcConnectGetHostname:
		return xdrString(nil, Hostname), nil
	}
	return nil, libvirt.Error{Code: uint32(libvirt.ErrNoSupport), Message: fmt.Sprintf("sshtest: procedure %d not supported", proc)}
}

func readPacket(r io.Reader) (header, []byte, error) {
	var buf [headerSize]byte
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return header{}, nil, err
	}
	n := binary.BigEndian.Uint32(buf[0:])
	if n < headerSize || n > maxPacket {
		return header{}, nil, fmt.Errorf("sshtest: bad packet length %d", n)
	}
	h := header{
		Program:   binary.BigEndian.Uint32(buf[4:]),
		Version:   binary.BigEndian.Uint32(buf[8:]),
		Procedure: binary.BigEndian.Uint32(buf[12:]),
		Type:      binary.BigEndian.Uint32(buf[16:]),
		Serial:    int32(binary.BigEndian.Uint32(buf[20:])),
		Status:    binary.BigEndian.Uint32(buf[24:]),
	}
	payload := make([]byte, n-headerSize)
	_, err := io.ReadFull(r, payload)
	return h, payload, err
}

// encodeError is remote_error: code, domain, message (optional string),
// level, dom, str1..3 (optional, absent), int1, int2, net (absent).
func encodeError(err error) []byte {
	code := uint32(libvirt.ErrInternalError)
	var le libvirt.Error
	if errors.As(err, &le) {
		code = le.Code
	}
	be := binary.BigEndian
	b := be.AppendUint32(nil, code)
	b = be.AppendUint32(b, 0) // domain
	b = be.AppendUint32(b, 1) // message present
	b = xdrString(b, err.Error())
	b = be.AppendUint32(b, 2) // level: VIR_ERR_ERROR
	for range 4 {             // dom, str1, str2, str3 absent
		b = be.AppendUint32(b, 0)
	}
	b = be.AppendUint32(b, 0) // int1
	b = be.AppendUint32(b, 0) // int2
	return be.AppendUint32(b, 0)
}

func xdrString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	b = append(b, s...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
