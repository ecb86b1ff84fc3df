package provider

import (
	"context"
	"time"

	"github.com/go-logr/logr"
)

// Default Checker timing.
const (
	DefaultCheckInterval = 5 * time.Minute
	DefaultCheckTimeout  = 30 * time.Second
)

// Checker runs every enabled provider's Check at start-up and every
// Interval, and records each result in the Registry (CheckError), so a
// Proxy whose proxy is unreachable can say why (e.g. no GCE firewall rule)
// instead of only "port closed". Add it to a manager (it is a
// manager.Runnable; it runs on every replica, not only the leader):
//
//	mgr.Add(&provider.Checker{Registry: registry})
//
// Checking constructs a lazily built provider, so a provider that cannot
// be built is reported at start-up too.
type Checker struct {
	Registry *Registry
	Interval time.Duration // default DefaultCheckInterval
	Timeout  time.Duration // per provider, default DefaultCheckTimeout
}

// Start checks until ctx ends.
func (c *Checker) Start(ctx context.Context) error {
	interval := c.Interval
	if interval <= 0 {
		interval = DefaultCheckInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		c.CheckAll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection is false: every replica's Proxy reconciles (after a
// failover) need fresh results.
func (c *Checker) NeedLeaderElection() bool { return false }

// CheckAll checks every enabled provider once and records the results.
func (c *Checker) CheckAll(ctx context.Context) {
	log := logr.FromContextOrDiscard(ctx)
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	for _, name := range c.Registry.Enabled() {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		p, err := c.Registry.Get(cctx, name)
		if err == nil {
			err = p.Check(cctx)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			log.Error(err, "provider check failed", "provider", name)
		} else if prev := c.Registry.CheckError(name); prev != nil {
			log.Info("provider check passes again", "provider", name)
		}
		c.Registry.setCheckError(name, err)
	}
}

// CheckError is the error of name's last Check (nil when it passed or has
// not run), for condition messages. A nil Registry has checked nothing.
func (r *Registry) CheckError(name string) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.checks[name]
}

func (r *Registry) setCheckError(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checks == nil {
		r.checks = map[string]error{}
	}
	r.checks[name] = err
}
