package kvm

import (
	"context"
	"fmt"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// Probe checks host over its pooled connection: the daemon's version and
// hostname prove libvirt answers, then the configured pool must exist and be
// running. It returns when ctx ends even if the RPCs have not: they are
// abandoned, the connection is left alone (an upload or a Create on it goes
// on), and until they return the next Probe of that host fails at once with
// ErrProbeBusy instead of piling up. A link that really died is closed by the
// SSH keepalive, not here; a pool verdict never drops a working link.
//
// ctx (the check timeout, which a KVMHost may set) is the probe's only
// bound: its RPCs get no per-RPC deadlines (Options.RPCDeadlines), which
// would cut a longer check timeout short.
//
// The verdict also decides whether the Proxies' calls go to the host: one
// that got no answer (Reason Timeout) turns them away until a check gets
// one (see refuseNotAnswering).
func (p *Provider) Probe(ctx context.Context, host string) (HostHealth, error) {
	h, err := p.checkHost(ctx, host)
	p.noteHealth(host, err)
	return h, err
}

func (p *Provider) checkHost(ctx context.Context, host string) (HostHealth, error) {
	if !p.startProbe(host) {
		return HostHealth{}, ErrProbeBusy
	}
	type result struct {
		h   HostHealth
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer p.endProbe(host)
		h, err := p.probe(ctx, host)
		done <- result{h, err}
	}()
	select {
	case r := <-done:
		if r.err != nil && ctx.Err() != nil {
			// The deadline cut the probe short (e.g. a dial into a
			// blackhole): that is a Timeout, whatever stage it was in.
			return HostHealth{}, fmt.Errorf("health check of host %q: %w (%v)", host, ctx.Err(), r.err) //nolint:errorlint // the deadline is the verdict; the stage's error is only told
		}
		return r.h, r.err
	case <-ctx.Done():
		return HostHealth{}, fmt.Errorf("health check of host %q: %w", host, ctx.Err())
	}
}

func (p *Provider) probe(ctx context.Context, host string) (HostHealth, error) {
	var h HostHealth
	// The dial is bounded by ctx; the RPCs run on a context that is not
	// cancelled with it and without deadlines of their own: Probe abandons
	// them as a whole and tracks them until they return.
	err := p.do(ctx, context.WithoutCancel(ctx), host, func(c virt.Client, hs HostSpec) error {
		ver, err := c.ConnectGetLibVersion()
		if err != nil {
			return classify(err)
		}
		h.LibvirtVersion = formatLibVersion(ver)
		if h.Hostname, err = c.ConnectGetHostname(); err != nil {
			return classify(err)
		}
		pool, err := lookupPool(c, hs.Pool)
		if err != nil {
			return err
		}
		state, capacity, allocation, available, err := c.StoragePoolGetInfo(pool)
		if err != nil {
			return classify(err)
		}
		h.Pool = PoolHealth{Name: hs.Pool, Capacity: capacity, Allocation: allocation, Available: available}
		if libvirt.StoragePoolState(state) != libvirt.StoragePoolRunning {
			return fmt.Errorf("%w: %q (state %d)", ErrPoolInactive, hs.Pool, state)
		}
		h.Capacity, err = readCapacity(c)
		return err
	}, virt.WithoutDeadlines())
	return h, err
}

// Linux reports total, free, buffers and cached for the whole host; it
// refuses any other count, so asking for 4 saves the call that asks for it.
const hostMemoryStats = 4

// readCapacity reads the host's size, its free memory and what its running
// domains were given: three RPCs whatever the number of domains. NOWAIT
// keeps a domain busy with a job (a migration, a long monitor call) from
// holding up the check; its vCPU and memory figures come from its
// definition and are reported anyway.
func readCapacity(c virt.Client) (CapacityHealth, error) {
	var hc CapacityHealth
	_, memKiB, cpus, _, _, _, _, _, err := c.NodeGetInfo()
	if err != nil {
		return hc, classify(err)
	}
	hc.CPUs, hc.MemoryBytes = cpus, memKiB<<10
	stats, _, err := c.NodeGetMemoryStats(hostMemoryStats, int32(libvirt.NodeMemoryStatsAllCells), 0)
	if err != nil {
		return hc, classify(err)
	}
	for _, s := range stats {
		// MemFree alone would call a host with a warm page cache full.
		switch s.Field {
		case "free", "buffers", "cached":
			hc.FreeMemoryBytes += s.Value << 10
		}
	}
	recs, err := c.ConnectGetAllDomainStats(nil, uint32(libvirt.DomainStatsVCPU|libvirt.DomainStatsBalloon),
		uint32(libvirt.ConnectGetAllDomainsStatsActive|libvirt.ConnectGetAllDomainsStatsNowait))
	if err != nil {
		return hc, classify(err)
	}
	for _, r := range recs {
		hc.RunningDomains++
		for _, p := range r.Params {
			switch p.Field {
			case libvirt.DomainStatsVCPUCurrent:
				hc.AllocatedVCPUs += int32(paramUint(p.Value))
			case libvirt.DomainStatsBalloonMaximum:
				hc.AllocatedMemoryBytes += paramUint(p.Value) << 10 // KiB
			}
		}
	}
	return hc, nil
}

// paramUint reads an integer typed parameter whatever its width; anything
// else (or a negative value) is 0.
func paramUint(v libvirt.TypedParamValue) uint64 {
	switch n := v.I.(type) {
	case uint32:
		return uint64(n)
	case uint64:
		return n
	case int32:
		return uint64(max(n, 0))
	case int64:
		return uint64(max(n, 0))
	}
	return 0
}

func (p *Provider) startProbe(host string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.probing[host] {
		return false
	}
	p.probing[host] = true
	return true
}

func (p *Provider) endProbe(host string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.probing, host)
}

// formatLibVersion turns libvirt's major*1e6+minor*1e3+release into "M.m.r".
func formatLibVersion(v uint64) string {
	return fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000)
}
