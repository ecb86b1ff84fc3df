// Package ipamtest is a small IPAM provider for tests: it serves Cluster
// API IPAddressClaims (ipam v1beta2) from fixed lists of addresses,
// following the provider's side of the contract as the in-cluster provider
// does, so the envtest suites and the e2e can fulfil the operator's claims
// without installing one (its module is not on the Go module proxy).
//
// For each claim on one of its pools it adds its finalizer to the claim,
// creates an IPAddress named as the claim, controlled by it, with the
// ProtectAddress finalizer and the pool's prefix and gateway, then sets
// status.addressRef and Ready. An exhausted pool leaves the claim unbound,
// Ready False with reason PoolExhausted. A deleted claim's IPAddress is
// deleted and both finalizers removed, which frees the address.
//
// The pools have no objects of their own: a claim's poolRef names them by
// PoolKind and name, so the IPAddress carries no owner reference to a pool.
package ipamtest

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// The pools' API group and kind: the in-cluster provider's, which the
// operator's admission accepts.
const (
	PoolGroup = "ipam.cluster.x-k8s.io"
	PoolKind  = "InClusterIPPool"
)

// Finalizers, as the in-cluster provider spells them.
const (
	ReleaseAddressFinalizer = "ipam.cluster.x-k8s.io/ReleaseAddress"
	ProtectAddressFinalizer = "ipam.cluster.x-k8s.io/ProtectAddress"
)

// Address is one address of a pool, with the virtual MAC a hosting
// provider would have issued for it (empty: none).
type Address struct {
	IP  string
	MAC string
}

// Pool is a fixed list of addresses with the prefix and gateway every
// IPAddress from it carries. Nothing is checked: a test may serve a bad
// gateway on purpose.
type Pool struct {
	Addresses []Address
	Prefix    int32
	Gateway   string
}

// DocumentationPool is 203.0.113.0/28 (TEST-NET-3) as a routed block on a
// bridge: gateway .1, addresses .2 to .14 in order, each with a locally
// administered virtual MAC 02:00:cb:00:71:NN (NN its last octet).
func DocumentationPool() Pool {
	p := Pool{Prefix: 28, Gateway: "203.0.113.1"}
	for i := 2; i <= 14; i++ {
		p.Addresses = append(p.Addresses, Address{IP: fmt.Sprintf("203.0.113.%d", i), MAC: fmt.Sprintf("02:00:cb:00:71:%02x", i)})
	}
	return p
}

// Ref is the pool reference a Proxy names to claim from pool name.
func Ref(name string) ipamv1.IPPoolReference {
	return ipamv1.IPPoolReference{APIGroup: PoolGroup, Kind: PoolKind, Name: name}
}

// Provider serves the claims on its Pools (by name).
type Provider struct {
	Client client.Client
	// Reader reads live: an allocation must see every address handed out
	// so far, not the cache's view of them.
	Reader client.Reader
	Pools  map[string]Pool
}

// SetupWithManager registers the provider's controller with mgr, one
// worker, so no two allocations race.
func (p *Provider) SetupWithManager(mgr ctrl.Manager) error {
	if p.Client == nil {
		p.Client = mgr.GetClient()
	}
	if p.Reader == nil {
		p.Reader = mgr.GetAPIReader()
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&ipamv1.IPAddressClaim{}).
		Owns(&ipamv1.IPAddress{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Named("ipamtest").
		Complete(p)
}

func (p *Provider) pool(ref ipamv1.IPPoolReference) (Pool, bool) {
	if ref.APIGroup != PoolGroup || ref.Kind != PoolKind {
		return Pool{}, false
	}
	pool, ok := p.Pools[ref.Name]
	return pool, ok
}

func (p *Provider) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	claim := &ipamv1.IPAddressClaim{}
	if err := p.Client.Get(ctx, req.NamespacedName, claim); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	pool, ours := p.pool(claim.Spec.PoolRef)
	if !ours {
		return ctrl.Result{}, nil // another provider's
	}
	if !claim.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, p.release(ctx, claim)
	}
	if controllerutil.AddFinalizer(claim, ReleaseAddressFinalizer) {
		if err := p.Client.Update(ctx, claim); err != nil {
			return ctrl.Result{}, err
		}
	}
	addr := &ipamv1.IPAddress{}
	err := p.Reader.Get(ctx, client.ObjectKeyFromObject(claim), addr)
	switch {
	case apierrors.IsNotFound(err):
		free, ok, err := p.free(ctx, claim.Spec.PoolRef, pool)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !ok {
			return ctrl.Result{}, p.setReady(ctx, claim, "", metav1.ConditionFalse, ipamv1.IPAddressClaimReadyPoolExhaustedReason,
				fmt.Sprintf("pool %s has no free address", claim.Spec.PoolRef.Name))
		}
		if addr, err = p.create(ctx, claim, pool, free); err != nil {
			return ctrl.Result{}, err
		}
	case err != nil:
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, p.setReady(ctx, claim, addr.Name, metav1.ConditionTrue, "Allocated", "")
}

// free is the first address of pool no IPAddress from it holds.
func (p *Provider) free(ctx context.Context, ref ipamv1.IPPoolReference, pool Pool) (Address, bool, error) {
	all := &ipamv1.IPAddressList{}
	if err := p.Reader.List(ctx, all); err != nil {
		return Address{}, false, err
	}
	var used []string
	for _, a := range all.Items {
		if a.Spec.PoolRef == ref {
			used = append(used, a.Spec.Address)
		}
	}
	for _, a := range pool.Addresses {
		if !slices.Contains(used, a.IP) {
			return a, true, nil
		}
	}
	return Address{}, false, nil
}

// create makes the claim's IPAddress: named as the claim, controlled by
// it, protected by the provider's finalizer.
func (p *Provider) create(ctx context.Context, claim *ipamv1.IPAddressClaim, pool Pool, a Address) (*ipamv1.IPAddress, error) {
	addr := &ipamv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{Namespace: claim.Namespace, Name: claim.Name, Finalizers: []string{ProtectAddressFinalizer}},
		Spec: ipamv1.IPAddressSpec{
			ClaimRef: ipamv1.IPAddressClaimReference{Name: claim.Name},
			PoolRef:  claim.Spec.PoolRef,
			Address:  a.IP,
			Prefix:   ptr.To(pool.Prefix),
			Gateway:  pool.Gateway,
		},
	}
	if a.MAC != "" {
		addr.Annotations = map[string]string{crawlv1.MACAddressAnnotation: a.MAC}
	}
	if err := controllerutil.SetControllerReference(claim, addr, p.Client.Scheme()); err != nil {
		return nil, err
	}
	if err := p.Client.Create(ctx, addr); err != nil {
		return nil, err
	}
	return addr, nil
}

// setReady writes status.addressRef and the Ready condition.
func (p *Provider) setReady(ctx context.Context, claim *ipamv1.IPAddressClaim, addressName string, status metav1.ConditionStatus, reason, msg string) error {
	orig := claim.DeepCopy()
	claim.Status.AddressRef.Name = addressName
	meta.SetStatusCondition(&claim.Status.Conditions, metav1.Condition{Type: ipamv1.IPAddressClaimReadyCondition, Status: status,
		Reason: reason, Message: msg, ObservedGeneration: claim.Generation})
	return p.Client.Status().Patch(ctx, claim, client.MergeFrom(orig))
}

// release frees a deleted claim's address: its IPAddress goes, then the
// claim's finalizer.
func (p *Provider) release(ctx context.Context, claim *ipamv1.IPAddressClaim) error {
	addr := &ipamv1.IPAddress{}
	err := p.Client.Get(ctx, client.ObjectKeyFromObject(claim), addr)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	default:
		if controllerutil.RemoveFinalizer(addr, ProtectAddressFinalizer) {
			if err := p.Client.Update(ctx, addr); err != nil {
				return client.IgnoreNotFound(err)
			}
		}
		if err := p.Client.Delete(ctx, addr); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	if controllerutil.RemoveFinalizer(claim, ReleaseAddressFinalizer) {
		return client.IgnoreNotFound(p.Client.Update(ctx, claim))
	}
	return nil
}
