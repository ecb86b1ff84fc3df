package image

import (
	"context"
	"errors"
	"path"
	"slices"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// Prune gives up c.Holder's claim on the cached images in pool it no
// longer wants, and deletes those nobody else claims and nothing uses.
// keep says which digests (lower-case hex) stay: the caller passes every
// digest a live KVMImage or Proxy of its install still names.
//
// Only images this install claims are touched (see the naming notes):
// another install's claim, or no claim at all (a copy cached by a build
// before claims, legacy or shared, whose holders cannot be known), keeps a
// volume. An image claimed by others loses only this install's claim. When
// this install is the last holder, the image stays while some volume of the
// pool names it as its backing file (its XML's backingStore path; libvirt
// does not check this itself: it deletes the backing file of an overlay,
// even of a running domain's disk) or while this Cache uploads it;
// otherwise its marker goes first, then, unless a claim appeared meanwhile,
// the image, and the claim last, so a crash halfway leaves the claim that
// makes the next pass finish the job. The claim check after the marker is
// gone is what makes this safe against another install starting to use
// the image: it claims before it looks the marker up (Cache.Ensure).
//
// When the pool's volumes cannot all be read nothing is deleted: an image
// not proven unused stays. Deletion continues past failures; the result
// (names deleted, and digests left behind only because they are in use)
// comes with the joined errors.
func (c *Cache) Prune(ctx context.Context, lv virt.Client, pool libvirt.StoragePool, keep func(digest string) bool) (PruneResult, error) {
	var res PruneResult
	vols, _, err := lv.StoragePoolListAllVolumes(pool, 1, 0)
	if err != nil {
		return res, virtError("listing volumes of", "pool", pool, err)
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("pool", pool.Name)

	var backing *backingSet
	var errs []error
	for _, ci := range groupCached(vols, holderName(c.Holder)) {
		if !c.prunable(log, pool, ci, keep, &res) {
			continue
		}
		if len(ci.others) > 0 {
			held, err := c.releaseShared(log, lv, pool, ci, &res)
			if err != nil {
				errs = append(errs, err)
			}
			if err != nil || held {
				continue
			}
		}
		if ci.vol != nil {
			if backing == nil {
				b, err := backingFiles(lv, pool, vols)
				if err != nil {
					return res, errors.Join(append(errs, err)...)
				}
				backing = &b
			}
			inUse, err := backing.uses(lv, *ci.vol)
			if err != nil {
				errs = append(errs, virtError("getting path of volume", ci.name, pool, err))
				continue
			}
			if inUse {
				log.V(1).Info("Not pruning image volume in use as a backing file", "volume", ci.name)
				res.inUse(ci.digest)
				continue
			}
		}
		if err := c.dropLast(log, lv, pool, ci.name, ci.vol, ci.markers, &res); err != nil {
			errs = append(errs, err)
			continue
		}
		if len(ci.others) == 0 {
			if err := c.release(log, lv, pool, *ci.claim, &res); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return res, errors.Join(errs...)
}

// cachedImage is one image volume's name and the volumes that go with it.
type cachedImage struct {
	name    string // the image volume's
	vol     *libvirt.StorageVol
	markers []libvirt.StorageVol
	claim   *libvirt.StorageVol // holder's
	others  []string            // holders other than holder
	digest  string
}

// groupCached sorts the volumes of ours among vols by the image they
// belong to, in the order the images first appear; holder is this
// install's claim holder name.
func groupCached(vols []libvirt.StorageVol, holder string) []*cachedImage {
	images := map[string]*cachedImage{}
	var order []*cachedImage
	for _, v := range vols {
		p, ours := parseName(v.Name)
		if !ours {
			continue
		}
		ci := images[p.image]
		if ci == nil {
			ci = &cachedImage{name: p.image}
			images[p.image] = ci
			order = append(order, ci)
		}
		switch {
		case p.holder == holder:
			ci.claim = &v
		case p.holder != "":
			ci.others = append(ci.others, p.holder)
		case p.marker:
			ci.markers = append(ci.markers, v)
		default:
			ci.vol = &v
		}
		if p.digest != "" {
			ci.digest = p.digest
		}
	}
	return order
}

// prunable reports whether this install may let go of ci: it claims it,
// keep does not want it, and this Cache is not uploading it.
func (c *Cache) prunable(log logr.Logger, pool libvirt.StoragePool, ci *cachedImage, keep func(digest string) bool, res *PruneResult) bool {
	switch {
	case ci.claim == nil:
		if ci.vol != nil && len(ci.others) == 0 && !keep(ci.digest) {
			log.V(1).Info("Leaving unwanted image volume that no install claims: cached before claims, its holders are unknown", "volume", ci.name)
		}
		return false
	case keep(ci.digest):
		return false
	case c.busy(pool, ci.name):
		log.V(1).Info("Not pruning volume being uploaded", "volume", ci.name)
		res.inUse(ci.digest)
		return false
	}
	return true
}

// releaseShared gives up this install's claim on an image other installs
// claim too; held says whether one of them still does. Theirs now: should
// they be letting go at this very moment too, whoever looks last finds no
// claim and deletes (if a disk still uses it then, it is left unclaimed:
// kept for good).
func (c *Cache) releaseShared(log logr.Logger, lv virt.Client, pool libvirt.StoragePool, ci *cachedImage, res *PruneResult) (held bool, err error) {
	if err := c.release(log, lv, pool, *ci.claim, res); err != nil {
		return false, err
	}
	others, err := claimsOf(lv, pool, ci.name)
	if err != nil {
		return false, err
	}
	if len(others) > 0 {
		log.V(1).Info("Released image claim; other installs still hold it", "volume", ci.name, "holders", strings.Join(others, ","))
		return true, nil
	}
	return false, nil
}

// dropLast deletes an image this install was the last to hold: markers
// first, so nobody starts using it, then, when no install has claimed it
// meanwhile, the volume. An install that did claim it is left the volume
// without its marker: it marks it again if one of its overlays already
// uses it, and uploads it again otherwise (Ensure).
func (c *Cache) dropLast(log logr.Logger, lv virt.Client, pool libvirt.StoragePool, name string, vol *libvirt.StorageVol, markers []libvirt.StorageVol, res *PruneResult) error {
	for _, m := range markers {
		if err := deleteVolume(lv, m); err != nil {
			return virtError("pruning marker", m.Name, pool, err)
		}
		log.Info("Pruned image marker", "volume", m.Name)
		res.Deleted = append(res.Deleted, m.Name)
	}
	if vol == nil {
		return nil
	}
	others, err := claimsOf(lv, pool, name)
	if err != nil {
		return err
	}
	others = slices.DeleteFunc(others, func(h string) bool { return h == holderName(c.Holder) })
	if len(others) > 0 {
		log.Info("Image claimed by another install while being pruned; leaving it to that install", "volume", name, "holders", strings.Join(others, ","))
		return nil
	}
	if err := deleteVolume(lv, *vol); err != nil {
		return virtError("pruning volume", name, pool, err)
	}
	log.Info("Pruned image volume", "volume", name)
	res.Deleted = append(res.Deleted, name)
	return nil
}

// release deletes this install's claim.
func (c *Cache) release(log logr.Logger, lv virt.Client, pool libvirt.StoragePool, claim libvirt.StorageVol, res *PruneResult) error {
	if err := deleteVolume(lv, claim); err != nil {
		return virtError("releasing claim", claim.Name, pool, err)
	}
	log.V(1).Info("Released image claim", "volume", claim.Name)
	res.Deleted = append(res.Deleted, claim.Name)
	return nil
}

// PruneResult is what Prune did.
type PruneResult struct {
	// Deleted names the volumes deleted.
	Deleted []string
	// InUse lists the digests (lower-case hex) whose volumes were not
	// wanted but stay: a volume backs an overlay, or is being uploaded.
	InUse []string
}

func (r *PruneResult) inUse(digest string) {
	if digest != "" && !slices.Contains(r.InUse, digest) {
		r.InUse = append(r.InUse, digest)
	}
}

// backingSet is the backing files the volumes of one pool name.
type backingSet struct {
	paths map[string]bool // absolute
	names map[string]bool // relative paths, resolved by qemu against the overlay's directory
}

// backingFiles reads every volume's XML. A volume deleted meanwhile is
// skipped; any other failure fails the whole: one unread overlay might be
// the one that uses an image.
func backingFiles(lv virt.Client, pool libvirt.StoragePool, vols []libvirt.StorageVol) (backingSet, error) {
	b := backingSet{paths: map[string]bool{}, names: map[string]bool{}}
	for _, v := range vols {
		doc, err := lv.StorageVolGetXMLDesc(v, 0)
		if virt.IsCode(err, libvirt.ErrNoStorageVol) {
			continue
		}
		if err != nil {
			return b, virtError("reading backing store of volume", v.Name, pool, err)
		}
		var x libvirtxml.StorageVolume
		if err := x.Unmarshal(doc); err != nil {
			return b, virtError("parsing XML of volume", v.Name, pool, err)
		}
		if x.BackingStore == nil || x.BackingStore.Path == "" {
			continue
		}
		if p := x.BackingStore.Path; strings.HasPrefix(p, "/") {
			b.paths[path.Clean(p)] = true
		} else {
			b.names[path.Clean(p)] = true
		}
	}
	return b, nil
}

// uses reports whether vol is a backing file of the set.
func (b backingSet) uses(lv virt.Client, vol libvirt.StorageVol) (bool, error) {
	if b.names[vol.Name] {
		return true, nil
	}
	p, err := lv.StorageVolGetPath(vol)
	if virt.IsCode(err, libvirt.ErrNoStorageVol) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return b.paths[path.Clean(p)] || b.paths[path.Clean(vol.Key)], nil
}
