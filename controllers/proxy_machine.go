package controllers

import (
	"context"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// waitFor says why a Proxy cannot be handed to its provider yet.
type waitFor struct {
	reason  string
	message string
	after   time.Duration
}

func waitOf(w *plugin.Wait) *waitFor {
	if w == nil {
		return nil
	}
	return &waitFor{reason: w.Reason, message: w.Message, after: w.After}
}

const dependencyPoll = plugin.DependencyPoll

// machines is the plug-in of p's provider building its Machines.
func (r *ProxyReconciler) machines(p *crawlv1.Proxy) (plugin.Machines, error) {
	pl := r.Plugins.Get(string(p.Spec.Provider))
	if pl == nil {
		return nil, provider.Permanentf("provider %q has no plug-in (registered: %v)", p.Spec.Provider, r.Plugins.Names())
	}
	return pl.Machines(r.Client), nil
}

// machineFor builds the provider's view of p for Get: identity, sizing and
// what its provider's plug-in adds (for the Hosts domain, the host). A
// Proxy the plug-in places is recorded there first (a wait). What only
// Create needs (e.g. the image) resolveForCreate adds when an instance
// must be created.
func (r *ProxyReconciler) machineFor(ctx context.Context, p *crawlv1.Proxy) (*provider.Machine, *waitFor, error) {
	ms, err := r.machines(p)
	if err != nil {
		return nil, nil, err
	}
	m := baseMachine(p, r.Tag)
	placeOn, wait, err := ms.ForGet(ctx, p, m)
	if wait != nil || err != nil {
		return nil, waitOf(wait), err
	}
	if placeOn != "" {
		if err := r.recordPlacement(ctx, p, placeOn); err != nil {
			return nil, nil, err
		}
		return nil, &waitFor{reason: crawlv1.ProxyProvisioningReason, message: "placed on host " + placeOn, after: time.Millisecond}, nil
	}
	if m.Host != "" {
		// Where the instance is, whatever an older write left in
		// status.host; the deferred patch records it.
		p.Status.Host = m.Host
	}
	return m, nil, nil
}

// recordPlacement writes the chosen host before anything is created, so a
// restart or a failed status write never places the same Proxy twice. The
// write is conditional on the resourceVersion read: a reconcile that read a
// stale Proxy (the cache had not seen an earlier placement) is refused
// instead of moving the Proxy to another host, and retries on a fresh read.
func (r *ProxyReconciler) recordPlacement(ctx context.Context, p *crawlv1.Proxy, host string) error {
	orig := p.DeepCopy()
	p.Status.Host = host
	if err := r.Client.Status().Patch(ctx, p, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		p.Status.Host = "" // the deferred, unconditional patch must not write it
		return provider.Transientf("record placement on host %s: %w", host, err)
	}
	// p now holds the version this write produced, on which the deferred
	// patch builds.
	return nil
}

// resolveForCreate adds what only Create needs (the plug-in's ForCreate:
// for kvm, a KVMHost not being deleted and the image). A missing one is a
// wait.
func (r *ProxyReconciler) resolveForCreate(ctx context.Context, p *crawlv1.Proxy, m *provider.Machine) (*waitFor, error) {
	ms, err := r.machines(p)
	if err != nil {
		return nil, err
	}
	wait, err := ms.ForCreate(ctx, p, m)
	return waitOf(wait), err
}

// machineForDelete builds the identity Delete needs; it never waits for a
// host or an image, so deletion converges when they are gone.
func (r *ProxyReconciler) machineForDelete(ctx context.Context, p *crawlv1.Proxy) (*provider.Machine, error) {
	ms, err := r.machines(p)
	if err != nil {
		return nil, err
	}
	m := baseMachine(p, r.Tag)
	if err := ms.ForDelete(ctx, p, m); err != nil {
		return nil, err
	}
	return m, nil
}

// neverPlaced reports whether m, p's Machine for Delete, was never placed,
// so nothing was ever created for it: a Machine of the Hosts domain on no
// host.
func (r *ProxyReconciler) neverPlaced(p *crawlv1.Proxy, m *provider.Machine) bool {
	return r.Plugins.DomainOf(string(p.Spec.Provider)) == plugin.Hosts && m.Host == ""
}

// attachSquid gives m the operator-managed squid configuration of p
// (spec.access, the credential, the port, the manager's probe sources
// and its counter credential), which every provider renders with squid.Render; nil when the
// user's cloud-init owns squid, and then the sources spec.access admits,
// for a provider that guards them itself. spec.access passed the rules
// admission applies in reconcilePolicy.
func (r *ProxyReconciler) attachSquid(p *crawlv1.Proxy, m *provider.Machine, creds *credentials, stats *squid.Auth) {
	m.Squid, m.AllowedSourceCIDRs = nil, nil
	if !p.IsManaged() {
		if p.Spec.Access != nil {
			m.AllowedSourceCIDRs = slices.Clone(p.Spec.Access.AllowedSourceCIDRs)
		}
		return
	}
	var auth squid.Auth
	if creds != nil {
		auth = creds.auth()
	}
	c := proxyaccess.SquidConfig(p.Spec.Access, m.Port, auth, r.ProbeSourceCIDRs)
	if stats != nil {
		c.Stats = *stats
	}
	m.Squid = &c
}

// defaulted is p's spec as admission defaults it, as far as the
// controllers read it (port, sizing, guest agent): a Proxy stored with the
// webhooks off carries no defaults, and a replica is sized before it is
// stored.
func defaulted(s *crawlv1.ProxySpec) crawlv1.ProxySpec {
	d := crawlv1.ProxySpec{Port: s.Port, InstallGuestAgent: s.InstallGuestAgent, Resources: *s.Resources.DeepCopy()}
	d.Default(false)
	return d
}

func baseMachine(p *crawlv1.Proxy, tag string) *provider.Machine {
	s := defaulted(&p.Spec)
	m := &provider.Machine{
		Namespace:         p.Namespace,
		Name:              p.Name,
		UID:               string(p.UID),
		ProviderID:        p.Status.ProviderID,
		Tag:               tag,
		CPUs:              max(s.Resources.CPUs, 1),
		UserData:          p.Spec.CloudInit.UserDataBytes(),
		VendorData:        []byte(p.Spec.CloudInit.VendorData),
		InstallGuestAgent: *s.InstallGuestAgent,
		Port:              s.Port,
		Project:           p.Spec.Placement.Project,
		Zone:              p.Spec.Placement.Zone,
		MachineType:       p.Spec.Placement.MachineType,
		SpreadGroup:       p.Labels[crawlv1.PoolNameLabel],
	}
	// Sizes as stored: none leaves the size to the provider (a machine
	// type's memory, an image's disk).
	if q := p.Spec.Resources.Memory; q != nil {
		m.MemoryBytes = q.Value()
	}
	if q := p.Spec.Resources.Disk; q != nil {
		m.DiskBytes = q.Value()
	}
	return m
}
