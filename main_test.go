package main

import (
	"flag"
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestStartupRejectsUnusableDurations(t *testing.T) {
	cases := []struct {
		args []string
		want string // in the error; empty: accepted
	}{
		{nil, ""},
		{[]string{"--gc-interval=0"}, "--gc-interval must be positive"},
		{[]string{"--gc-interval=-1m"}, "--gc-interval must be positive"},
		{[]string{"--resync-interval=-1s"}, "--resync-interval must not be negative"},
		{[]string{"--provider-call-timeout=-1s"}, "--provider-call-timeout must not be negative"},
		{[]string{"--gc-volume-grace=-1m"}, "--gc-volume-grace must not be negative"},
		{[]string{"--instance-tag="}, "--instance-tag must not be empty"},
		{[]string{"--install-id=Staging_1"}, "--install-id"},
		{[]string{"--install-id=staging-1"}, ""},
		{[]string{"--provider-check-interval=10s", "--provider-check-timeout=20s"}, "--provider-check-timeout"},
		// flag.Duration accepts 0: the check timeout is then derived.
		{[]string{"--provider-check-timeout=0"}, ""},
		{[]string{"--probe-source-cidrs=10.244.0.0/16, 192.0.2.7/32,2001:db8::/64"}, ""},
		{[]string{"--probe-source-cidrs=10.244.0.0/16,10.1.2.3"}, `--probe-source-cidrs: "10.1.2.3" must be a CIDR`},
		{[]string{"--probe-source-cidrs=10.244.1.1/16"}, "has host bits set"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var o options
			fs := flag.NewFlagSet("manager", flag.ContinueOnError)
			o.bind(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := o.validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestEnabledProviders(t *testing.T) {
	cases := []struct {
		list string
		want []string // sorted
		err  string   // in the error; empty: accepted
	}{
		{"kvm", []string{"kvm"}, ""},
		{"kvm,kubernetes,gcp", []string{"gcp", "kubernetes", "kvm"}, ""},
		{" gcp , kvm ,", []string{"gcp", "kvm"}, ""},
		{"", []string{}, ""},
		{"kvm,azure", nil, `--providers: unknown provider "azure"`},
		{"KVM", nil, `unknown provider "KVM"`},
	}
	for _, tc := range cases {
		t.Run(tc.list, func(t *testing.T) {
			enabled, err := enabledProviders(tc.list)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("enabledProviders(%q) = %v, %v; want an error containing %q", tc.list, enabled, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := slices.Sorted(maps.Keys(enabled))
			if !slices.Equal(got, tc.want) {
				t.Errorf("enabledProviders(%q) = %v, want %v", tc.list, got, tc.want)
			}
		})
	}
}
