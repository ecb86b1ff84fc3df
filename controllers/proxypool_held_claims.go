package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// A quarantined static address stays out of its IPAM pool until the
// quarantine ends (docs/egress.md). Before the pool deletes a replica
// whose assigned address is quarantined, it marks the replica's claims as
// held: QuarantineHoldLabel (the pool's UID), the address, and an owner
// reference to the pool. The Proxy's deletion then hands each marked claim
// to the pool (handOverClaim) instead of deleting it, so the IPAM provider
// cannot give the address to the replacement. The pool deletes a held
// claim once its address is no longer quarantined (expired, or dropped by
// the quarantine's bound) and all of them when it is deleted. The marks
// on the claims are the state: a restarted manager finds them, and the
// garbage collector deletes a held claim with its pool should the pool's
// finalizer be bypassed.

// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;patch;delete

// assignedAddress is the address p was booted with from its IPAM claim
// ("" for none).
func assignedAddress(p *crawlv1.Proxy) string {
	prefix, err := netip.ParsePrefix(p.Status.AssignedAddress)
	if err != nil {
		return ""
	}
	return prefix.Addr().String()
}

// holdClaims marks p's claims as held by pool when p's assigned address is
// quarantined. Read live and written before p's deletion is asked for:
// the delete path must see the mark, or it releases the address.
func (r *ProxyPoolReconciler) holdClaims(ctx context.Context, pool *crawlv1.ProxyPool, quarantine map[string]crawlv1.QuarantinedAddress, p *crawlv1.Proxy) error {
	addr := assignedAddress(p)
	if _, quarantined := quarantine[addr]; !r.IPAM || addr == "" || !quarantined {
		return nil
	}
	for i := range p.Spec.AddressPools() {
		claim := &ipamv1.IPAddressClaim{}
		err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: addressClaimName(p, i)}, claim)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("read the IPAddressClaim of %s: %w", p.Name, err)
		case !metav1.IsControlledBy(claim, p) || !claim.DeletionTimestamp.IsZero() || holdingPool(claim) != nil:
			// Not the replica's to hand over, already going, or held.
			continue
		}
		orig := claim.DeepCopy()
		markHeld(claim, holdBy(pool), addr)
		if err := r.Client.Patch(ctx, claim, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("hold IPAddressClaim %s of quarantined address %s: %w", claim.Name, addr, err)
		}
		r.Recorder.Eventf(pool, "Normal", "AddressHeld", "IPAddressClaim %s of %s held while its address %s is quarantined", claim.Name, p.Name, addr)
	}
	return nil
}

// holdBy is the owner reference a held claim carries for pool.
func holdBy(pool *crawlv1.ProxyPool) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: crawlv1.GroupVersion.String(), Kind: "ProxyPool", Name: pool.Name, UID: pool.UID, BlockOwnerDeletion: ptr.To(true)}
}

// markHeld puts the marks of a hold by holder on claim for addr; the
// holder is not its controller until the replica hands it over.
func markHeld(claim *ipamv1.IPAddressClaim, holder metav1.OwnerReference, addr string) {
	metav1.SetMetaDataLabel(&claim.ObjectMeta, crawlv1.QuarantineHoldLabel, string(holder.UID))
	metav1.SetMetaDataAnnotation(&claim.ObjectMeta, crawlv1.QuarantinedAddressAnnotation, addr)
	holder.Controller = nil
	claim.OwnerReferences = append(withoutOwner(claim.OwnerReferences, holder.UID), holder)
}

// releaseHeldClaims deletes the claims pool holds whose address is not in
// quarantine (nil: every one, the pool being deleted). One still
// controlled by its replica (the quarantine ended before the replica
// went) is unmarked instead: the replica's deletion releases it. When the
// pool goes, a marked claim with no controller at all is one the garbage
// collector orphaned (propagation Orphan strips the pool's reference): it
// is deleted too, since nothing else would ever release its address.
func (r *ProxyPoolReconciler) releaseHeldClaims(ctx context.Context, reader client.Reader, pool *crawlv1.ProxyPool, quarantine map[string]crawlv1.QuarantinedAddress) error {
	if !r.IPAM {
		return nil
	}
	list := &ipamv1.IPAddressClaimList{}
	if err := reader.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingLabels{crawlv1.QuarantineHoldLabel: string(pool.UID)}); err != nil {
		return fmt.Errorf("list the IPAddressClaims held for quarantined addresses: %w", err)
	}
	var errs []error
	for i := range list.Items {
		claim := &list.Items[i]
		addr := claim.Annotations[crawlv1.QuarantinedAddressAnnotation]
		if _, quarantined := quarantine[addr]; quarantined || !claim.DeletionTimestamp.IsZero() {
			continue
		}
		orphaned := quarantine == nil && metav1.GetControllerOf(claim) == nil
		if metav1.IsControlledBy(claim, pool) || orphaned {
			if err := r.Client.Delete(ctx, claim, client.Preconditions{UID: &claim.UID}); client.IgnoreNotFound(err) != nil {
				errs = append(errs, fmt.Errorf("release held IPAddressClaim %s: %w", claim.Name, err))
				continue
			}
			r.Recorder.Eventf(pool, "Normal", "AddressReleased", "IPAddressClaim %s deleted: %s is no longer quarantined", claim.Name, addr)
			continue
		}
		orig := claim.DeepCopy()
		delete(claim.Labels, crawlv1.QuarantineHoldLabel)
		delete(claim.Annotations, crawlv1.QuarantinedAddressAnnotation)
		claim.OwnerReferences = withoutOwner(claim.OwnerReferences, pool.UID)
		if err := r.Client.Patch(ctx, claim, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("stop holding IPAddressClaim %s: %w", claim.Name, err))
		}
	}
	return errors.Join(errs...)
}

// holdingPool is the owner reference of the ProxyPool that holds claim
// for a quarantined address, nil if none does: a label without the
// pool's owner reference is no hold.
func holdingPool(claim *ipamv1.IPAddressClaim) *metav1.OwnerReference {
	uid, ok := claim.Labels[crawlv1.QuarantineHoldLabel]
	if !ok {
		return nil
	}
	i := slices.IndexFunc(claim.OwnerReferences, func(o metav1.OwnerReference) bool {
		return o.Kind == "ProxyPool" && string(o.UID) == uid && o.APIVersion == crawlv1.GroupVersion.String()
	})
	if i < 0 {
		return nil
	}
	return &claim.OwnerReferences[i]
}

// quarantiningPool is the hold of the pool that controls p and quarantines
// its assigned address (nil if there is none): a replica deleted by hand,
// or by anything but its pool, must not release a banned address either.
// Read live: the quarantine may have been written a moment ago. A pool
// being deleted holds nothing; it releases what it held.
func (r *ProxyReconciler) quarantiningPool(ctx context.Context, p *crawlv1.Proxy) (*metav1.OwnerReference, error) {
	ref, addr := metav1.GetControllerOf(p), assignedAddress(p)
	if ref == nil || ref.Kind != "ProxyPool" || ref.APIVersion != crawlv1.GroupVersion.String() || addr == "" {
		return nil, nil
	}
	pool := &crawlv1.ProxyPool{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: ref.Name}, pool); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if pool.UID != ref.UID || !pool.DeletionTimestamp.IsZero() {
		return nil, nil
	}
	now := r.Clock.Now()
	for _, q := range pool.Status.Quarantine {
		if q.Address == addr && q.ExpiresAt.After(now) {
			holder := holdBy(pool)
			return &holder, nil
		}
	}
	return nil, nil
}

// handOverClaim makes the pool that holds claim its controller in place
// of p, whose deletion would otherwise release the quarantined address
// addr.
func (r *ProxyReconciler) handOverClaim(ctx context.Context, p *crawlv1.Proxy, claim *ipamv1.IPAddressClaim, holder metav1.OwnerReference, addr string) error {
	orig := claim.DeepCopy()
	markHeld(claim, holder, addr)
	holder.Controller = ptr.To(true)
	claim.OwnerReferences = append(withoutOwner(withoutOwner(claim.OwnerReferences, p.UID), holder.UID), holder)
	if err := r.Client.Patch(ctx, claim, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("hand IPAddressClaim %s to ProxyPool %s: %w", claim.Name, holder.Name, err)
	}
	r.Recorder.Eventf(p, "Normal", "AddressHeld", "IPAddressClaim %s handed to ProxyPool %s: its address %s is quarantined",
		claim.Name, holder.Name, claim.Annotations[crawlv1.QuarantinedAddressAnnotation])
	return nil
}

func withoutOwner(refs []metav1.OwnerReference, uid types.UID) []metav1.OwnerReference {
	return slices.DeleteFunc(slices.Clone(refs), func(o metav1.OwnerReference) bool { return o.UID == uid })
}
