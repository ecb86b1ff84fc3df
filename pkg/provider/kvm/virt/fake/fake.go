// Package fake is an in-memory libvirt daemon implementing virt.Client for
// unit tests of the KVM provider and the controllers.
//
// It reproduces the daemon behaviour callers must handle — error codes and
// messages, idempotence traps, lifecycle events, asynchronous guest agents,
// metadata namespace stripping, partial uploads — and adds fault injection
// (FailNext, Fail, FailNextAfter, Delay, Block, Stop; for upload streams
// StallUploads and PaceUploads) and call counters.
//
// One Fake is one host: one daemon with any number of connections. A *Fake
// is itself a virt.Client (its default connection); Connect opens more, which
// is how a test models reconnecting after Disconnect. All methods are safe
// for concurrent use; state sits behind one mutex per Fake, so a benchmark
// with many hosts uses one Fake per host.
package fake

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// Defaults of a new Fake.
const (
	// DefaultVersion is libvirt 11.6.0 in virConnectGetLibVersion encoding
	// (major*1e6 + minor*1e3 + micro).
	DefaultVersion  uint64 = 11_006_000
	DefaultHostname        = "fake-kvm-host"
	// DefaultMaxStoredBytes bounds the content kept per volume; beyond it
	// only size and a running SHA-256 are kept (see VolumeSHA256).
	DefaultMaxStoredBytes = 64 << 20
	// PoolDir is the parent of every pool's target path.
	PoolDir = "/var/lib/libvirt/images"
)

// Option configures New.
type Option func(*Fake)

// WithVersion sets the libvirt version reported.
func WithVersion(v uint64) Option { return func(f *Fake) { f.version = v } }

// WithHostname sets the hostname reported.
func WithHostname(h string) Option { return func(f *Fake) { f.hostname = h } }

// WithMaxStoredBytes sets how much uploaded content is kept per volume.
func WithMaxStoredBytes(n int) Option { return func(f *Fake) { f.maxStored = n } }

// WithAgentAutoConnect sets whether a started domain's guest agent counts as
// connected at once (default true) — only if the domain has the
// org.qemu.guest_agent.0 channel. With false, agents stay disconnected until
// SetAgentConnected, which models the seconds a guest needs to boot.
func WithAgentAutoConnect(on bool) Option { return func(f *Fake) { f.agentAuto = on } }

// Fake is an in-memory libvirt daemon. See the package documentation.
type Fake struct {
	*Conn // default connection, so a *Fake is a virt.Client

	mu        sync.Mutex
	version   uint64
	hostname  string
	maxStored int
	agentAuto bool
	host      hostSize

	domains   map[string]*domain // by name
	nextID    int32
	nextVnet  int
	pools     map[string]*pool
	networks  map[string]*network
	arp       map[string]string      // MAC → IP, the host's neighbour table
	agents    map[string]*agentState // by domain name; survives redefinition
	nvramGone map[string]bool

	conns map[*Conn]struct{}
	subs  map[*subscriber]struct{}

	hooks map[string]*hook
	calls map[string]int
	total int

	uploadStall *stall               // non-nil while StallUploads is in force
	uploadPace  func(written uint64) // PaceUploads
	stopped     *gate                // non-nil while Stop is in force
	stoppedN    int                  // calls waiting on stopped
}

// New returns an empty daemon: no domains, pools or networks.
func New(opts ...Option) *Fake {
	f := &Fake{
		version:   DefaultVersion,
		hostname:  DefaultHostname,
		maxStored: DefaultMaxStoredBytes,
		agentAuto: true,
		host:      hostSize{cpus: DefaultCPUs, memory: DefaultMemoryBytes, used: DefaultHostUsedBytes},
		domains:   map[string]*domain{},
		nextID:    1,
		pools:     map[string]*pool{},
		networks:  map[string]*network{},
		arp:       map[string]string{},
		agents:    map[string]*agentState{},
		nvramGone: map[string]bool{},
		conns:     map[*Conn]struct{}{},
		subs:      map[*subscriber]struct{}{},
		hooks:     map[string]*hook{},
		calls:     map[string]int{},
	}
	for _, o := range opts {
		o(f)
	}
	f.Conn = f.Connect()
	return f
}

var _ virt.Client = (*Fake)(nil)

// SetVersion changes the libvirt version reported.
func (f *Fake) SetVersion(v uint64) { f.mu.Lock(); f.version = v; f.mu.Unlock() }

// SetHostname changes the hostname reported.
func (f *Fake) SetHostname(h string) { f.mu.Lock(); f.hostname = h; f.mu.Unlock() }

// Connections.

// Conn is one client connection to the Fake; it implements virt.Client and,
// like *libvirt.Libvirt, Disconnect/Disconnected/IsConnected.
type Conn struct {
	f    *Fake
	done chan struct{}
	once sync.Once
}

var _ virt.Client = (*Conn)(nil)

// Connect opens a new connection to the daemon (e.g. a test's dialer after
// Disconnect). The daemon's state is shared by all connections.
func (f *Fake) Connect() *Conn {
	c := &Conn{f: f, done: make(chan struct{})}
	f.mu.Lock()
	f.conns[c] = struct{}{}
	f.mu.Unlock()
	return c
}

// Disconnect drops every open connection, including the Fake's default one,
// as when the SSH link or the daemon goes away: in-flight calls return
// libvirt.ErrInterrupted, later ones ErrDisconnected, event channels close.
// State survives; Connect gives a working connection again.
func (f *Fake) Disconnect() error {
	f.mu.Lock()
	conns := slices.Collect(maps.Keys(f.conns))
	f.mu.Unlock()
	for _, c := range conns {
		_ = c.Disconnect()
	}
	return nil
}

// Disconnect closes this connection only. It is idempotent.
func (c *Conn) Disconnect() error {
	c.once.Do(func() {
		c.f.mu.Lock()
		delete(c.f.conns, c)
		c.f.mu.Unlock()
		close(c.done)
	})
	return nil
}

// Disconnected is closed once the connection is closed.
func (c *Conn) Disconnected() <-chan struct{} { return c.done }

// IsConnected reports whether the connection is open.
func (c *Conn) IsConnected() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// ConnectToURI is what the connection pool calls on a new client (the
// daemon here needs no handshake); it fails once the connection is closed.
func (c *Conn) ConnectToURI(libvirt.ConnectURI) error {
	if !c.IsConnected() {
		return ErrDisconnected
	}
	return nil
}

// Fault injection and counters.

type hook struct {
	failNext  []error
	failAfter []error
	fail      error
	delay     time.Duration
	block     *gate // non-nil while Block is in force
	blocked   int   // calls waiting on block
}

// gate is a Block: calls wait until it opens. Both its release func and
// ClearFaults may open it.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

func (f *Fake) hook(rpc string) *hook {
	h := f.hooks[rpc]
	if h == nil {
		h = &hook{}
		f.hooks[rpc] = h
	}
	return h
}

// FailNext makes the next call of rpc (a virt.RPC* name) return err without
// taking effect. Calls queue: FailNext twice fails the next two calls.
func (f *Fake) FailNext(rpc string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.hook(rpc)
	h.failNext = append(h.failNext, err)
}

// FailNextAfter makes the next call of rpc take effect and then return err,
// as when the reply is lost (use libvirt.ErrInterrupted for that): the
// idempotence case where a retry finds its own earlier work.
func (f *Fake) FailNextAfter(rpc string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.hook(rpc)
	h.failAfter = append(h.failAfter, err)
}

// Fail makes every call of rpc return err until Fail(rpc, nil) or
// ClearFaults. FailNext entries are consumed first.
func (f *Fake) Fail(rpc string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hook(rpc).fail = err
}

// Delay makes every call of rpc wait d before running (0 clears). A dropped
// connection cuts the wait short with libvirt.ErrInterrupted.
func (f *Fake) Delay(rpc string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hook(rpc).delay = d
}

// Block makes calls of rpc hang (a blackholed RPC) until release is called
// or their connection drops. release is idempotent and frees waiting calls.
func (f *Fake) Block(rpc string) (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closeGate(&f.hook(rpc).block)
}

// Stop makes the whole daemon stop answering, as SIGSTOP does to
// libvirtd while sshd stays up: every call, on every connection, is
// counted and then hangs until cont is called or its connection drops
// (then it returns libvirt.ErrInterrupted). Connections stay open. cont is
// idempotent; ClearFaults also ends the stop.
func (f *Fake) Stop() (cont func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closeGate(&f.stopped)
}

// closeGate puts a closed gate in *slot (keeping one already there) and
// returns the idempotent func that opens it and takes it out. Call with
// f.mu held.
func (f *Fake) closeGate(slot **gate) (open func()) {
	if *slot == nil {
		*slot = &gate{ch: make(chan struct{})}
	}
	g := *slot
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if *slot == g {
			*slot = nil
		}
		g.open()
	}
}

// Stopped returns how many calls are hanging in Stop.
func (f *Fake) Stopped() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stoppedN
}

// stall is a StallUploads: uploads that have taken after bytes wait on gate.
type stall struct {
	after   uint64
	gate    *gate
	waiting int
}

// StallUploads makes every upload stop taking bytes from its stream once it
// has taken after bytes (0: before the first), as a daemon whose storage
// stopped accepting writes: the call neither progresses nor fails until
// release is called or its connection drops (then it returns
// libvirt.ErrInterrupted). release is idempotent.
func (f *Fake) StallUploads(after uint64) (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &stall{after: after, gate: &gate{ch: make(chan struct{})}}
	if f.uploadStall != nil {
		f.uploadStall.gate.open()
	}
	f.uploadStall = s
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.uploadStall == s {
			f.uploadStall = nil
		}
		s.gate.open()
	}
}

// StalledUploads returns how many uploads are waiting in StallUploads.
func (f *Fake) StalledUploads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.uploadStall == nil {
		return 0
	}
	return f.uploadStall.waiting
}

// PaceUploads calls pace before an upload takes each chunk of its stream,
// with the bytes taken so far, from the upload's goroutine (nil clears):
// the place for a test to model a daemon that takes its stream slowly, by
// stepping its clock or waiting there.
func (f *Fake) PaceUploads(pace func(written uint64)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uploadPace = pace
}

// beforeChunk runs the stream faults before an upload on c takes the next
// chunk, having taken written bytes.
func (c *Conn) beforeChunk(written uint64) error {
	f := c.f
	f.mu.Lock()
	pace, s := f.uploadPace, f.uploadStall
	if s != nil && written >= s.after {
		s.waiting++
	} else {
		s = nil
	}
	f.mu.Unlock()
	if pace != nil {
		pace(written)
	}
	if s == nil {
		return nil
	}
	var err error
	select {
	case <-s.gate.ch:
	case <-c.done:
		err = libvirt.ErrInterrupted
	}
	f.mu.Lock()
	s.waiting--
	f.mu.Unlock()
	return err
}

// Blocked returns how many calls of rpc are currently hanging in Block.
func (f *Fake) Blocked(rpc string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.hooks[rpc]; h != nil {
		return h.blocked
	}
	return 0
}

// ClearFaults removes every injected failure, delay and pace and releases
// blocks and stalls.
func (f *Fake) ClearFaults() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range f.hooks {
		if h.block != nil {
			h.block.open()
		}
	}
	f.hooks = map[string]*hook{}
	if f.stopped != nil {
		f.stopped.open()
		f.stopped = nil
	}
	if f.uploadStall != nil {
		f.uploadStall.gate.open()
		f.uploadStall = nil
	}
	f.uploadPace = nil
}

// Calls returns how many times rpc was called, on any connection, including
// calls that failed (injected or not).
func (f *Fake) Calls(rpc string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[rpc]
}

// TotalCalls returns the number of calls of every rpc.
func (f *Fake) TotalCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}

// CallCounts returns how many times each rpc was called, as Calls.
func (f *Fake) CallCounts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.calls)
}

// ResetCalls zeroes the counters, e.g. after a test's setup.
func (f *Fake) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls, f.total = map[string]int{}, 0
}

// enter runs the per-call prologue: count, connection check, Block, Delay,
// injected failures. after is an error to return once the call took effect.
func (c *Conn) enter(rpc string) (after, err error) {
	f := c.f
	f.mu.Lock()
	f.calls[rpc]++
	f.total++
	if !c.IsConnected() {
		f.mu.Unlock()
		return nil, ErrDisconnected
	}
	if stopped := f.stopped; stopped != nil {
		f.stoppedN++
		f.mu.Unlock()
		select {
		case <-stopped.ch:
		case <-c.done:
			err = libvirt.ErrInterrupted
		}
		f.mu.Lock()
		f.stoppedN--
		if err != nil {
			f.mu.Unlock()
			return nil, err
		}
	}
	h := f.hooks[rpc]
	var block *gate
	var delay time.Duration
	if h != nil {
		block, delay = h.block, h.delay
		if block != nil {
			h.blocked++
		}
	}
	f.mu.Unlock()

	if block != nil {
		select {
		case <-block.ch:
		case <-c.done:
			err = libvirt.ErrInterrupted
		}
		f.mu.Lock()
		h.blocked--
		f.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-c.done:
			t.Stop()
			return nil, libvirt.ErrInterrupted
		}
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	if !c.IsConnected() {
		return nil, libvirt.ErrInterrupted
	}
	if h = f.hooks[rpc]; h == nil {
		return nil, nil
	}
	switch {
	case len(h.failNext) > 0:
		err, h.failNext = h.failNext[0], h.failNext[1:]
		return nil, err
	case h.fail != nil:
		return nil, h.fail
	case len(h.failAfter) > 0:
		after, h.failAfter = h.failAfter[0], h.failAfter[1:]
	}
	return after, nil
}

// do runs op under the daemon lock after the prologue.
func do[T any](c *Conn, rpc string, op func(f *Fake) (T, error)) (T, error) {
	var zero T
	after, err := c.enter(rpc)
	if err != nil {
		return zero, err
	}
	c.f.mu.Lock()
	v, err := op(c.f)
	c.f.mu.Unlock()
	if after != nil {
		return zero, after
	}
	return v, err
}

func do0(c *Conn, rpc string, op func(f *Fake) error) error {
	_, err := do(c, rpc, func(f *Fake) (struct{}, error) { return struct{}{}, op(f) })
	return err
}

// Daemon.

// ConnectGetLibVersion implements virt.Client.
func (c *Conn) ConnectGetLibVersion() (uint64, error) {
	return do(c, virt.RPCConnectGetLibVersion, func(f *Fake) (uint64, error) { return f.version, nil })
}

// ConnectGetHostname implements virt.Client.
func (c *Conn) ConnectGetHostname() (string, error) {
	return do(c, virt.RPCConnectGetHostname, func(f *Fake) (string, error) { return f.hostname, nil })
}

// Events.

// subscriber buffers events of one type without bound so the daemon never
// blocks on a slow consumer (go-libvirt queues them the same way).
type subscriber struct {
	id    libvirt.DomainEventID
	mu    sync.Mutex
	queue []any
	wake  chan struct{}
}

// LifecycleEvents implements virt.Client: every define, start, stop and
// undefine is delivered in order until ctx ends or the connection drops,
// then the channel is closed.
func (c *Conn) LifecycleEvents(ctx context.Context) (<-chan libvirt.DomainEventLifecycleMsg, error) {
	s, err := c.subscribe(virt.RPCConnectDomainEventRegisterAny, libvirt.DomainEventIDLifecycle)
	if err != nil {
		return nil, err
	}
	return pump(ctx, c, s, func(ev any) libvirt.DomainEventLifecycleMsg { return ev.(libvirt.DomainEventLifecycleMsg) }), nil
}

// SubscribeEvents implements virt.Client for the guest agent's lifecycle,
// delivered as go-libvirt does: *libvirt.DomainEventCallbackAgentLifecycleMsg.
// Other event types (and a domain filter) are refused as unsupported, so a
// caller relying on them fails loudly here rather than waiting forever.
func (c *Conn) SubscribeEvents(ctx context.Context, eventID libvirt.DomainEventID, dom libvirt.OptDomain) (<-chan interface{}, error) {
	if eventID != libvirt.DomainEventIDAgentLifecycle || len(dom) != 0 {
		return nil, do0(c, virt.RPCConnectDomainEventCallbackRegisterAny, func(*Fake) error {
			return lverr(libvirt.ErrArgumentUnsupported, "fake: event %d (domain filter %d) not supported", eventID, len(dom))
		})
	}
	s, err := c.subscribe(virt.RPCConnectDomainEventCallbackRegisterAny, eventID)
	if err != nil {
		return nil, err
	}
	return pump(ctx, c, s, func(ev any) interface{} { return ev }), nil
}

func (c *Conn) subscribe(rpc string, id libvirt.DomainEventID) (*subscriber, error) {
	s := &subscriber{id: id, wake: make(chan struct{}, 1)}
	if err := do0(c, rpc, func(f *Fake) error {
		f.subs[s] = struct{}{}
		return nil
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// pump delivers s's events in order until ctx ends or the connection drops,
// then unsubscribes and closes the channel.
func pump[T any](ctx context.Context, c *Conn, s *subscriber, conv func(any) T) <-chan T {
	out := make(chan T)
	go func() {
		defer close(out)
		defer func() {
			c.f.mu.Lock()
			delete(c.f.subs, s)
			c.f.mu.Unlock()
		}()
		for {
			s.mu.Lock()
			q := s.queue
			s.queue = nil
			s.mu.Unlock()
			for _, ev := range q {
				select {
				case out <- conv(ev):
				case <-ctx.Done():
					return
				case <-c.done:
					return
				}
			}
			select {
			case <-s.wake:
			case <-ctx.Done():
				return
			case <-c.done:
				return
			}
		}
	}()
	return out
}

// emit queues a lifecycle event for every subscriber. Caller holds f.mu.
func (f *Fake) emit(d *domain, event libvirt.DomainEventType, detail int32) {
	f.publish(libvirt.DomainEventIDLifecycle, libvirt.DomainEventLifecycleMsg{Dom: d.handle(), Event: int32(event), Detail: detail})
}

// emitAgent queues a guest agent lifecycle event. Caller holds f.mu.
func (f *Fake) emitAgent(d *domain, state libvirt.ConnectDomainEventAgentLifecycleState, reason libvirt.ConnectDomainEventAgentLifecycleReason) {
	f.publish(libvirt.DomainEventIDAgentLifecycle, &libvirt.DomainEventCallbackAgentLifecycleMsg{Dom: d.handle(), State: int32(state), Reason: int32(reason)})
}

func (f *Fake) publish(id libvirt.DomainEventID, ev any) {
	for s := range f.subs {
		if s.id != id {
			continue
		}
		s.mu.Lock()
		s.queue = append(s.queue, ev)
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}
