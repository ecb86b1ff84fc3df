package controllers

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// The Proxy's side of the Cluster API IPAM contract
// (docs/static-addresses.md): a Proxy naming a pool in
// spec.network.addressesFromPools gets one IPAddressClaim, named after it
// and controlled by it (blockOwnerDeletion, so clusterctl move and the
// garbage collector see the tie), before anything is created; the instance
// boots only once the claim is bound to a valid IPAddress no other Proxy
// holds. On deletion the instance goes first, then the claim, and the
// finalizer only once the claim is gone, so an address is never handed to
// another Proxy while a VM may still use it, and never leaked.

// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddresses,verbs=get;list;watch

// ServesIPAM reports whether the cluster serves Cluster API's
// IPAddressClaim in the version the operator writes (ipam v1beta2) and
// the manager's scheme knows it. Without it the Proxy controller does not
// watch claims, and Proxies naming a pool say IPAMNotInstalled.
func ServesIPAM(mgr ctrl.Manager) (bool, error) {
	gvk := ipamv1.GroupVersion.WithKind("IPAddressClaim")
	if !mgr.GetScheme().Recognizes(gvk) {
		return false, nil
	}
	_, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: gvk.Group, Kind: gvk.Kind}, gvk.Version)
	switch {
	case meta.IsNoMatchError(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("look up %s: %w", gvk, err)
	}
	return true, nil
}

// addressClaimName is the name of the claim for p's i-th pool: derived
// from the Proxy's, as the contract asks, so a restart finds it again.
func addressClaimName(p *crawlv1.Proxy, i int) string {
	return p.Name + "-" + strconv.Itoa(i)
}

// poolName is a pool reference for messages: Kind/name (group).
func poolName(ref ipamv1.IPPoolReference) string {
	return fmt.Sprintf("%s/%s (%s)", ref.Kind, ref.Name, ref.APIGroup)
}

// reconcileStaticAddress gives the Machine the address of p's IPAM claim:
// the claim is made, waited for, its IPAddress checked and held against
// every other Proxy. A Proxy naming no pool passes.
func (r *ProxyReconciler) reconcileStaticAddress(ctx context.Context, s *proxyScope) (ctrl.Result, error) {
	p := s.proxy
	pools := p.Spec.AddressPools()
	if len(pools) == 0 {
		return ctrl.Result{}, nil
	}
	if pl := r.Plugins.Get(string(p.Spec.Provider)); pl == nil || !plugin.TakesStaticAddresses(pl) {
		return r.fail(p, crawlv1.ProxySpecRefusedReason, provider.Permanentf("spec.network.addressesFromPools: provider %s cannot boot an instance with a static address from an IPAM pool", p.Spec.Provider))
	}
	if len(pools) > 1 {
		return r.fail(p, crawlv1.ProxySpecRefusedReason, provider.Permanentf("spec.network.addressesFromPools: %d pools, at most 1 (one NIC, single-stack claims)", len(pools)))
	}
	if !r.IPAM {
		r.setNotProvisioned(p, crawlv1.ProxyIPAMNotInstalledReason, fmt.Sprintf(
			"spec.network.addressesFromPools names %s, and the cluster serves no %s IPAddressClaim: install an IPAM provider (clusterctl init --ipam in-cluster), then restart the manager",
			poolName(pools[0]), ipamv1.GroupVersion))
		return ctrl.Result{RequeueAfter: r.ResyncInterval}, nil
	}
	ref := pools[0]
	claim, wait, err := r.ensureAddressClaim(ctx, p, addressClaimName(p, 0), ref)
	if wait != nil || err != nil {
		return r.stopFor(p, wait, err)
	}
	addr, wait, err := r.boundAddress(ctx, claim, ref)
	if wait != nil || err != nil {
		return r.stopFor(p, wait, err)
	}
	sn, err := staticNetworkOf(addr)
	if err != nil {
		return r.fail(p, crawlv1.ProxyPermanentErrorReason, err)
	}
	if wait, err := r.holdAddress(ctx, p, sn.Address); wait != nil || err != nil {
		return r.stopFor(p, wait, err)
	}
	s.machine.StaticNetwork = sn
	return ctrl.Result{}, nil
}

// ensureAddressClaim returns p's claim on ref, creating it when missing.
// A claim of that name that is not p's, or claims another pool, is never
// used: it is a permanent error naming it.
func (r *ProxyReconciler) ensureAddressClaim(ctx context.Context, p *crawlv1.Proxy, name string, ref ipamv1.IPPoolReference) (*ipamv1.IPAddressClaim, *waitFor, error) {
	claim := &ipamv1.IPAddressClaim{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: name}, claim)
	switch {
	case apierrors.IsNotFound(err):
		return nil, r.createAddressClaim(ctx, p, name, ref), nil
	case err != nil:
		return nil, nil, provider.Transient(err)
	case !metav1.IsControlledBy(claim, p):
		return nil, nil, provider.Permanentf("IPAddressClaim %s exists and is not this Proxy's (no controller reference to it); delete or rename it", name)
	case claim.Spec.PoolRef != ref:
		return nil, nil, provider.Permanentf("IPAddressClaim %s claims from %s, not from spec.network.addressesFromPools[0] %s", name, poolName(claim.Spec.PoolRef), poolName(ref))
	case !claim.DeletionTimestamp.IsZero():
		return nil, &waitFor{reason: crawlv1.ProxyWaitingForIPAddressReason, message: fmt.Sprintf("IPAddressClaim %s is being deleted; a new one follows", name), after: dependencyPoll}, nil
	}
	return claim, nil, nil
}

// createAddressClaim creates p's claim on ref, controlled by p, and waits
// for it to be bound (the claim's watch wakes the Proxy). Already there is
// no error: a reconcile that read a stale cache comes back to it.
// spec.clusterName stays empty: the in-cluster provider looks up a Cluster
// of that name and never serves the claim when there is none.
func (r *ProxyReconciler) createAddressClaim(ctx context.Context, p *crawlv1.Proxy, name string, ref ipamv1.IPPoolReference) *waitFor {
	claim := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: name},
		Spec:       ipamv1.IPAddressClaimSpec{PoolRef: ref},
	}
	// SetControllerReference sets blockOwnerDeletion, as the contract asks.
	if err := controllerutil.SetControllerReference(p, claim, r.Client.Scheme()); err != nil {
		return &waitFor{reason: crawlv1.ProxyTransientErrorReason, message: err.Error(), after: dependencyPoll}
	}
	msg := fmt.Sprintf("created IPAddressClaim %s on pool %s; waiting for it to be bound", name, poolName(ref))
	if err := r.Client.Create(ctx, claim); err != nil && !apierrors.IsAlreadyExists(err) {
		msg = fmt.Sprintf("creating IPAddressClaim %s on pool %s: %v", name, poolName(ref), err)
	} else if err == nil {
		r.Recorder.Eventf(p, "Normal", "AddressClaimed", "IPAddressClaim %s created on pool %s", name, poolName(ref))
	}
	return &waitFor{reason: crawlv1.ProxyWaitingForIPAddressReason, message: msg, after: dependencyPoll}
}

// boundAddress returns the IPAddress claim is bound to. While it is not
// bound the Proxy waits, naming the pool and what the claim's Ready
// condition says (e.g. PoolExhausted); the in-cluster provider sets none,
// so its absence says nothing. An address that is not the claim's, or
// from another pool, is never used.
func (r *ProxyReconciler) boundAddress(ctx context.Context, claim *ipamv1.IPAddressClaim, ref ipamv1.IPPoolReference) (*ipamv1.IPAddress, *waitFor, error) {
	if claim.Status.AddressRef.Name == "" {
		msg := fmt.Sprintf("IPAddressClaim %s is not bound yet by pool %s", claim.Name, poolName(ref))
		if c := meta.FindStatusCondition(claim.Status.Conditions, ipamv1.IPAddressClaimReadyCondition); c != nil && c.Status != metav1.ConditionTrue {
			msg += fmt.Sprintf(": %s", c.Reason)
			if c.Message != "" {
				msg += ": " + c.Message
			}
		}
		return nil, &waitFor{reason: crawlv1.ProxyWaitingForIPAddressReason, message: msg, after: dependencyPoll}, nil
	}
	addr := &ipamv1.IPAddress{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Status.AddressRef.Name}, addr)
	switch {
	case apierrors.IsNotFound(err):
		return nil, &waitFor{reason: crawlv1.ProxyWaitingForIPAddressReason,
			message: fmt.Sprintf("IPAddressClaim %s is bound to IPAddress %s, which does not exist (yet)", claim.Name, claim.Status.AddressRef.Name), after: dependencyPoll}, nil
	case err != nil:
		return nil, nil, provider.Transient(err)
	case addr.Spec.ClaimRef.Name != claim.Name:
		return nil, nil, provider.Permanentf("IPAddress %s spec.claimRef names %q, not IPAddressClaim %s", addr.Name, addr.Spec.ClaimRef.Name, claim.Name)
	case addr.Spec.PoolRef != ref:
		return nil, nil, provider.Permanentf("IPAddress %s spec.poolRef is %s, not the claim's pool %s", addr.Name, poolName(addr.Spec.PoolRef), poolName(ref))
	}
	return addr, nil, nil
}

// staticNetworkOf checks an IPAddress and turns it into the Machine's
// static network. What Cluster API's own webhook does not check (and
// envtest, or a cluster without it, does not run) is checked here: the
// address and gateway parse, the prefix fits the family, the gateway is
// another address inside the prefix, the MAC annotation is a 48-bit MAC.
// Each error is permanent and names the field.
func staticNetworkOf(a *ipamv1.IPAddress) (*provider.StaticNetwork, error) {
	bad := func(field string, value any, why string) error {
		return provider.Permanentf("IPAddress %s %s %q: %s", a.Name, field, fmt.Sprint(value), why)
	}
	ip, err := netip.ParseAddr(a.Spec.Address)
	if err != nil || ip.Zone() != "" {
		return nil, bad("spec.address", a.Spec.Address, "not an IP address")
	}
	ip = ip.Unmap()
	if a.Spec.Prefix == nil {
		return nil, provider.Permanentf("IPAddress %s spec.prefix: missing", a.Name)
	}
	prefix, err := ip.Prefix(int(*a.Spec.Prefix))
	if err != nil || *a.Spec.Prefix < 0 {
		return nil, bad("spec.prefix", *a.Spec.Prefix, fmt.Sprintf("not a prefix length of %s (at most %d)", ip, ip.BitLen()))
	}
	sn := &provider.StaticNetwork{Address: netip.PrefixFrom(ip, prefix.Bits())}
	if a.Spec.Gateway != "" {
		gw, err := netip.ParseAddr(a.Spec.Gateway)
		switch {
		case err != nil || gw.Zone() != "":
			return nil, bad("spec.gateway", a.Spec.Gateway, "not an IP address")
		case gw.Unmap().Is4() != ip.Is4():
			return nil, bad("spec.gateway", a.Spec.Gateway, fmt.Sprintf("not of the family of spec.address %s", ip))
		case !prefix.Contains(gw.Unmap()):
			return nil, bad("spec.gateway", a.Spec.Gateway, fmt.Sprintf("outside %s (spec.address/spec.prefix)", prefix))
		case gw.Unmap() == ip:
			return nil, bad("spec.gateway", a.Spec.Gateway, "is spec.address itself")
		}
		sn.Gateway = gw.Unmap()
	}
	if mac, ok := a.Annotations[crawlv1.MACAddressAnnotation]; ok {
		hw, err := net.ParseMAC(mac)
		if err != nil || len(hw) != 6 {
			return nil, bad("annotation "+crawlv1.MACAddressAnnotation, mac, "not a 48-bit MAC address")
		}
		if hw[0]&1 == 1 {
			return nil, bad("annotation "+crawlv1.MACAddressAnnotation, mac, "a multicast MAC cannot be a NIC's")
		}
		sn.MAC = hw.String()
	}
	return sn, nil
}

// holdAddress records addr as p's in status.assignedAddress unless another
// Proxy holds it. The check and the record are one step under addressMu,
// on a live list of every Proxy (not the cache, which may not have seen
// the last record yet): the leader is the only manager writing records, so
// two Proxies never record, and so never boot with, one address. The
// record is written at once, conditional on p's resourceVersion.
func (r *ProxyReconciler) holdAddress(ctx context.Context, p *crawlv1.Proxy, addr netip.Prefix) (*waitFor, error) {
	want := addr.String()
	if p.Status.AssignedAddress == want {
		return nil, nil
	}
	if p.Status.AssignedAddress != "" && p.Status.ProviderID != "" {
		// The claim was replaced (deleted by hand) and the new one got
		// another address; the instance still has the old one.
		return nil, provider.Permanentf("the IPAddressClaim now gives %s, and instance %s was booted with %s; delete the Proxy to boot one with the new address",
			want, p.Status.ProviderID, p.Status.AssignedAddress)
	}
	r.addressMu.Lock()
	defer r.addressMu.Unlock()
	all := &crawlv1.ProxyList{}
	if err := r.APIReader.List(ctx, all); err != nil {
		return nil, provider.Transient(err)
	}
	for i := range all.Items {
		o := &all.Items[i]
		if o.UID == p.UID || o.Status.AssignedAddress == "" {
			continue
		}
		if held, err := netip.ParsePrefix(o.Status.AssignedAddress); err == nil && held.Addr() == addr.Addr() {
			return &waitFor{reason: crawlv1.ProxyAddressInUseReason,
				message: fmt.Sprintf("the claimed address %s is held by Proxy %s/%s; nothing is booted with it until that Proxy lets it go", addr.Addr(), o.Namespace, o.Name),
				after:   dependencyPoll}, nil
		}
	}
	orig := p.DeepCopy()
	p.Status.AssignedAddress = want
	if err := r.Client.Status().Patch(ctx, p, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		p.Status.AssignedAddress = orig.Status.AssignedAddress
		return nil, provider.Transientf("record assigned address %s: %w", want, err)
	}
	return nil, nil
}

// reconcileStaticEgress: an instance booted with a static address on a
// bridge (the provider refuses any other network) sends from that address,
// so it is the egress, by construction.
func (r *ProxyReconciler) reconcileStaticEgress(_ context.Context, s *proxyScope) (ctrl.Result, error) {
	p := s.proxy
	if s.machine == nil || s.machine.StaticNetwork == nil || p.Status.ProviderID == "" {
		return ctrl.Result{}, nil
	}
	p.Status.EgressAddress = s.machine.StaticNetwork.Address.Addr().String()
	p.Status.EgressSource = crawlv1.EgressSourceStatic
	return ctrl.Result{}, nil
}

// releaseAddressClaims deletes p's claims once its instance is gone and
// reports whether they are all gone; one a pool holds for a quarantined
// address is handed to the pool instead. The IPAM provider deletes the
// IPAddress and lets the claim go; until then the finalizer stays, so the
// address is not handed out while the claim still holds it. Nothing to do
// when the cluster serves no claims.
func (r *ProxyReconciler) releaseAddressClaims(ctx context.Context, p *crawlv1.Proxy) (bool, error) {
	if !r.IPAM {
		return true, nil
	}
	gone := true
	for i := range p.Spec.AddressPools() {
		claim := &ipamv1.IPAddressClaim{}
		key := client.ObjectKey{Namespace: p.Namespace, Name: addressClaimName(p, i)}
		// The live read: a claim the cache has not seen yet (created just
		// before the deletion) must not be missed.
		err := r.APIReader.Get(ctx, key, claim)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return false, provider.Transient(err)
		case !metav1.IsControlledBy(claim, p):
			continue // not ours: never deleted
		}
		if claim.DeletionTimestamp.IsZero() {
			// Its address is quarantined: the pool keeps it out of the
			// IPAM pool (proxypool_held_claims.go), whether the pool
			// marked it before deleting p or p was deleted otherwise.
			addr, holder := claim.Annotations[crawlv1.QuarantinedAddressAnnotation], holdingPool(claim)
			if holder == nil {
				if holder, err = r.quarantiningPool(ctx, p); err != nil {
					return false, provider.Transient(err)
				}
				addr = assignedAddress(p)
			}
			if holder != nil {
				if err := r.handOverClaim(ctx, p, claim, *holder, addr); err != nil {
					return false, provider.Transient(err)
				}
				continue
			}
		}
		gone = false
		if claim.DeletionTimestamp.IsZero() {
			if err := r.Client.Delete(ctx, claim, client.Preconditions{UID: &claim.UID}); err != nil && !apierrors.IsNotFound(err) {
				return false, provider.Transient(err)
			}
			r.Recorder.Eventf(p, "Normal", "AddressReleased", "IPAddressClaim %s deleted", claim.Name)
		}
	}
	return gone, nil
}

// claimReleasePoll is how often a deleting Proxy looks at claims its IPAM
// provider has not let go yet; their deletion also wakes it (Owns).
const claimReleasePoll = 5 * time.Second
