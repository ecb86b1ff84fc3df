package controllers

import (
	"context"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// waitFor says why a Proxy cannot be handed to its provider yet.
type waitFor struct {
	reason  string
	message string
	after   time.Duration
}

const dependencyPoll = 15 * time.Second

// machineFor builds the provider's view of p for Get: identity, sizing and,
// for kvm, the host. A Proxy with no host yet is placed first (a wait). The
// KVMHost and KVMImage objects are not needed to look at an instance:
// resolveForCreate adds them when one must be created.
func (r *ProxyReconciler) machineFor(ctx context.Context, p *crawlv1.Proxy) (*provider.Machine, *waitFor, error) {
	m := baseMachine(p, r.Tag)
	if p.Spec.Provider != crawlv1.ProviderKVM {
		m.Image = provider.Image{URL: p.Spec.Placement.Image}
		return m, nil, nil
	}
	if host := recordedHost(p); host != "" && host != p.Status.Host {
		// The instance is where its provider ID says, whatever an older
		// write left in status.host.
		logf.FromContext(ctx).Info("status.host disagrees with the provider ID; following the provider ID",
			"host", host, "statusHost", p.Status.Host, "providerID", p.Status.ProviderID)
		p.Status.Host = host
	}
	if p.Status.Host == "" {
		host, wait, err := r.selectHost(ctx, p)
		if wait != nil || err != nil {
			return nil, wait, err
		}
		if err := r.recordPlacement(ctx, p, host); err != nil {
			return nil, nil, err
		}
		return nil, &waitFor{reason: crawlv1.ProxyProvisioningReason, message: "placed on host " + host, after: time.Millisecond}, nil
	}
	m.Host = p.Status.Host
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
	// The deferred patch diffs against the object as read; a new
	// resourceVersion in that diff would make its two writes conflict.
	p.ResourceVersion = orig.ResourceVersion
	return nil
}

// recordedHost is the host in a kvm provider ID, empty without one.
func recordedHost(p *crawlv1.Proxy) string {
	if p.Spec.Provider != crawlv1.ProviderKVM || p.Status.ProviderID == "" {
		return ""
	}
	host, _, err := provider.ParseKVMProviderID(p.Status.ProviderID)
	if err != nil {
		return ""
	}
	return host
}

// resolveForCreate adds what only Create needs: for kvm, a KVMHost that is
// not being deleted and the image. A missing one is a wait.
func (r *ProxyReconciler) resolveForCreate(ctx context.Context, p *crawlv1.Proxy, m *provider.Machine) (*waitFor, error) {
	if p.Spec.Provider != crawlv1.ProviderKVM {
		return nil, nil
	}
	h := &crawlv1.KVMHost{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: m.Host}, h); err != nil {
		if apierrors.IsNotFound(err) {
			return &waitFor{crawlv1.ProxyWaitingForHostReason, fmt.Sprintf("KVMHost %q does not exist", m.Host), dependencyPoll}, nil
		}
		return nil, provider.Transient(err)
	}
	if !h.DeletionTimestamp.IsZero() {
		return &waitFor{crawlv1.ProxyWaitingForHostReason, fmt.Sprintf("KVMHost %q is being deleted", m.Host), dependencyPoll}, nil
	}
	img, wait, err := r.resolveImage(ctx, p)
	if wait != nil || err != nil {
		return wait, err
	}
	m.Image = img
	return nil, nil
}

// machineForDelete builds the identity Delete needs; it never waits for a
// host or an image, so deletion converges when they are gone. The host is
// where the provider ID says the instance is, then the placement.
func (r *ProxyReconciler) machineForDelete(_ context.Context, p *crawlv1.Proxy) (*provider.Machine, error) {
	m := baseMachine(p, r.Tag)
	if p.Spec.Provider == crawlv1.ProviderKVM && p.Status.ProviderID != "" {
		host, _, err := provider.ParseKVMProviderID(p.Status.ProviderID)
		if err != nil {
			return nil, provider.Permanent(err)
		}
		m.Host = host
	}
	for _, h := range []string{p.Status.Host, p.Spec.Placement.Host} {
		if m.Host == "" {
			m.Host = h
		}
	}
	return m, nil
}

// attachSquid gives m the operator-managed squid configuration of p
// (spec.access, the credential, the port and the manager's probe
// sources), which every provider renders with squid.Render; nil when the
// user's cloud-init owns squid. An access the renderer refuses (stored
// past the webhook) is permanent: nothing is created with it.
func (r *ProxyReconciler) attachSquid(p *crawlv1.Proxy, m *provider.Machine, creds *credentials) error {
	m.Squid = nil
	if !p.IsManaged() {
		return nil
	}
	var auth squid.Auth
	if creds != nil {
		auth = creds.auth()
	}
	c := proxyaccess.SquidConfig(p.Spec.Access, m.Port, auth, r.ProbeSourceCIDRs)
	if errs := c.ValidateFields(proxyaccess.AccessPath); len(errs) > 0 {
		return provider.Permanentf("%v", errs.ToAggregate())
	}
	m.Squid = &c
	return nil
}

func baseMachine(p *crawlv1.Proxy, tag string) *provider.Machine {
	m := &provider.Machine{
		Namespace:         p.Namespace,
		Name:              p.Name,
		UID:               string(p.UID),
		ProviderID:        p.Status.ProviderID,
		Tag:               tag,
		CPUs:              max(p.Spec.Resources.CPUs, 1),
		UserData:          p.Spec.CloudInit.UserDataBytes(),
		VendorData:        []byte(p.Spec.CloudInit.VendorData),
		InstallGuestAgent: p.Spec.InstallGuestAgent == nil || *p.Spec.InstallGuestAgent,
		Port:              p.Spec.Port,
		Project:           p.Spec.Placement.Project,
		Zone:              p.Spec.Placement.Zone,
		MachineType:       p.Spec.Placement.MachineType,
		SpreadGroup:       p.Labels[crawlv1.PoolNameLabel],
	}
	if m.Port == 0 {
		m.Port = crawlv1.DefaultProxyPort
	}
	if q := p.Spec.Resources.Memory; q != nil {
		m.MemoryBytes = q.Value()
	}
	if q := p.Spec.Resources.Disk; q != nil {
		m.DiskBytes = q.Value()
	}
	return m
}

// selectHost picks, for a hostSelector, the Ready matching KVMHost with the
// fewest Proxies (name order breaks ties).
func (r *ProxyReconciler) selectHost(ctx context.Context, p *crawlv1.Proxy) (string, *waitFor, error) {
	pl := p.Spec.Placement
	if pl.Host != "" {
		return pl.Host, nil, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(pl.HostSelector)
	if err != nil {
		return "", nil, provider.Permanentf("spec.placement.hostSelector: %w", err)
	}
	hosts := &crawlv1.KVMHostList{}
	if err := r.Client.List(ctx, hosts, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return "", nil, provider.Transient(err)
	}
	proxies := &crawlv1.ProxyList{}
	if err := r.Client.List(ctx, proxies); err != nil {
		return "", nil, provider.Transient(err)
	}
	load := map[string]int{}
	for _, other := range proxies.Items {
		if other.Status.Host != "" {
			load[other.Status.Host]++
		}
	}
	var ready []string
	for _, h := range hosts.Items {
		if h.DeletionTimestamp.IsZero() && conditions.IsTrue(&h, crawlv1.ReadyCondition) {
			ready = append(ready, h.Name)
		}
	}
	if len(ready) == 0 {
		return "", &waitFor{crawlv1.ProxyWaitingForHostReason, fmt.Sprintf("no Ready KVMHost matches %s", sel), dependencyPoll}, nil
	}
	slices.SortFunc(ready, func(a, b string) int {
		if load[a] != load[b] {
			return load[a] - load[b]
		}
		if a < b {
			return -1
		}
		return 1
	})
	return ready[0], nil, nil
}

// resolveImage turns placement.image into a provider.Image: a KVMImage by
// name, or a URL with its checksum.
func (r *ProxyReconciler) resolveImage(ctx context.Context, p *crawlv1.Proxy) (provider.Image, *waitFor, error) {
	pl := p.Spec.Placement
	if crawlv1.IsImageURL(pl.Image) {
		return provider.Image{URL: pl.Image, Checksum: pl.ImageChecksum,
			Format:   string(orDefault(pl.ImageFormat, crawlv1.ImageFormatQCOW2)),
			Firmware: string(orDefault(pl.Firmware, crawlv1.FirmwareUEFI))}, nil, nil
	}
	img := &crawlv1.KVMImage{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: pl.Image}, img); err != nil {
		if apierrors.IsNotFound(err) {
			return provider.Image{}, &waitFor{crawlv1.ProxyWaitingForImageReason, fmt.Sprintf("KVMImage %q does not exist", pl.Image), dependencyPoll}, nil
		}
		return provider.Image{}, nil, provider.Transient(err)
	}
	return ImageOf(img), nil, nil
}

// ImageOf is the provider's view of a KVMImage.
func ImageOf(img *crawlv1.KVMImage) provider.Image {
	return provider.Image{
		Name:     img.Name,
		URL:      img.Spec.URL,
		Checksum: img.Spec.Checksum,
		Format:   string(orDefault(img.Spec.Format, crawlv1.ImageFormatQCOW2)),
		Firmware: string(orDefault(img.Spec.Firmware, crawlv1.FirmwareUEFI)),
	}
}

func orDefault[T ~string](v, def T) T {
	if v == "" {
		return def
	}
	return v
}
