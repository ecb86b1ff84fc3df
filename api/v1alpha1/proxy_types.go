package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// ProxySpec is the desired proxy.
type ProxySpec struct {
	// Provider runs the instance: kvm, kubernetes or gcp.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="provider is immutable"
	Provider ProviderName `json:"provider"`

	// Placement says where the instance runs and what it boots. Immutable:
	// moving a proxy is deleting it and creating another.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="placement is immutable"
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
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="port is immutable: the instance keeps the port it was created with; delete the Proxy and create another"
	// +optional
	Port int32 `json:"port,omitempty"`
}

// ProxyProbeStatus is the last health probe of the proxy.
type ProxyProbeStatus struct {
	// LastProbeTime is when the last probe finished.
	// +optional
	LastProbeTime *metav1.Time `json:"lastProbeTime,omitempty"`
	// LatencyMilliseconds of the last probe.
	// +optional
	LatencyMilliseconds int64 `json:"latencyMilliseconds,omitempty"`
	// ConsecutiveFailures since the last success.
	// +optional
	ConsecutiveFailures int32 `json:"consecutiveFailures,omitempty"`
	// LastError of the last failed probe.
	// +optional
	LastError string `json:"lastError,omitempty"`
}

// ProxyStatus is the observed proxy.
type ProxyStatus struct {
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

	// Probe is the last health probe.
	// +optional
	Probe *ProxyProbeStatus `json:"probe,omitempty"`

	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

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
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProxySpec   `json:"spec,omitempty"`
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
	SchemeBuilder.Register(&Proxy{}, &ProxyList{})
}
