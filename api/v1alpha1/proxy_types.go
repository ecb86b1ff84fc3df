package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
)

const (
	// ProxyFinalizer holds a Proxy until its instance is gone.
	ProxyFinalizer = "crawl.example.com/proxy"

	// SkipCleanupAnnotation, when set to "true" on a Proxy being deleted,
	// releases its finalizer at once without touching the provider. Use it
	// when the provider or host is gone for good, or when deletion is
	// blocked by a same-named instance the operator refuses to touch. An
	// instance that still carries this operator's tag and the Proxy's UID
	// is an orphan from then on, and the orphan sweep deletes it; to keep
	// such a VM, stop the sweep from seeing it (e.g. remove its metadata).
	SkipCleanupAnnotation = "crawl.example.com/skip-cleanup"

	// DefaultProxyPort is squid's conventional port.
	DefaultProxyPort = 3128
)

// ProviderName selects the backend that runs a Proxy.
// +kubebuilder:validation:Enum=kvm;kubernetes;gcp
type ProviderName string

const (
	ProviderKVM        ProviderName = "kvm"
	ProviderKubernetes ProviderName = "kubernetes"
	ProviderGCP        ProviderName = "gcp"
)

// ProxyPhase summarises where a Proxy stands.
// +kubebuilder:validation:Enum=Pending;Provisioning;Ready;Failed;Deleting
type ProxyPhase string

const (
	ProxyPending      ProxyPhase = "Pending"
	ProxyProvisioning ProxyPhase = "Provisioning"
	ProxyReady        ProxyPhase = "Ready"
	ProxyFailed       ProxyPhase = "Failed"
	ProxyDeleting     ProxyPhase = "Deleting"
)

// EgressSource says how a Proxy's egress address is known.
// +kubebuilder:validation:Enum=echo;static;unknown
type EgressSource string

const (
	// EgressSourceEcho: an address-echo endpoint saw the address as the
	// source of a request through the proxy.
	EgressSourceEcho EgressSource = "echo"
	// EgressSourceStatic: the operator assigned the address (IPAM) on a
	// network without NAT, so it is the source address by construction.
	EgressSourceStatic EgressSource = "static"
	// EgressSourceUnknown: not measured (no echo endpoint, or it failed).
	EgressSourceUnknown EgressSource = "unknown"
)

// ProxyPlacement says where the instance runs and what it boots.
type ProxyPlacement struct {
	// Host is the KVMHost to run on (kvm). Exclusive with HostSelector.
	// +optional
	Host string `json:"host,omitempty"`

	// HostSelector picks a Ready KVMHost by labels (kvm); the chosen host is
	// recorded in status.host and kept.
	// +optional
	HostSelector *metav1.LabelSelector `json:"hostSelector,omitempty"`

	// Image is a KVMImage name, or an http(s) URL of a cloud image (kvm),
	// or a source image (gcp, e.g. projects/debian-cloud/global/images/family/debian-12).
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	Image string `json:"image,omitempty"`

	// ImageChecksum ("sha256:<64 hex>") is required when Image is a URL.
	// +optional
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-fA-F]{64}$`
	ImageChecksum string `json:"imageChecksum,omitempty"`

	// ImageFormat of a URL image; qcow2 when omitted.
	// +optional
	ImageFormat ImageFormat `json:"imageFormat,omitempty"`

	// Firmware of a URL image; defaulted to uefi. A KVMImage carries its own.
	// +optional
	Firmware Firmware `json:"firmware,omitempty"`

	// Project, Zone and MachineType place a gcp instance; the provider's
	// configuration supplies what is omitted.
	// +optional
	Project string `json:"project,omitempty"`
	// +optional
	Zone string `json:"zone,omitempty"`
	// +optional
	MachineType string `json:"machineType,omitempty"`
}

// ProxyResources sizes the instance.
type ProxyResources struct {
	// CPUs is the number of vCPUs.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	CPUs int32 `json:"cpus,omitempty"`

	// Memory of the instance.
	// +kubebuilder:default="512Mi"
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// Disk size of the instance's root disk (kvm, gcp).
	// +kubebuilder:default="10Gi"
	// +optional
	Disk *resource.Quantity `json:"disk,omitempty"`
}

// MACAddressAnnotation, on a Cluster API IPAddress, is the MAC the
// instance's NIC must have to use that address: hosting providers route an
// additional address only to the "virtual MAC" they issued for it (OVH,
// Hetzner). The MAC belongs to the address, not to the Proxy, and the
// IPAddress type has no field for it, so it travels with the address as an
// annotation written by whoever creates the IPAddress (an IPAM provider, an
// admission policy, or the admin). Without it the kvm provider gives the NIC
// a locally administered MAC of its own (docs/static-addresses.md).
const MACAddressAnnotation = "crawl.example.com/mac-address"

// KnownIPPoolKinds are the IPAM pool kinds spec.network.addressesFromPools
// may name, by API group: the Cluster API IPAM providers whose claims the
// operator was built against (the in-cluster provider, Infoblox). Another
// kind is refused at admission, naming the field, rather than leaving a
// claim no provider will ever serve.
var KnownIPPoolKinds = map[string][]string{
	"ipam.cluster.x-k8s.io": {"InClusterIPPool", "GlobalInClusterIPPool", "InfobloxIPPool"},
}

// ProxyNetwork is how the instance's network address is given.
type ProxyNetwork struct {
	// AddressesFromPools names the Cluster API IPAM pool the instance's
	// address comes from: the operator creates an IPAddressClaim for it,
	// owned by the Proxy, and boots the instance with the bound IPAddress
	// configured statically (kvm, on a KVMHost with networkMode bridge).
	// The contract is single-stack and the instance has one NIC, so at most
	// one pool. Immutable.
	// +optional
	// +kubebuilder:validation:MaxItems=1
	// +listType=atomic
	AddressesFromPools []ipamv1.IPPoolReference `json:"addressesFromPools,omitempty"`
}

// AddressPools is spec.network.addressesFromPools, nil without a network.
func (s *ProxySpec) AddressPools() []ipamv1.IPPoolReference {
	if s.Network == nil {
		return nil
	}
	return s.Network.AddressesFromPools
}

// ProxyCloudInit is passed to the guest untouched.
// +kubebuilder:validation:XValidation:rule="!(has(self.userData) && has(self.userDataBase64))",message="set userData or userDataBase64, not both"
type ProxyCloudInit struct {
	// UserData reaches the guest byte for byte, whatever its format
	// (cloud-config, jinja template, script, MIME multipart).
	// +optional
	UserData string `json:"userData,omitempty"`

	// UserDataBase64 is UserData for content that is not UTF-8 (e.g. gzip).
	// +optional
	UserDataBase64 []byte `json:"userDataBase64,omitempty"`

	// VendorData travels beside the guest-agent installer, untouched.
	// +optional
	VendorData string `json:"vendorData,omitempty"`
}

// ProxyAuthType is how clients authenticate to squid.
// +kubebuilder:validation:Enum=Basic;None
type ProxyAuthType string

const (
	ProxyAuthBasic ProxyAuthType = "Basic"
	// ProxyAuthNone leaves the source allow-list as the only guard; it must
	// be stated explicitly and each allowed range must be a single subnet.
	ProxyAuthNone ProxyAuthType = "None"
)

// Keys of the credential Secrets: the user's spec.access.auth.secretRef
// holds username and password; the operator's status.credentialsSecretRef
// holds all three, url once the address is known.
const (
	CredentialsUsernameKey = "username"
	CredentialsPasswordKey = "password"
	CredentialsURLKey      = "url"
)

// CredentialsSecretType is the type a Secret must have for
// spec.access.auth.secretRef to adopt it: made for proxies on purpose
// (kubectl create secret generic NAME --type=crawl.example.com/proxy-credentials
// --from-literal=username=... --from-literal=password=...). A Secret's type
// is set when it is created and never changes, so no Secret written for
// something else (basic-auth for a registry, a git server, a database)
// becomes a proxy credential, and no label a tool stamps on every object
// makes it one.
const CredentialsSecretType = "crawl.example.com/proxy-credentials"

// CredentialsSecretName is the Secret the operator writes for a managed
// Proxy with Basic auth (status.credentialsSecretRef): username, password
// and url. It is owned by the Proxy and goes with it.
func CredentialsSecretName(p *Proxy) string {
	return p.Name + "-proxy-credentials"
}

// ProxyAuth is the client authentication of a managed squid.
type ProxyAuth struct {
	// Type is Basic (default) or None.
	// +kubebuilder:default=Basic
	// +optional
	Type ProxyAuthType `json:"type,omitempty"`

	// SecretRef names a Secret in the Proxy's namespace of type
	// crawl.example.com/proxy-credentials with keys username and password;
	// a Secret of another type is never adopted. When absent with Basic,
	// the operator generates a random credential into a Secret owned by the
	// Proxy.
	// +optional
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`
}

// LocalObjectReference names an object in the same namespace.
type LocalObjectReference struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
}

// ProxyAccess is who may use the proxy and where it may go. With managed
// true (the default) the operator renders squid's whole configuration from
// it (pkg/squid); see docs/security.md.
type ProxyAccess struct {
	// Managed: the operator writes and starts squid's configuration. false
	// leaves squid to the user's cloud-init, and the proxy's safety with it.
	// +kubebuilder:default=true
	// +optional
	Managed *bool `json:"managed,omitempty"`

	// AllowedSourceCIDRs are the client ranges admitted, as squid sees the
	// source address. Required when managed.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=64
	// +listType=atomic
	AllowedSourceCIDRs []string `json:"allowedSourceCIDRs,omitempty"`

	// Auth of clients; Basic with a generated credential when absent.
	// +optional
	Auth *ProxyAuth `json:"auth,omitempty"`

	// AllowedPorts are the destination ports (default 80 and 443); CONNECT
	// only ever goes to 443.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	AllowedPorts []int32 `json:"allowedPorts,omitempty"`

	// ExtraDeniedDestinations are refused on top of the built-in list of
	// every range that is not globally reachable (docs/security.md, "The
	// rendered squid.conf", lists it with the source of each entry).
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=64
	// +listType=atomic
	ExtraDeniedDestinations []string `json:"extraDeniedDestinations,omitempty"`

	// AllowedDestinationExceptions are carved out of the built-in denied
	// list, for targets that really are internal. Each must lie inside a
	// built-in range an exception may lift. One reaching loopback,
	// link-local or a metadata address is admitted only when the manager
	// grants it (--allow-destination-exceptions). Use narrowly: an
	// exception is reachable by every client of the proxy.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=64
	// +listType=atomic
	AllowedDestinationExceptions []string `json:"allowedDestinationExceptions,omitempty"`

	// MaxConnectionsPerClient caps concurrent connections per client
	// address (default 256).
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxConnectionsPerClient int32 `json:"maxConnectionsPerClient,omitempty"`
}

// IsManaged reports whether the operator renders squid's configuration.
// A nil Access (a Proxy stored before spec.access existed) is unmanaged:
// its squid belongs to its cloud-init, as when it was created.
func (p *Proxy) IsManaged() bool {
	a := p.Spec.Access
	return a != nil && (a.Managed == nil || *a.Managed)
}

// ProxySpec is the desired proxy.
type ProxySpec struct {
	// Provider runs the instance: kvm, kubernetes or gcp.
	// +required
	Provider ProviderName `json:"provider"`

	// Placement says where the instance runs and what it boots. Immutable:
	// moving a proxy is deleting it and creating another.
	// +optional
	Placement ProxyPlacement `json:"placement,omitempty"`

	// Resources size the instance.
	// +optional
	Resources ProxyResources `json:"resources,omitempty"`

	// CloudInit is handed to the guest's cloud-init (kvm, gcp).
	// +optional
	CloudInit ProxyCloudInit `json:"cloudInit,omitempty"`

	// InstallGuestAgent adds vendor-data that installs qemu-guest-agent when
	// the image lacks it (kvm). Defaulted to true.
	// +optional
	InstallGuestAgent *bool `json:"installGuestAgent,omitempty"`

	// Port squid listens on. Immutable: squid is configured with it when
	// the instance is created.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// Access is who may use the proxy and where it may go. Immutable: squid
	// is configured with it when the instance is created.
	// +optional
	Access *ProxyAccess `json:"access,omitempty"`

	// Network gives the instance a static address from an IPAM pool
	// (docs/static-addresses.md). Immutable: the instance is configured with
	// it when it is created.
	// +optional
	Network *ProxyNetwork `json:"network,omitempty"`
}

// ProxyProbeStatus is the last health probe of the proxy. A probe that
// changes nothing here, nor anything else in status, writes nothing: every
// probe's time, latency and outcome are the manager's metrics
// (proxy_operator_proxy_last_probe_timestamp_seconds,
// proxy_operator_proxy_probe_latency_seconds, proxy_operator_proxy_probes_total).
type ProxyProbeStatus struct {
	// LastProbeTime is when a probe finished, as a heartbeat: written with
	// any other change of status, else once the written one is an hour old
	// (so at most about an hour behind while the probe runs).
	// +optional
	LastProbeTime *metav1.Time `json:"lastProbeTime,omitempty"`
	// ConsecutiveFailures since the last success.
	// +optional
	ConsecutiveFailures int32 `json:"consecutiveFailures,omitempty"`
	// LastError of the last failed probe.
	// +optional
	LastError string `json:"lastError,omitempty"`
}

// ProxyStatus is the observed proxy.
type ProxyStatus struct {
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Phase: Pending, Provisioning, Ready, Failed or Deleting.
	// +optional
	Phase ProxyPhase `json:"phase,omitempty"`

	// ProviderID identifies the instance, e.g. kvm://<host>/<domain-uuid>.
	// +optional
	ProviderID string `json:"providerID,omitempty"`

	// Host the instance runs on (KVMHost name, node, or zone).
	// +optional
	Host string `json:"host,omitempty"`

	// Address is the instance's IPv4 address.
	// +optional
	Address string `json:"address,omitempty"`

	// AddressSource says where Address was learned: agent, lease, arp, pod
	// or nic.
	// +optional
	AddressSource string `json:"addressSource,omitempty"`

	// Endpoint is the proxy URL, http://ADDRESS:PORT.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// EgressAddress is the source address target sites see for requests
	// through this proxy; EgressSource says how it is known. Empty while
	// unknown: a private address behind NAT is never recorded here.
	// +optional
	EgressAddress string `json:"egressAddress,omitempty"`

	// EgressSource says how EgressAddress is known: echo (an address-echo
	// endpoint saw it through the proxy), static (an address the operator
	// assigned on a network without NAT) or unknown.
	// +optional
	EgressSource EgressSource `json:"egressSource,omitempty"`

	// AssignedAddress is the address (address/prefix) the Proxy's
	// IPAddressClaim was given, recorded before the instance boots with it,
	// so that no two Proxies boot with one address.
	// +optional
	// +kubebuilder:validation:MaxLength=43
	AssignedAddress string `json:"assignedAddress,omitempty"`

	// EgressMeasuredAt is when an echo measured EgressAddress, as a
	// heartbeat like probe.lastProbeTime: a measurement that finds the same
	// address is written with any other change of status, else once the
	// written time is an hour old.
	// +optional
	EgressMeasuredAt *metav1.Time `json:"egressMeasuredAt,omitempty"`

	// CredentialsSecretRef names the Secret (owned by this Proxy) with keys
	// username, password and url (http://user:pass@address:port) for
	// clients. Set when squid is managed with Basic auth.
	// +optional
	CredentialsSecretRef *LocalObjectReference `json:"credentialsSecretRef,omitempty"`

	// Probe is the last health probe.
	// +optional
	Probe *ProxyProbeStatus `json:"probe,omitempty"`

	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// Proxy is one egress HTTP forward proxy (squid) on a provider.
//
// Annotation crawl.example.com/skip-cleanup="true" releases a Proxy being
// deleted without touching its provider.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=crawl
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.provider`
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.status.host`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.address`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Proxy struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// The immutability rules sit here, not on the fields, because
	// ProxySpec is also a ProxyPool's template, which must change to roll.
	// Like field-level transition rules, each holds only when the field is
	// set before and after; access may also not be added or removed.
	// +kubebuilder:validation:XValidation:rule="self.provider == oldSelf.provider",message="provider is immutable",fieldPath=".provider"
	// +kubebuilder:validation:XValidation:rule="!has(self.placement) || !has(oldSelf.placement) || self.placement == oldSelf.placement",message="placement is immutable",fieldPath=".placement"
	// +kubebuilder:validation:XValidation:rule="!has(self.port) || !has(oldSelf.port) || self.port == oldSelf.port",message="port is immutable: the instance keeps the port it was created with; delete the Proxy and create another",fieldPath=".port"
	// +kubebuilder:validation:XValidation:rule="has(self.access) == has(oldSelf.access) && (!has(self.access) || self.access == oldSelf.access)",message="access is immutable: the instance keeps the access it was created with; delete the Proxy and create another (a ProxyPool rolls its replicas)",fieldPath=".access"
	// +kubebuilder:validation:XValidation:rule="has(self.network) == has(oldSelf.network) && (!has(self.network) || self.network == oldSelf.network)",message="network is immutable: the instance keeps the address it was created with; delete the Proxy and create another (a ProxyPool rolls its replicas)",fieldPath=".network"
	// +optional
	Spec ProxySpec `json:"spec,omitempty"`
	// +optional
	Status ProxyStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ProxyList contains a list of Proxy.
type ProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Proxy `json:"items"`
}

func (p *Proxy) GetConditions() []metav1.Condition  { return p.Status.Conditions }
func (p *Proxy) SetConditions(c []metav1.Condition) { p.Status.Conditions = c }

// UserData returns the user-data bytes, whichever field holds them.
func (c *ProxyCloudInit) UserDataBytes() []byte {
	if len(c.UserDataBase64) > 0 {
		return c.UserDataBase64
	}
	return []byte(c.UserData)
}

func init() {
	addKnownTypes(&Proxy{}, &ProxyList{})
}
