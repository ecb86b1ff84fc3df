package controllers

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// proxyMemory is what the Proxy reconciler remembers of each Proxy between
// reconciles and keeps out of its status: writing it there would cost a
// status write per look, or it is about this process alone (a probe under
// way, a port watch's report). A restarted manager starts with none of it,
// so each use falls back on the conditions' evidence.
//
// The event bridge and the port watch call in from their own goroutines,
// possibly before the reconciler is set up: the zero value is ready to use
// and every method takes the lock.
type proxyMemory struct {
	mu sync.Mutex
	// synced: when each Proxy's instance was last read from its provider.
	synced map[types.NamespacedName]time.Time
	// waiting: since when each Proxy has waited for its address.
	waiting map[types.NamespacedName]time.Time
	// probeBackoff: the next requeue of each Proxy probed but never yet
	// healthy (see firstProbeBackoff).
	probeBackoff map[types.NamespacedName]time.Duration
	// portOpened: where (host:port) the port watch saw each Proxy's port
	// accept, until the reconcile it woke takes it.
	portOpened map[types.NamespacedName]string
	// probing: how to interrupt each Proxy's probe under way.
	probing map[types.NamespacedName]context.CancelFunc
	// echoes: each Proxy's last egress echo attempt.
	echoes map[types.NamespacedName]echoAttempt
}

// echoAttempt is when an echo last measured a Proxy's egress, of which
// instance (address and provider id), whether it worked, and the address
// it measured (the last one that worked).
type echoAttempt struct {
	at       time.Time
	instance string
	ok       bool
	measured string
	// measuredAt: when measured was.
	measuredAt time.Time
}

// lock takes the lock, making the maps on first use.
func (m *proxyMemory) lock() {
	m.mu.Lock()
	if m.synced == nil {
		m.synced = map[types.NamespacedName]time.Time{}
		m.waiting = map[types.NamespacedName]time.Time{}
		m.probeBackoff = map[types.NamespacedName]time.Duration{}
		m.portOpened = map[types.NamespacedName]string{}
		m.probing = map[types.NamespacedName]context.CancelFunc{}
		m.echoes = map[types.NamespacedName]echoAttempt{}
	}
}

// markDirty makes the next reconcile of key re-read its instance (a
// provider event says it changed).
func (m *proxyMemory) markDirty(key types.NamespacedName) {
	m.lock()
	defer m.mu.Unlock()
	delete(m.synced, key)
}

// markSynced records that key's instance was read at now.
func (m *proxyMemory) markSynced(key types.NamespacedName, now time.Time) {
	m.lock()
	defer m.mu.Unlock()
	m.synced[key] = now
}

// readWithin: key's instance was read less than d before now and no
// provider event about it came since.
func (m *proxyMemory) readWithin(key types.NamespacedName, d time.Duration, now time.Time) bool {
	m.lock()
	defer m.mu.Unlock()
	t, ok := m.synced[key]
	return ok && now.Sub(t) < d
}

// waitingSince is when key began waiting for its address: now, the first
// time it is asked.
func (m *proxyMemory) waitingSince(key types.NamespacedName, now time.Time) time.Time {
	m.lock()
	defer m.mu.Unlock()
	t, ok := m.waiting[key]
	if !ok {
		t = now
		m.waiting[key] = t
	}
	return t
}

// stopWaiting: key has its address; a later wait starts afresh.
func (m *proxyMemory) stopWaiting(key types.NamespacedName) {
	m.lock()
	defer m.mu.Unlock()
	delete(m.waiting, key)
}

// nextProbeBackoff returns the requeue after a failed probe of a Proxy that
// has never been healthy: start says it is booting (first probe, or not
// Ready since provisioned), which begins the backoff if it has not begun;
// false means the Proxy is not backing off (it was healthy before). Each
// step doubles the last, up to ceiling.
func (m *proxyMemory) nextProbeBackoff(key types.NamespacedName, start bool, ceiling time.Duration) (time.Duration, bool) {
	m.lock()
	defer m.mu.Unlock()
	d, ok := m.probeBackoff[key]
	if !ok {
		if !start {
			return 0, false
		}
		d = firstProbeBackoff
	}
	d = min(d, ceiling)
	m.probeBackoff[key] = min(2*d, ceiling)
	return d, true
}

// inProbeBackoff: key is booting by this manager's memory, which outlasts
// the conditions' evidence (an instance started again is booting, but its
// first failed probe replaces the InstanceNotRunning verdict).
func (m *proxyMemory) inProbeBackoff(key types.NamespacedName) bool {
	m.lock()
	defer m.mu.Unlock()
	_, ok := m.probeBackoff[key]
	return ok
}

// endProbeBackoff: key served; a later failure is no longer booting.
func (m *proxyMemory) endProbeBackoff(key types.NamespacedName) {
	m.lock()
	defer m.mu.Unlock()
	delete(m.probeBackoff, key)
}

// notePortOpened keeps the port watch's report that key's port accepted
// at address (host:port) for the reconcile it wakes.
func (m *proxyMemory) notePortOpened(key types.NamespacedName, address string) {
	m.lock()
	defer m.mu.Unlock()
	m.portOpened[key] = address
}

// takePortOpened returns and drops the port watch's report for key: each
// report wakes one reconcile.
func (m *proxyMemory) takePortOpened(key types.NamespacedName) (string, bool) {
	m.lock()
	defer m.mu.Unlock()
	address, ok := m.portOpened[key]
	delete(m.portOpened, key)
	return address, ok
}

// startProbe returns the context of key's probe, which interruptProbe
// cancels, and the func that ends it. One reconcile per Proxy runs at a
// time, so there is at most one probe per key.
func (m *proxyMemory) startProbe(ctx context.Context, key types.NamespacedName) (context.Context, func()) {
	probeCtx, cancel := context.WithCancel(ctx)
	m.lock()
	m.probing[key] = cancel
	m.mu.Unlock()
	return probeCtx, func() {
		m.lock()
		delete(m.probing, key)
		m.mu.Unlock()
		cancel()
	}
}

// interruptProbe cancels key's probe under way, if any.
func (m *proxyMemory) interruptProbe(key types.NamespacedName) {
	m.lock()
	defer m.mu.Unlock()
	if cancel, ok := m.probing[key]; ok {
		cancel()
	}
}

// forget drops what is remembered of key, but a probe under way: it ends
// by itself, with the reconcile that started it.
func (m *proxyMemory) forget(key types.NamespacedName) {
	m.lock()
	defer m.mu.Unlock()
	delete(m.synced, key)
	delete(m.waiting, key)
	delete(m.probeBackoff, key)
	delete(m.portOpened, key)
	delete(m.echoes, key)
}

// echoDue: key's egress is to be measured now. The first time (this
// process has not measured it), when the instance changed since, an
// interval after the last success, or retry after the last failure.
func (m *proxyMemory) echoDue(key types.NamespacedName, instance string, now time.Time, interval, retry time.Duration) bool {
	m.lock()
	defer m.mu.Unlock()
	a, ok := m.echoes[key]
	if !ok || a.instance != instance {
		return true
	}
	if a.ok {
		return !now.Before(a.at.Add(interval))
	}
	return !now.Before(a.at.Add(retry))
}

// echoed records an echo attempt on key's instance and, when it worked,
// the address it measured.
func (m *proxyMemory) echoed(key types.NamespacedName, instance string, now time.Time, measured string) {
	m.lock()
	defer m.mu.Unlock()
	a := echoAttempt{at: now, instance: instance, ok: measured != ""}
	if old, same := m.echoes[key]; same && old.instance == instance {
		a.measured, a.measuredAt = old.measured, old.measuredAt
	}
	if a.ok {
		a.measured, a.measuredAt = measured, now
	}
	m.echoes[key] = a
}

// lastEcho is the last address an echo measured on key's instance, and
// when ("" if none did).
func (m *proxyMemory) lastEcho(key types.NamespacedName, instance string) (string, time.Time) {
	m.lock()
	defer m.mu.Unlock()
	a, ok := m.echoes[key]
	if !ok || a.instance != instance {
		return "", time.Time{}
	}
	return a.measured, a.measuredAt
}
