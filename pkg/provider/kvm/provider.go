// Package kvm is the KVM provider: Proxies become libvirt domains on
// hypervisors reached over SSH, each booting from a qcow2 overlay on a cached,
// sha256-verified image, with a cloud-init NoCloud seed ISO.
//
// Everything external is injected: the host configuration (HostSource), the
// SSH+libvirt connections (conn.Pool, with its dialer), image downloads
// (image.Cache) and RPC observation (virt.Observer), so the whole provider
// runs against the in-memory libvirt in virt/fake.
package kvm

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	"libvirt.org/go/libvirtxml"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/image"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/seed"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// Name is the value of Proxy.spec.provider served here.
const Name = "kvm"

// HostSpec is everything the provider needs to know about one KVMHost.
type HostSpec struct {
	Conn     conn.HostConfig
	Material conn.MaterialLoader
	Pool     string
	Network  domxml.Network
	// DomainType is domxml.DomainTypeKVM or domxml.DomainTypeQEMU.
	DomainType string
	// Nameservers are the DNS servers of VMs with a static address
	// (KVMHost spec.nameservers).
	Nameservers []netip.Addr
	// CheckInterval is how often the host's health is checked (its
	// KVMHost's spec.checkInterval); 0: Options.CheckInterval. It says how
	// long a check's verdict stands (see refuseNotAnswering).
	CheckInterval time.Duration
}

// HostSource resolves host names. Host returns an error matching
// conn.ErrHostNotConfigured for a host that does not exist.
type HostSource interface {
	Host(ctx context.Context, name string) (HostSpec, error)
	List(ctx context.Context) ([]string, error)
}

// Connections is the per-host connection pool the provider runs RPCs on;
// *conn.Pool implements it.
type Connections interface {
	Set(cfg conn.HostConfig, loader conn.MaterialLoader) error
	Do(ctx context.Context, host string, fn func(virt.Client) error) error
	Remove(name string)
}

var _ Connections = (*conn.Pool)(nil)

// Options configure a Provider.
type Options struct {
	// InstallID names this operator install (provider.ValidateInstallID):
	// written into every domain's metadata, and ListByTag returns only
	// domains carrying it, so installs sharing a host never collect each
	// other's domains.
	InstallID string
	Hosts     HostSource
	// Pool holds the connections; the provider adds hosts to it as they are
	// used. Build it with conn.New and pass OnConnect: p.OnConnect to get
	// lifecycle events.
	Pool Connections
	// Images downloads and verifies images; a zero image.Cache works. New
	// sets its Holder to InstallID, so use one Cache per Provider.
	Images *image.Cache
	// Observer sees every libvirt RPC (metrics, RPC counting).
	Observer virt.Observer
	// RPCDeadlines bound each libvirt RPC by its class (lookups and
	// reads: seconds; defines; starts and stops; uploads: a no-progress
	// bound), so a daemon that stops answering costs a call one deadline,
	// not its caller's whole budget. Zero fields take virt's defaults
	// (virt.DefaultDeadlines). Health probes keep their own bound (the
	// check timeout) instead.
	RPCDeadlines virt.Deadlines
	// MaxUploadsPerHost bounds concurrent image uploads to one host, so an
	// image does not starve the host's other work. Default 2.
	MaxUploadsPerHost int
	// MaxUploads bounds concurrent image uploads of this provider, over
	// all hosts: each upload holds buffers (go-libvirt's stream buffer,
	// 4 MiB, the HTTP download's and the SSH channel's), so a KVMImage
	// going to hundreds of hosts at once would otherwise make the
	// manager's peak memory grow with the hosts. Zero: DefaultMaxUploads;
	// negative: no bound.
	MaxUploads int
	// MaxInFlightPerHost bounds the Create, Get, Delete and ListByTag calls
	// in flight to one host; beyond it they fail at once with a transient
	// provider.ErrBusy instead of waiting, so a host whose libvirtd hangs holds
	// at most this many of the callers' workers. A call whose RPC was
	// abandoned (at the RPC's deadline or the caller's) counts until that
	// RPC really returns. Health probes and image caching (EnsureImage)
	// are bounded on their own and not counted. Default
	// DefaultMaxInFlightPerHost.
	MaxInFlightPerHost int
	// EventBuffer is the size of the Events channel. Default 1024.
	EventBuffer int
	// CheckInterval is the health check interval of hosts without their
	// own (the manager's --provider-check-interval). Default
	// crawlv1.DefaultCheckInterval.
	CheckInterval time.Duration
	// Clock times health verdicts; the real clock when nil.
	Clock clock.PassiveClock
	// Logger for what happens outside calls (event subscriptions).
	Logger logr.Logger
	// OnImageUpload, if set, is told about every image download+upload that
	// transferred bytes (metrics).
	OnImageUpload func(host string, bytes int64, took time.Duration, err error)
}

// Provider implements provider.Provider for KVM hosts.
type Provider struct {
	opts   Options
	events chan DomainEvent

	mu       sync.Mutex
	images   map[string]*sync.RWMutex // per host: Create's overlay step (R) against PruneImages (W)
	uploads  map[string]chan struct{} // per-host upload slots
	anyHost  chan struct{}            // upload slots over all hosts; nil: unbounded
	probing  map[string]bool          // hosts with a probe still running
	inFlight map[string]int           // per-host calls counted by MaxInFlightPerHost
	// busyWaiting: per host, the Proxies whose call was refused as busy,
	// woken when a call slot frees or the host is found not answering.
	busyWaiting map[string]map[proxyKey]struct{}
	// calls: per host, the calls in flight, cut short when a health check
	// finds the host not answering.
	calls map[string]map[*hostCall]struct{}
	// notAnswering: hosts whose latest health check got no answer.
	notAnswering map[string]*notAnswering
}

// DefaultMaxUploads keeps the upload buffers in the manager to tens of MiB
// while 16 uploads at the ~100 MB/s one upload reaches over SSH
// (docs/performance.md §1) are more than a manager's 10 Gb/s link carries.
const DefaultMaxUploads = 16

// DefaultMaxInFlightPerHost is a quarter of the manager's default 16 Proxy
// workers: one hung host can stall no more than that share of them.
const DefaultMaxInFlightPerHost = 4

var _ provider.Provider = (*Provider)(nil)

// New returns a Provider.
func New(opts Options) *Provider {
	if opts.Images == nil {
		opts.Images = &image.Cache{}
	}
	// Installs sharing a pool share its cached images; each claims what it
	// uses, so none prunes what another still holds.
	opts.Images.Holder = opts.InstallID
	if opts.MaxUploadsPerHost <= 0 {
		opts.MaxUploadsPerHost = 2
	}
	if opts.MaxUploads == 0 {
		opts.MaxUploads = DefaultMaxUploads
	}
	var anyHost chan struct{}
	if opts.MaxUploads > 0 {
		anyHost = make(chan struct{}, opts.MaxUploads)
	}
	if opts.MaxInFlightPerHost <= 0 {
		opts.MaxInFlightPerHost = DefaultMaxInFlightPerHost
	}
	if opts.EventBuffer <= 0 {
		opts.EventBuffer = 1024
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = crawlv1.DefaultCheckInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Provider{
		opts:         opts,
		events:       make(chan DomainEvent, opts.EventBuffer),
		images:       map[string]*sync.RWMutex{},
		uploads:      map[string]chan struct{}{},
		anyHost:      anyHost,
		probing:      map[string]bool{},
		inFlight:     map[string]int{},
		busyWaiting:  map[string]map[proxyKey]struct{}{},
		calls:        map[string]map[*hostCall]struct{}{},
		notAnswering: map[string]*notAnswering{},
	}
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return Name }

// Check implements provider.Provider: the provider itself needs nothing to
// serve; per-host health is Probe's.
func (p *Provider) Check(context.Context) error { return nil }

// ForgetHost closes a deleted host's connection and forgets its health.
func (p *Provider) ForgetHost(host string) {
	p.opts.Pool.Remove(host)
	p.forgetHealth(host)
}

// hostFunc is a call's work on its host: ctx ends with the call (the
// caller's context, or the host found not answering meanwhile).
type hostFunc func(ctx context.Context, c virt.Client, hs HostSpec) error

// withHost runs fn with an instrumented client of host, as one of the
// host's MaxInFlightPerHost calls: with all of them taken it fails at once
// with provider.ErrBusy, and waiter (the Proxy's Machine; nil for host-wide
// calls) is woken when a slot frees or the host is found not answering. A
// host whose health check gets no answer is not called at all: the call
// fails at once with a provider.UnavailableError, and waiter is woken when
// the host answers again (refuseNotAnswering); a call already under way
// when the check finds that ends then, with the same error (answering).
// The host's current configuration is (re)applied to the pool first; an
// unchanged one keeps the link.
func (p *Provider) withHost(ctx context.Context, host string, waiter *provider.Machine, fn hostFunc) error {
	hs, err := p.opts.Hosts.Host(ctx, host)
	if err != nil {
		return err
	}
	if err := p.refuseNotAnswering(host, hs, waiter); err != nil {
		logr.FromContextOrDiscard(ctx).V(1).Info("not calling a host that does not answer its health checks", "host", host, "err", err)
		return err
	}
	if err := p.startCall(host, waiter); err != nil {
		return err
	}
	var rpcs virt.CallTracker
	err = p.answering(ctx, host, hs, waiter, fn, virt.WithCallTracker(&rpcs))
	if rpcs.Running() == 0 {
		p.endCall(host) // nothing was abandoned: every RPC has returned
	} else {
		// RPCs abandoned at their deadline (or the caller's) still
		// occupy the host (and, on a hung daemon, the link's capacity)
		// until they return.
		go func() { rpcs.Wait(); p.endCall(host) }()
	}
	return err
}

// startCall takes one of host's call slots, or notes waiter (if any) to
// wake when one frees.
func (p *Provider) startCall(host string, waiter *provider.Machine) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.inFlight[host]
	busy := n >= p.opts.MaxInFlightPerHost
	if waiter != nil {
		key := proxyKey{waiter.Namespace, waiter.Name}
		switch {
		case !busy:
			delete(p.busyWaiting[host], key) // it has a slot: nothing to wake it for
		case p.busyWaiting[host] == nil:
			p.busyWaiting[host] = map[proxyKey]struct{}{key: {}}
		default:
			p.busyWaiting[host][key] = struct{}{}
		}
	}
	if busy {
		return provider.Transient(fmt.Errorf("host %q %w: %d calls in flight", host, provider.ErrBusy, n))
	}
	p.inFlight[host]++
	return nil
}

// endCall frees one of host's call slots and wakes one Proxy turned away
// as busy: one, since one slot freed, so a long queue is not woken all at
// once to find the host busy again.
func (p *Provider) endCall(host string) {
	p.mu.Lock()
	if p.inFlight[host]--; p.inFlight[host] <= 0 {
		delete(p.inFlight, host)
	}
	var wake []proxyKey
	for k := range p.busyWaiting[host] {
		wake = append(wake, k)
		delete(p.busyWaiting[host], k)
		break
	}
	p.mu.Unlock()
	p.wake(host, wake, DomainEvent{SlotFree: true})
}

// answering is doSpec (dial and RPCs on one context) with a context that
// also ends when a health check finds host not answering (noteHealth). A
// call cut short that way returns the host's UnavailableError, as a call
// refused at the start would, with waiter noted to wake when the host
// answers; its RPCs are abandoned as at their deadline.
func (p *Provider) answering(ctx context.Context, host string, hs HostSpec, waiter *provider.Machine, fn hostFunc, opts ...virt.Option) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	hc := &hostCall{cancel: cancel}
	p.mu.Lock()
	if p.calls[host] == nil {
		p.calls[host] = map[*hostCall]struct{}{}
	}
	p.calls[host][hc] = struct{}{}
	p.mu.Unlock()
	err := p.doSpec(ctx, ctx, host, hs, func(c virt.Client, hs HostSpec) error { return fn(ctx, c, hs) }, opts...)
	p.mu.Lock()
	delete(p.calls[host], hc)
	if len(p.calls[host]) == 0 {
		delete(p.calls, host)
	}
	p.mu.Unlock()
	var unavailable *provider.UnavailableError
	if err != nil && errors.As(context.Cause(ctx), &unavailable) {
		if refused := p.refuseNotAnswering(host, hs, waiter); refused != nil {
			logr.FromContextOrDiscard(ctx).V(1).Info("call ended: its host stopped answering its health checks", "host", host, "err", err)
			return refused
		}
	}
	return err
}

// hostCall is a call in flight to a host (answering).
type hostCall struct{ cancel context.CancelCauseFunc }

// do is withHost with separate contexts for the dial and for the RPCs, and
// without the in-flight bound.
func (p *Provider) do(dialCtx, rpcCtx context.Context, host string, fn func(virt.Client, HostSpec) error, opts ...virt.Option) error {
	hs, err := p.opts.Hosts.Host(dialCtx, host)
	if err != nil {
		return err
	}
	return p.doSpec(dialCtx, rpcCtx, host, hs, fn, opts...)
}

// doAnswering is do for the host-wide calls that are not the Proxies'
// (caching and pruning images): without the in-flight bound, but refused
// at once, as withHost refuses, while the host's health check gets no
// answer. A KVMImage job or prune started from a cache that still shows the
// host Ready would otherwise hang on the daemon until its deadline.
func (p *Provider) doAnswering(ctx context.Context, host string, fn hostFunc) error {
	hs, err := p.opts.Hosts.Host(ctx, host)
	if err != nil {
		return err
	}
	if err := p.refuseNotAnswering(host, hs, nil); err != nil {
		return err
	}
	return p.answering(ctx, host, hs, nil, fn)
}

// doSpec is do with the host's spec already read.
func (p *Provider) doSpec(dialCtx, rpcCtx context.Context, host string, hs HostSpec, fn func(virt.Client, HostSpec) error, opts ...virt.Option) error {
	if err := p.opts.Pool.Set(hs.Conn, hs.Material); err != nil {
		return err
	}
	return p.opts.Pool.Do(dialCtx, host, func(raw virt.Client) error {
		return fn(p.instrument(rpcCtx, host, raw, opts...), hs)
	})
}

// instrument binds c to ctx and host with the provider's deadlines and
// observer; opts come last, so a caller may override them.
func (p *Provider) instrument(ctx context.Context, host string, c virt.Client, opts ...virt.Option) virt.Client {
	all := []virt.Option{virt.WithHost(host), virt.WithDeadlines(p.opts.RPCDeadlines)}
	if p.opts.Observer != nil {
		all = append(all, virt.WithObserver(p.opts.Observer))
	}
	return virt.Instrument(ctx, c, append(all, opts...)...)
}

// Create makes the Proxy's domain exist and run. It is idempotent: an
// existing domain (after the identity check) is only started if needed;
// otherwise the image is cached, the overlay reused or created, the seed
// rebuilt, and the domain defined and started.
func (p *Provider) Create(ctx context.Context, m *provider.Machine) (*provider.Instance, error) {
	if err := checkMachine(m); err != nil {
		return nil, err
	}
	// Before anything is downloaded or made: the seed renders it.
	if _, _, err := provider.ManagedSquid(m, squid.Paths{}); err != nil {
		return nil, err
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("host", m.Host)
	ctx = logr.NewContext(ctx, log)
	var inst *provider.Instance
	err := p.withHost(ctx, m.Host, m, func(ctx context.Context, c virt.Client, hs HostSpec) error {
		name := domxml.DomainName(m.Namespace, m.Name)
		dom, found, err := p.lookupOwned(c, m)
		if err != nil {
			return err
		}
		if found {
			if err := ensureRunning(log, c, dom); err != nil {
				return err
			}
			inst = p.instance(m.Host, dom, m, provider.StatePending)
			return nil
		}

		// Before anything is downloaded or made: a host that cannot take
		// the static address refuses it.
		nic, err := staticNIC(m, hs)
		if err != nil {
			return err
		}
		pool, err := lookupPool(c, hs.Pool)
		if err != nil {
			return err
		}
		img, err := p.ensureImage(ctx, c, m.Host, pool, m.Image, nil)
		if err != nil {
			return err
		}
		diskPath, err := p.overlayOnImage(c, m.Host, pool, m, img)
		if err != nil {
			return err
		}
		seedPath, err := rebuildSeed(c, pool, m, nic)
		if err != nil {
			return err
		}
		xml, err := domxml.Domain(domxml.Params{
			Name:        name,
			DomainType:  hs.DomainType,
			VCPUs:       m.CPUs,
			MemoryBytes: m.MemoryBytes,
			Firmware:    m.Image.Firmware,
			DiskPath:    diskPath,
			SeedPath:    seedPath,
			Network:     hs.Network,
			MAC:         nic.MAC,
			Metadata:    domxml.Metadata{Namespace: m.Namespace, Name: m.Name, UID: m.UID, Tag: m.Tag, InstallID: p.opts.InstallID},
		})
		if err != nil {
			return err
		}
		dom, err = c.DomainDefineXMLFlags(xml, 0)
		if err != nil {
			return classify(err)
		}
		log.Info("defined domain", "domain", name, "uuid", virt.FormatUUID(dom.UUID))
		if err := c.DomainCreate(dom); err != nil {
			return classify(err)
		}
		inst = p.instance(m.Host, dom, m, provider.StatePending)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return inst, nil
}

// Get reports the Proxy's domain: state, and the routable IPv4 from the DHCP
// lease, then the guest agent, then ARP (see findAddress). A host that is not configured
// is a permanent error, never ErrNotFound: a typo in a host name must not
// look like a missing VM to rebuild.
func (p *Provider) Get(ctx context.Context, m *provider.Machine) (*provider.Instance, error) {
	if err := checkMachine(m); err != nil {
		return nil, err
	}
	var inst *provider.Instance
	err := p.withHost(ctx, m.Host, m, func(ctx context.Context, c virt.Client, hs HostSpec) error {
		dom, found, err := p.lookupOwned(c, m)
		if err != nil {
			return err
		}
		if !found {
			return provider.NotFoundf("domain %q not found on host %q", domxml.DomainName(m.Namespace, m.Name), m.Host)
		}
		state, reason, err := c.DomainGetState(dom, 0)
		if err != nil {
			return classify(err)
		}
		inst = p.instance(m.Host, dom, m, stateOf(state))
		if libvirt.DomainState(state) == libvirt.DomainPaused {
			inst.Message = "paused (" + pausedReason(reason) + ")"
		}
		if inst.State == provider.StateRunning {
			inst.Address, inst.AddressSource, inst.Message = findAddress(c, dom, hs.Network)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return inst, nil
}

// Delete destroys and undefines the Proxy's domain, only when it is this
// Proxy's (metadata UID, and UUID when one is recorded), then removes the
// per-VM volumes. Every already-gone case is success; a host that is not
// configured is success too (nothing of ours can be reached there).
func (p *Provider) Delete(ctx context.Context, m *provider.Machine) error {
	if err := checkMachine(m); err != nil {
		return err
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("host", m.Host)
	err := p.withHost(ctx, m.Host, m, func(ctx context.Context, c virt.Client, hs HostSpec) error {
		dom, found, err := p.lookupOwned(c, m)
		if err != nil {
			return err
		}
		if found {
			if err := c.DomainDestroyFlags(dom, 0); err != nil && !virt.IsCode(err, libvirt.ErrOperationInvalid, libvirt.ErrNoDomain) {
				return classify(err)
			}
			flags := libvirt.DomainUndefineNvram | libvirt.DomainUndefineManagedSave | libvirt.DomainUndefineSnapshotsMetadata
			if err := c.DomainUndefineFlags(dom, flags); err != nil && !virt.IsCode(err, libvirt.ErrNoDomain) {
				return classify(err)
			}
			log.Info("deleted domain", "domain", dom.Name, "uuid", virt.FormatUUID(dom.UUID))
		}
		// Volume names carry the Proxy UID: these are this Proxy's.
		pool, err := lookupPool(c, hs.Pool)
		if errors.Is(err, ErrPoolMissing) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, vol := range []string{domxml.DiskVolumeName(m.UID), domxml.SeedVolumeName(m.UID)} {
			if err := deleteVolume(c, pool, vol); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, conn.ErrHostNotConfigured) {
		log.Info("host not configured; nothing to delete", "proxy", m.Namespace+"/"+m.Name)
		return nil
	}
	return err
}

// ListByTag returns the domains whose metadata carries tag and this
// install's id, on every host. Domains without our metadata are skipped, as
// are domains that cannot be read. Hosts are listed concurrently, so a host
// that does not answer costs the others nothing: it fails its part when ctx
// ends, and the listing returns the other hosts' domains with that error.
func (p *Provider) ListByTag(ctx context.Context, tag string) ([]provider.Instance, error) {
	hosts, err := p.opts.Hosts.List(ctx)
	if err != nil {
		return nil, provider.Transient(err)
	}
	var (
		mu   sync.Mutex
		out  []provider.Instance
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, listConcurrency)
	)
	for _, host := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
				mu.Lock()
				errs = append(errs, fmt.Errorf("host %q: not listed: %w", host, ctx.Err()))
				mu.Unlock()
				return
			}
			found, err := p.listHost(ctx, host, tag)
			mu.Lock()
			defer mu.Unlock()
			out = append(out, found...)
			if err != nil {
				errs = append(errs, fmt.Errorf("host %q: %w", host, err))
			}
		}()
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].ProviderID < out[j].ProviderID })
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return out, errors.Join(errs...)
}

// listConcurrency bounds the hosts ListByTag lists at once.
const listConcurrency = 16

func (p *Provider) listHost(ctx context.Context, host, tag string) ([]provider.Instance, error) {
	var out []provider.Instance
	err := p.withHost(ctx, host, nil, func(_ context.Context, c virt.Client, _ HostSpec) error {
		doms, _, err := c.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive|libvirt.ConnectListDomainsInactive)
		if err != nil {
			return classify(err)
		}
		for _, dom := range doms {
			md, ok, err := readMetadata(c, dom)
			if err != nil || !ok || md.ManagedBy != domxml.ManagedBy || md.Tag != tag || md.InstallID != p.opts.InstallID {
				continue
			}
			out = append(out, provider.Instance{
				ProviderID: provider.FormatKVMProviderID(host, virt.FormatUUID(dom.UUID)),
				Name:       dom.Name,
				Host:       host,
				State:      provider.StateUnknown,
				Owner:      provider.Owner{Namespace: md.Namespace, Name: md.Name, UID: md.UID},
				InstallID:  md.InstallID,
			})
		}
		return nil
	})
	return out, err
}

// EnsureImage caches img on host, bounded by MaxUploadsPerHost and
// MaxUploads (and not by MaxInFlightPerHost: KVMImage jobs are not the
// callers' workers).
func (p *Provider) EnsureImage(ctx context.Context, host string, img provider.Image, progress Progress) (CachedImage, error) {
	var out CachedImage
	err := p.doAnswering(ctx, host, func(ctx context.Context, c virt.Client, hs HostSpec) error {
		pool, err := lookupPool(c, hs.Pool)
		if err != nil {
			return err
		}
		res, err := p.ensureImage(ctx, c, host, pool, img, progress)
		if err != nil {
			return err
		}
		out = CachedImage{Volume: res.VolumeName, Path: res.Path, Bytes: res.Bytes, Checksum: res.Checksum}
		// Only reported: a failure here must not fail a verified image.
		if v, err := c.StorageVolLookupByName(pool, res.VolumeName); err == nil {
			if _, _, alloc, err := c.StorageVolGetInfo(v); err == nil {
				out.Allocated = int64(alloc)
			}
		}
		return nil
	})
	return out, err
}

func (p *Provider) ensureImage(ctx context.Context, c virt.Client, host string, pool libvirt.StoragePool, img provider.Image, progress Progress) (image.Result, error) {
	// A cached image needs no upload slot: checking first keeps Creates from
	// queueing behind other images' downloads.
	if res, ok, err := p.opts.Images.Lookup(c, pool, img); err != nil || ok {
		return res, err
	}
	// Another image of the same digest may be uploading it right now.
	if waited, err := p.opts.Images.Wait(ctx, pool, img); err != nil {
		return image.Result{}, err
	} else if waited {
		if res, ok, err := p.opts.Images.Lookup(c, pool, img); err != nil || ok {
			return res, err
		}
	}
	// The host's slot first: an upload waiting for its busy host holds
	// none of the slots other hosts' uploads could use.
	slot := p.uploadSlot(host)
	select {
	case slot <- struct{}{}:
	case <-ctx.Done():
		return image.Result{}, provider.Transient(fmt.Errorf("waiting for an upload slot on host %q: %w", host, ctx.Err()))
	}
	defer func() { <-slot }()
	if p.anyHost != nil {
		select {
		case p.anyHost <- struct{}{}:
		case <-ctx.Done():
			return image.Result{}, provider.Transient(fmt.Errorf("waiting for one of the manager's %d upload slots (host %q): %w",
				cap(p.anyHost), host, ctx.Err()))
		}
		defer func() { <-p.anyHost }()
	}
	start := time.Now()
	res, err := p.opts.Images.Ensure(ctx, c, pool, img, progress)
	if p.opts.OnImageUpload != nil && (res.Bytes > 0 || err != nil) {
		p.opts.OnImageUpload(host, res.Bytes, time.Since(start), err)
	}
	return res, err
}

func (p *Provider) uploadSlot(host string) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.uploads[host]
	if !ok {
		s = make(chan struct{}, p.opts.MaxUploadsPerHost)
		p.uploads[host] = s
	}
	return s
}

// lookupOwned finds the Machine's domain by name and checks it is this
// Machine's; found is false when no domain has the name.
func (p *Provider) lookupOwned(c virt.Client, m *provider.Machine) (dom libvirt.Domain, found bool, err error) {
	dom, err = c.DomainLookupByName(domxml.DomainName(m.Namespace, m.Name))
	switch {
	case virt.IsCode(err, libvirt.ErrNoDomain):
		return dom, false, nil
	case err != nil:
		return dom, false, classify(err)
	}
	return dom, true, p.checkIdentity(c, dom, m)
}

// checkIdentity refuses a domain that is not this Machine's: its metadata
// must name the Machine's UID, and its UUID must match the recorded
// providerID when there is one.
func (p *Provider) checkIdentity(c virt.Client, dom libvirt.Domain, m *provider.Machine) error {
	md, ok, err := readMetadata(c, dom)
	switch {
	case err != nil:
		return err
	case !ok:
		return &provider.IdentityError{Kind: "domain", Name: dom.Name, Mismatch: "it has no proxy-operator metadata (not created by this operator)"}
	case md.UID != m.UID:
		return &provider.IdentityError{Kind: "domain", Name: dom.Name,
			Mismatch: fmt.Sprintf("its metadata names Proxy UID %q (%s/%s), not %q", md.UID, md.Namespace, md.Name, m.UID)}
	}
	if m.ProviderID != "" {
		_, want, err := provider.ParseKVMProviderID(m.ProviderID)
		if err != nil {
			return provider.Permanent(err)
		}
		if got := virt.FormatUUID(dom.UUID); got != want {
			return &provider.IdentityError{Kind: "domain", Name: dom.Name,
				Mismatch: fmt.Sprintf("its UUID %s is not the recorded %s (recreated outside the operator?)", got, want)}
		}
	}
	return nil
}

func (p *Provider) instance(host string, dom libvirt.Domain, m *provider.Machine, state provider.State) *provider.Instance {
	return &provider.Instance{
		ProviderID: provider.FormatKVMProviderID(host, virt.FormatUUID(dom.UUID)),
		Name:       dom.Name,
		Host:       host,
		State:      state,
		Owner:      provider.Owner{Namespace: m.Namespace, Name: m.Name, UID: m.UID},
	}
}

// readMetadata returns our metadata element of dom; ok is false when the
// domain has none (libvirt's VIR_ERR_NO_DOMAIN_METADATA) or ours does not
// parse. Any other error is the read's own, classified: an interrupted call
// must not make our domain look foreign (a permanent IdentityError).
func readMetadata(c virt.Client, dom libvirt.Domain) (md domxml.Metadata, ok bool, err error) {
	s, err := c.DomainGetMetadata(dom, int32(libvirt.DomainMetadataElement), libvirt.OptString{domxml.MetadataNS}, libvirt.DomainAffectCurrent)
	switch {
	case virt.IsCode(err, libvirt.ErrNoDomainMetadata):
		return domxml.Metadata{}, false, nil
	case err != nil:
		return domxml.Metadata{}, false, classify(fmt.Errorf("reading the metadata of domain %s: %w", dom.Name, err))
	}
	md, err = domxml.ParseMetadata(s)
	if err != nil {
		return domxml.Metadata{}, false, nil //nolint:nilerr // metadata that does not parse is not ours: the domain is foreign
	}
	return md, true, nil
}

func lookupPool(c virt.Client, name string) (libvirt.StoragePool, error) {
	pool, err := c.StoragePoolLookupByName(name)
	if err != nil {
		if virt.IsCode(err, libvirt.ErrNoStoragePool) {
			return pool, fmt.Errorf("%w: %q", ErrPoolMissing, name)
		}
		return pool, classify(err)
	}
	return pool, nil
}

// overlayOnImage makes the Proxy's overlay exist on img. PruneImages cannot
// run meanwhile, and img is looked up again first: an image found unused and
// pruned since ensureImage must not become a missing backing file.
func (p *Provider) overlayOnImage(c virt.Client, host string, pool libvirt.StoragePool, m *provider.Machine, img image.Result) (string, error) {
	mu := p.imageLock(host)
	mu.RLock()
	defer mu.RUnlock()
	again, ok, err := p.opts.Images.Lookup(c, pool, m.Image)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", provider.Transientf("image volume %s was pruned before the overlay was made; retrying", img.VolumeName)
	}
	return ensureOverlay(c, pool, m, again)
}

func (p *Provider) imageLock(host string) *sync.RWMutex {
	p.mu.Lock()
	defer p.mu.Unlock()
	mu, ok := p.images[host]
	if !ok {
		mu = &sync.RWMutex{}
		p.images[host] = mu
	}
	return mu
}

// PruneImages deletes the cached images in host's pool whose digest keep
// rejects and that no overlay uses (image.Cache.Prune). A host that is not
// configured, or has no pool, holds nothing to prune. Bounded by
// MaxUploadsPerHost's sibling rule: not counted by MaxInFlightPerHost.
func (p *Provider) PruneImages(ctx context.Context, host string, keep func(digest string) bool) (image.PruneResult, error) {
	var res image.PruneResult
	err := p.doAnswering(ctx, host, func(ctx context.Context, c virt.Client, hs HostSpec) error {
		pool, err := lookupPool(c, hs.Pool)
		if errors.Is(err, ErrPoolMissing) {
			return nil
		}
		if err != nil {
			return err
		}
		mu := p.imageLock(host)
		mu.Lock()
		defer mu.Unlock()
		res, err = p.opts.Images.Prune(ctx, c, pool, keep)
		return err
	})
	if errors.Is(err, conn.ErrHostNotConfigured) {
		return res, nil
	}
	return res, err
}

// ensureOverlay reuses the Proxy's overlay or creates it on the image.
func ensureOverlay(c virt.Client, pool libvirt.StoragePool, m *provider.Machine, img image.Result) (string, error) {
	name := domxml.DiskVolumeName(m.UID)
	vol, err := c.StorageVolLookupByName(pool, name)
	if err == nil {
		return volPath(c, vol)
	}
	if !virt.IsCode(err, libvirt.ErrNoStorageVol) {
		return "", classify(err)
	}
	capacity := m.DiskBytes
	// An overlay smaller than its backing image would hide the image's tail.
	if iv, err := c.StorageVolLookupByName(pool, img.VolumeName); err == nil {
		if _, imageCapacity, _, err := c.StorageVolGetInfo(iv); err == nil && int64(imageCapacity) > capacity {
			capacity = int64(imageCapacity)
		}
	}
	xml, err := domxml.OverlayVolume(name, capacity, img.Path, m.Image.Format)
	if err != nil {
		return "", err
	}
	vol, err = c.StorageVolCreateXML(pool, xml, 0)
	if err != nil {
		return "", classify(err)
	}
	return volPath(c, vol)
}

// rebuildSeed writes a fresh seed volume: a cancelled upload may have left a
// truncated one, so it is never reused.
func rebuildSeed(c virt.Client, pool libvirt.StoragePool, m *provider.Machine, nic staticConfig) (string, error) {
	in, err := seed.ForMachine(m)
	if err != nil {
		return "", err
	}
	in.NetworkConfig = nic.NetworkConfig
	iso, err := seed.Build(in)
	if err != nil {
		return "", err
	}
	name := domxml.SeedVolumeName(m.UID)
	if err := deleteVolume(c, pool, name); err != nil {
		return "", err
	}
	xml, err := domxml.RawVolume(name, int64(len(iso)))
	if err != nil {
		return "", err
	}
	vol, err := c.StorageVolCreateXML(pool, xml, 0)
	if err != nil {
		return "", classify(err)
	}
	if err := c.StorageVolUpload(vol, bytes.NewReader(iso), 0, uint64(len(iso)), 0); err != nil {
		return "", classify(err)
	}
	return volPath(c, vol)
}

func deleteVolume(c virt.Client, pool libvirt.StoragePool, name string) error {
	vol, err := c.StorageVolLookupByName(pool, name)
	if err != nil {
		if virt.IsCode(err, libvirt.ErrNoStorageVol) {
			return nil
		}
		return classify(err)
	}
	if err := c.StorageVolDelete(vol, 0); err != nil && !virt.IsCode(err, libvirt.ErrNoStorageVol) {
		return classify(err)
	}
	return nil
}

func volPath(c virt.Client, vol libvirt.StorageVol) (string, error) {
	path, err := c.StorageVolGetPath(vol)
	if err != nil {
		return "", classify(err)
	}
	return path, nil
}

// staticConfig is what a static address puts into a domain: its NIC's MAC
// and the seed's network-config. Zero for a Machine without one (DHCP,
// libvirt picks the MAC).
type staticConfig struct {
	MAC           string
	NetworkConfig []byte
}

// staticNIC renders m's static address for host hs: only on a bridge (a
// libvirt NAT network would translate it, so it would not be the egress,
// and its DHCP range is the network's own), with the host's nameservers,
// and the address's virtual MAC or, without one, the Proxy's own
// (domxml.ProxyMAC), which the network-config matches.
func staticNIC(m *provider.Machine, hs HostSpec) (staticConfig, error) {
	sn := m.StaticNetwork
	if sn == nil {
		return staticConfig{}, nil
	}
	if hs.Network.Type != domxml.NetworkTypeBridge {
		return staticConfig{}, provider.Permanentf("static address %s needs a KVMHost with networkMode bridge: KVMHost %q attaches VMs to libvirt network %q (NAT), behind which the address would not be the egress",
			sn.Address, m.Host, hs.Network.Name)
	}
	if len(hs.Nameservers) == 0 {
		return staticConfig{}, provider.Permanentf("static address %s: KVMHost %q has no spec.nameservers; a static configuration has no DHCP to learn DNS servers from", sn.Address, m.Host)
	}
	mac := cmp.Or(sn.MAC, domxml.ProxyMAC(m.UID))
	cfg, err := seed.NetworkConfig(seed.Network{Address: sn.Address, Gateway: sn.Gateway, MAC: mac, Nameservers: hs.Nameservers})
	if err != nil {
		return staticConfig{}, err
	}
	return staticConfig{MAC: mac, NetworkConfig: cfg}, nil
}

func checkMachine(m *provider.Machine) error {
	switch {
	case m.Host == "":
		return provider.Permanentf("proxy %s/%s: no KVM host", m.Namespace, m.Name)
	case m.UID == "":
		return provider.Permanentf("proxy %s/%s: no UID", m.Namespace, m.Name)
	}
	return nil
}

// classify gives a libvirt error its class. Daemon answers that retrying
// cannot change are permanent; everything else (including transport
// errors) is transient.
func classify(err error) error {
	if err == nil || provider.HasClass(err) {
		return err
	}
	if virt.IsCode(err, libvirt.ErrXMLError, libvirt.ErrXMLDetail, libvirt.ErrInvalidArg, libvirt.ErrConfigUnsupported,
		libvirt.ErrNoSupport, libvirt.ErrOperationDenied, libvirt.ErrAccessDenied, libvirt.ErrXMLInvalidSchema) {
		return provider.Permanent(err)
	}
	return provider.Transient(err)
}

// ensureRunning starts an existing domain that is not running, resuming one
// libvirt paused (an I/O error such as ENOSPC, a watchdog, virsh suspend)
// rather than "starting" it, which libvirt refuses for a paused domain. A
// domain paused by a job in progress (migration, save, snapshot) is left to
// it. No error is ignored: a start that fails is retried with its class.
func ensureRunning(log logr.Logger, c virt.Client, dom libvirt.Domain) error {
	state, reason, err := c.DomainGetState(dom, 0)
	if err != nil {
		return classify(err)
	}
	switch s := libvirt.DomainState(state); {
	case isRunning(state):
		return nil
	case s == libvirt.DomainPaused && pausedByJob(reason):
		return provider.Transientf("domain %s is paused (%s); waiting for that to end", dom.Name, pausedReason(reason))
	case s == libvirt.DomainPaused:
		log.Info("resuming paused domain", "domain", dom.Name, "reason", pausedReason(reason))
		if err := c.DomainResume(dom); err != nil {
			return classify(fmt.Errorf("resuming domain %s, paused (%s): %w", dom.Name, pausedReason(reason), err))
		}
		return nil
	default:
		log.Info("starting existing domain", "domain", dom.Name)
		if err := c.DomainCreate(dom); err != nil {
			return classify(fmt.Errorf("starting domain %s: %w", dom.Name, err))
		}
		return nil
	}
}

// pausedByJob reports whether a paused domain waits for a libvirt job that
// resumes or ends it by itself.
func pausedByJob(reason int32) bool {
	switch libvirt.DomainPausedReason(reason) {
	case libvirt.DomainPausedMigration, libvirt.DomainPausedSave, libvirt.DomainPausedDump,
		libvirt.DomainPausedShuttingDown, libvirt.DomainPausedSnapshot, libvirt.DomainPausedStartingUp,
		libvirt.DomainPausedPostcopy:
		return true
	}
	return false
}

// pausedReason names a VIR_DOMAIN_PAUSED_* reason for messages.
func pausedReason(reason int32) string {
	switch libvirt.DomainPausedReason(reason) {
	case libvirt.DomainPausedUser:
		return "paused by a user"
	case libvirt.DomainPausedMigration:
		return "migrating"
	case libvirt.DomainPausedSave:
		return "saving"
	case libvirt.DomainPausedDump:
		return "dumping core"
	case libvirt.DomainPausedIoerror:
		return "disk I/O error, e.g. the storage pool is full"
	case libvirt.DomainPausedWatchdog:
		return "watchdog fired"
	case libvirt.DomainPausedFromSnapshot:
		return "restored from a snapshot"
	case libvirt.DomainPausedShuttingDown:
		return "shutting down"
	case libvirt.DomainPausedSnapshot:
		return "taking a snapshot"
	case libvirt.DomainPausedCrashed:
		return "guest crashed"
	case libvirt.DomainPausedStartingUp:
		return "starting up"
	case libvirt.DomainPausedPostcopy, libvirt.DomainPausedPostcopyFailed:
		return "post-copy migration"
	case libvirt.DomainPausedAPIError:
		return "libvirt API error"
	}
	return fmt.Sprintf("reason %d", reason)
}

func isRunning(state int32) bool {
	s := libvirt.DomainState(state)
	return s == libvirt.DomainRunning || s == libvirt.DomainBlocked
}

func stateOf(state int32) provider.State {
	switch libvirt.DomainState(state) {
	case libvirt.DomainRunning, libvirt.DomainBlocked:
		return provider.StateRunning
	case libvirt.DomainPaused, libvirt.DomainShutdown, libvirt.DomainShutoff, libvirt.DomainPmsuspended:
		return provider.StateStopped
	case libvirt.DomainCrashed:
		return provider.StateFailed
	}
	return provider.StateUnknown
}

// SweepVolumes deletes the per-Proxy volumes (proxy-<uid>-*) in host's
// pool that nothing uses and whose UID collect accepts, and returns the
// UIDs it offered collect and the volumes it deleted. Volumes carry no
// metadata, so "nothing uses" is proven conservatively in the same call:
// no domain on the host, of any install or none, mentions the UID anywhere
// in its live or persistent XML (name, metadata, disk source paths: volume
// names carry the UID), and no volume of the pool names the volume as its
// backing file. When any domain or volume cannot be read nothing is
// offered or deleted. collect decides ownership (see OrphanCollector); it
// is called once per candidate UID, while the host's call is held, so it
// must not block. A host that is not configured, or has no pool, holds
// nothing.
func (p *Provider) SweepVolumes(ctx context.Context, host string, collect func(uid string) bool) (candidates, deleted []string, err error) {
	err = p.withHost(ctx, host, nil, func(ctx context.Context, c virt.Client, hs HostSpec) error {
		pool, err := lookupPool(c, hs.Pool)
		if errors.Is(err, ErrPoolMissing) {
			return nil
		}
		if err != nil {
			return err
		}
		log := logr.FromContextOrDiscard(ctx).WithValues("host", host, "pool", hs.Pool)
		candidates, deleted, err = sweepPool(log, c, pool, collect)
		return err
	})
	if errors.Is(err, conn.ErrHostNotConfigured) {
		return nil, nil, nil
	}
	return candidates, deleted, err
}

// sweepPool is SweepVolumes on one host's pool.
func sweepPool(log logr.Logger, c virt.Client, pool libvirt.StoragePool, collect func(uid string) bool) (candidates, deleted []string, err error) {
	vols, _, err := c.StoragePoolListAllVolumes(pool, 1, 0)
	if err != nil {
		return nil, nil, classify(err)
	}
	uids, byUID := volumesByOwner(vols)
	if len(uids) == 0 {
		return nil, nil, nil
	}
	docs, err := domainDocuments(c)
	if err != nil {
		return nil, nil, err
	}
	backing, err := backingPaths(c, vols)
	if err != nil {
		return nil, nil, err
	}
	for _, uid := range uids {
		if slices.ContainsFunc(docs, func(doc string) bool { return strings.Contains(doc, uid) }) {
			continue
		}
		candidates = append(candidates, uid)
		if !collect(uid) {
			continue
		}
		gone, err := deleteUnlessBacking(log, c, byUID[uid], backing)
		deleted = append(deleted, gone...)
		if err != nil {
			return candidates, deleted, err
		}
	}
	return candidates, deleted, nil
}

// volumesByOwner groups the per-Proxy volumes among vols by their owner's
// UID; uids in the order first seen.
func volumesByOwner(vols []libvirt.StorageVol) (uids []string, byUID map[string][]libvirt.StorageVol) {
	byUID = map[string][]libvirt.StorageVol{}
	for _, v := range vols {
		if uid, ok := domxml.VolumeOwnerUID(v.Name); ok {
			if byUID[uid] == nil {
				uids = append(uids, uid)
			}
			byUID[uid] = append(byUID[uid], v)
		}
	}
	return uids, byUID
}

// deleteUnlessBacking deletes each of vols that no volume names as its
// backing file (backing: paths and names), and returns the names deleted.
func deleteUnlessBacking(log logr.Logger, c virt.Client, vols []libvirt.StorageVol, backing map[string]bool) (deleted []string, err error) {
	for _, v := range vols {
		path, err := volPath(c, v)
		if err != nil {
			return deleted, err
		}
		if backing[path] || backing[v.Name] {
			log.V(1).Info("Not sweeping volume that backs another", "volume", v.Name)
			continue
		}
		if err := c.StorageVolDelete(v, 0); err != nil && !virt.IsCode(err, libvirt.ErrNoStorageVol) {
			return deleted, classify(fmt.Errorf("deleting volume %s: %w", v.Name, err))
		}
		deleted = append(deleted, v.Name)
	}
	return deleted, nil
}

// domainDocuments returns the live and persistent XML of every domain on
// the host. A domain undefined meanwhile is skipped; any other failure
// fails the whole: an unread domain might be the one using a volume.
func domainDocuments(c virt.Client) ([]string, error) {
	doms, _, err := c.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive|libvirt.ConnectListDomainsInactive)
	if err != nil {
		return nil, classify(err)
	}
	var docs []string
	for _, dom := range doms {
		for _, flags := range []libvirt.DomainXMLFlags{0, libvirt.DomainXMLInactive} {
			doc, err := c.DomainGetXMLDesc(dom, flags)
			if virt.IsCode(err, libvirt.ErrNoDomain) {
				break
			}
			if err != nil {
				return nil, classify(fmt.Errorf("reading the XML of domain %s: %w", dom.Name, err))
			}
			docs = append(docs, dom.Name, doc)
		}
	}
	return docs, nil
}

// backingPaths returns the backing files (paths as written, cleaned) the
// volumes name. A volume deleted meanwhile is skipped; any other failure
// fails the whole.
func backingPaths(c virt.Client, vols []libvirt.StorageVol) (map[string]bool, error) {
	out := map[string]bool{}
	for _, v := range vols {
		doc, err := c.StorageVolGetXMLDesc(v, 0)
		if virt.IsCode(err, libvirt.ErrNoStorageVol) {
			continue
		}
		if err != nil {
			return nil, classify(fmt.Errorf("reading the XML of volume %s: %w", v.Name, err))
		}
		var x libvirtxml.StorageVolume
		if err := x.Unmarshal(doc); err != nil {
			return nil, provider.Permanentf("parsing the XML of volume %s: %v", v.Name, err)
		}
		if x.BackingStore != nil && x.BackingStore.Path != "" {
			out[path.Clean(x.BackingStore.Path)] = true
		}
	}
	return out, nil
}
