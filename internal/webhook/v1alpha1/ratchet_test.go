package v1alpha1

import (
	"context"
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// updateCtx is the context a webhook sees for an update of stored.
func updateCtx(t *testing.T, stored runtime.Object) context.Context {
	t.Helper()
	raw, err := json.Marshal(stored)
	if err != nil {
		t.Fatal(err)
	}
	return admission.NewContextWithRequest(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, OldObject: runtime.RawExtension{Raw: raw}}})
}

// storedInvalidProxy is a Proxy today's rules reject (memory below the
// minimum, a name that is no DNS label), stored without defaults, with
// the finalizer: as if created with the webhooks off.
func storedInvalidProxy() *crawlv1.Proxy {
	return &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: "p.1", Namespace: "crawl", Finalizers: []string{crawlv1.ProxyFinalizer}},
		Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM,
			Placement: crawlv1.ProxyPlacement{Host: "hv1", Image: "https://img.example/d.qcow2", ImageChecksum: goodSum},
			Resources: crawlv1.ProxyResources{Memory: ptr.To(resource.MustParse("64Mi"))}},
	}
}

func TestUpdatesReleasingAnInvalidStoredObjectAreAdmitted(t *testing.T) {
	w := proxyWebhook(false)
	now := metav1.Now()
	cases := map[string]func(*crawlv1.Proxy){
		"finalizer removed":       func(p *crawlv1.Proxy) { p.Finalizers = nil },
		"skip-cleanup annotation": func(p *crawlv1.Proxy) { p.Annotations = map[string]string{crawlv1.SkipCleanupAnnotation: "true"} },
		"finalizer removed while deleting, spec touched": func(p *crawlv1.Proxy) {
			p.DeletionTimestamp, p.Finalizers, p.Spec.Resources.CPUs = &now, nil, 2
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			stored := storedInvalidProxy()
			p := stored.DeepCopy()
			mutate(p)
			ctx := updateCtx(t, stored)
			want := p.DeepCopy()
			if err := w.Default(ctx, p); err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(p.Spec, want.Spec) {
				t.Fatalf("Default changed the spec of a releasing update:\n got %+v\nwant %+v", p.Spec, want.Spec)
			}
			if _, err := w.ValidateUpdate(ctx, stored, p); err != nil {
				t.Fatalf("ValidateUpdate refused: %v", err)
			}
		})
	}
}

func TestUpdateIsValidatedForWhatItChanges(t *testing.T) {
	w := proxyWebhook(false)
	cases := []struct {
		name    string
		mutate  func(*crawlv1.Proxy)
		wantErr string
	}{
		{"a valid change beside old errors", func(p *crawlv1.Proxy) { p.Spec.Resources.CPUs = 2 }, ""},
		{"the bad field changed to another bad value", func(p *crawlv1.Proxy) { p.Spec.Resources.Memory = ptr.To(resource.MustParse("100Mi")) }, "spec.resources.memory: Invalid value: \"100Mi\""},
		{"a new error", func(p *crawlv1.Proxy) { p.Spec.Resources.CPUs = 65 }, "spec.resources.cpus"},
		{"an immutable field", func(p *crawlv1.Proxy) { p.Spec.Placement.Host = "hv2" }, "spec.placement.host: Forbidden"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stored := storedInvalidProxy()
			p := stored.DeepCopy()
			tc.mutate(p)
			ctx := updateCtx(t, stored)
			if err := w.Default(ctx, p); err != nil {
				t.Fatal(err)
			}
			// Defaults apply to a real change, except that the immutable
			// placement and port keep their stored spelling when it means
			// the same.
			if p.Spec.InstallGuestAgent == nil {
				t.Error("installGuestAgent not defaulted on a spec update")
			}
			if p.Spec.Port != 0 {
				t.Errorf("port = %d, want the stored (unset) value kept", p.Spec.Port)
			}
			if tc.wantErr == "" && p.Spec.Placement.Firmware != "" {
				t.Errorf("stored placement was rewritten with defaults: %+v", p.Spec.Placement)
			}
			_, err := w.ValidateUpdate(ctx, stored, p)
			checkErrs(t, err, tc.wantErr)
		})
	}
}

func TestReleasingUpdatesOfInvalidHostsAndImagesAreAdmitted(t *testing.T) {
	host := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: "hv1", Finalizers: []string{"crawl.example.com/kvmhost"}},
		Spec: crawlv1.KVMHostSpec{Address: "hv1", SocketPath: "relative/sock"}}
	h := host.DeepCopy()
	h.Finalizers = nil
	ctx := updateCtx(t, host)
	if err := (&KVMHostWebhook{}).Default(ctx, h); err != nil {
		t.Fatal(err)
	}
	if h.Spec.Address != "hv1" {
		t.Errorf("address defaulted to %q on a metadata-only update", h.Spec.Address)
	}
	if _, err := (&KVMHostWebhook{}).ValidateUpdate(ctx, host, h); err != nil {
		t.Errorf("KVMHost finalizer removal refused: %v", err)
	}
	// A real change defaults, yet "hv1" still means "hv1:22": no move.
	h.Spec.CheckInterval = dur(60e9)
	if err := (&KVMHostWebhook{}).Default(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := (&KVMHostWebhook{}).ValidateUpdate(ctx, host, h); err != nil {
		t.Errorf("KVMHost interval change refused: %v", err)
	}

	img := &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: "old", Finalizers: []string{"x"}},
		Spec: crawlv1.KVMImageSpec{URL: "ftp://img.example/d", Checksum: goodSum}}
	i := img.DeepCopy()
	i.Annotations = map[string]string{"a": "b"}
	if _, err := (&KVMImageWebhook{}).ValidateUpdate(updateCtx(t, img), img, i); err != nil {
		t.Errorf("KVMImage annotation refused: %v", err)
	}
}
