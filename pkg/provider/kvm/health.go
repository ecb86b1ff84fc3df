package kvm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
)

// HostHealth is what one successful probe learned about a host.
type HostHealth struct {
	LibvirtVersion string
	Hostname       string
	Pool           PoolHealth
	Capacity       CapacityHealth
}

// CapacityHealth is the host's size and what its running domains take.
type CapacityHealth struct {
	CPUs int32
	// MemoryBytes is physical memory; FreeMemoryBytes what a new VM can
	// get (free, buffers and page cache).
	MemoryBytes     uint64
	FreeMemoryBytes uint64
	// Of the running domains, whoever made them.
	RunningDomains       int32
	AllocatedVCPUs       int32
	AllocatedMemoryBytes uint64
}

// PoolHealth is the host's storage pool.
type PoolHealth struct {
	Name       string
	Capacity   uint64
	Allocation uint64
	Available  uint64
}

// Probe verdicts that are not dial failures.
var (
	// ErrProbeBusy: the previous probe of this host was abandoned and has not
	// returned yet; the host is reported Timeout at once rather than piling
	// up another blocked probe.
	ErrProbeBusy = provider.Transientf("previous health check still running")
	// ErrPoolMissing and ErrPoolInactive are pool verdicts: the link works,
	// and being classed they never make the pool drop it.
	ErrPoolMissing  = provider.Permanentf("storage pool not found")
	ErrPoolInactive = provider.Transientf("storage pool is not running")
)

// Reason maps a probe error onto the KVMHost Ready reason.
func Reason(err error) string {
	if err == nil {
		return crawlv1.HostReadyReason
	}
	if stage, ok := conn.DialStage(err); ok {
		return stage
	}
	switch {
	case errors.Is(err, ErrProbeBusy), errors.Is(err, context.DeadlineExceeded):
		return crawlv1.HostTimeoutReason
	case errors.Is(err, ErrPoolMissing):
		return crawlv1.HostPoolMissingReason
	case errors.Is(err, ErrPoolInactive):
		return crawlv1.HostPoolInactiveReason
	}
	return crawlv1.HostProbeFailedReason
}

// CachedImage is an image verified in a host's pool.
type CachedImage struct {
	Volume string
	Path   string
	// Bytes uploaded by this call; 0 when the image was cached already.
	Bytes int64
	// Allocated is the disk space the volume takes on the host (0 when the
	// host would not say).
	Allocated int64
	Checksum  string
}

// Progress reports bytes downloaded so far and the total (-1 when unknown).
type Progress func(done, total int64)

// A host whose health check gets no answer (Reason Timeout: libvirtd
// stopped or hung behind a live sshd, a blackholed host) is not called by
// Create, Get, Delete, the sweep, image caching or pruning while that
// verdict stands: each fails at once with a provider.UnavailableError
// instead of spending an RPC deadline, and holding a worker, on a daemon
// that does not answer. The
// Proxies turned away are woken (a DomainEvent each) by the check that
// finds the host answering again, which is also its KVMHost's Ready
// transition.
//
// A verdict stands for verdictIntervals check intervals of its host after
// the check that gave it. A host that stays wedged renews it at every
// check (a check that finds the previous one still hanging reports Timeout
// at once, ErrProbeBusy); a check that gets any answer ends it. So it
// lapses only when the host is no longer checked, and then calls go to the
// host again, each RPC bounded by its deadline. A host never checked (just
// added, the manager just started) is called as any other.
const verdictIntervals = 3

// notAnswering is a host whose health checks get no answer.
type notAnswering struct {
	since   time.Time // the first check of this outage that got none
	checked time.Time // the latest
	// waiting are the Proxies turned away meanwhile.
	waiting map[proxyKey]struct{}
}

type proxyKey struct{ namespace, name string }

// noteHealth records the verdict of a health check of host (err from
// Probe): Timeout starts or renews a not-answering verdict; anything else
// ends it and wakes the Proxies it turned away.
func (p *Provider) noteHealth(host string, err error) {
	now := p.opts.Clock.Now()
	p.mu.Lock()
	v := p.notAnswering[host]
	if Reason(err) == crawlv1.HostTimeoutReason {
		if v == nil {
			v = &notAnswering{since: now, waiting: map[proxyKey]struct{}{}}
			p.notAnswering[host] = v
		}
		v.checked = now
		// Calls that passed the gate before this verdict end now rather
		// than at their RPCs' deadlines (minutes for a start or an
		// upload), and the Proxies turned away as busy are woken to be
		// refused as not answering: every Proxy of the host says so
		// within a check, and none holds a worker on it.
		cause := v.unavailable(host)
		cut := slices.Collect(maps.Keys(p.calls[host]))
		busy := slices.Collect(maps.Keys(p.busyWaiting[host]))
		delete(p.busyWaiting, host)
		p.mu.Unlock()
		for _, c := range cut {
			c.cancel(cause)
		}
		p.wake(host, busy, DomainEvent{SlotFree: true})
		return
	}
	delete(p.notAnswering, host)
	p.mu.Unlock()
	if v == nil || len(v.waiting) == 0 {
		return
	}
	p.opts.Logger.Info("host answers its health check again; waking the Proxies turned away", "host", host, "proxies", len(v.waiting))
	p.wake(host, slices.Collect(maps.Keys(v.waiting)), DomainEvent{HostAnswers: true})
}

// wake sends ev, for host, to each of the Proxies.
func (p *Provider) wake(host string, proxies []proxyKey, ev DomainEvent) {
	for _, k := range proxies {
		ev.Host, ev.Namespace, ev.Name = host, k.namespace, k.name
		p.send(ev)
	}
}

// forgetHealth drops what is known of host's health (the host is gone).
func (p *Provider) forgetHealth(host string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.notAnswering, host)
	delete(p.busyWaiting, host)
}

// refuseNotAnswering returns a provider.UnavailableError when host's
// health check got no answer and that verdict stands, and notes waiter
// (if any) to wake when the host answers.
func (p *Provider) refuseNotAnswering(host string, hs HostSpec, waiter *provider.Machine) error {
	now := p.opts.Clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.notAnswering[host]
	if v == nil || !p.stands(v, hs.CheckInterval, now) {
		return nil
	}
	if waiter != nil {
		v.waiting[proxyKey{waiter.Namespace, waiter.Name}] = struct{}{}
	}
	return v.unavailable(host)
}

// unavailable is the error of a call refused, or cut short, by v.
func (v *notAnswering) unavailable(host string) *provider.UnavailableError {
	return &provider.UnavailableError{
		Place:  fmt.Sprintf("KVM host %q", host),
		Reason: "no answer to its health checks since " + v.since.UTC().Format(time.RFC3339),
	}
}

// stands: v is recent enough to act on, for a host checked every interval
// (0: the provider's default).
func (p *Provider) stands(v *notAnswering, interval time.Duration, now time.Time) bool {
	if interval <= 0 {
		interval = p.opts.CheckInterval
	}
	return now.Sub(v.checked) < verdictIntervals*interval
}
