// Package plugin is how a provider plugs into the operator's generic code
// (the Proxy and ProxyPool controllers, the orphan sweep and the admission
// webhooks), beside its provider.Provider: where its instances are placed,
// its part of admission, how a Proxy becomes its Machine, and what the
// sweep does for it besides ListByTag and Delete. Each provider package
// defines one Plugin; controllers.Plugins is the one list of them, which
// the manager hands to the controllers (Deps) and to the webhooks. Generic
// code never names a provider: it asks the Plugin of spec.provider.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
)

// Plugin is what generic code needs from one provider.
type Plugin interface {
	// Name is the spec.provider value it serves, its provider.Provider's.
	Name() string
	// Domain is where its instances are placed.
	Domain() Domain
	// HostOf is the KVMHost p's instance is on or placed on (the Hosts
	// domain); "" for the other domains and for a Proxy not placed.
	HostOf(p *crawlv1.Proxy) string
	// Default applies this provider's defaults to a Proxy spec, after
	// crawlv1.ProxySpec.Default, on every admission (a ProxyPool's
	// template included).
	Default(s *crawlv1.ProxySpec)
	// Validate returns the problems only this provider finds in p, each
	// naming its field. The rules of every Proxy (name, access, port,
	// sizes) and of the placement domains (see Domain) are checked beside
	// it.
	Validate(p *crawlv1.Proxy, policy Policy) field.ErrorList
	// Machines builds this provider's Machines; r reads the cluster (the
	// manager's cached client).
	Machines(r client.Reader) Machines
}

// Domain is where a provider's instances are placed, and so what generic
// code does to place them.
type Domain string

const (
	// Hosts: each instance runs on a KVMHost. A Proxy names one
	// (spec.placement.host) or selects one (spec.placement.hostSelector),
	// and its Machine carries it (Machine.Host): a Machine without one was
	// never placed, so nothing was created for it. A ProxyPool places
	// each replica on a Ready KVMHost matching its placement.hostSelector
	// with room for it and the fewest of its replicas (placement.
	// cpuOvercommit applies), and an orphan's OrphanDeleted Event goes on
	// its KVMHost.
	Hosts Domain = "hosts"
	// Zones: each instance runs in a zone (spec.placement.zone); a
	// ProxyPool spreads its replicas over placement.zones.
	Zones Domain = "zones"
	// Nodes: the provider spreads the instances of one group
	// (Machine.SpreadGroup, a ProxyPool's name) over cluster nodes itself;
	// a ProxyPool places nothing.
	Nodes Domain = "nodes"
)

// Policy is the part of the manager's configuration admission applies
// through the plug-ins.
type Policy struct {
	// AllowImageURLs admits images the manager itself downloads from a URL
	// (--allow-proxy-image-urls): from inside the cluster, so a URL lets
	// anyone who may create a Proxy make the manager fetch internal
	// addresses.
	AllowImageURLs bool
	// RefuseUserData refuses spec.cloudInit altogether
	// (--allow-proxy-user-data=false): on kvm and gcp it runs as root on
	// the instance, which sits on the hypervisor's network or in the VPC,
	// and can listen where squid should (docs/security.md). Checked by
	// ValidateCloudInit, for every provider.
	RefuseUserData bool
}

// UserDataFlag is the manager flag behind Policy.RefuseUserData.
const UserDataFlag = "--allow-proxy-user-data"

// ValidateCloudInit refuses every spec.cloudInit field that is set when
// the policy refuses user-data, naming the field and the flag; the
// content never goes into a message. Admission and the Proxy controller
// both apply it.
func (pol Policy) ValidateCloudInit(s *crawlv1.ProxySpec) field.ErrorList {
	if !pol.RefuseUserData {
		return nil
	}
	ci := field.NewPath("spec", "cloudInit")
	var errs field.ErrorList
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"userData", s.CloudInit.UserData != ""},
		{"userDataBase64", len(s.CloudInit.UserDataBase64) > 0},
		{"vendorData", s.CloudInit.VendorData != ""},
	} {
		if f.set {
			errs = append(errs, field.Forbidden(ci.Child(f.name),
				"this installation refuses Proxy cloud-init (the manager runs with "+UserDataFlag+"=false): it would run as root on the instance, on the hypervisor's network or in the VPC; the operator's managed squid needs none"))
		}
	}
	return errs
}

// Machines turns a Proxy into its provider's Machine. The Proxy
// controller first fills in what every provider gets (identity, tag,
// sizing, user-data, port, squid); Machines adds the provider's own part.
type Machines interface {
	// ForGet completes m for looking at p's instance. A Proxy that must be
	// placed first gets the host to place it on (placeOn): the controller
	// records it in status.host, conditional on the Proxy's
	// resourceVersion and before anything is created, so a restart or a
	// stale read never places it twice, and comes back. A wait says why
	// there is nothing to look at yet. When m.Host is set, status.host
	// follows it.
	ForGet(ctx context.Context, p *crawlv1.Proxy, m *provider.Machine) (placeOn string, wait *Wait, err error)
	// ForCreate adds to m what only Create needs (e.g. the image); a wait
	// when something it needs is missing.
	ForCreate(ctx context.Context, p *crawlv1.Proxy, m *provider.Machine) (*Wait, error)
	// ForDelete completes m for Delete from what p records. It never
	// waits, so deletion converges when what p referenced is gone.
	ForDelete(ctx context.Context, p *crawlv1.Proxy, m *provider.Machine) error
}

// Wait says why a Proxy cannot be handed to its provider yet: a Proxy
// condition reason and message, and when to look again.
type Wait struct {
	Reason  string
	Message string
	After   time.Duration
}

// DependencyPoll is how often a Proxy waiting for an object it depends on
// (a KVMHost, a KVMImage, a credential Secret) is looked at again.
const DependencyPoll = 15 * time.Second

// GivenImage are the Machines of a provider that needs nothing from the
// cluster: the Machine's image is spec.placement.image as given (a cloud
// source image; empty: the provider's default).
type GivenImage struct{}

func (GivenImage) ForGet(_ context.Context, p *crawlv1.Proxy, m *provider.Machine) (string, *Wait, error) {
	m.Image = provider.Image{URL: p.Spec.Placement.Image}
	return "", nil, nil
}

func (GivenImage) ForCreate(context.Context, *crawlv1.Proxy, *provider.Machine) (*Wait, error) {
	return nil, nil
}

func (GivenImage) ForDelete(context.Context, *crawlv1.Proxy, *provider.Machine) error { return nil }

// Basic is the Plugin of a provider outside the Hosts domain whose
// Machines need nothing from the cluster (GivenImage); its own admission
// rules are Defaults and Rules, either nil for none; Shared is its
// SharedEgress, nil when its instances may each have their own.
type Basic struct {
	Provider string
	In       Domain
	Defaults func(s *crawlv1.ProxySpec)
	Rules    func(p *crawlv1.Proxy, policy Policy) field.ErrorList
	// UnmanagedSources: see UnmanagedSourcesGuard.
	UnmanagedSources bool
	Shared           func(s *crawlv1.ProxySpec) string
}

var _ SharedEgress = Basic{}

func (b Basic) SharedEgress(s *crawlv1.ProxySpec) string {
	if b.Shared == nil {
		return ""
	}
	return b.Shared(s)
}

var _ Plugin = Basic{}

func (b Basic) Name() string                  { return b.Provider }
func (b Basic) Domain() Domain                { return b.In }
func (Basic) HostOf(*crawlv1.Proxy) string    { return "" }
func (Basic) Machines(client.Reader) Machines { return GivenImage{} }

func (b Basic) Default(s *crawlv1.ProxySpec) {
	if b.Defaults != nil {
		b.Defaults(s)
	}
}

func (b Basic) Validate(p *crawlv1.Proxy, policy Policy) field.ErrorList {
	if b.Rules == nil {
		return nil
	}
	return b.Rules(p, policy)
}

// GuardsUnmanagedSources implements UnmanagedSourcesGuard.
func (b Basic) GuardsUnmanagedSources() bool { return b.UnmanagedSources }

// UnmanagedSourcesGuard is a plug-in whose provider admits the clients of
// an unmanaged Proxy (spec.access.managed: false) by its
// spec.access.allowedSourceCIDRs itself, in front of the squid it does not
// configure (the kubernetes provider's NetworkPolicy). When it says so,
// admission requires that field of such a Proxy instead of refusing it.
type UnmanagedSourcesGuard interface {
	GuardsUnmanagedSources() bool
}

// SharedEgress is what a plug-in may say of its instances' egress
// addresses (docs/egress.md): why every instance of s leaves from one
// address the provider shares (a Cloud NAT, a node's address), "" when
// each may have its own, which only measurement proves. A ProxyPool with
// egress.distinct Required is refused with this reason, by admission
// and by the pool controller. A plug-in without it shares nothing.
type SharedEgress interface {
	SharedEgress(s *crawlv1.ProxySpec) string
}

// SharedEgressOf is pl's SharedEgress for s; "" when pl says nothing.
func SharedEgressOf(pl Plugin, s *crawlv1.ProxySpec) string {
	if se, ok := pl.(SharedEgress); ok {
		return se.SharedEgress(s)
	}
	return ""
}

// HostEgress is what a plug-in of the Hosts domain may say of a host's
// egress: SharedBy is the name of what every instance on h leaves
// through (e.g. "NAT" for libvirt's NAT network), "" when instances may
// have addresses of their own (a bridge: measured, or assigned).
// Placement puts at most one replica of a pool with egress.distinct
// Required on a host with a SharedBy, and prefers others with Preferred.
type HostEgress interface {
	SharedBy(h *crawlv1.KVMHost) string
}

// HostSharedBy is pl's HostEgress for h; "" when pl says nothing.
func HostSharedBy(pl Plugin, h *crawlv1.KVMHost) string {
	if he, ok := pl.(HostEgress); ok {
		return he.SharedBy(h)
	}
	return ""
}

// VolumeSweeper is a sweep extra a provider may implement (kvm does): it
// deletes, per host, the volumes its instances left behind when they were
// removed outside the operator (see controllers.OrphanCollector).
type VolumeSweeper interface {
	// SweepVolumes deletes host's unused per-Proxy volumes whose owner UID
	// collect accepts, and returns the UIDs it offered collect and the
	// volumes it deleted.
	SweepVolumes(ctx context.Context, host string, collect func(uid string) bool) (candidates, deleted []string, err error)
	// VolumeOwnerUID is the Proxy UID a volume was made for.
	VolumeOwnerUID(volume string) (string, bool)
}

// List is the registration list: the plug-ins of every provider the
// operator knows, in the order messages name them.
type List []Plugin

// Get returns the plug-in serving name, nil if none does.
func (l List) Get(name string) Plugin {
	for _, p := range l {
		if p.Name() == name {
			return p
		}
	}
	return nil
}

// Names returns the providers' names in list order.
func (l List) Names() []string {
	out := make([]string, 0, len(l))
	for _, p := range l {
		out = append(out, p.Name())
	}
	return out
}

// NamesIn returns, in list order, the names of the providers placing in d.
func (l List) NamesIn(d Domain) []string {
	var out []string
	for _, p := range l {
		if p.Domain() == d {
			out = append(out, p.Name())
		}
	}
	return out
}

// GuardsUnmanagedSources reports whether the provider name admits an
// unmanaged Proxy's clients by spec.access.allowedSourceCIDRs
// (UnmanagedSourcesGuard).
func (l List) GuardsUnmanagedSources(name string) bool {
	g, ok := l.Get(name).(UnmanagedSourcesGuard)
	return ok && g.GuardsUnmanagedSources()
}

// DomainOf is the domain of the provider name, "" when none is listed.
func (l List) DomainOf(name string) Domain {
	if p := l.Get(name); p != nil {
		return p.Domain()
	}
	return ""
}

// Validate reports a list generic code cannot use: empty, a plug-in
// without a name or a domain, or two serving one name.
func (l List) Validate() error {
	if len(l) == 0 {
		return errors.New("no provider plug-ins")
	}
	var errs []error
	seen := map[string]bool{}
	for i, p := range l {
		switch {
		case p == nil:
			errs = append(errs, fmt.Errorf("plug-in %d is nil", i))
			continue
		case p.Name() == "":
			errs = append(errs, fmt.Errorf("plug-in %d (%T) has no name", i, p))
		case seen[p.Name()]:
			errs = append(errs, fmt.Errorf("two plug-ins serve provider %q", p.Name()))
		}
		switch p.Domain() {
		case Hosts, Zones, Nodes:
		default:
			errs = append(errs, fmt.Errorf("plug-in %q: unknown domain %q", p.Name(), p.Domain()))
		}
		seen[p.Name()] = true
	}
	return errors.Join(errs...)
}

// StaticAddresses is what a plug-in implements when its provider boots an
// instance with a static address from a Cluster API IPAM pool
// (spec.network.addressesFromPools): the Machine's StaticNetwork. Admission
// refuses the field for the other providers.
type StaticAddresses interface {
	// StaticAddresses is true when the provider configures
	// Machine.StaticNetwork on the instance.
	StaticAddresses() bool
}

// TakesStaticAddresses reports whether p's provider can boot an instance
// with a static address from an IPAM pool.
func TakesStaticAddresses(p Plugin) bool {
	s, ok := p.(StaticAddresses)
	return ok && s.StaticAddresses()
}
