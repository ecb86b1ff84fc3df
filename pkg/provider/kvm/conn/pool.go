// Package conn keeps one SSH connection per KVM host, with libvirt's unix
// socket forwarded through it, shared by every reconcile and health check of
// that host.
//
// A host's link is dialed lazily by the first Do and reused until it dies:
// when libvirt reports the socket closed, when SSH keepalives go unanswered,
// or when an RPC fails with a transport error. The next Do redials. Dialing
// is serialized per host by a one-slot channel that is held only while the
// link is checked or dialed, never during RPCs: RPCs multiplex on the link,
// so a long image upload does not block a health check, and a caller waiting
// for someone else's dial gives up when its own context ends.
//
// The pool hands the client out through Do rather than a getter: Do knows
// which link an error came from, so a transport failure drops exactly that
// link and never a fresh one another caller dialed meanwhile.
package conn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"
	"github.com/go-logr/logr"
	"golang.org/x/crypto/ssh"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// Defaults.
const (
	DefaultPort               = "22"
	DefaultSocketPath         = "/var/run/libvirt/libvirt-sock"
	DefaultHandshakeTimeout   = 10 * time.Second
	DefaultKeepaliveInterval  = 15 * time.Second
	DefaultKeepaliveMaxMissed = 3
)

// HostConfig says how to reach one KVM host.
type HostConfig struct {
	// Name identifies the host in the pool (the KVMHost name).
	Name string
	// Address is host[:port] of its SSH server; port 22 when omitted.
	Address string
	// User is the SSH user.
	User string
	// SocketPath is libvirt's unix socket on the host; DefaultSocketPath
	// when empty.
	SocketPath string
	// MaterialRevision identifies the credentials the loader returns, e.g.
	// the Secret's namespace/name and resourceVersion. Loaders are funcs and
	// cannot be compared, so this is how Set learns the material changed:
	// like any config change it drops the link. Optional: material is read
	// afresh on every dial anyway, so new credentials are used from the next
	// dial on; a changed revision only makes that dial happen now.
	MaterialRevision string
}

// normalize applies defaults and validates; Set compares normalized configs.
func (c HostConfig) normalize() (HostConfig, error) {
	if c.Name == "" {
		return c, provider.Permanentf("kvm host config: empty name")
	}
	if c.User == "" {
		return c, provider.Permanentf("kvm host %q: empty ssh user", c.Name)
	}
	addr, err := normalizeAddress(c.Address)
	if err != nil {
		return c, provider.Permanentf("kvm host %q: %w", c.Name, err)
	}
	c.Address = addr
	if c.SocketPath == "" {
		c.SocketPath = DefaultSocketPath
	}
	return c, nil
}

// normalizeAddress turns host[:port] into host:port (IPv6 in brackets).
func normalizeAddress(a string) (string, error) {
	a = strings.TrimSpace(a)
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		switch {
		case strings.HasPrefix(a, "[") && strings.HasSuffix(a, "]"):
			host = a[1 : len(a)-1]
		case strings.ContainsAny(a, "[]"):
			return "", fmt.Errorf("invalid address %q: %w", a, err)
		default: // a name, an IPv4 or a bare IPv6 address
			host = a
		}
		port = DefaultPort
	}
	if host == "" {
		return "", fmt.Errorf("invalid address %q: empty host", a)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", fmt.Errorf("invalid address %q: bad port %q", a, port)
	}
	return net.JoinHostPort(host, port), nil
}

// Libvirt is what the pool needs of a libvirt client: the provider's API and
// connection control. *libvirt.Libvirt satisfies it.
type Libvirt interface {
	virt.Client
	ConnectToURI(uri libvirt.ConnectURI) error
	Disconnected() <-chan struct{}
}

var _ Libvirt = (*libvirt.Libvirt)(nil)

// Options configure a Pool. Zero values take the defaults.
type Options struct {
	// Dial opens the TCP connection to a host's SSH server; a net.Dialer
	// when nil.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HandshakeTimeout bounds a whole dial: TCP connect, SSH handshake and
	// libvirt connect (the caller's context may end it sooner).
	HandshakeTimeout time.Duration
	// KeepaliveInterval between SSH keepalives; negative disables them. A
	// link whose keepalive stays unanswered for KeepaliveMaxMissed intervals
	// is closed, so a blackholed host is noticed and redialed.
	KeepaliveInterval  time.Duration
	KeepaliveMaxMissed int
	// NewLibvirt builds the libvirt client over an open socket;
	// libvirt.NewWithDialer when nil. Tests inject fakes here.
	NewLibvirt func(host string, d socket.Dialer) Libvirt
	// OnConnect, if set, runs in its own goroutine after each successful
	// dial, with the new link's client and a channel closed when that link
	// is dropped. It may block until then (e.g. consuming libvirt events);
	// Close waits for it to return.
	OnConnect func(host string, c virt.Client, disconnected <-chan struct{})
	// Logger receives events that happen outside any call (keepalive or
	// libvirt disconnects). Calls log to the logger in their context.
	Logger logr.Logger
}

// Pool holds one link per configured host. It is safe for concurrent use.
type Pool struct {
	opts Options

	mu     sync.Mutex
	hosts  map[string]*hostState
	closed bool
	wg     sync.WaitGroup // per-link goroutines; Add only under mu while !closed
}

// hostState is one configured host. Its config is fixed: Set with a
// different config retires it and installs a new one.
type hostState struct {
	cfg    HostConfig
	ctx    context.Context // cancelled when retired; aborts its dial
	cancel context.CancelFunc
	slot   chan struct{} // held while checking or dialing the link

	mu     sync.Mutex
	loader MaterialLoader // called on every dial; see loadMaterial
	link   *link
}

func (h *hostState) current() *link {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.link
}

// link is one SSH session with a libvirt connection over it.
type link struct {
	ssh  *ssh.Client
	lv   Libvirt
	done chan struct{} // closed when the link is dropped
	once sync.Once
}

// close tears the link down; it reports whether this call did.
func (l *link) close() bool {
	closed := false
	l.once.Do(func() {
		closed = true
		close(l.done)
		// Closing the SSH connection ends the forwarded socket, which ends
		// go-libvirt's reader and fails its in-flight calls. No polite
		// ConnectClose: on a dead link it would only block.
		_ = l.ssh.Close()
	})
	return closed
}

// New returns an empty pool.
func New(opts Options) *Pool {
	if opts.Dial == nil {
		opts.Dial = (&net.Dialer{}).DialContext
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if opts.KeepaliveInterval == 0 {
		opts.KeepaliveInterval = DefaultKeepaliveInterval
	}
	if opts.KeepaliveMaxMissed <= 0 {
		opts.KeepaliveMaxMissed = DefaultKeepaliveMaxMissed
	}
	if opts.NewLibvirt == nil {
		opts.NewLibvirt = func(_ string, d socket.Dialer) Libvirt { return libvirt.NewWithDialer(d) }
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	return &Pool{opts: opts, hosts: map[string]*hostState{}}
}

// Set adds a host or updates it. A changed config (including
// MaterialRevision) drops the old link; an unchanged one
// keeps the link and only swaps in loader for future loads. The error is
// permanent for an invalid config.
func (p *Pool) Set(cfg HostConfig, loader MaterialLoader) error {
	cfg, err := cfg.normalize()
	if err != nil {
		return err
	}
	if loader == nil {
		return provider.Permanentf("kvm host %q: no ssh material loader", cfg.Name)
	}

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errPoolClosed
	}
	old := p.hosts[cfg.Name]
	if old != nil && old.cfg == cfg {
		old.mu.Lock()
		old.loader = loader
		old.mu.Unlock()
		p.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.hosts[cfg.Name] = &hostState{cfg: cfg, ctx: ctx, cancel: cancel, slot: make(chan struct{}, 1), loader: loader}
	p.mu.Unlock()

	if old != nil {
		p.retire(old, "configuration changed")
	}
	return nil
}

// Remove closes the host's link and forgets it. Calls waiting for or dialing
// it return promptly.
func (p *Pool) Remove(name string) {
	p.mu.Lock()
	h := p.hosts[name]
	delete(p.hosts, name)
	p.mu.Unlock()
	if h != nil {
		p.retire(h, "host removed")
	}
}

// Hosts returns the configured host names, sorted.
func (p *Pool) Hosts() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	names := make([]string, 0, len(p.hosts))
	for n := range p.hosts {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Close closes every link, forgets every host and waits for the pool's
// goroutines (including OnConnect hooks) to return.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	hosts := p.hosts
	p.hosts = map[string]*hostState{}
	p.mu.Unlock()
	for _, h := range hosts {
		p.retire(h, "pool closed")
	}
	p.wg.Wait()
}

// retire cancels a host state that was taken out of the map and closes its
// link.
func (p *Pool) retire(h *hostState, reason string) {
	h.cancel()
	h.mu.Lock()
	l := h.link
	h.link = nil
	h.mu.Unlock()
	if l != nil && l.close() {
		p.opts.Logger.V(1).Info("closed kvm host connection", "host", h.cfg.Name, "reason", reason)
	}
}

// Do runs fn with the host's libvirt client, dialing the link first if there
// is none. fn's error is returned unchanged; if it is a transport failure
// (EOF, closed or reset connection, go-libvirt's interrupted call) the link
// fn used is dropped so the next Do redials. Other errors (classed provider
// errors, libvirt errors, context errors) keep it.
//
// fn may run RPCs concurrently with other Do calls. Bounding each RPC by
// ctx is the caller's job (wrap the client with virt.Instrument); Do bounds
// only the wait for and the dial of the link. A dial failure is returned as
// an error whose stage DialStage reports, classed transient or permanent. An
// unknown host gives a permanent error matching ErrHostNotConfigured.
func (p *Pool) Do(ctx context.Context, host string, fn func(virt.Client) error) error {
	h, l, err := p.acquire(ctx, host)
	if err != nil {
		return err
	}
	err = fn(l.lv)
	if isTransportError(err) {
		p.drop(logr.FromContextOrDiscard(ctx), h, l, "rpc transport error", err)
	}
	return err
}

// errRetired: the host state was replaced or removed while we used it.
var errRetired = errors.New("host state retired")

func (p *Pool) acquire(ctx context.Context, name string) (*hostState, *link, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("kvm host %q: %w", name, err)
		}
		p.mu.Lock()
		h, closed := p.hosts[name], p.closed
		p.mu.Unlock()
		switch {
		case closed:
			return nil, nil, errPoolClosed
		case h == nil:
			return nil, nil, &notConfiguredError{host: name}
		}
		l, err := p.linkFor(ctx, h)
		if errors.Is(err, errRetired) {
			continue // Set replaced it: use the new config, or Remove: report so
		}
		return h, l, err
	}
}

func (p *Pool) linkFor(ctx context.Context, h *hostState) (*link, error) {
	if l := h.current(); l != nil {
		return l, nil
	}
	select {
	case h.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the connection to kvm host %q: %w", h.cfg.Name, ctx.Err())
	case <-h.ctx.Done():
		return nil, errRetired
	}
	defer func() { <-h.slot }()

	if l := h.current(); l != nil { // dialed by whoever held the slot
		return l, nil
	}
	l, err := p.dial(ctx, h)
	if h.ctx.Err() != nil {
		if l != nil {
			l.close()
		}
		return nil, errRetired
	}
	if err != nil {
		return nil, err
	}
	if !p.publish(h, l) {
		l.close()
		return nil, errRetired
	}
	return l, nil
}

// publish makes l the host's link and starts its goroutines, unless the host
// was retired or the pool closed meanwhile.
func (p *Pool) publish(h *hostState, l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.hosts[h.cfg.Name] != h {
		return false
	}
	h.mu.Lock()
	h.link = l
	h.mu.Unlock()

	p.wg.Add(1)
	go p.supervise(h, l)
	if p.opts.OnConnect != nil {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.opts.OnConnect(h.cfg.Name, l.lv, l.done)
		}()
	}
	return true
}

// drop forgets l (if it is still the host's link) and closes it.
func (p *Pool) drop(log logr.Logger, h *hostState, l *link, reason string, err error) {
	h.mu.Lock()
	if h.link == l {
		h.link = nil
	}
	h.mu.Unlock()
	if l.close() {
		kv := []any{"host", h.cfg.Name, "reason", reason}
		if err != nil {
			kv = append(kv, "error", err.Error())
		}
		log.Info("dropped kvm host connection; the next call redials", kv...)
	}
}

// supervise drops the link when libvirt reports it disconnected or SSH
// keepalives go unanswered, and waits for the link's goroutines to end once
// it is closed.
func (p *Pool) supervise(h *hostState, l *link) {
	defer p.wg.Done()
	log := p.opts.Logger

	var tick <-chan time.Time
	if p.opts.KeepaliveInterval > 0 {
		t := time.NewTicker(p.opts.KeepaliveInterval)
		defer t.Stop()
		tick = t.C
	}
	disconnected := l.lv.Disconnected()
	var pending chan error // the outstanding keepalive's result
	missed := 0

	for {
		select {
		case <-l.done:
			// The SSH connection is closed: its goroutines and go-libvirt's
			// reader end promptly. Wait for them so Close leaves none behind.
			_ = l.ssh.Wait()
			select {
			case <-l.lv.Disconnected():
			case <-time.After(5 * time.Second):
			}
			return
		case <-disconnected:
			disconnected = nil
			p.drop(log, h, l, "libvirt connection closed", nil)
		case err := <-pending:
			pending = nil
			if err != nil {
				p.drop(log, h, l, "ssh keepalive failed", err)
			}
			missed = 0
		case <-tick:
			if pending != nil {
				// Only one keepalive is outstanding at a time; each tick it
				// stays unanswered counts as a miss.
				if missed++; missed >= p.opts.KeepaliveMaxMissed {
					p.drop(log, h, l, "ssh keepalive timeout", fmt.Errorf("no keepalive reply for %s", time.Duration(missed)*p.opts.KeepaliveInterval))
				}
				continue
			}
			pending = make(chan error, 1)
			p.wg.Add(1) // the counter is > 0 (this goroutine), so racing Close's Wait is fine
			go func(res chan<- error) {
				defer p.wg.Done()
				// Any reply, even "request failed", proves the peer alive.
				// The call returns with an error once the link is closed.
				_, _, err := l.ssh.SendRequest("keepalive@openssh.com", true, nil)
				res <- err
			}(pending)
		}
	}
}
