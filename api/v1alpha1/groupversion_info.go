// Package v1alpha1 contains the API of the proxy operator: Proxy (one egress
// HTTP forward proxy), KVMHost (a hypervisor reached over SSH) and KVMImage
// (a cloud image cached in every host's storage pool).
// +kubebuilder:object:generate=true
// +groupName=crawl.example.com
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is group version used to register these objects.
	GroupVersion = schema.GroupVersion{Group: "crawl.example.com", Version: "v1alpha1"}

	// SchemeBuilder is used to add go types to the GroupVersionKind scheme.
	// Built on apimachinery alone (controller-runtime's scheme.Builder is
	// deprecated) so the API package stays cheap to import; each kind's file
	// registers its types with addKnownTypes.
	SchemeBuilder = runtime.NewSchemeBuilder(func(scheme *runtime.Scheme) error {
		metav1.AddToGroupVersion(scheme, GroupVersion)
		return nil
	})

	// AddToScheme adds the types in this group-version to the given scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes registers objects under GroupVersion when AddToScheme runs.
func addKnownTypes(objects ...runtime.Object) {
	SchemeBuilder.Register(func(scheme *runtime.Scheme) error {
		scheme.AddKnownTypes(GroupVersion, objects...)
		return nil
	})
}
