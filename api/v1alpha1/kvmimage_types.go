package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ImageFormat is the disk format of a cloud image.
// +kubebuilder:validation:Enum=qcow2;raw
type ImageFormat string

const (
	ImageFormatQCOW2 ImageFormat = "qcow2"
	ImageFormatRaw   ImageFormat = "raw"
)

// Firmware the guest boots with.
// +kubebuilder:validation:Enum=uefi;bios
type Firmware string

const (
	FirmwareUEFI Firmware = "uefi"
	FirmwareBIOS Firmware = "bios"
)

// ImageHostPhase is where caching an image on one host stands.
// +kubebuilder:validation:Enum=Pending;Downloading;Verified;Failed
type ImageHostPhase string

const (
	ImageHostPending     ImageHostPhase = "Pending"
	ImageHostDownloading ImageHostPhase = "Downloading"
	ImageHostVerified    ImageHostPhase = "Verified"
	ImageHostFailed      ImageHostPhase = "Failed"
)

// KVMImageSpec is a cloud image to cache on hypervisors.
type KVMImageSpec struct {
	// URL to download the image from (http or https).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +required
	URL string `json:"url"`

	// Checksum of the image as "sha256:<64 hex>". A download that does not
	// match leaves no usable volume; a changed checksum re-fetches.
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-fA-F]{64}$`
	// +required
	Checksum string `json:"checksum"`

	// Format of the image.
	// +kubebuilder:default=qcow2
	// +optional
	Format ImageFormat `json:"format,omitempty"`

	// Firmware the image boots with; defaulted to uefi.
	// +optional
	Firmware Firmware `json:"firmware,omitempty"`

	// Retain is how many checksums, the current one included, stay cached
	// after the checksum changes; older ones are deleted from every host
	// once no VM disk uses them.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	// +optional
	Retain int32 `json:"retain,omitempty"`
}

// KVMImageHostStatus is the cache state of the image on one host.
type KVMImageHostStatus struct {
	// Host is the KVMHost name.
	// +required
	Host string `json:"host"`
	// Phase: Pending, Downloading, Verified or Failed.
	// +required
	Phase ImageHostPhase `json:"phase"`
	// Verified is true when the cached volume matched the checksum.
	// +optional
	Verified bool `json:"verified,omitempty"`
	// Volume is the storage volume holding the image.
	// +optional
	Volume string `json:"volume,omitempty"`
	// Bytes downloaded so far (Downloading) or the image size (Verified).
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
	// AllocatedBytes is the disk space the cached volume takes on the host.
	// Images with the same checksum share one volume, so each reports it.
	// +optional
	AllocatedBytes int64 `json:"allocatedBytes,omitempty"`
	// TotalBytes is the size announced by the server, when known.
	// +optional
	TotalBytes int64 `json:"totalBytes,omitempty"`
	// Checksum seen on the cached volume.
	// +optional
	Checksum string `json:"checksum,omitempty"`
	// Message says what failed or what is awaited.
	// +optional
	Message string `json:"message,omitempty"`
	// LastTransitionTime is when Phase last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
}

// KVMImageStatus is the cache state of the image across hosts.
type KVMImageStatus struct {
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Hosts holds one entry per host the image is cached on (or being).
	// +listType=map
	// +listMapKey=host
	// +optional
	Hosts []KVMImageHostStatus `json:"hosts,omitempty"`

	// Checksums the image has been cached under, newest first, at most
	// spec.retain: these stay cached; an older one is pruned once unused.
	// +optional
	// +listType=atomic
	Checksums []string `json:"checksums,omitempty"`

	// ReadyHosts counts hosts with a verified copy.
	// +optional
	ReadyHosts int32 `json:"readyHosts,omitempty"`
	// TotalHosts counts hosts that need the image.
	// +optional
	TotalHosts int32 `json:"totalHosts,omitempty"`

	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// KVMImage is a cloud image downloaded, sha256-verified and cached in the
// storage pool of every host that needs it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=crawl
// +kubebuilder:printcolumn:name="Firmware",type=string,JSONPath=`.spec.firmware`
// +kubebuilder:printcolumn:name="Format",type=string,JSONPath=`.spec.format`
// +kubebuilder:printcolumn:name="Ready Hosts",type=integer,JSONPath=`.status.readyHosts`
// +kubebuilder:printcolumn:name="Total Hosts",type=integer,JSONPath=`.status.totalHosts`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type KVMImage struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec KVMImageSpec `json:"spec,omitempty"`
	// +optional
	Status KVMImageStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// KVMImageList contains a list of KVMImage.
type KVMImageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KVMImage `json:"items"`
}

func (i *KVMImage) GetConditions() []metav1.Condition  { return i.Status.Conditions }
func (i *KVMImage) SetConditions(c []metav1.Condition) { i.Status.Conditions = c }

// HostStatus returns the entry for host, or nil.
func (s *KVMImageStatus) HostStatus(host string) *KVMImageHostStatus {
	for i := range s.Hosts {
		if s.Hosts[i].Host == host {
			return &s.Hosts[i]
		}
	}
	return nil
}

func init() {
	addKnownTypes(&KVMImage{}, &KVMImageList{})
}
