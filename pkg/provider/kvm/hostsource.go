package kvm

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
)

// KubeHosts resolves host names to KVMHost objects. SSH material comes from
// the KVMHost's Secret, read on every load (so a Secret created after the
// manager started is picked up at the next dial), or from DefaultMaterial
// (the manager's --ssh-key-dir) when the KVMHost names none.
type KubeHosts struct {
	// Reader reads KVMHosts (the manager's cache).
	Reader client.Reader
	// SecretReader reads Secrets; the API reader, so the manager needs only
	// "get" on Secrets rather than watching all of them.
	SecretReader client.Reader
	// DefaultMaterial is used for KVMHosts without sshKeySecretRef.
	DefaultMaterial conn.MaterialLoader
	// SecretNamespace is the only namespace Secrets are read from (the
	// manager's; the webhook enforces it too). A KVMHost naming another,
	// stored with the webhook off, gets a permanent error; empty refuses
	// every sshKeySecretRef.
	SecretNamespace string

	// parsed keeps each Secret's Material while the Secret is unchanged:
	// KVMHosts usually share one Secret whose known_hosts lists them all,
	// and a parse per host would hold hosts × hosts entries (16 MiB at 250
	// hosts).
	parsedMu sync.Mutex
	parsed   map[client.ObjectKey]parsedSecret
}

// parsedSecret is a Secret's Material as of one version of the Secret.
type parsedSecret struct {
	uid             types.UID
	resourceVersion string
	material        *conn.Material
}

var _ HostSource = (*KubeHosts)(nil)

// Host returns the spec of the KVMHost name. A missing or deleted-and-gone
// KVMHost is an error matching conn.ErrHostNotConfigured.
func (k *KubeHosts) Host(ctx context.Context, name string) (HostSpec, error) {
	h := &crawlv1.KVMHost{}
	if err := k.Reader.Get(ctx, client.ObjectKey{Name: name}, h); err != nil {
		if apierrors.IsNotFound(err) {
			return HostSpec{}, hostNotConfigured(name)
		}
		return HostSpec{}, provider.Transient(err)
	}
	return k.spec(h), nil
}

// List returns every KVMHost's name.
func (k *KubeHosts) List(ctx context.Context) ([]string, error) {
	list := &crawlv1.KVMHostList{}
	if err := k.Reader.List(ctx, list); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(list.Items))
	for _, h := range list.Items {
		names = append(names, h.Name)
	}
	return names, nil
}

func (k *KubeHosts) spec(h *crawlv1.KVMHost) HostSpec {
	s := h.Spec
	hs := HostSpec{
		Conn: conn.HostConfig{
			Name:       h.Name,
			Address:    s.Address,
			User:       orDefaultString(s.User, "root"),
			SocketPath: orDefaultString(s.SocketPath, crawlv1.DefaultLibvirtSocket),
		},
		Pool:       orDefaultString(s.StoragePool, crawlv1.DefaultStoragePool),
		Network:    domxml.Network{Type: orDefaultString(string(s.NetworkMode), domxml.NetworkTypeNetwork), Name: orDefaultString(s.Network, crawlv1.DefaultNetwork)},
		DomainType: orDefaultString(string(s.DomainType), domxml.DomainTypeKVM),
		Material:   k.DefaultMaterial,
	}
	if ref := s.SSHKeySecretRef; ref != nil {
		hs.Conn.MaterialRevision = "secret:" + ref.Namespace + "/" + ref.Name
		hs.Material = k.secretMaterial(*ref)
	}
	for _, ns := range s.Nameservers {
		// Admission checked them; one that does not parse is left out
		// rather than failing every call to the host.
		if a, err := netip.ParseAddr(ns); err == nil {
			hs.Nameservers = append(hs.Nameservers, a)
		}
	}
	if s.CheckInterval != nil {
		hs.CheckInterval = s.CheckInterval.Duration
	}
	if hs.Material == nil {
		hs.Material = func(context.Context) (*conn.Material, error) {
			return nil, provider.Transientf("no SSH material for host %q: set spec.sshKeySecretRef or the manager's --ssh-key-dir", h.Name)
		}
	}
	return hs
}

func (k *KubeHosts) secretMaterial(ref crawlv1.SecretReference) conn.MaterialLoader {
	return func(ctx context.Context) (*conn.Material, error) {
		if ref.Namespace != k.SecretNamespace {
			return nil, provider.Permanentf("spec.sshKeySecretRef.namespace %q: SSH Secrets are read only from the manager's namespace %q", ref.Namespace, k.SecretNamespace)
		}
		key := client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}
		sec := &corev1.Secret{}
		if err := k.SecretReader.Get(ctx, key, sec); err != nil {
			if apierrors.IsNotFound(err) {
				// A deleted Secret's keys do not stay in memory.
				k.forget(key)
				return nil, provider.Transientf("Secret %s/%s not found", ref.Namespace, ref.Name)
			}
			return nil, provider.Transient(fmt.Errorf("reading Secret %s/%s: %w", ref.Namespace, ref.Name, err))
		}
		return k.materialOf(sec)
	}
}

// materialOf parses sec's Material, or returns the one parsed from the same
// version of it (the Material is read-only, so hosts share it).
func (k *KubeHosts) materialOf(sec *corev1.Secret) (*conn.Material, error) {
	key := client.ObjectKeyFromObject(sec)
	k.parsedMu.Lock()
	p, ok := k.parsed[key]
	k.parsedMu.Unlock()
	if ok && p.uid == sec.UID && p.resourceVersion == sec.ResourceVersion && sec.ResourceVersion != "" {
		return p.material, nil
	}
	m, err := conn.SecretMaterial(sec.Data)
	if err != nil {
		return nil, fmt.Errorf("Secret %s/%s: %w", sec.Namespace, sec.Name, err)
	}
	k.parsedMu.Lock()
	defer k.parsedMu.Unlock()
	if k.parsed == nil {
		k.parsed = map[client.ObjectKey]parsedSecret{}
	}
	k.parsed[key] = parsedSecret{uid: sec.UID, resourceVersion: sec.ResourceVersion, material: m}
	return m, nil
}

func (k *KubeHosts) forget(key client.ObjectKey) {
	k.parsedMu.Lock()
	defer k.parsedMu.Unlock()
	delete(k.parsed, key)
}

// hostNotConfigured is permanent and matches conn.ErrHostNotConfigured.
type hostNotConfiguredError struct{ host string }

func hostNotConfigured(host string) error { return &hostNotConfiguredError{host} }

func (e *hostNotConfiguredError) Error() string {
	return fmt.Sprintf("KVMHost %q does not exist", e.host)
}

func (e *hostNotConfiguredError) Is(target error) bool {
	return target == conn.ErrHostNotConfigured || target == provider.ErrPermanent
}

func orDefaultString(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
