package controllers

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// measure records egress as the Proxy controller would for each named
// replica (source echo).
func (u *poolUnit) measure(egress map[string]string) {
	u.t.Helper()
	for _, p := range u.replicas() {
		a, ok := egress[p.Name]
		if !ok {
			continue
		}
		p.Status.EgressAddress, p.Status.EgressSource = a, crawlv1.EgressSourceEcho
		p.Status.EgressMeasuredAt = &metav1.Time{Time: u.clock.Now()}
		if err := u.c.Client.Status().Update(context.Background(), &p); err != nil {
			u.t.Fatal(err)
		}
	}
}

func bridged(h *crawlv1.KVMHost) { h.Spec.NetworkMode = crawlv1.NetworkModeBridge }

func egressCondition(t *testing.T, pool *crawlv1.ProxyPool) *metav1.Condition {
	t.Helper()
	c := conditions.Get(pool, crawlv1.PoolEgressDistinctCondition)
	if c == nil {
		t.Fatal("no EgressDistinct condition")
	}
	return c
}

// TestPoolEgressRequiredOnANATHost: libvirt's NAT gives every VM on a host
// the host's address, so Required places one replica there and reports,
// rather than create replicas it would refuse.
func TestPoolEgressRequiredOnANATHost(t *testing.T) {
	u := newPoolUnit(t, 3, func(p *crawlv1.ProxyPool) { p.Spec.Egress.Distinct = crawlv1.EgressDistinctRequired })
	u.reconcile()
	if n := len(u.replicas()); n != 1 {
		t.Fatalf("%d replicas on the one NAT host, want 1", n)
	}
	pool := u.getPool()
	pb := conditions.Get(pool, crawlv1.PoolPlacementBlockedCondition)
	if pb == nil || pb.Status != metav1.ConditionTrue || pb.Reason != crawlv1.PoolNoDistinctEgressReason || !strings.Contains(pb.Message, "hv1 (NAT, replica p-") {
		t.Fatalf("PlacementBlocked %+v, want True NoDistinctEgress naming hv1 (NAT)", pb)
	}
	if c := egressCondition(t, pool); c.Status != metav1.ConditionFalse || c.Reason != crawlv1.PoolNoDistinctEgressReason || !strings.Contains(c.Message, "spec.egress.distinct Required") {
		t.Fatalf("EgressDistinct %+v, want False NoDistinctEgress", c)
	}

	// Preferred places all three there (nowhere else to go) and counts one.
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Egress.Distinct = crawlv1.EgressDistinctPreferred })
	u.reconcile()
	if n := len(u.replicas()); n != 3 {
		t.Fatalf("%d replicas with Preferred, want 3", n)
	}
	u.readyAll(time.Hour)
	egress := map[string]string{}
	for _, p := range u.replicas() {
		egress[p.Name] = "203.0.113.9"
	}
	u.measure(egress)
	u.reconcile()
	pool = u.getPool()
	if pool.Status.DistinctEgressAddresses != 1 || pool.Status.AvailableReplicas != 3 {
		t.Fatalf("distinct %d, available %d; want 1, 3", pool.Status.DistinctEgressAddresses, pool.Status.AvailableReplicas)
	}
	c := egressCondition(t, pool)
	if c.Status != metav1.ConditionFalse || c.Reason != crawlv1.PoolEgressSharedReason || !strings.Contains(c.Message, "3 replicas share 203.0.113.9 on host hv1 (NAT)") {
		t.Fatalf("EgressDistinct %+v, want False: 3 replicas share 203.0.113.9 on host hv1 (NAT)", c)
	}
	if last := u.pubs[len(u.pubs)-1]; len(last) != 3 {
		t.Fatalf("published %v, want all three with Preferred", last)
	}
}

// TestPoolEgressRequiredReplacesASharedReplica: on bridges, two replicas
// that measured one address: the newer is unpublished and not available,
// and replaced within maxSurge onto a host not already giving that
// address; once the replacement is available it goes.
func TestPoolEgressRequiredReplacesASharedReplica(t *testing.T) {
	u := newPoolUnit(t, 2, func(p *crawlv1.ProxyPool) {
		p.Spec.Egress.Distinct = crawlv1.EgressDistinctRequired
		p.Spec.Template.Spec.Placement = crawlv1.ProxyPlacement{Image: "debian"}
		p.Spec.Placement.HostSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"role": "proxy"}}
	})
	// hv1 (the harness's) is NAT and outside nothing: make the fleet bridges.
	hv1 := &crawlv1.KVMHost{}
	if err := u.c.Client.Get(context.Background(), client.ObjectKey{Name: "hv1"}, hv1); err != nil {
		t.Fatal(err)
	}
	bridged(hv1)
	if err := u.c.Client.Update(context.Background(), hv1); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"hv2", "hv3"} {
		if err := u.c.Client.Create(context.Background(), sizedHost(h, 64*giB, bridged)); err != nil {
			t.Fatal(err)
		}
	}
	u.reconcile()
	rs := u.replicas()
	if len(rs) != 2 {
		t.Fatalf("%d replicas, want 2", len(rs))
	}
	u.readyAll(time.Hour)
	rs = u.replicas()
	// The older (by creation, then name) keeps the address.
	older, newer := rs[0], rs[1]
	if newer.CreationTimestamp.Before(&older.CreationTimestamp) || (newer.CreationTimestamp.Equal(&older.CreationTimestamp) && newer.Name < older.Name) {
		older, newer = newer, older
	}
	// Both on one host, as a router's NAT behind it would show.
	for _, p := range []*crawlv1.Proxy{&older, &newer} {
		p.Spec.Placement.Host = "hv1"
		if err := u.c.Client.Update(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	u.measure(map[string]string{older.Name: "198.51.100.7", newer.Name: "198.51.100.7"})
	u.reconcile()

	pool := u.getPool()
	if last := u.pubs[len(u.pubs)-1]; !slices.Equal(last, []string{older.Name}) {
		t.Fatalf("published %v, want only the older %s", last, older.Name)
	}
	if pool.Status.AvailableReplicas != 1 || pool.Status.DistinctEgressAddresses != 1 {
		t.Fatalf("available %d, distinct %d; want 1, 1", pool.Status.AvailableReplicas, pool.Status.DistinctEgressAddresses)
	}
	c := egressCondition(t, pool)
	if c.Status != metav1.ConditionFalse || c.Reason != crawlv1.PoolEgressSharedReason ||
		!strings.Contains(c.Message, "2 replicas share 198.51.100.7 on host hv1") || !strings.Contains(c.Message, "being replaced") {
		t.Fatalf("EgressDistinct %+v, want False: 2 replicas share 198.51.100.7 on host hv1, being replaced", c)
	}
	rs = u.replicas()
	if len(rs) != 3 {
		t.Fatalf("%d replicas, want a replacement (3)", len(rs))
	}
	var repl crawlv1.Proxy
	for _, p := range rs {
		if p.Name != older.Name && p.Name != newer.Name {
			repl = p
		}
	}
	if repl.Spec.Placement.Host == "hv1" {
		t.Fatalf("replacement placed on hv1, which already gives 198.51.100.7 twice")
	}

	// The replacement serves from a new address: the shared one goes.
	u.readyAll(time.Hour)
	u.measure(map[string]string{repl.Name: "198.51.100.8"})
	u.reconcile()
	pool = u.getPool()
	if pool.Status.DistinctEgressAddresses != 2 || pool.Status.AvailableReplicas != 2 {
		t.Fatalf("distinct %d, available %d; want 2, 2", pool.Status.DistinctEgressAddresses, pool.Status.AvailableReplicas)
	}
	drained := false
	for _, p := range u.replicas() {
		if _, ok := p.Annotations[crawlv1.DrainingAnnotation]; ok && p.Name == newer.Name {
			drained = true
		} else if ok || p.DeletionTimestamp != nil {
			t.Fatalf("%s drained or deleted, want only %s", p.Name, newer.Name)
		}
	}
	gone := true
	for _, p := range u.replicas() {
		if p.Name == newer.Name {
			gone = false
		}
	}
	if !drained && !gone {
		t.Fatalf("the shared replica %s neither drained nor deleted", newer.Name)
	}
	if c := egressCondition(t, u.getPool()); c.Status != metav1.ConditionTrue && !gone {
		// It still shares until it is gone; the condition says so.
		if !strings.Contains(c.Message, "198.51.100.7") {
			t.Fatalf("EgressDistinct %+v", c)
		}
	}
}

// TestPoolEgressIgnore: Ignore is True with reason Ignored, and still
// counts the measured addresses; unmeasured ones are not counted.
func TestPoolEgressIgnore(t *testing.T) {
	u := newPoolUnit(t, 2, func(p *crawlv1.ProxyPool) { p.Spec.Egress.Distinct = crawlv1.EgressDistinctIgnore })
	u.reconcile()
	u.readyAll(time.Hour)
	rs := u.replicas()
	u.measure(map[string]string{rs[0].Name: "203.0.113.1"})
	// An address without a measured source is not counted.
	p := u.replicas()[1]
	p.Status.EgressAddress, p.Status.EgressSource = "192.168.122.5", crawlv1.EgressSourceUnknown
	if err := u.c.Client.Status().Update(context.Background(), &p); err != nil {
		t.Fatal(err)
	}
	u.reconcile()
	pool := u.getPool()
	if c := egressCondition(t, pool); c.Status != metav1.ConditionTrue || c.Reason != crawlv1.PoolEgressIgnoredReason {
		t.Fatalf("EgressDistinct %+v, want True Ignored", c)
	}
	if pool.Status.DistinctEgressAddresses != 1 || len(u.replicas()) != 2 {
		t.Fatalf("distinct %d, %d replicas; want 1 (measured only), 2", pool.Status.DistinctEgressAddresses, len(u.replicas()))
	}
}

func TestPublishedProxyCarriesMeasuredEgressOnly(t *testing.T) {
	pool := &crawlv1.ProxyPool{}
	for _, tc := range []struct {
		source     crawlv1.EgressSource
		wantAddr   string
		wantSource crawlv1.EgressSource
	}{
		{crawlv1.EgressSourceEcho, "203.0.113.1", crawlv1.EgressSourceEcho},
		{crawlv1.EgressSourceStatic, "203.0.113.1", crawlv1.EgressSourceStatic},
		{crawlv1.EgressSourceUnknown, "", ""},
		{"", "", ""},
	} {
		p := &crawlv1.Proxy{Status: crawlv1.ProxyStatus{EgressAddress: "203.0.113.1", EgressSource: tc.source}}
		e := publishedProxy(pool, p, "http://192.0.2.1:3128")
		if e.EgressAddress != tc.wantAddr || e.EgressSource != tc.wantSource {
			t.Errorf("source %q: entry egress %q (%q), want %q (%q)", tc.source, e.EgressAddress, e.EgressSource, tc.wantAddr, tc.wantSource)
		}
	}
}
