package v1alpha1

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// AddToScheme is what main, the harnesses and clients call: every kind and
// its list under GroupVersion, and the meta types a client needs to list and
// watch them (ListOptions as query parameters, WatchEvent).
func TestAddToSchemeRegistersEveryKind(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatalf("AddToScheme: %v", err)
	}
	for kind, obj := range map[string]runtime.Object{
		"Proxy": &Proxy{}, "ProxyList": &ProxyList{},
		"ProxyPool": &ProxyPool{}, "ProxyPoolList": &ProxyPoolList{},
		"KVMHost": &KVMHost{}, "KVMHostList": &KVMHostList{},
		"KVMImage": &KVMImage{}, "KVMImageList": &KVMImageList{},
	} {
		gvks, _, err := s.ObjectKinds(obj)
		if err != nil {
			t.Errorf("%s: %v", kind, err)
			continue
		}
		if len(gvks) != 1 || gvks[0] != GroupVersion.WithKind(kind) {
			t.Errorf("%s registered as %v, want %v", kind, gvks, GroupVersion.WithKind(kind))
		}
	}
	if !s.Recognizes(GroupVersion.WithKind("WatchEvent")) {
		t.Errorf("WatchEvent not registered under %v", GroupVersion)
	}
	q, err := runtime.NewParameterCodec(s).EncodeParameters(&metav1.ListOptions{LabelSelector: "pool=a"}, GroupVersion)
	if err != nil {
		t.Fatalf("ListOptions as parameters of %v: %v", GroupVersion, err)
	}
	if got := q.Get("labelSelector"); got != "pool=a" {
		t.Errorf("labelSelector parameter = %q, want pool=a", got)
	}
}
