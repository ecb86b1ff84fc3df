package kvm

import "crawl.example.com/proxy-operator/pkg/provider/kvm/conn"

// NewWithPool returns a Provider on a new conn.Pool whose links hand their
// lifecycle events to the provider (pool.OnConnect is replaced), so callers
// need no forward-declared provider for the pool's callback.
func NewWithPool(opts Options, pool conn.Options) (*Provider, *conn.Pool) {
	p := New(opts)
	pool.OnConnect = p.OnConnect
	cp := conn.New(pool)
	p.opts.Pool = cp
	return p, cp
}
