package controllers

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	clientfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

func TestStaticNetworkOfAnIPAddress(t *testing.T) {
	addr := func(address string, prefix *int32, gateway, mac string) *ipamv1.IPAddress {
		a := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: "p1-0"},
			Spec: ipamv1.IPAddressSpec{Address: address, Prefix: prefix, Gateway: gateway}}
		if mac != "" {
			a.Annotations = map[string]string{crawlv1.MACAddressAnnotation: mac}
		}
		return a
	}
	cases := []struct {
		name                      string
		in                        *ipamv1.IPAddress
		wantAddr, wantGW, wantMAC string
		wantErr                   string
	}{
		{"routed block with a virtual MAC", addr("203.0.113.5", ptr.To[int32](28), "203.0.113.1", "02-00-CB-00-71-05"), "203.0.113.5/28", "203.0.113.1", "02:00:cb:00:71:05", ""},
		{"no gateway", addr("203.0.113.5", ptr.To[int32](32), "", ""), "203.0.113.5/32", "invalid IP", "", ""},
		{"ipv6", addr("2001:db8::10", ptr.To[int32](64), "2001:db8::1", ""), "2001:db8::10/64", "2001:db8::1", "", ""},
		{"address not an IP", addr("203.0.113.x", ptr.To[int32](28), "", ""), "", "", "", `IPAddress p1-0 spec.address "203.0.113.x": not an IP address`},
		{"no prefix", addr("203.0.113.5", nil, "", ""), "", "", "", "IPAddress p1-0 spec.prefix: missing"},
		{"prefix too long for IPv4", addr("203.0.113.5", ptr.To[int32](33), "", ""), "", "", "", `IPAddress p1-0 spec.prefix "33": not a prefix length of 203.0.113.5 (at most 32)`},
		{"negative prefix", addr("203.0.113.5", ptr.To[int32](-1), "", ""), "", "", "", "spec.prefix"},
		{"gateway not an IP", addr("203.0.113.5", ptr.To[int32](28), "gw", ""), "", "", "", `IPAddress p1-0 spec.gateway "gw": not an IP address`},
		{"gateway outside the prefix", addr("203.0.113.5", ptr.To[int32](28), "198.51.100.1", ""), "", "", "", `spec.gateway "198.51.100.1": outside 203.0.113.0/28`},
		{"gateway of the other family", addr("203.0.113.5", ptr.To[int32](28), "2001:db8::1", ""), "", "", "", `spec.gateway "2001:db8::1": not of the family of spec.address`},
		{"gateway is the address", addr("203.0.113.5", ptr.To[int32](28), "203.0.113.5", ""), "", "", "", "is spec.address itself"},
		{"MAC not a MAC", addr("203.0.113.5", ptr.To[int32](28), "203.0.113.1", "02:00:cb"), "", "", "", `annotation crawl.example.com/mac-address "02:00:cb": not a 48-bit MAC address`},
		{"multicast MAC", addr("203.0.113.5", ptr.To[int32](28), "203.0.113.1", "01:00:5e:00:00:01"), "", "", "", "a multicast MAC cannot be a NIC's"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sn, err := staticNetworkOf(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || provider.Class(err) != provider.ClassPermanent {
					t.Fatalf("err = %v (class %s), want a permanent one containing %q", err, provider.Class(err), tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sn.Address.String() != tc.wantAddr || sn.Gateway.String() != tc.wantGW || sn.MAC != tc.wantMAC {
				t.Errorf("got %s gw %s mac %q, want %s gw %s mac %q", sn.Address, sn.Gateway, sn.MAC, tc.wantAddr, tc.wantGW, tc.wantMAC)
			}
		})
	}
}

func TestHoldAddress(t *testing.T) {
	proxy := func(ns, name, uid, assigned, providerID string) *crawlv1.Proxy {
		return &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
			Status: crawlv1.ProxyStatus{AssignedAddress: assigned, ProviderID: providerID}}
	}
	addr := netip.MustParsePrefix("203.0.113.5/28")
	cases := []struct {
		name       string
		self       *crawlv1.Proxy
		others     []*crawlv1.Proxy
		wantReason string // a wait's reason; "" for none
		wantErr    string
		wantRecord string
	}{
		{"a free address is recorded", proxy("a", "p1", "u1", "", ""), []*crawlv1.Proxy{proxy("b", "p2", "u2", "203.0.113.6/28", "")}, "", "", "203.0.113.5/28"},
		{"already recorded: nothing to do", proxy("a", "p1", "u1", "203.0.113.5/28", "kvm://hv1/x"), nil, "", "", "203.0.113.5/28"},
		{"held by another Proxy, whatever its prefix", proxy("a", "p1", "u1", "", ""), []*crawlv1.Proxy{proxy("b", "p2", "u2", "203.0.113.5/24", "")}, crawlv1.ProxyAddressInUseReason, "", ""},
		{"a running instance never changes address", proxy("a", "p1", "u1", "203.0.113.9/28", "kvm://hv1/x"), nil, "", "instance kvm://hv1/x was booted with 203.0.113.9/28", "203.0.113.9/28"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := []client.Object{tc.self}
			for _, o := range tc.others {
				objs = append(objs, o)
			}
			c := clientfake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).WithStatusSubresource(&crawlv1.Proxy{}).Build()
			r := &ProxyReconciler{Client: c, APIReader: c}
			p := &crawlv1.Proxy{}
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(tc.self), p); err != nil {
				t.Fatal(err)
			}
			wait, err := r.holdAddress(context.Background(), p, addr)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || provider.Class(err) != provider.ClassPermanent {
					t.Fatalf("err = %v, want a permanent one containing %q", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case tc.wantReason == "" && wait != nil:
				t.Fatalf("waits: %+v", wait)
			case tc.wantReason != "" && (wait == nil || wait.reason != tc.wantReason || !strings.Contains(wait.message, "Proxy b/p2")):
				t.Fatalf("wait = %+v, want %s naming Proxy b/p2", wait, tc.wantReason)
			}
			stored := &crawlv1.Proxy{}
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(tc.self), stored); err != nil {
				t.Fatal(err)
			}
			if stored.Status.AssignedAddress != tc.wantRecord {
				t.Errorf("stored assignedAddress %q, want %q", stored.Status.AssignedAddress, tc.wantRecord)
			}
		})
	}
}

func TestHoldingPoolOfAClaim(t *testing.T) {
	const uid = types.UID("pool-uid")
	poolRef := metav1.OwnerReference{APIVersion: crawlv1.GroupVersion.String(), Kind: "ProxyPool", Name: "crawl-a", UID: uid}
	proxyRef := metav1.OwnerReference{APIVersion: crawlv1.GroupVersion.String(), Kind: "Proxy", Name: "crawl-a-x", UID: "proxy-uid", Controller: ptr.To(true)}
	otherGroup := poolRef
	otherGroup.APIVersion = "example.org/v1"
	cases := []struct {
		name   string
		label  map[string]string
		owners []metav1.OwnerReference
		held   bool
	}{
		{"label and the pool's reference", map[string]string{crawlv1.QuarantineHoldLabel: string(uid)}, []metav1.OwnerReference{proxyRef, poolRef}, true},
		{"no label", nil, []metav1.OwnerReference{proxyRef, poolRef}, false},
		{"label without the pool's reference", map[string]string{crawlv1.QuarantineHoldLabel: string(uid)}, []metav1.OwnerReference{proxyRef}, false},
		{"label naming another pool", map[string]string{crawlv1.QuarantineHoldLabel: "other"}, []metav1.OwnerReference{proxyRef, poolRef}, false},
		{"a ProxyPool of another group", map[string]string{crawlv1.QuarantineHoldLabel: string(uid)}, []metav1.OwnerReference{otherGroup}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			claim := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Name: "crawl-a-x-0", Labels: c.label, OwnerReferences: c.owners}}
			got := holdingPool(claim)
			if (got != nil) != c.held {
				t.Fatalf("holdingPool = %v, want held %v", got, c.held)
			}
			if got != nil && got.UID != uid {
				t.Fatalf("holdingPool names %s, want %s", got.UID, uid)
			}
		})
	}
}

// What a pool's releaseHeldClaims does to each claim marked as held for
// it, while it runs and when it is deleted (quarantine nil). A claim the
// garbage collector orphaned (propagation Orphan stripped the pool's
// reference before the pool's finalizer ran) has no controller left: only
// the pool's deletion can release it.
func TestReleaseHeldClaims(t *testing.T) {
	pool := &crawlv1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "crawl-a", UID: "pool-uid"}}
	poolRef := holdBy(pool)
	poolRef.Controller = ptr.To(true)
	proxyRef := metav1.OwnerReference{APIVersion: crawlv1.GroupVersion.String(), Kind: "Proxy", Name: "crawl-a-x", UID: "proxy-uid", Controller: ptr.To(true)}
	const addr = "203.0.113.5"
	quarantined := map[string]crawlv1.QuarantinedAddress{addr: {Address: addr}}
	cases := []struct {
		name       string
		owners     []metav1.OwnerReference
		quarantine map[string]crawlv1.QuarantinedAddress
		want       string // deleted, kept (marks intact), unmarked
	}{
		{"held, still quarantined", []metav1.OwnerReference{poolRef}, quarantined, "kept"},
		{"held, quarantine over", []metav1.OwnerReference{poolRef}, map[string]crawlv1.QuarantinedAddress{}, "deleted"},
		{"held, pool deleted", []metav1.OwnerReference{poolRef}, nil, "deleted"},
		{"orphaned by the garbage collector, pool deleted", nil, nil, "deleted"},
		{"orphaned by the garbage collector, pool running", nil, quarantined, "kept"},
		{"marked, its replica not gone yet, pool deleted", []metav1.OwnerReference{proxyRef, holdBy(pool)}, nil, "unmarked"},
		{"marked, its replica not gone yet, quarantine over", []metav1.OwnerReference{proxyRef, holdBy(pool)}, map[string]crawlv1.QuarantinedAddress{}, "unmarked"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			claim := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: "crawl-a-x-0", OwnerReferences: c.owners,
				Labels:      map[string]string{crawlv1.QuarantineHoldLabel: string(pool.UID)},
				Annotations: map[string]string{crawlv1.QuarantinedAddressAnnotation: addr}}}
			api := clientfake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(claim).Build()
			r := &ProxyPoolReconciler{Client: api, IPAM: true, Recorder: record.NewFakeRecorder(10)}
			if err := r.releaseHeldClaims(context.Background(), api, pool, c.quarantine); err != nil {
				t.Fatal(err)
			}
			got := &ipamv1.IPAddressClaim{}
			err := api.Get(context.Background(), client.ObjectKeyFromObject(claim), got)
			switch {
			case apierrors.IsNotFound(err):
				if c.want != "deleted" {
					t.Fatalf("claim deleted, want %s", c.want)
				}
			case err != nil:
				t.Fatal(err)
			case c.want == "deleted":
				t.Fatalf("claim kept (owners %v), want it deleted", got.OwnerReferences)
			case c.want == "unmarked":
				if _, ok := got.Labels[crawlv1.QuarantineHoldLabel]; ok || holdingPool(got) != nil || !metav1.IsControlledBy(got, &metav1.ObjectMeta{UID: proxyRef.UID}) {
					t.Fatalf("claim not handed back to its replica alone: labels %v, owners %v", got.Labels, got.OwnerReferences)
				}
			case got.Labels[crawlv1.QuarantineHoldLabel] != string(pool.UID):
				t.Fatalf("claim lost its hold: labels %v", got.Labels)
			}
		})
	}
}
