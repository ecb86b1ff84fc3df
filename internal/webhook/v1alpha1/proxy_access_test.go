package v1alpha1

import (
	"context"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// TestDefaultProxyAccess: a new Proxy is managed with a generated Basic
// credential unless it says otherwise; nothing explicit is overwritten.
func TestDefaultProxyAccess(t *testing.T) {
	cases := []struct {
		name   string
		access *crawlv1.ProxyAccess
		want   *crawlv1.ProxyAccess
	}{
		{"absent: managed, Basic, 80 and 443, 256 connections", nil, &crawlv1.ProxyAccess{
			Managed: ptr.To(true), Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthBasic},
			AllowedPorts: []int32{80, 443}, MaxConnectionsPerClient: 256}},
		{"sources only", &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"}}, &crawlv1.ProxyAccess{
			Managed: ptr.To(true), AllowedSourceCIDRs: []string{"10.0.0.0/8"}, Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthBasic},
			AllowedPorts: []int32{80, 443}, MaxConnectionsPerClient: 256}},
		{"explicit values kept", &crawlv1.ProxyAccess{Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthNone},
			AllowedPorts: []int32{8080}, MaxConnectionsPerClient: 16}, &crawlv1.ProxyAccess{
			Managed: ptr.To(true), Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthNone},
			AllowedPorts: []int32{8080}, MaxConnectionsPerClient: 16}},
		{"secretRef kept, type Basic", &crawlv1.ProxyAccess{Auth: &crawlv1.ProxyAuth{SecretRef: &crawlv1.LocalObjectReference{Name: "mine"}}},
			&crawlv1.ProxyAccess{Managed: ptr.To(true), Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthBasic, SecretRef: &crawlv1.LocalObjectReference{Name: "mine"}},
				AllowedPorts: []int32{80, 443}, MaxConnectionsPerClient: 256}},
		{"unmanaged: nothing else defaulted", &crawlv1.ProxyAccess{Managed: ptr.To(false)}, &crawlv1.ProxyAccess{Managed: ptr.To(false)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := kvmProxy()
			p.Spec.Access = tc.access
			if err := proxyWebhook(false).Default(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(p.Spec.Access, tc.want) {
				t.Fatalf("access = %+v, want %+v", p.Spec.Access, tc.want)
			}
		})
	}
}

// TestStoredProxyWithoutAccessStaysUnmanaged: an update never adds
// spec.access to a Proxy stored before it existed (its squid belongs to
// its cloud-init), and such a Proxy stays updatable.
func TestStoredProxyWithoutAccessStaysUnmanaged(t *testing.T) {
	w := proxyWebhook(false)
	stored := kvmProxy()
	stored.Spec.Access = nil
	p := stored.DeepCopy()
	p.Spec.Resources.CPUs = 2
	ctx := updateCtx(t, stored)
	if err := w.Default(ctx, p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.Access != nil {
		t.Fatalf("update defaulted access to %+v; a stored Proxy without it must stay unmanaged", p.Spec.Access)
	}
	if p.IsManaged() {
		t.Fatal("IsManaged() = true for a Proxy without spec.access")
	}
	warnings, err := w.ValidateUpdate(ctx, stored, p)
	if err != nil || len(warnings) != 0 {
		t.Fatalf("ValidateUpdate = %v, %v; want admitted without warnings", warnings, err)
	}
}

// TestAccessDefaultsKeepTheStoredSpelling: an update that re-sends access
// in a form that defaults to the stored one is no change (access is
// immutable); a real change is refused naming spec.access.
func TestAccessDefaultsKeepTheStoredSpelling(t *testing.T) {
	w := proxyWebhook(false)
	stored := kvmProxy()
	stored.Spec.Access.AllowedPorts, stored.Spec.Access.MaxConnectionsPerClient = nil, 0 // stored with the webhook off
	p := stored.DeepCopy()
	p.Spec.Resources.CPUs = 2
	ctx := updateCtx(t, stored)
	if err := w.Default(ctx, p); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(p.Spec.Access, stored.Spec.Access) {
		t.Fatalf("access rewritten on update: %+v, stored %+v", p.Spec.Access, stored.Spec.Access)
	}
	if _, err := w.ValidateUpdate(ctx, stored, p); err != nil {
		t.Fatalf("refused: %v", err)
	}

	changed := p.DeepCopy()
	changed.Spec.Access.AllowedSourceCIDRs = []string{"192.0.2.0/24"}
	if err := w.Default(ctx, changed); err != nil {
		t.Fatal(err)
	}
	_, err := w.ValidateUpdate(ctx, stored, changed)
	checkErrs(t, err, "spec.access: Forbidden: access is immutable")
}

func TestValidateProxyAccess(t *testing.T) {
	basic := func(a *crawlv1.ProxyAccess) func(*crawlv1.Proxy) {
		return func(p *crawlv1.Proxy) {
			p.Spec.Access = a
			proxyWebhook(false).DefaultProxy(p)
		}
	}
	cases := []struct {
		name    string
		mutate  func(*crawlv1.Proxy)
		wantErr string
	}{
		{"generated credential", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.244.0.0/16", "2001:db8::/48"}}), ""},
		{"user's Secret, not read at admission", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"},
			Auth: &crawlv1.ProxyAuth{SecretRef: &crawlv1.LocalObjectReference{Name: "not-created-yet"}}}), ""},
		{"no sources", basic(&crawlv1.ProxyAccess{}), "spec.access.allowedSourceCIDRs: Required value"},
		{"not a CIDR, named by index", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8", "10.1.2.3"}}),
			`spec.access.allowedSourceCIDRs[1]: Invalid value: "10.1.2.3": must be a CIDR`},
		{"host bits set", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.1.2.3/8"}}), "spec.access.allowedSourceCIDRs[0]: Invalid value: \"10.1.2.3/8\": has host bits set"},
		{"auth None with narrow sources", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"192.0.2.0/24"},
			Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthNone}}), ""},
		{"auth None with a wide source", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"},
			Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthNone}}), "spec.access.allowedSourceCIDRs[0]: Invalid value: \"10.0.0.0/8\": with auth type None"},
		{"auth None with a credential", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"192.0.2.0/24"},
			Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthNone, SecretRef: &crawlv1.LocalObjectReference{Name: "s"}}}), "spec.access.auth.secretRef: Forbidden"},
		{"secretRef naming the operator's Secret", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"},
			Auth: &crawlv1.ProxyAuth{SecretRef: &crawlv1.LocalObjectReference{Name: "p1-proxy-credentials"}}}), "spec.access.auth.secretRef.name: Invalid value: \"p1-proxy-credentials\": is the Secret the operator writes"},
		{"secretRef not a Secret name", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"},
			Auth: &crawlv1.ProxyAuth{SecretRef: &crawlv1.LocalObjectReference{Name: "My_Secret"}}}), "spec.access.auth.secretRef.name: Invalid value"},
		{"bad port", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{80, 70000}}), "spec.access.allowedPorts[1]: Invalid value"},
		{"exception outside the denied list", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"},
			AllowedDestinationExceptions: []string{"8.8.8.8/32"}}), "spec.access.allowedDestinationExceptions[0]: Invalid value"},
		{"exception for an internal probe target", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"},
			AllowedDestinationExceptions: []string{"10.200.0.1/32"}}), ""},
		{"extra denied not a CIDR", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"},
			ExtraDeniedDestinations: []string{"pods"}}), "spec.access.extraDeniedDestinations[0]: Invalid value"},
		{"negative connection cap", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"}, MaxConnectionsPerClient: -1}),
			"spec.access.maxConnectionsPerClient: Invalid value"},
		{"no auth type (stored past the webhook)", func(p *crawlv1.Proxy) {
			p.Spec.Access = &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"}, Auth: &crawlv1.ProxyAuth{}}
		}, ""},
		{"unknown auth type", basic(&crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"}, Auth: &crawlv1.ProxyAuth{Type: "Digest"}}),
			"spec.access.auth.type: Unsupported value"},
		{"unmanaged", basic(&crawlv1.ProxyAccess{Managed: ptr.To(false)}), ""},
		{"unmanaged with managed-only fields", basic(&crawlv1.ProxyAccess{Managed: ptr.To(false), AllowedSourceCIDRs: []string{"10.0.0.0/8"}, MaxConnectionsPerClient: 5}),
			"[spec.access.allowedSourceCIDRs: Forbidden: only used when the operator manages squid"},
		{"stored before spec.access", func(p *crawlv1.Proxy) { p.Spec.Access = nil }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := kvmProxy()
			tc.mutate(p)
			checkErrs(t, proxyWebhook(true).ValidateProxy(p).ToAggregate(), tc.wantErr)
		})
	}
}

// TestUnmanagedProxyIsAdmittedWithAWarning: managed false is the user's
// choice, so a warning, not an error; a managed Proxy gets none unless a
// source admits every address.
func TestUnmanagedProxyIsAdmittedWithAWarning(t *testing.T) {
	w := proxyWebhook(false)
	for _, tc := range []struct {
		name   string
		access *crawlv1.ProxyAccess
		want   string // "" = no warning
	}{
		{"managed", &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"}}, ""},
		{"unmanaged", &crawlv1.ProxyAccess{Managed: ptr.To(false)}, "spec.access.managed is false"},
		{"every IPv4 address", &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8", "0.0.0.0/0"}}, "spec.access.allowedSourceCIDRs[1] is 0.0.0.0/0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := kvmProxy()
			p.Spec.Access = tc.access
			if err := w.Default(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			warnings, err := w.ValidateCreate(context.Background(), p)
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tc.want == "" {
				if len(warnings) != 0 {
					t.Fatalf("warnings %q, want none", warnings)
				}
				return
			}
			if !slices.ContainsFunc(warnings, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Fatalf("warnings %q, want one containing %q", warnings, tc.want)
			}
		})
	}
}

// TestUnmanagedKubernetesProxyNeedsSources: the kubernetes provider guards
// an unmanaged Proxy's pod with a NetworkPolicy admitting its
// allowedSourceCIDRs, so admission requires them, naming the field, and
// checks each; providers that do not guard keep refusing the field.
func TestUnmanagedKubernetesProxyNeedsSources(t *testing.T) {
	unmanaged := func(provider crawlv1.ProviderName, sources ...string) *crawlv1.Proxy {
		p := kvmProxy()
		p.Spec.Provider = provider
		if provider != crawlv1.ProviderKVM {
			p.Spec.Placement = crawlv1.ProxyPlacement{}
		}
		p.Spec.Access = &crawlv1.ProxyAccess{Managed: ptr.To(false), AllowedSourceCIDRs: sources}
		return p
	}
	for _, tc := range []struct {
		name    string
		p       *crawlv1.Proxy
		wantErr string
	}{
		{"kubernetes without sources", unmanaged(crawlv1.ProviderKubernetes), "spec.access.allowedSourceCIDRs: Required value"},
		{"kubernetes with sources", unmanaged(crawlv1.ProviderKubernetes, "10.244.0.0/16"), ""},
		{"kubernetes with a bad source", unmanaged(crawlv1.ProviderKubernetes, "10.244.0.0/16", "10.1.2.3/8"),
			`spec.access.allowedSourceCIDRs[1]: Invalid value: "10.1.2.3/8": has host bits set`},
		{"kvm with sources", unmanaged(crawlv1.ProviderKVM, "10.244.0.0/16"),
			"spec.access.allowedSourceCIDRs: Forbidden: only used when the operator manages squid"},
		{"kvm without", unmanaged(crawlv1.ProviderKVM), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkErrs(t, proxyWebhook(false).ValidateProxy(tc.p).ToAggregate(), tc.wantErr)
		})
	}
}
