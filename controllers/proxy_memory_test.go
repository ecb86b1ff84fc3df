package controllers

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

var (
	memKey   = types.NamespacedName{Namespace: "ns", Name: "p"}
	otherKey = types.NamespacedName{Namespace: "ns", Name: "q"}
	memT0    = time.Unix(1000, 0)
)

// TestProxyMemoryReadWithin: a read counts for d after it, until a
// provider event (markDirty) or forget; another Proxy's read or event is
// not this one's.
func TestProxyMemoryReadWithin(t *testing.T) {
	cases := []struct {
		name string
		ops  func(m *proxyMemory)
		// since: how long after memT0 the question is asked.
		since time.Duration
		want  bool
	}{
		{"never read", func(*proxyMemory) {}, 0, false},
		{"read just now", func(m *proxyMemory) { m.markSynced(memKey, memT0) }, 0, true},
		{"read within d", func(m *proxyMemory) { m.markSynced(memKey, memT0) }, 29 * time.Second, true},
		{"read exactly d ago", func(m *proxyMemory) { m.markSynced(memKey, memT0) }, 30 * time.Second, false},
		{"read, then a provider event", func(m *proxyMemory) { m.markSynced(memKey, memT0); m.markDirty(memKey) }, time.Second, false},
		{"event, then read again", func(m *proxyMemory) {
			m.markSynced(memKey, memT0.Add(-time.Hour))
			m.markDirty(memKey)
			m.markSynced(memKey, memT0)
		}, time.Second, true},
		{"another Proxy read", func(m *proxyMemory) { m.markSynced(otherKey, memT0) }, 0, false},
		{"another Proxy's event", func(m *proxyMemory) { m.markSynced(memKey, memT0); m.markDirty(otherKey) }, 0, true},
		{"forgotten", func(m *proxyMemory) { m.markSynced(memKey, memT0); m.forget(memKey) }, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m proxyMemory
			tc.ops(&m)
			if got := m.readWithin(memKey, 30*time.Second, memT0.Add(tc.since)); got != tc.want {
				t.Fatalf("readWithin = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestProxyMemoryProbeBackoff: the backoff begins only for a booting
// Proxy, doubles from firstProbeBackoff up to the ceiling, goes on once
// begun whatever start says, and ends with endProbeBackoff or forget.
func TestProxyMemoryProbeBackoff(t *testing.T) {
	type step struct {
		start  bool
		want   time.Duration
		wantOK bool
	}
	const ms = time.Millisecond
	cases := []struct {
		name    string
		ceiling time.Duration
		steps   []step
		// then runs after the steps; wantAfter is inProbeBackoff then.
		then      func(t *testing.T, m *proxyMemory)
		wantAfter bool
	}{
		{name: "booting doubles up to the ceiling", ceiling: 5 * time.Second,
			steps:     []step{{true, 500 * ms, true}, {true, time.Second, true}, {true, 2 * time.Second, true}, {true, 4 * time.Second, true}, {true, 5 * time.Second, true}, {true, 5 * time.Second, true}},
			wantAfter: true},
		{name: "not booting never begins", ceiling: 5 * time.Second,
			steps: []step{{false, 0, false}, {false, 0, false}}},
		{name: "once begun it goes on", ceiling: 5 * time.Second,
			steps:     []step{{true, 500 * ms, true}, {false, time.Second, true}, {false, 2 * time.Second, true}},
			wantAfter: true},
		{name: "a ceiling below the first step", ceiling: 200 * ms,
			steps:     []step{{true, 200 * ms, true}, {true, 200 * ms, true}},
			wantAfter: true},
		{name: "ended", ceiling: 5 * time.Second,
			steps: []step{{true, 500 * ms, true}, {true, time.Second, true}},
			then:  func(_ *testing.T, m *proxyMemory) { m.endProbeBackoff(memKey) }},
		{name: "ended, booting again starts from the first step", ceiling: 5 * time.Second,
			steps: []step{{true, 500 * ms, true}, {true, time.Second, true}},
			then: func(t *testing.T, m *proxyMemory) {
				m.endProbeBackoff(memKey)
				if d, _ := m.nextProbeBackoff(memKey, true, 5*time.Second); d != firstProbeBackoff {
					t.Fatalf("restarted at %v, want %v", d, firstProbeBackoff)
				}
			},
			wantAfter: true},
		{name: "forgotten", ceiling: 5 * time.Second,
			steps: []step{{true, 500 * ms, true}},
			then:  func(_ *testing.T, m *proxyMemory) { m.forget(memKey) }},
		{name: "another Proxy's backoff", ceiling: 5 * time.Second,
			steps: []step{{true, 500 * ms, true}},
			then:  func(_ *testing.T, m *proxyMemory) { m.endProbeBackoff(otherKey) }, wantAfter: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m proxyMemory
			for i, s := range tc.steps {
				d, ok := m.nextProbeBackoff(memKey, s.start, tc.ceiling)
				if d != s.want || ok != s.wantOK {
					t.Fatalf("step %d (start %v): %v, %v; want %v, %v", i, s.start, d, ok, s.want, s.wantOK)
				}
			}
			if tc.then != nil {
				tc.then(t, &m)
			}
			if got := m.inProbeBackoff(memKey); got != tc.wantAfter {
				t.Fatalf("inProbeBackoff = %v, want %v", got, tc.wantAfter)
			}
		})
	}
}

// TestProxyMemoryWaitingSince: the wait for an address dates from the
// first time it was asked about, until stopWaiting or forget.
func TestProxyMemoryWaitingSince(t *testing.T) {
	cases := []struct {
		name string
		// between runs after a first waitingSince at memT0; the second is
		// asked a minute later.
		between func(m *proxyMemory)
		want    time.Time
	}{
		{"still waiting", func(*proxyMemory) {}, memT0},
		{"got its address", func(m *proxyMemory) { m.stopWaiting(memKey) }, memT0.Add(time.Minute)},
		{"forgotten", func(m *proxyMemory) { m.forget(memKey) }, memT0.Add(time.Minute)},
		{"another Proxy got its address", func(m *proxyMemory) { m.stopWaiting(otherKey) }, memT0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m proxyMemory
			if got := m.waitingSince(memKey, memT0); !got.Equal(memT0) {
				t.Fatalf("first waitingSince = %v, want %v", got, memT0)
			}
			tc.between(&m)
			if got := m.waitingSince(memKey, memT0.Add(time.Minute)); !got.Equal(tc.want) {
				t.Fatalf("waitingSince = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestProxyMemoryPortOpened: a port watch's report is taken once, by the
// reconcile it woke; the latest report wins; forget drops it.
func TestProxyMemoryPortOpened(t *testing.T) {
	cases := []struct {
		name     string
		ops      func(m *proxyMemory)
		want     string
		wantOK   bool
		takeMore bool // a second take finds nothing
	}{
		{name: "no report", ops: func(*proxyMemory) {}},
		{name: "a report", ops: func(m *proxyMemory) { m.notePortOpened(memKey, "10.0.0.5:3128") }, want: "10.0.0.5:3128", wantOK: true},
		{name: "the latest report", ops: func(m *proxyMemory) {
			m.notePortOpened(memKey, "10.0.0.4:3128")
			m.notePortOpened(memKey, "10.0.0.5:3128")
		}, want: "10.0.0.5:3128", wantOK: true},
		{name: "another Proxy's report", ops: func(m *proxyMemory) { m.notePortOpened(otherKey, "10.0.0.5:3128") }},
		{name: "forgotten", ops: func(m *proxyMemory) { m.notePortOpened(memKey, "10.0.0.5:3128"); m.forget(memKey) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m proxyMemory
			tc.ops(&m)
			got, ok := m.takePortOpened(memKey)
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("takePortOpened = %q, %v; want %q, %v", got, ok, tc.want, tc.wantOK)
			}
			if got, ok := m.takePortOpened(memKey); ok {
				t.Fatalf("a second take found %q: a report must wake one reconcile", got)
			}
		})
	}
}

// TestProxyMemoryInterruptProbe: interruptProbe cancels the Proxy's probe
// under way and nothing else: not another Proxy's, not one that ended,
// and forget leaves a probe under way to its reconcile.
func TestProxyMemoryInterruptProbe(t *testing.T) {
	cases := []struct {
		name string
		// act runs while memKey's probe is under way.
		act           func(m *proxyMemory)
		wantCancelled bool
	}{
		{"interrupted", func(m *proxyMemory) { m.interruptProbe(memKey) }, true},
		{"another Proxy interrupted", func(m *proxyMemory) { m.interruptProbe(otherKey) }, false},
		{"forgotten, then interrupted", func(m *proxyMemory) { m.forget(memKey); m.interruptProbe(memKey) }, true},
		{"a provider event alone", func(m *proxyMemory) { m.markDirty(memKey) }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m proxyMemory
			ctx, end := m.startProbe(context.Background(), memKey)
			defer end()
			tc.act(&m)
			if got := ctx.Err() != nil; got != tc.wantCancelled {
				t.Fatalf("probe cancelled = %v, want %v", got, tc.wantCancelled)
			}
		})
	}
	t.Run("after the probe ended", func(t *testing.T) {
		var m proxyMemory
		_, end := m.startProbe(context.Background(), memKey)
		end()
		next, endNext := m.startProbe(context.Background(), otherKey)
		defer endNext()
		m.interruptProbe(memKey)
		if next.Err() != nil {
			t.Fatal("interrupting an ended probe cancelled another")
		}
		m.lock()
		defer m.mu.Unlock()
		if _, ok := m.probing[memKey]; ok {
			t.Fatal("an ended probe is still recorded")
		}
	})
}

// TestProxyMemoryConcurrentCallers: the event bridge and the port watch
// call from their own goroutines while reconciles run, starting before
// anything else touched the memory (go test -race checks the locking).
func TestProxyMemoryConcurrentCallers(t *testing.T) {
	var m proxyMemory
	var wg sync.WaitGroup
	for i := range 8 {
		key := types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("p%d", i%3)}
		wg.Add(3)
		go func() { // the event bridge
			defer wg.Done()
			for range 100 {
				m.markDirty(key)
				m.interruptProbe(key)
			}
		}()
		go func() { // the port watch
			defer wg.Done()
			for range 100 {
				m.notePortOpened(key, "10.0.0.5:3128")
			}
		}()
		go func() { // a reconcile
			defer wg.Done()
			for range 100 {
				m.markSynced(key, memT0)
				m.readWithin(key, time.Minute, memT0)
				m.takePortOpened(key)
				_, end := m.startProbe(context.Background(), key)
				m.nextProbeBackoff(key, true, time.Second)
				m.waitingSince(key, memT0)
				end()
				m.forget(key)
			}
		}()
	}
	wg.Wait()
	m.lock()
	defer m.mu.Unlock()
	if len(m.probing) != 0 {
		t.Fatalf("%d probes left recorded after every probe ended", len(m.probing))
	}
}
