package controllers

import (
	"strings"
	"testing"
	"time"

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
