package kvm

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// Plugin is the kvm provider's part in the operator's generic code (see
// package plugin): instances on KVMHosts, booting a KVMImage or an image
// URL. Its admission rules are in admission.go.
func Plugin() plugin.Plugin { return hostsPlugin{} }

type hostsPlugin struct{}

func (hostsPlugin) Name() string { return Name }

func (hostsPlugin) Domain() plugin.Domain { return plugin.Hosts }

// SharedBy: on a libvirt network (networkMode network, libvirt's NAT by
// default) every VM leaves through the host's address; on a bridge each
// VM has an address of its own (assigned or by DHCP, perhaps NATed
// again by a router: measurement tells).
func (hostsPlugin) SharedBy(h *crawlv1.KVMHost) string {
	if h.Spec.NetworkMode == crawlv1.NetworkModeBridge {
		return ""
	}
	return "NAT"
}

// HostOf is where p's domain is: the provider ID's host, else the host
// recorded at placement, else the one its spec names.
func (hostsPlugin) HostOf(p *crawlv1.Proxy) string {
	return cmp.Or(recordedHost(p), p.Status.Host, p.Spec.Placement.Host)
}

// Machines reads KVMHosts, KVMImages and Proxies through r.
func (hostsPlugin) Machines(r client.Reader) plugin.Machines { return machines{r} }

// recordedHost is the host in p's provider ID, empty without one.
func recordedHost(p *crawlv1.Proxy) string {
	if p.Status.ProviderID == "" {
		return ""
	}
	host, _, err := provider.ParseKVMProviderID(p.Status.ProviderID)
	if err != nil {
		return ""
	}
	return host
}

type machines struct{ r client.Reader }

// ForGet gives m its host: where the provider ID says the domain is, else
// status.host. A Proxy on no host yet is placed first: on placement.host,
// or on the Ready hostSelector match with the fewest Proxies. The KVMHost
// and KVMImage objects are not needed to look at a domain: ForCreate adds
// them when one must be created.
func (k machines) ForGet(ctx context.Context, p *crawlv1.Proxy, m *provider.Machine) (string, *plugin.Wait, error) {
	host := p.Status.Host
	if h := recordedHost(p); h != "" && h != host {
		// The domain is where its provider ID says, whatever an older
		// write left in status.host.
		logr.FromContextOrDiscard(ctx).Info("status.host disagrees with the provider ID; following the provider ID",
			"host", h, "statusHost", p.Status.Host, "providerID", p.Status.ProviderID)
		host = h
	}
	if host == "" {
		return k.selectHost(ctx, p)
	}
	m.Host = host
	return "", nil, nil
}

// ForCreate adds what only Create needs: a KVMHost that is not being
// deleted, and the image. A missing one is a wait.
func (k machines) ForCreate(ctx context.Context, p *crawlv1.Proxy, m *provider.Machine) (*plugin.Wait, error) {
	h := &crawlv1.KVMHost{}
	if err := k.r.Get(ctx, client.ObjectKey{Name: m.Host}, h); err != nil {
		if apierrors.IsNotFound(err) {
			return &plugin.Wait{Reason: crawlv1.ProxyWaitingForHostReason, Message: fmt.Sprintf("KVMHost %q does not exist", m.Host), After: plugin.DependencyPoll}, nil
		}
		return nil, provider.Transient(err)
	}
	if !h.DeletionTimestamp.IsZero() {
		return &plugin.Wait{Reason: crawlv1.ProxyWaitingForHostReason, Message: fmt.Sprintf("KVMHost %q is being deleted", m.Host), After: plugin.DependencyPoll}, nil
	}
	img, wait, err := k.resolveImage(ctx, p)
	if wait != nil || err != nil {
		return wait, err
	}
	m.Image = img
	return nil, nil
}

// ForDelete gives m the host the domain is on: where the provider ID says,
// then the placement. It never waits for a host or an image, so deletion
// converges when they are gone.
func (machines) ForDelete(_ context.Context, p *crawlv1.Proxy, m *provider.Machine) error {
	if p.Status.ProviderID != "" {
		host, _, err := provider.ParseKVMProviderID(p.Status.ProviderID)
		if err != nil {
			return provider.Permanent(err)
		}
		m.Host = host
	}
	m.Host = cmp.Or(m.Host, p.Status.Host, p.Spec.Placement.Host)
	return nil
}

// selectHost picks, for a hostSelector, the Ready matching KVMHost with the
// fewest Proxies (name order breaks ties).
func (k machines) selectHost(ctx context.Context, p *crawlv1.Proxy) (string, *plugin.Wait, error) {
	pl := p.Spec.Placement
	if pl.Host != "" {
		return pl.Host, nil, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(pl.HostSelector)
	if err != nil {
		return "", nil, provider.Permanentf("spec.placement.hostSelector: %w", err)
	}
	hosts := &crawlv1.KVMHostList{}
	if err := k.r.List(ctx, hosts, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return "", nil, provider.Transient(err)
	}
	proxies := &crawlv1.ProxyList{}
	if err := k.r.List(ctx, proxies); err != nil {
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
		return "", &plugin.Wait{Reason: crawlv1.ProxyWaitingForHostReason, Message: fmt.Sprintf("no Ready KVMHost matches %s", sel), After: plugin.DependencyPoll}, nil
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
func (k machines) resolveImage(ctx context.Context, p *crawlv1.Proxy) (provider.Image, *plugin.Wait, error) {
	pl := p.Spec.Placement
	if crawlv1.IsImageURL(pl.Image) {
		return provider.Image{URL: pl.Image, Checksum: pl.ImageChecksum,
			Format:   string(pl.ImageFormat.OrDefault()),
			Firmware: string(pl.Firmware.OrDefault())}, nil, nil
	}
	img := &crawlv1.KVMImage{}
	if err := k.r.Get(ctx, client.ObjectKey{Name: pl.Image}, img); err != nil {
		if apierrors.IsNotFound(err) {
			return provider.Image{}, &plugin.Wait{Reason: crawlv1.ProxyWaitingForImageReason, Message: fmt.Sprintf("KVMImage %q does not exist", pl.Image), After: plugin.DependencyPoll}, nil
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
		Format:   string(img.Spec.Format.OrDefault()),
		Firmware: string(img.Spec.Firmware.OrDefault()),
	}
}

// VolumeOwnerUID is the Proxy UID a volume SweepVolumes deleted was made
// for (the sweep's Events name it).
func (p *Provider) VolumeOwnerUID(volume string) (string, bool) {
	return domxml.VolumeOwnerUID(volume)
}

var _ plugin.VolumeSweeper = (*Provider)(nil)

// StaticAddresses: a kvm instance on a bridged KVMHost takes the address of
// its IPAM claim in its seed's network-config (Machine.StaticNetwork).
func (hostsPlugin) StaticAddresses() bool { return true }

var _ plugin.StaticAddresses = hostsPlugin{}
