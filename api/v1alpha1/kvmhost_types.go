package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// DefaultLibvirtSocket is libvirt's system socket on the hypervisor.
	DefaultLibvirtSocket = "/var/run/libvirt/libvirt-sock"
	// DefaultStoragePool is libvirt's conventional pool name.
	DefaultStoragePool = "default"
	// DefaultNetwork is libvirt's conventional NAT network name.
	DefaultNetwork = "default"
	// SSHPrivateKeyKey and KnownHostsKey are the keys read from the SSH Secret.
	SSHPrivateKeyKey = "ssh-privatekey"
	KnownHostsKey    = "known_hosts"
)

// NetworkMode says what KVMHostSpec.Network names.
// +kubebuilder:validation:Enum=network;bridge
type NetworkMode string

const (
	NetworkModeNetwork NetworkMode = "network"
	NetworkModeBridge  NetworkMode = "bridge"
)

// DomainType is the libvirt domain type VMs are defined with.
// +kubebuilder:validation:Enum=kvm;qemu
type DomainType string

const (
	// DomainTypeKVM uses hardware virtualisation.
	DomainTypeKVM DomainType = "kvm"
	// DomainTypeQEMU uses TCG emulation, for hypervisors without usable KVM
	// (e.g. nested virtualisation that lacks features).
	DomainTypeQEMU DomainType = "qemu"
)

// SecretReference names a Secret in a namespace (KVMHost is cluster-scoped).
type SecretReference struct {
	// +kubebuilder:validation:MinLength=1
	// +required
	Name string `json:"name"`
	// +kubebuilder:validation:MinLength=1
	// +required
	Namespace string `json:"namespace"`
}

// KVMHostSpec describes how to reach a hypervisor and where its VMs live.
type KVMHostSpec struct {
	// Address is host[:port] of the hypervisor's SSH server (port 22 when
	// omitted). Immutable: VMs stay on the machine they were created on, so
	// a new address would make the operator look for them elsewhere.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=261
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="address is immutable: its VMs stay on that machine; create another KVMHost for another machine"
	// +required
	Address string `json:"address"`

	// User is the SSH user; it must be allowed to open the libvirt socket.
	// +kubebuilder:default=root
	// +optional
	User string `json:"user,omitempty"`

	// SSHKeySecretRef names a Secret with keys `ssh-privatekey` and
	// `known_hosts`. Host keys are checked strictly against known_hosts.
	// When omitted, the manager's --ssh-key-dir (a mounted Secret) is used.
	// +optional
	SSHKeySecretRef *SecretReference `json:"sshKeySecretRef,omitempty"`

	// SocketPath is libvirt's unix socket on the hypervisor, forwarded
	// through the SSH session.
	// +optional
	SocketPath string `json:"socketPath,omitempty"`

	// StoragePool is the libvirt storage pool for images, disks and seeds.
	// Immutable, like address: existing disks stay in the pool they were
	// created in.
	// +kubebuilder:default=default
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="storagePool is immutable: existing disks stay in that pool; create another KVMHost for another pool"
	// +optional
	StoragePool string `json:"storagePool,omitempty"`

	// Network is the libvirt network (networkMode network) or host bridge
	// (networkMode bridge) the VMs' NIC attaches to.
	// +kubebuilder:default=default
	// +optional
	Network string `json:"network,omitempty"`

	// NetworkMode says whether Network is a libvirt network or a bridge.
	// +kubebuilder:default=network
	// +optional
	NetworkMode NetworkMode `json:"networkMode,omitempty"`

	// Nameservers are the DNS servers of the VMs on this host that get a
	// static address (a Proxy's spec.network, networkMode bridge): a static
	// configuration has no DHCP to learn them from, and the resolvers a
	// hosting provider offers are per data centre, so per host. Required
	// for such Proxies. At most 3, the guest resolver's limit.
	// +optional
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:MaxLength=39
	// +listType=atomic
	Nameservers []string `json:"nameservers,omitempty"`

	// DomainType is kvm (hardware virtualisation) or qemu (TCG emulation).
	// +kubebuilder:default=kvm
	// +optional
	DomainType DomainType `json:"domainType,omitempty"`

	// CheckInterval between health checks; the manager's
	// --provider-check-interval when omitted.
	// +optional
	CheckInterval *metav1.Duration `json:"checkInterval,omitempty"`

	// CheckTimeout bounds one health check. Unset or 0 derives
	// min(15s, checkInterval). It must not exceed checkInterval.
	// +optional
	CheckTimeout *metav1.Duration `json:"checkTimeout,omitempty"`
}

// PoolStatus is the storage pool as last seen.
type PoolStatus struct {
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	CapacityBytes int64 `json:"capacityBytes,omitempty"`
	// +optional
	AllocationBytes int64 `json:"allocationBytes,omitempty"`
	// +optional
	AvailableBytes int64 `json:"availableBytes,omitempty"`
	// Available is AvailableBytes for people, e.g. "37.2Gi".
	// +optional
	Available string `json:"available,omitempty"`
}

// HostCapacity is what a hypervisor has and what its running domains were
// given, as last seen; ProxyPool placement reads it.
type HostCapacity struct {
	// CPUs are the host's logical CPUs.
	// +optional
	CPUs int32 `json:"cpus,omitempty"`
	// MemoryBytes is the host's physical memory.
	// +optional
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// FreeMemoryBytes is the memory a new VM can get: free memory plus
	// buffers and page cache, which the kernel reclaims. Written when the
	// rounded FreeMemory changes, so it lags the host by less than that.
	// +optional
	FreeMemoryBytes int64 `json:"freeMemoryBytes,omitempty"`
	// FreeMemory is FreeMemoryBytes for people, e.g. "41.3Gi".
	// +optional
	FreeMemory string `json:"freeMemory,omitempty"`
	// RunningDomains on the host, the operator's and any other.
	// +optional
	RunningDomains int32 `json:"runningDomains,omitempty"`
	// AllocatedVCPUs are the vCPUs of the running domains.
	// +optional
	AllocatedVCPUs int32 `json:"allocatedVCPUs,omitempty"`
	// AllocatedMemoryBytes is the memory of the running domains (each
	// one's maximum, whatever its guest has touched so far).
	// +optional
	AllocatedMemoryBytes int64 `json:"allocatedMemoryBytes,omitempty"`
}

// KVMHostStatus is the observed health of a hypervisor.
type KVMHostStatus struct {
	// Conditions: Ready says whether the host answers over SSH+libvirt and
	// its pool runs; its reason names what failed.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// LibvirtVersion reported by the daemon, e.g. "9.0.0".
	// +optional
	LibvirtVersion string `json:"libvirtVersion,omitempty"`

	// Hostname reported by the daemon.
	// +optional
	Hostname string `json:"hostname,omitempty"`

	// Pool is the storage pool as last seen.
	// +optional
	Pool *PoolStatus `json:"pool,omitempty"`

	// Capacity is the host's CPUs and memory and what its running domains
	// take, as last seen.
	// +optional
	Capacity *HostCapacity `json:"capacity,omitempty"`

	// LastCheckTime is when the last health check finished.
	// +optional
	LastCheckTime *metav1.Time `json:"lastCheckTime,omitempty"`

	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// KVMHost is a hypervisor on the LAN, reached over SSH with the libvirt unix
// socket forwarded through the session.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=crawl
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Libvirt",type=string,JSONPath=`.status.libvirtVersion`
// +kubebuilder:printcolumn:name="CPUs",type=integer,JSONPath=`.status.capacity.cpus`,priority=1
// +kubebuilder:printcolumn:name="vCPUs",type=integer,JSONPath=`.status.capacity.allocatedVCPUs`,priority=1
// +kubebuilder:printcolumn:name="Mem Free",type=string,JSONPath=`.status.capacity.freeMemory`
// +kubebuilder:printcolumn:name="Pool Free",type=string,JSONPath=`.status.pool.available`
// +kubebuilder:printcolumn:name="Last Check",type=date,JSONPath=`.status.lastCheckTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type KVMHost struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec KVMHostSpec `json:"spec,omitempty"`
	// +optional
	Status KVMHostStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// KVMHostList contains a list of KVMHost.
type KVMHostList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KVMHost `json:"items"`
}

// GetConditions returns the conditions (for condition helpers).
func (h *KVMHost) GetConditions() []metav1.Condition { return h.Status.Conditions }

// SetConditions sets the conditions (for condition helpers).
func (h *KVMHost) SetConditions(c []metav1.Condition) { h.Status.Conditions = c }

func init() {
	addKnownTypes(&KVMHost{}, &KVMHostList{})
}
