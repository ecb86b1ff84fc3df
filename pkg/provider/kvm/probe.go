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
func (p *Provider) Probe(ctx context.Context, host string) (HostHealth, error) {
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
			return HostHealth{}, fmt.Errorf("health check of host %q: %w (%v)", host, ctx.Err(), r.err)
		}
		return r.h, r.err
	case <-ctx.Done():
		return HostHealth{}, fmt.Errorf("health check of host %q: %w", host, ctx.Err())
	}
}

func (p *Provider) probe(ctx context.Context, host string) (HostHealth, error) {
	var h HostHealth
	// The dial is bounded by ctx; the RPCs run on a context that is not
	// cancelled with it: Probe abandons them as a whole and tracks them
	// until they return.
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
		return nil
	})
	return h, err
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
