package portwatch

import (
	"context"
	"errors"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"crawl.example.com/proxy-operator/internal/testutil"
)

// opened records the keys and addresses open was called with, as
// "key@address".
type opened struct {
	mu   sync.Mutex
	keys []string
}

func (o *opened) open(k, address string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.keys = append(o.keys, k+"@"+address)
}

func (o *opened) get() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.keys)
}

// closedPort is a loopback address where nothing listens (yet): a port
// that was free a moment ago.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// listen starts accepting on addr, as squid does once it has started.
func listen(t *testing.T, addr string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	testutil.AcceptAndClose(l)
}

// countingDial dials for real and counts the attempts per address.
type countingDial struct {
	mu    sync.Mutex
	calls map[string]int
}

func (d *countingDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	if d.calls == nil {
		d.calls = map[string]int{}
	}
	d.calls[addr]++
	d.mu.Unlock()
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

func (d *countingDial) count(addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[addr]
}

func TestWatchOpensOnceWhenAListenerAppears(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got opened
	d := &countingDial{}
	w := New(ctx, Options{Interval: 5 * time.Millisecond, Dial: d.dial}, got.open)
	addr := closedPort(t)
	if !w.Watch("ns/p", addr) {
		t.Fatal("first Watch started nothing")
	}
	if w.Watch("ns/p", addr) {
		t.Fatal("a second Watch of the same address started another watch")
	}
	if n := w.Running(); n != 1 {
		t.Fatalf("%d watches running, want 1", n)
	}
	// Some refused dials first: the port is closed while the guest boots.
	testutil.WaitFor(t, func() bool { return d.count(addr) >= 3 })
	if k := got.get(); len(k) != 0 {
		t.Fatalf("opened %v while nothing listened", k)
	}
	listen(t, addr)
	testutil.WaitFor(t, func() bool { return w.Running() == 0 })
	if k := got.get(); !slices.Equal(k, []string{"ns/p@" + addr}) {
		t.Fatalf("opened %v, want [ns/p@%s]", k, addr)
	}
	// Done with this address: watching it again does nothing (a port that
	// accepts while the proxy does not serve yet is the probe's backoff's).
	if w.Watch("ns/p", addr) {
		t.Fatal("the same address was watched again after it opened")
	}
	// Until it is forgotten.
	w.Forget("ns/p")
	if !w.Watch("ns/p", addr) {
		t.Fatal("no watch after Forget")
	}
	testutil.WaitFor(t, func() bool { return len(got.get()) == 2 })
}

// TestWatchStops: a watch ends, without calling Open, when its key is
// forgotten, its address replaced, the Watcher's context ends or it ran
// MaxDuration.
func TestWatchStops(t *testing.T) {
	cases := []struct {
		name        string
		maxDuration time.Duration
		// act ends the watch of key "p" on addr; other is a second closed
		// address.
		act func(w *Watcher[string], cancel context.CancelFunc, other string)
		// wantWatching: addresses of "p" still watched after act.
		wantWatching int
	}{
		{name: "forgotten (deleted, or healthy)", act: func(w *Watcher[string], _ context.CancelFunc, _ string) { w.Forget("p") }},
		{name: "context ended (manager stops)", act: func(_ *Watcher[string], cancel context.CancelFunc, _ string) { cancel() }},
		{name: "address changed", wantWatching: 1, act: func(w *Watcher[string], _ context.CancelFunc, other string) {
			if !w.Watch("p", other) {
				panic("the new address was not watched")
			}
		}},
		{name: "max duration", maxDuration: 30 * time.Millisecond, act: func(*Watcher[string], context.CancelFunc, string) {}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var got opened
			d := &countingDial{}
			w := New(ctx, Options{Interval: 5 * time.Millisecond, MaxDuration: tc.maxDuration, Dial: d.dial}, got.open)
			addr, other := closedPort(t), closedPort(t)
			w.Watch("p", addr)
			testutil.WaitFor(t, func() bool { return d.count(addr) >= 1 })
			tc.act(w, cancel, other)
			testutil.WaitFor(t, func() bool { return w.Running() == tc.wantWatching })
			// The old address opens now: nobody must hear of it.
			before := d.count(addr)
			listen(t, addr)
			time.Sleep(50 * time.Millisecond) // ten intervals
			if k := got.get(); len(k) != 0 {
				t.Fatalf("opened %v after the watch of %s ended", k, addr)
			}
			if n := d.count(addr); n > before+1 {
				t.Fatalf("%s dialed %d more times after its watch ended", addr, n-before)
			}
			if tc.wantWatching == 1 {
				listen(t, other)
				testutil.WaitFor(t, func() bool { return len(got.get()) == 1 })
				if k := got.get(); k[0] != "p@"+other {
					t.Fatalf("opened %v, want the new address p@%s", k, other)
				}
			}
		})
	}
}

// TestMaxInFlightBoundsConcurrentDials: dials that hang (a firewall
// dropping SYNs) hold at most MaxInFlight tokens, whatever the number of
// watches.
func TestMaxInFlightBoundsConcurrentDials(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var inFlight, peak, total atomic.Int64
	hang := func(ctx context.Context, _, _ string) (net.Conn, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		total.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	const bound, watches = 3, 40
	w := New(ctx, Options{Interval: time.Millisecond, DialTimeout: time.Hour, MaxInFlight: bound, Dial: hang}, func(string, string) {})
	for i := range watches {
		w.Watch(string(rune('a'+i)), "192.0.2.1:3128") // never dialed for real
	}
	testutil.WaitFor(t, func() bool { return inFlight.Load() == bound })
	time.Sleep(20 * time.Millisecond) // room for a dial beyond the bound to show
	if p := peak.Load(); p != bound {
		t.Fatalf("peak %d dials in flight, want %d", p, bound)
	}
	if n := total.Load(); n != bound {
		t.Fatalf("%d dials started while %d hang, want %d", n, bound, bound)
	}
	cancel()
	w.Wait()
}

// refusingDial refuses every dial at once, recording when (on clk) it
// was asked.
type refusingDial struct {
	clk *clocktesting.FakeClock
	mu  sync.Mutex
	at  []time.Time
}

func (d *refusingDial) dial(context.Context, string, string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = append(d.at, d.clk.Now())
	return nil, syscall.ECONNREFUSED
}

func (d *refusingDial) times() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.at)
}

// runFor steps clk by step until span has passed, letting every watch get
// back to its timer between steps.
func runFor(t *testing.T, clk *clocktesting.FakeClock, w *Watcher[string], span, step time.Duration) {
	t.Helper()
	for elapsed := time.Duration(0); elapsed < span; elapsed += step {
		clk.Step(step)
		testutil.WaitFor(t, func() bool { return clk.Waiters() == w.Running() })
	}
}

// TestDialRate: one booting proxy costs one dial per Interval; many share
// MaxDialsPerSecond, each dial start at least 1/MaxDialsPerSecond after the
// previous one.
func TestDialRate(t *testing.T) {
	cases := []struct {
		name     string
		watches  int
		rate     float64
		span     time.Duration
		wantMin  int
		wantMax  int
		wantGap  time.Duration
		interval time.Duration
	}{
		// 250 ms: 4 dials/s for each booting proxy, the first one interval
		// after the watch began.
		{name: "one watch dials every interval", watches: 1, rate: DefaultMaxDialsPerSecond, interval: DefaultInterval,
			span: 10 * time.Second, wantMin: 40, wantMax: 40},
		// From the first interval on, 100/s: 201 dials in the 2 s that
		// follow it, bounds included.
		{name: "a thousand watches share the rate", watches: 1000, rate: 100, interval: DefaultInterval,
			span: DefaultInterval + 2*time.Second, wantMin: 200, wantMax: 201, wantGap: 10 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			d := &refusingDial{clk: clk}
			w := New(ctx, Options{Interval: tc.interval, MaxDialsPerSecond: tc.rate, MaxDuration: time.Hour, Dial: d.dial, Clock: clk}, func(string, string) {})
			for i := range tc.watches {
				w.Watch(string(rune(0x4e00+i)), "192.0.2.1:3128")
			}
			testutil.WaitFor(t, func() bool { return clk.Waiters() == tc.watches })
			runFor(t, clk, w, tc.span, 5*time.Millisecond)
			at := d.times()
			if len(at) < tc.wantMin || len(at) > tc.wantMax {
				t.Fatalf("%d dials in %s, want %d..%d", len(at), tc.span, tc.wantMin, tc.wantMax)
			}
			for i := 1; i < len(at); i++ {
				if gap := at[i].Sub(at[i-1]); gap < tc.wantGap {
					t.Fatalf("dials %d and %d only %s apart, want >= %s", i-1, i, gap, tc.wantGap)
				}
			}
			cancel()
			w.Wait()
		})
	}
}

// TestNoGoroutineLeft: every watch's goroutine ends with the Watcher's
// context, including those waiting for their turn to dial.
func TestNoGoroutineLeft(t *testing.T) {
	before := settledGoroutines()
	ctx, cancel := context.WithCancel(context.Background())
	var dials atomic.Int64
	refuse := func(context.Context, string, string) (net.Conn, error) {
		dials.Add(1)
		return nil, errors.New("connection refused")
	}
	w := New(ctx, Options{Interval: time.Millisecond, MaxDialsPerSecond: 50, Dial: refuse}, func(string, string) {})
	for i := range 200 {
		w.Watch(string(rune(0x4e00+i)), "192.0.2.1:3128")
	}
	testutil.WaitFor(t, func() bool { return dials.Load() >= 2 })
	if during := runtime.NumGoroutine(); during < before+200 {
		t.Fatalf("%d goroutines while watching, want at least %d (one per watch)", during, before+200)
	}
	cancel()
	w.Wait()
	if n := w.Running(); n != 0 {
		t.Fatalf("%d watches still running", n)
	}
	testutil.WaitFor(t, func() bool { return runtime.NumGoroutine() <= before })
	if w.Watch("late", "192.0.2.1:3128") {
		t.Fatal("a watch started after the context ended")
	}
}

// settledGoroutines is the goroutine count once the other tests' have
// finished exiting (a WaitGroup is done just before its goroutine ends).
func settledGoroutines() int {
	n := runtime.NumGoroutine()
	for range 100 {
		time.Sleep(10 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			return n
		}
		n = m
	}
	return n
}

// BenchmarkDialClosedPort is what one look of a watch costs while the
// guest's squid is not up: a dial to a loopback port that refuses. cpu-us/dial
// is the process's user+system CPU (wall time moves with the machine's load).
func BenchmarkDialClosedPort(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	w := New(context.Background(), Options{}, func(string, string) {})
	before := cpuTime(b)
	for b.Loop() {
		if w.dial(context.Background(), addr) {
			b.Fatal("the closed port accepted")
		}
	}
	b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(b.N), "cpu-us/dial")
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
