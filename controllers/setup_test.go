package controllers

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
)

// TestDepsValidate: zero durations mean the defaults (as where they are
// used), so a harness that sets only what it needs is accepted; negative
// and inconsistent ones are refused, naming the flag.
func TestDepsValidate(t *testing.T) {
	valid := func() Deps {
		return Deps{Registry: provider.NewRegistry(), Prober: benchProber{}, Tag: "t",
			Sweep: SweepOptions{Interval: time.Hour}, KVM: &KVMDeps{Hosts: &kvm.KubeHosts{}}}
	}
	cases := []struct {
		name    string
		mutate  func(*Deps)
		wantErr string
	}{
		{"zero check interval and timeout mean the defaults", func(*Deps) {}, ""},
		{"explicit check timing", func(d *Deps) { d.KVM.CheckInterval, d.KVM.CheckTimeout = 10*time.Second, 5*time.Second }, ""},
		{"negative check interval", func(d *Deps) { d.KVM.CheckInterval = -time.Second }, "--provider-check-interval"},
		{"timeout above the default interval", func(d *Deps) { d.KVM.CheckTimeout = time.Hour }, "--provider-check-timeout"},
		{"negative probe interval", func(d *Deps) { d.Proxy.ProbeInterval = -time.Second }, "--proxy-probe-interval must not be negative"},
		{"no hosts", func(d *Deps) { d.KVM.Hosts = nil }, "Deps.KVM.Hosts is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := valid()
			tc.mutate(&d)
			err := d.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestManagerOptionsStripManagedFields: the cache keeps no managedFields
// (most of a cached Proxy's bytes at scale), and a transform the caller
// chose is kept.
func TestManagerOptionsStripManagedFields(t *testing.T) {
	withFields := func() *crawlv1.Proxy {
		return &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "p", ManagedFields: []metav1.ManagedFieldsEntry{
			{Manager: "proxy-operator", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"},
		}}}
	}
	opts := ManagerOptions(ctrl.Options{})
	if opts.Cache.DefaultTransform == nil {
		t.Fatal("no default transform: cached objects keep their managedFields")
	}
	out, err := opts.Cache.DefaultTransform(withFields())
	if err != nil {
		t.Fatal(err)
	}
	if p := out.(*crawlv1.Proxy); p.ManagedFields != nil || p.Name != "p" {
		t.Errorf("transformed: managedFields %v, name %q; want none, \"p\"", p.ManagedFields, p.Name)
	}

	called := false
	own := func(in any) (any, error) { called = true; return in, nil }
	opts = ManagerOptions(ctrl.Options{Cache: cache.Options{DefaultTransform: own}})
	if _, err := opts.Cache.DefaultTransform(withFields()); err != nil || !called {
		t.Errorf("the caller's transform was replaced (called %v, err %v)", called, err)
	}
}
