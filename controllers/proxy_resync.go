package controllers

import (
	"context"
	"net"
	"strconv"
	"time"

	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
)

// bootingResync bounds how long a booting Proxy with an address is only
// probed between reads of its instance. Its address seldom changes once
// leased, and a provider event (lifecycle, guest agent connected) or its
// port opening wakes it at once; the read catches what comes without one.
const bootingResync = 30 * time.Second

// reconcileResync decides whether this reconcile reads the instance or
// only probes the proxy (s.probeOnly). A proxy whose instance was read
// recently and has had no event since only needs its proxy probed (fast):
// a Ready one until ResyncInterval; a booting one, whose port is all that
// is missing, until bootingResync, or ResyncInterval once its port has
// just accepted at its recorded address (which says the instance runs
// there). Reading it asks the guest agent, which a booting TCG guest
// answers in up to 2 s, and the reconcile woken by the port opening waits
// behind it.
func (r *ProxyReconciler) reconcileResync(_ context.Context, s *proxyScope) (ctrl.Result, error) {
	p := s.proxy
	// Only an address the provider will not replace counts: a read would
	// still change its source.
	provisioned := conditions.IsTrue(p, crawlv1.InstanceProvisionedCondition) && p.Status.Address != "" && settledAddress(p)
	var readWithin time.Duration
	switch portOpened := r.portJustOpened(s); {
	case conditions.IsTrue(p, crawlv1.ReadyCondition), provisioned && portOpened:
		readWithin = r.ResyncInterval
	case provisioned && (booting(p) || r.mem.inProbeBackoff(s.key)):
		readWithin = min(bootingResync, r.ResyncInterval)
	}
	s.probeOnly = readWithin > 0 && r.mem.readWithin(s.key, readWithin, r.Clock.Now())
	return ctrl.Result{}, nil
}

// settledAddress: p's address came from a source the provider will not
// replace with a better one. kvm prefers the DHCP lease, which can appear
// after the guest agent has reported the same address (or ARP seen it).
func settledAddress(p *crawlv1.Proxy) bool {
	return p.Status.AddressSource != provider.AddressSourceAgent && p.Status.AddressSource != provider.AddressSourceARP
}

// portJustOpened takes the port watch's report for the Proxy: whether its
// port accepted, since its last reconcile, at the address and port in its
// status now (a report about an address since replaced says nothing).
func (r *ProxyReconciler) portJustOpened(s *proxyScope) bool {
	p := s.proxy
	address, ok := r.mem.takePortOpened(s.key)
	return ok && p.Status.Address != "" && address == net.JoinHostPort(p.Status.Address, strconv.Itoa(int(p.Spec.Port)))
}
