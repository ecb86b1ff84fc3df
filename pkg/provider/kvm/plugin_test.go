package kvm_test

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
)

func fakeReader(t *testing.T, objs ...runtime.Object) *fake.ClientBuilder {
	t.Helper()
	s := runtime.NewScheme()
	if err := crawlv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(objs...)
}

func readyHost(name string, ready bool, labels map[string]string) *crawlv1.KVMHost {
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	return &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: crawlv1.KVMHostStatus{Conditions: []metav1.Condition{{Type: crawlv1.ReadyCondition, Status: status}}}}
}

// A Proxy with a hostSelector and no host yet is placed on the Ready
// matching KVMHost with the fewest Proxies; with none it waits for a host.
func TestForGetPlacesByHostSelector(t *testing.T) {
	onHost := func(name, h string) *crawlv1.Proxy {
		return &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Status: crawlv1.ProxyStatus{Host: h}}
	}
	rackA := map[string]string{"rack": "a"}
	cases := []struct {
		name     string
		objs     []runtime.Object
		wantHost string
		wantWait bool
	}{
		{"fewest proxies wins", []runtime.Object{readyHost("hv1", true, rackA), readyHost("hv2", true, rackA), onHost("x", "hv1")}, "hv2", false},
		{"name breaks ties", []runtime.Object{readyHost("hv2", true, rackA), readyHost("hv1", true, rackA)}, "hv1", false},
		{"not Ready is skipped", []runtime.Object{readyHost("hv1", false, rackA), readyHost("hv2", true, rackA), onHost("x", "hv2")}, "hv2", false},
		{"labels must match", []runtime.Object{readyHost("hv1", true, map[string]string{"rack": "b"})}, "", true},
		{"no Ready host waits", []runtime.Object{readyHost("hv1", false, rackA)}, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := fakeReader(t, tc.objs...).Build()
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "new"},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: rackA}}}}
			m := &provider.Machine{}
			got, wait, err := kvm.Plugin().Machines(c).ForGet(context.Background(), p, m)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.wantHost || (wait != nil) != tc.wantWait {
				t.Fatalf("ForGet placed on %q, wait %+v; want %q, wait %v", got, wait, tc.wantHost, tc.wantWait)
			}
			if wait != nil && wait.Reason != crawlv1.ProxyWaitingForHostReason {
				t.Fatalf("wait reason %q", wait.Reason)
			}
			if m.Host != "" {
				t.Fatalf("Machine.Host = %q before the placement is recorded", m.Host)
			}
		})
	}
}

// A placed Proxy's Machine is on its host; a provider ID naming another
// host wins over status.host (an older write).
func TestForGetFollowsTheProviderID(t *testing.T) {
	const uuid = "0a0a0a0a-0000-4000-8000-000000000001"
	for _, tc := range []struct {
		name, statusHost, providerID, want string
	}{
		{"status.host", "hv1", "", "hv1"},
		{"provider ID agrees", "hv1", provider.FormatKVMProviderID("hv1", uuid), "hv1"},
		{"provider ID wins", "hv1", provider.FormatKVMProviderID("hv2", uuid), "hv2"},
		{"provider ID without status.host", "", provider.FormatKVMProviderID("hv2", uuid), "hv2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &crawlv1.Proxy{Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: "hv9"}},
				Status: crawlv1.ProxyStatus{Host: tc.statusHost, ProviderID: tc.providerID}}
			m := &provider.Machine{}
			placeOn, wait, err := kvm.Plugin().Machines(fakeReader(t).Build()).ForGet(context.Background(), p, m)
			if placeOn != "" || wait != nil || err != nil {
				t.Fatalf("ForGet = %q, %+v, %v; want the Machine", placeOn, wait, err)
			}
			if m.Host != tc.want {
				t.Fatalf("Machine.Host = %q, want %q", m.Host, tc.want)
			}
			if got := kvm.Plugin().HostOf(p); got != tc.want {
				t.Fatalf("HostOf = %q, want %q", got, tc.want)
			}
		})
	}
}

// Create needs the KVMHost (not being deleted) and the image; each missing
// one is a wait naming it. A URL image needs no object and gets the
// KVMImage defaults.
func TestForCreateWaitsForHostAndImage(t *testing.T) {
	now := metav1.Now()
	deleting := readyHost("hv1", true, nil)
	deleting.DeletionTimestamp, deleting.Finalizers = &now, []string{"x"}
	image := &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: "debian"},
		Spec: crawlv1.KVMImageSpec{URL: "https://img/d.qcow2", Checksum: "sha256:" + strings.Repeat("a", 64)}}
	for _, tc := range []struct {
		name       string
		objs       []runtime.Object
		image      string
		wantReason string
		want       provider.Image
	}{
		{"no host", []runtime.Object{image}, "debian", crawlv1.ProxyWaitingForHostReason, provider.Image{}},
		{"host being deleted", []runtime.Object{deleting, image}, "debian", crawlv1.ProxyWaitingForHostReason, provider.Image{}},
		{"no image", []runtime.Object{readyHost("hv1", true, nil)}, "debian", crawlv1.ProxyWaitingForImageReason, provider.Image{}},
		{"KVMImage", []runtime.Object{readyHost("hv1", true, nil), image}, "debian", "",
			provider.Image{Name: "debian", URL: image.Spec.URL, Checksum: image.Spec.Checksum, Format: "qcow2", Firmware: "uefi"}},
		{"URL", []runtime.Object{readyHost("hv1", true, nil)}, "https://img/u.raw", "",
			provider.Image{URL: "https://img/u.raw", Format: "qcow2", Firmware: "uefi"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &crawlv1.Proxy{Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: "hv1", Image: tc.image}}}
			m := &provider.Machine{Host: "hv1"}
			wait, err := kvm.Plugin().Machines(fakeReader(t, tc.objs...).Build()).ForCreate(context.Background(), p, m)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.wantReason != "" && (wait == nil || wait.Reason != tc.wantReason):
				t.Fatalf("wait %+v, want reason %s", wait, tc.wantReason)
			case tc.wantReason == "" && wait != nil:
				t.Fatalf("wait %+v, want the image", wait)
			case m.Image != tc.want:
				t.Fatalf("image %+v, want %+v", m.Image, tc.want)
			}
		})
	}
}

// Delete finds the domain where the provider ID says, then where the Proxy
// was placed; an unreadable provider ID is permanent, never a guess.
func TestForDeleteFindsTheHost(t *testing.T) {
	const uuid = "0a0a0a0a-0000-4000-8000-000000000001"
	for _, tc := range []struct {
		name           string
		status         crawlv1.ProxyStatus
		specHost, want string
		permanent      bool
	}{
		{"provider ID", crawlv1.ProxyStatus{ProviderID: provider.FormatKVMProviderID("hv2", uuid), Host: "hv1"}, "hv1", "hv2", false},
		{"status.host", crawlv1.ProxyStatus{Host: "hv1"}, "hv3", "hv1", false},
		{"spec host", crawlv1.ProxyStatus{}, "hv3", "hv3", false},
		{"never placed", crawlv1.ProxyStatus{}, "", "", false},
		{"bad provider ID", crawlv1.ProxyStatus{ProviderID: "kvm://hv1/not-a-uuid"}, "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &crawlv1.Proxy{Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: tc.specHost}}, Status: tc.status}
			m := &provider.Machine{}
			err := kvm.Plugin().Machines(nil).ForDelete(context.Background(), p, m)
			if tc.permanent {
				if provider.Class(err) != provider.ClassPermanent {
					t.Fatalf("ForDelete error %v, want a permanent one", err)
				}
				return
			}
			if err != nil || m.Host != tc.want {
				t.Fatalf("ForDelete: host %q, %v; want %q", m.Host, err, tc.want)
			}
		})
	}
}
