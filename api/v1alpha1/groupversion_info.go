// Package v1alpha1 contains the API of the proxy operator: Proxy (one egress
// HTTP forward proxy), KVMHost (a hypervisor reached over SSH) and KVMImage
// (a cloud image cached in every host's storage pool).
// +kubebuilder:object:generate=true
// +groupName=crawl.example.com
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is group version used to register these objects.
	GroupVersion = schema.GroupVersion{Group: "crawl.example.com", Version: "v1alpha1"}

	// SchemeBuilder is used to add go types to the GroupVersionKind scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types in this group-version to the given scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
