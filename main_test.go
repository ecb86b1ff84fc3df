package main

import (
	"flag"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
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
		{[]string{"--kubernetes-squid-image=docker.io/ubuntu/squid:latest"}, `--kubernetes-squid-image "docker.io/ubuntu/squid:latest" has no digest`},
		{[]string{"--kubernetes-squid-image=registry.test/squid@sha256:abc"}, "has no digest"},
		{[]string{"--kubernetes-squid-image=docker.io/ubuntu/squid:latest", "--kubernetes-squid-image-allow-tag"}, ""},
		{[]string{"--kubernetes-squid-image=registry.test/squid:6@sha256:6a097f68bae708cedbabd6188d68c7e2e7a38cedd05a176e1cc0ba29e3bbe029"}, ""},
		{[]string{"--allow-destination-exceptions=169.254.169.254/32, 127.0.0.1/32,fe80::/64"}, ""},
		{[]string{"--allow-destination-exceptions=169.254.169.254"}, `--allow-destination-exceptions: "169.254.169.254" must be a CIDR`},
		{[]string{"--allow-destination-exceptions=10.0.0.0/8"}, "needs no grant"},
		{[]string{"--allow-destination-exceptions=64:ff9b::a9fe:a9fe/128"}, "which no exception lifts"},
		{[]string{"--namespaces=crawl-a, crawl-b"}, ""},
		{[]string{"--namespaces=crawl,Crawl"}, `--namespaces: "Crawl" is not a namespace name`},
		{[]string{"--egress-echo-url=https://api.ipify.org?format=json"}, ""},
		{[]string{"--egress-echo-url=http://u:p@echo.example/ip"}, "--egress-echo-url: must not carry credentials"},
		{[]string{"--egress-echo-url=echo.example/ip"}, "--egress-echo-url: scheme"},
		{[]string{"--egress-echo-interval=-1m"}, "--egress-echo-interval must not be negative"},
		{[]string{"--egress-stale-after=-1m"}, "--egress-stale-after must not be negative"},
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

// TestPolicyFlagsReachAdmissionAndController: the grants and the user-data
// switch go to the Proxy webhook (and so the ProxyPool's) and to the
// controllers alike, so a Proxy stored past the webhook meets the same
// rules.
func TestPolicyFlagsReachAdmissionAndController(t *testing.T) {
	var o options
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	o.bind(fs)
	if err := fs.Parse([]string{"--allow-destination-exceptions=169.254.169.254/32", "--allow-proxy-user-data=false"}); err != nil {
		t.Fatal(err)
	}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	w, d := o.proxyWebhook(), o.deps(nil)
	if w.DestinationExceptionGrants.String() != "169.254.169.254/32" || d.Proxy.DestinationExceptionGrants.String() != "169.254.169.254/32" {
		t.Errorf("grants: webhook %q, controller %q; want 169.254.169.254/32 for both", w.DestinationExceptionGrants, d.Proxy.DestinationExceptionGrants)
	}
	if !w.RefuseUserData || !d.Proxy.RefuseUserData {
		t.Errorf("RefuseUserData: webhook %v, controller %v; want true for both", w.RefuseUserData, d.Proxy.RefuseUserData)
	}

	// The egress flags reach the Proxy controller; the gcp NAT flag the
	// plug-ins both sides get.
	var eg options
	egfs := flag.NewFlagSet("manager", flag.ContinueOnError)
	eg.bind(egfs)
	if err := egfs.Parse([]string{"--egress-echo-url=http://echo.example/ip", "--egress-echo-interval=3m", "--gcp-no-external-ip"}); err != nil {
		t.Fatal(err)
	}
	if d := eg.deps(nil); d.Proxy.Egress.EchoURL != "http://echo.example/ip" || d.Proxy.Egress.Interval != 3*time.Minute {
		t.Errorf("egress options %+v, want the flags'", d.Proxy.Egress)
	}
	gcpSpec := &crawlv1.ProxySpec{Provider: crawlv1.ProviderGCP}
	for side, pl := range map[string]plugin.List{"webhook": eg.proxyWebhook().Plugins, "controller": eg.deps(nil).Plugins} {
		if plugin.SharedEgressOf(pl.Get(string(crawlv1.ProviderGCP)), gcpSpec) == "" {
			t.Errorf("%s: the gcp plug-in does not know --gcp-no-external-ip", side)
		}
	}

	var def options
	def.bind(flag.NewFlagSet("manager", flag.ContinueOnError))
	if err := def.validate(); err != nil {
		t.Fatal(err)
	}
	if w, d := def.proxyWebhook(), def.deps(nil); len(w.DestinationExceptionGrants)+len(d.Proxy.DestinationExceptionGrants) != 0 || w.RefuseUserData || d.Proxy.RefuseUserData {
		t.Errorf("defaults grant %v/%v and refuse user-data %v/%v; want no grant, user-data admitted", w.DestinationExceptionGrants, d.Proxy.DestinationExceptionGrants, w.RefuseUserData, d.Proxy.RefuseUserData)
	}
}

// TestNamespacesFlagRestrictsTheCache: --namespaces reaches the manager's
// cache as its namespaces, beside the kubernetes provider's own filters;
// without it the cache spans every namespace.
func TestNamespacesFlagRestrictsTheCache(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, nil},
		{[]string{"--namespaces=crawl-b,crawl-a"}, []string{"crawl-a", "crawl-b"}},
	} {
		var o options
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		o.bind(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := o.validate(); err != nil {
			t.Fatal(err)
		}
		c := o.cacheOptions(map[string]bool{"kubernetes": true})
		if got := slices.Sorted(maps.Keys(c.DefaultNamespaces)); !slices.Equal(got, tc.want) {
			t.Errorf("%v: cache namespaces %v, want %v", tc.args, got, tc.want)
		}
		if len(c.ByObject) == 0 {
			t.Errorf("%v: the kubernetes provider's cache filters are gone", tc.args)
		}
	}
}
