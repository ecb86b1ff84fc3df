package kubernetes

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// ingressCIDRs are the ipBlocks np admits, and whether it admits the
// manager's pods.
func ingressCIDRs(t *testing.T, np *networkingv1.NetworkPolicy) (cidrs []string, manager bool) {
	t.Helper()
	if len(np.Spec.Ingress) != 1 {
		t.Fatalf("NetworkPolicy ingress %+v, want one rule", np.Spec.Ingress)
	}
	for _, peer := range np.Spec.Ingress[0].From {
		if peer.IPBlock != nil {
			cidrs = append(cidrs, peer.IPBlock.CIDR)
		} else {
			manager = manager || peer.NamespaceSelector != nil
		}
	}
	return cidrs, manager
}

// Issue 25, item 6: an unmanaged Proxy (the user's squid.conf stays the
// built-in policy, without a credential) is guarded like a managed one: a
// NetworkPolicy admits only its spec.access.allowedSourceCIDRs and the
// manager, and limits egress exactly as a managed Proxy's does.
func TestUnmanagedProxyGetsTheNetworkPolicy(t *testing.T) {
	ctx := context.Background()
	c := newFake(t)
	p := New(c, Options{ManagerNamespace: managerNS}).(*Provider)
	m := machine()
	m.AllowedSourceCIDRs = []string{"10.244.3.0/24"}
	if _, err := p.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	var np networkingv1.NetworkPolicy
	if err := c.Get(ctx, podKey(m), &np); err != nil {
		t.Fatalf("no NetworkPolicy for an unmanaged Proxy: %v", err)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("policy types %v, want ingress and egress", np.Spec.PolicyTypes)
	}
	cidrs, manager := ingressCIDRs(t, &np)
	if !slices.Equal(cidrs, []string{"10.244.3.0/24"}) || !manager {
		t.Errorf("ingress from %v (manager %v), want only allowedSourceCIDRs and the manager", cidrs, manager)
	}
	if ports := np.Spec.Ingress[0].Ports; len(ports) != 1 || ports[0].Port.IntValue() != 3128 {
		t.Errorf("ingress ports %+v, want the proxy port only", ports)
	}

	// Egress as for a managed Proxy with the default deny list.
	mc := newFake(t)
	managed := machine()
	managed.Squid = &squid.Config{AllowedSourceCIDRs: []string{"10.244.3.0/24"},
		Auth: squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: squidPassword}}
	if _, err := New(mc, Options{ManagerNamespace: managerNS}).Create(ctx, managed); err != nil {
		t.Fatal(err)
	}
	var want networkingv1.NetworkPolicy
	if err := mc.Get(ctx, podKey(managed), &want); err != nil {
		t.Fatal(err)
	}
	if len(want.Spec.Egress) == 0 || !equality.Semantic.DeepEqual(np.Spec.Egress, want.Spec.Egress) {
		t.Errorf("unmanaged egress\n%+v\nwant the managed Proxy's\n%+v", np.Spec.Egress, want.Spec.Egress)
	}

	// Delete removes it with the rest.
	if err := p.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, podKey(m), &networkingv1.NetworkPolicy{}); !apierrors.IsNotFound(err) {
		t.Errorf("NetworkPolicy after Delete: %v", err)
	}
}

// An unmanaged Proxy stored without allowedSourceCIDRs (before admission
// required them) is guarded by the built-in policy's ranges, which squid
// admits anyway; bad ones stored past admission are refused, naming the
// field, before anything is made.
func TestUnmanagedProxySources(t *testing.T) {
	ctx := context.Background()
	c := newFake(t)
	p := New(c, Options{}).(*Provider)
	m := machine()
	if _, err := p.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	var np networkingv1.NetworkPolicy
	if err := c.Get(ctx, podKey(m), &np); err != nil {
		t.Fatalf("no NetworkPolicy: %v", err)
	}
	if cidrs, _ := ingressCIDRs(t, &np); !slices.Equal(cidrs, DefaultAllowedClientCIDRs) {
		t.Errorf("ingress from %v, want the built-in policy's %v", cidrs, DefaultAllowedClientCIDRs)
	}

	bad := machine()
	bad.Name, bad.UID = "bad", "uid-bad"
	bad.AllowedSourceCIDRs = []string{"10.244.3.1/24"}
	_, err := p.Create(ctx, bad)
	if provider.Class(err) != provider.ClassPermanent || !strings.Contains(err.Error(), "spec.access.allowedSourceCIDRs[0]") {
		t.Fatalf("Create = %v, want a permanent error naming spec.access.allowedSourceCIDRs[0]", err)
	}
	if err := c.Get(ctx, podKey(bad), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("a pod was made for a refused Machine: %v", err)
	}
}
