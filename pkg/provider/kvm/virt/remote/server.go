package remote

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/digitalocean/go-libvirt/socket"
)

// Handler is a daemon: it opens a Session for each client connection. ctx
// ends when the connection does; calls still in flight then must return
// (the connection's end waits for them).
type Handler interface {
	Open(ctx context.Context, c Client) Session
}

// Session is one client connection's view of the daemon.
type Session interface {
	// Call answers one call of proc with its XDR arguments. Calls run
	// concurrently; ctx is Open's. An error goes back as a libvirt error
	// (a libvirt.Error keeps its code).
	Call(ctx context.Context, proc uint32, args []byte) ([]byte, error)
}

// Uploader is a Session that takes virStorageVolUpload streams.
type Uploader interface {
	// Upload runs one upload. It calls accept once the daemon has taken
	// the upload on (libvirtd's reply to the call, after which the client
	// sends data); an error before that is the call's answer, one after it
	// ends the stream. data yields the stream's bytes, then io.EOF when the
	// client finishes or an error when it aborts or the connection ends.
	Upload(ctx context.Context, args []byte, accept func(), data io.Reader) error
}

// Client is the connection a Session serves.
type Client interface {
	// Send sends an event message (what a
	// virConnectDomainEventCallbackRegisterAny callback receives).
	Send(proc uint32, msg any) error
	// Close drops the connection, as when libvirtd or the link goes away.
	Close()
}

// Options configure a Server.
type Options struct {
	// MaxClientRequests bounds the calls of one connection in flight;
	// while it is reached the connection is not read, as libvirtd does
	// with max_client_requests (5 by default in libvirtd.conf). 0: no
	// bound.
	MaxClientRequests int
}

// Server serves connections with one Handler. Its methods are safe for
// concurrent use.
type Server struct {
	h    Handler
	opts Options

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	lns    map[net.Listener]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a server answering with h.
func NewServer(h Handler, opts Options) *Server {
	return &Server{h: h, opts: opts, conns: map[net.Conn]struct{}{}, lns: map[net.Listener]struct{}{}}
}

// Serve accepts connections on ln until it is closed (or Close), serving
// each in its own goroutine.
func (s *Server) Serve(ln net.Listener) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close()
		return
	}
	s.lns[ln] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				_ = c.Close()
				return
			}
			s.conns[c] = struct{}{}
			s.wg.Add(1)
			s.mu.Unlock()
			go func() {
				defer s.wg.Done()
				s.serveConn(c)
			}()
		}
	}()
}

// DropConns closes every client connection, like a libvirtd restart.
func (s *Server) DropConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		_ = c.Close()
	}
}

// Close stops serving: listeners and connections are closed, and it waits
// for every call and session to end.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for ln := range s.lns {
		_ = ln.Close()
	}
	s.mu.Unlock()
	s.DropConns()
	s.wg.Wait()
}

// conn is one client connection being served.
type conn struct {
	c     net.Conn
	wmu   sync.Mutex
	wbuf  []byte
	slots chan struct{} // nil: no bound

	smu     sync.Mutex
	streams map[int32]*upload
}

// send writes one packet; errors mean the connection is going away, which
// the read loop notices.
func (cn *conn) send(h socket.Header, payload []byte) {
	h.Program, h.Version = Program, ProtocolVersion
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	cn.wbuf = appendPacket(cn.wbuf[:0], h, payload)
	_, _ = cn.c.Write(cn.wbuf)
}

func (cn *conn) reply(call socket.Header, payload []byte, err error) {
	call.Type, call.Status = socket.Reply, socket.StatusOK
	if err != nil {
		call.Status, payload = socket.StatusError, encodeError(err)
	}
	cn.send(call, payload)
}

// Close implements Client.
func (cn *conn) Close() { _ = cn.c.Close() }

// Send implements Client.
func (cn *conn) Send(proc uint32, msg any) error {
	b, err := Marshal(msg)
	if err != nil {
		return err
	}
	cn.send(socket.Header{Procedure: proc, Type: socket.Message, Status: socket.StatusOK}, b)
	return nil
}

func (cn *conn) acquire() {
	if cn.slots != nil {
		cn.slots <- struct{}{}
	}
}

func (cn *conn) release() {
	if cn.slots != nil {
		<-cn.slots
	}
}

// upload is one upload stream of a connection, by the call's serial.
type upload struct {
	pw      *io.PipeWriter
	done    chan struct{} // closed when Upload returned
	err     error         // Upload's, set before done is closed
	errSent atomic.Bool   // err went to the client already
	ended   atomic.Bool   // the client ended or aborted the stream
}

var errClientAbort = errors.New("stream aborted by client")

func (s *Server) serveConn(c net.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	cn := &conn{c: c, streams: map[int32]*upload{}}
	if s.opts.MaxClientRequests > 0 {
		cn.slots = make(chan struct{}, s.opts.MaxClientRequests)
	}
	sess := s.h.Open(ctx, cn)
	var calls sync.WaitGroup
	defer func() {
		cancel()
		_ = c.Close()
		cn.smu.Lock()
		for _, u := range cn.streams {
			u.pw.CloseWithError(net.ErrClosed)
		}
		cn.smu.Unlock()
		calls.Wait()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()

	r := bufio.NewReaderSize(c, 64<<10)
	for {
		h, payload, err := readPacket(r)
		if err != nil {
			return
		}
		switch {
		case h.Type == socket.Stream:
			cn.streamPacket(h, payload, &calls)
		case h.Type != socket.Call:
			// Nothing else is expected from a client.
		case h.Program != Program:
			cn.reply(h, nil, fmt.Errorf("remote: unknown program %#x", h.Program))
		case h.Procedure == ProcStorageVolUpload:
			up, ok := sess.(Uploader)
			if !ok {
				cn.reply(h, nil, UnknownProcedure(h.Procedure))
				continue
			}
			cn.acquire()
			calls.Add(1)
			cn.startUpload(ctx, up, h, payload, &calls)
		default:
			cn.acquire()
			calls.Add(1)
			go func() {
				defer calls.Done()
				out, err := sess.Call(ctx, h.Procedure, payload)
				cn.reply(h, out, err)
				cn.release()
			}()
		}
	}
}

// startUpload registers the stream before anything is answered, so data
// the client sends after the reply always finds it.
func (cn *conn) startUpload(ctx context.Context, up Uploader, call socket.Header, args []byte, calls *sync.WaitGroup) {
	pr, pw := io.Pipe()
	u := &upload{pw: pw, done: make(chan struct{})}
	cn.smu.Lock()
	cn.streams[call.Serial] = u
	cn.smu.Unlock()
	var accepted atomic.Bool
	accept := func() {
		if !accepted.Swap(true) {
			cn.reply(call, nil, nil)
			cn.release()
		}
	}
	go func() {
		defer calls.Done()
		err := up.Upload(ctx, args, accept, pr)
		_ = pr.CloseWithError(io.ErrClosedPipe) // later data is dropped, not waited for
		if !accepted.Swap(true) {
			if err != nil {
				// Refused before taking any data: the call's answer.
				cn.forget(call.Serial)
				cn.reply(call, nil, err)
				cn.release()
				close(u.done)
				return
			}
			// Done without data (nothing to take): the stream's end is
			// still confirmed when the client sends it.
			cn.reply(call, nil, nil)
			cn.release()
		} else if err != nil && !u.ended.Load() {
			// Failed while the client still sends: tell it now, as
			// libvirtd does, rather than after it sent everything.
			u.errSent.Store(true)
			stream := call
			stream.Type, stream.Status = socket.Stream, socket.StatusError
			cn.send(stream, encodeError(err))
		}
		u.err = err
		close(u.done)
	}()
}

func (cn *conn) forget(serial int32) {
	cn.smu.Lock()
	delete(cn.streams, serial)
	cn.smu.Unlock()
}

// streamPacket takes one packet of an upload stream: data goes to the
// upload (blocking this connection's reads until it is taken, as libvirtd
// stops reading a client whose stream is not drained); the end or an abort
// is answered once the upload has returned.
func (cn *conn) streamPacket(h socket.Header, payload []byte, calls *sync.WaitGroup) {
	cn.smu.Lock()
	u := cn.streams[h.Serial]
	cn.smu.Unlock()
	if u == nil {
		return // a stream that ended already
	}
	if h.Status == socket.StatusContinue {
		_, _ = u.pw.Write(payload)
		return
	}
	u.ended.Store(true)
	cn.forget(h.Serial)
	abort := h.Status != socket.StatusOK
	if abort {
		u.pw.CloseWithError(errClientAbort)
	} else {
		u.pw.Close()
	}
	calls.Add(1)
	go func() {
		defer calls.Done()
		<-u.done
		h.Type = socket.Stream
		switch {
		case u.errSent.Load():
		case abort:
			// Answer so the client does not wait.
			h.Status = socket.StatusError
			cn.send(h, encodeError(errClientAbort))
		case u.err != nil:
			h.Status = socket.StatusError
			cn.send(h, encodeError(u.err))
		default:
			h.Status = socket.StatusOK
			cn.send(h, nil)
		}
	}()
}
