package provider

import (
	"context"
	"net/netip"

	"crawl.example.com/proxy-operator/pkg/squid"
)

// Provider turns a Machine (the provider-neutral view of one Proxy) into a
// running instance and back. Every method is idempotent and every error it
// returns is classified (see Class).
type Provider interface {
	// Name is the value of Proxy.spec.provider this provider serves.
	Name() string
	// Create makes the instance exist and run. Calling it again for an
	// instance that exists only starts it if needed.
	Create(ctx context.Context, m *Machine) (*Instance, error)
	// Get reports the instance. ErrNotFound means it does not exist (and the
	// place it should be in was reachable and configured).
	Get(ctx context.Context, m *Machine) (*Instance, error)
	// Delete removes the instance and everything made for it, only after
	// checking it is this Machine's (IdentityError otherwise). Already gone
	// is success.
	Delete(ctx context.Context, m *Machine) error
	// ListByTag returns every instance carrying our management tag and made
	// by this install (the provider's configured install id), with the owner
	// and install recorded on it, for garbage collection. Instances without
	// our tag or of another install (or of none: made before install ids)
	// are never returned.
	ListByTag(ctx context.Context, tag string) ([]Instance, error)
	// Check reports whether the provider can serve requests at all.
	Check(ctx context.Context) error
}

// Machine is what a provider is told about one Proxy. Controllers build it
// from the Proxy and the objects it references; providers never read the API.
type Machine struct {
	// Identity of the owning Proxy; UID is what ownership checks compare.
	Namespace string
	Name      string
	UID       string
	// ProviderID recorded in the Proxy status by an earlier Create, if any.
	ProviderID string
	// Tag is the management tag written on the instance for ListByTag.
	Tag string

	// Host is the KVMHost the instance lives on (kvm only).
	Host string
	// Image is the resolved boot image (kvm, gcp).
	Image Image

	CPUs        int32
	MemoryBytes int64
	DiskBytes   int64

	// UserData and VendorData travel to the guest byte for byte.
	UserData          []byte
	VendorData        []byte
	InstallGuestAgent bool
	Port              int32

	// Squid is the operator-managed squid configuration (Paths left empty:
	// each provider renders it with squid.Render and its own paths, and
	// delivers squid.conf and the password file before squid first
	// serves). nil when the user's cloud-init owns squid (managed: false).
	// Auth.Password is plaintext: never log or record it.
	Squid *squid.Config
	// AllowedSourceCIDRs are an unmanaged Proxy's
	// spec.access.allowedSourceCIDRs (Squid nil; a managed one's are
	// Squid's): the clients a provider that guards the instance in front
	// of squid admits (kubernetes: its NetworkPolicy).
	AllowedSourceCIDRs []string

	// StaticNetwork is the address the instance is configured with (the
	// Proxy's IPAM claim), nil when the provider's network gives it one
	// (DHCP). Only providers whose plug-in takes static addresses
	// (plugin.StaticAddresses) get it.
	StaticNetwork *StaticNetwork

	// GCP placement (gcp only).
	Project     string
	Zone        string
	MachineType string

	// SpreadGroup names the set this instance is spread with over nodes
	// (kubernetes): the ProxyPool's name, empty for a Proxy of no pool.
	SpreadGroup string
}

// StaticNetwork is a static address for an instance's one NIC, checked by
// whoever built it: Address is valid, Gateway (when valid) lies inside
// Address's prefix and is of its family, MAC (when set) is a 48-bit MAC.
type StaticNetwork struct {
	// Address is the instance's address with its prefix length.
	Address netip.Prefix
	// Gateway is the default route's next hop; the zero Addr for none.
	Gateway netip.Addr
	// MAC the NIC must have (a hosting provider's virtual MAC for the
	// address); empty: the provider chooses one.
	MAC string
}

// Image is a resolved boot image: a KVMImage, or a direct URL on the Proxy.
type Image struct {
	// Name is the KVMImage name; empty for a direct URL.
	Name string
	URL  string
	// Checksum is "sha256:<64 hex>".
	Checksum string
	Format   string // qcow2 | raw
	Firmware string // uefi | bios
}

// State is the provider-neutral lifecycle state of an instance.
type State string

const (
	StatePending  State = "Pending"  // accepted, not yet running (defined, scheduling, staging)
	StateRunning  State = "Running"  // running; Address may still be empty
	StateStopped  State = "Stopped"  // exists, not running (shut off, paused, terminated)
	StateFailed   State = "Failed"   // crashed or failed; will not recover by itself
	StateDeleting State = "Deleting" // being torn down
	StateUnknown  State = "Unknown"
)

// Owner is the Proxy recorded on an instance (metadata, labels, tags).
type Owner struct {
	Namespace string
	Name      string
	UID       string
}

// Instance is what a provider reports about one instance.
type Instance struct {
	ProviderID string
	// Name is the provider-side name (domain, pod, instance).
	Name string
	// Host is the KVM host, node or zone the instance is in.
	Host  string
	State State
	// Address is the first routable IPv4, empty until known.
	Address string
	// AddressSource says where Address came from: agent, lease, arp, pod, nic.
	AddressSource string
	// Message explains a state short of Running-with-address, e.g.
	// "guest agent not connected".
	Message string
	Owner   Owner
	// InstallID is the operator install recorded on the instance (see
	// ValidateInstallID); filled by ListByTag, empty on instances made
	// before install ids.
	InstallID string
}

// Address sources.
const (
	AddressSourceAgent = "agent"
	AddressSourceLease = "lease"
	AddressSourceARP   = "arp"
	AddressSourcePod   = "pod"
	AddressSourceNIC   = "nic"
)
