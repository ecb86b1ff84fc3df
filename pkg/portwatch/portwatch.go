// Package portwatch tells, soon after it happens, that a TCP port begins to
// accept connections: a booting proxy's squid opens its port tens of
// seconds after the instance got its address, and the reconciler's own
// probe, which writes status on each failure, backs off to the provision
// poll interval long before that. A watch only dials: it writes nothing and
// holds no reconcile worker, and when the port accepts it calls Open once
// so the caller can run its real probe at once.
//
// Dials are bounded fleet-wide, not just per port: at most MaxInFlight at
// once and MaxDialsPerSecond in all, so a thousand instances booting
// together cost a fixed budget and each is simply dialed less often.
package portwatch

import (
	"context"
	"net"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Defaults of Options.
const (
	// DefaultInterval between two dials of one address: a port that opens
	// is noticed after half of it on average.
	DefaultInterval = 250 * time.Millisecond
	// DefaultDialTimeout bounds a dial whose SYN goes unanswered (a
	// firewall that drops, a guest not up yet).
	DefaultDialTimeout = time.Second
	// DefaultMaxDuration: a port still closed this long after its watch
	// began is left to the reconciler's poll.
	DefaultMaxDuration = 10 * time.Minute
	// DefaultMaxInFlight dials at once, over all watches.
	DefaultMaxInFlight = 32
	// DefaultMaxDialsPerSecond over all watches: a refused dial costs
	// about 35 µs of CPU on loopback, so this is under 2% of one core; it
	// keeps 125 booting proxies at the full Interval and spreads more.
	DefaultMaxDialsPerSecond = 500
)

// Options configure a Watcher; zero values take the defaults.
type Options struct {
	Interval          time.Duration
	DialTimeout       time.Duration
	MaxDuration       time.Duration
	MaxInFlight       int
	MaxDialsPerSecond float64
	// Dial is net.Dialer's DialContext unless set (tests, or a harness
	// whose addresses are not real).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Clock is the real clock unless set.
	Clock clock.WithTicker
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.MaxDuration <= 0 {
		o.MaxDuration = DefaultMaxDuration
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.MaxDialsPerSecond <= 0 {
		o.MaxDialsPerSecond = DefaultMaxDialsPerSecond
	}
	if o.Dial == nil {
		o.Dial = (&net.Dialer{}).DialContext
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o
}

// Watcher runs at most one watch per key.
type Watcher[K comparable] struct {
	opts Options
	ctx  context.Context
	open func(K, string)
	// inFlight holds a token per dial under way.
	inFlight chan struct{}
	// gap between two dial starts, fleet-wide.
	gap time.Duration

	mu sync.Mutex
	// watches: the current watch of each key, kept after it ended (port
	// opened, or MaxDuration passed) so the same address is not watched
	// again until Forget.
	watches map[K]*watch
	// nextDial: the earliest start of the next dial (see pace).
	nextDial time.Time
	running  int
	wg       sync.WaitGroup
}

type watch struct {
	address string
	cancel  context.CancelFunc
}

// New returns a Watcher whose watches end when ctx does. open is called,
// from a watch's goroutine, with key and the address whose port accepted a
// connection; it should not block for long.
func New[K comparable](ctx context.Context, opts Options, open func(key K, address string)) *Watcher[K] {
	opts = opts.withDefaults()
	return &Watcher[K]{
		opts:     opts,
		ctx:      ctx,
		open:     open,
		inFlight: make(chan struct{}, opts.MaxInFlight),
		gap:      time.Duration(float64(time.Second) / opts.MaxDialsPerSecond),
		watches:  map[K]*watch{},
	}
}

// Watch makes sure address (host:port) is watched for key. A watch of
// another address for key is stopped first. Watching an address that this
// key already watches, or watched until it opened or timed out, does
// nothing: a port that accepts but whose proxy does not yet serve must not
// turn into a loop of reconciles. It reports whether a watch started.
func (w *Watcher[K]) Watch(key K, address string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, ok := w.watches[key]; ok {
		if old.address == address {
			return false
		}
		old.cancel()
	}
	if w.ctx.Err() != nil {
		return false
	}
	ctx, cancel := context.WithCancel(w.ctx)
	wt := &watch{address: address, cancel: cancel}
	w.watches[key] = wt
	w.running++
	w.wg.Add(1)
	go w.run(ctx, key, wt)
	return true
}

// Forget stops key's watch and drops what is remembered of it: the next
// Watch of key starts afresh.
func (w *Watcher[K]) Forget(key K) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, ok := w.watches[key]; ok {
		old.cancel()
		delete(w.watches, key)
	}
}

// Running is the number of watches still dialing.
func (w *Watcher[K]) Running() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.running
}

// Wait returns when every watch has ended (after ctx of New ended, or
// each was forgotten, opened or timed out).
func (w *Watcher[K]) Wait() { w.wg.Wait() }

func (w *Watcher[K]) run(ctx context.Context, key K, wt *watch) {
	defer w.wg.Done()
	defer func() {
		w.mu.Lock()
		w.running--
		w.mu.Unlock()
	}()
	clk := w.opts.Clock
	deadline := clk.Now().Add(w.opts.MaxDuration)
	// The caller has just found the port closed: the first dial waits an
	// interval too.
	timer := clk.NewTimer(w.opts.Interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		}
		if !clk.Now().Before(deadline) {
			return
		}
		if !w.pace(ctx) {
			return
		}
		if w.dial(ctx, wt.address) {
			w.mu.Lock()
			current := w.watches[key] == wt && ctx.Err() == nil
			w.mu.Unlock()
			if current {
				w.open(key, wt.address)
			}
			return
		}
		timer.Reset(w.opts.Interval)
	}
}

// pace waits for this dial's turn: dial starts are at least gap apart over
// all watches, in the order they asked.
func (w *Watcher[K]) pace(ctx context.Context) bool {
	w.mu.Lock()
	now := w.opts.Clock.Now()
	start := w.nextDial
	if start.Before(now) {
		start = now
	}
	w.nextDial = start.Add(w.gap)
	w.mu.Unlock()
	wait := start.Sub(now)
	if wait <= 0 {
		return ctx.Err() == nil
	}
	t := w.opts.Clock.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// dial reports whether address accepted a connection, within MaxInFlight.
func (w *Watcher[K]) dial(ctx context.Context, address string) bool {
	select {
	case w.inFlight <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-w.inFlight }()
	dctx, cancel := context.WithTimeout(ctx, w.opts.DialTimeout)
	defer cancel()
	c, err := w.opts.Dial(dctx, "tcp", address)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}
