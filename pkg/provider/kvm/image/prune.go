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

// Prune deletes the cached images in pool that are no longer wanted and
// not in use, markers first so an image volume never outlives its marker's
// claim. keep says which digests (lower-case hex) stay: the caller passes
// every digest a live KVMImage or Proxy still names. A legacy copy (see the
// naming notes) stays only while its digest is kept and no verified shared
// copy exists.
//
// In use means that some volume of the pool names the image as its backing
// file (its XML's backingStore path). libvirt does not check this itself: it
// deletes the backing file of an overlay, even of a running domain's disk.
// A volume being uploaded by this Cache is skipped too. When the pool's
// volumes cannot all be read nothing is deleted: an image not proven unused
// stays. Deletion continues past failures; the result (names deleted, and
// digests left behind only because they are in use) comes with the joined
// errors.
func (c *Cache) Prune(ctx context.Context, lv virt.Client, pool libvirt.StoragePool, keep func(digest string) bool) (PruneResult, error) {
	var res PruneResult
	vols, _, err := lv.StoragePoolListAllVolumes(pool, 1, 0)
	if err != nil {
		return res, virtError("listing volumes of", "pool", pool, err)
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("pool", pool.Name)

	type cachedImage struct {
		vol     *libvirt.StorageVol
		markers []libvirt.StorageVol
		digest  string
		p       parsedName
	}
	images := map[string]*cachedImage{}
	var order []string
	for _, v := range vols {
		p, ours := parseName(v.Name)
		if !ours {
			continue
		}
		ci := images[p.image]
		if ci == nil {
			ci = &cachedImage{p: p}
			images[p.image] = ci
			order = append(order, p.image)
		}
		if p.marker {
			ci.markers = append(ci.markers, v)
			ci.digest = p.digest
		} else {
			ci.vol = &v
			if !p.legacy {
				ci.digest = p.digest
			}
		}
	}
	if len(images) == 0 {
		return res, nil
	}
	backing, err := backingFiles(lv, pool, vols)
	if err != nil {
		return res, err
	}

	var errs []error
	for _, name := range order {
		ci := images[name]
		drop := ci.digest == "" || !keep(ci.digest)
		if !drop && ci.p.legacy {
			shared := images[sharedPrefix+ci.digest+path.Ext(name)]
			drop = shared != nil && shared.vol != nil && len(shared.markers) > 0
		}
		if !drop {
			continue
		}
		if c.busy(pool, name) {
			log.V(1).Info("Not pruning volume being uploaded", "volume", name)
			res.inUse(ci.digest)
			continue
		}
		if ci.vol != nil {
			inUse, err := backing.uses(lv, *ci.vol)
			if err != nil {
				errs = append(errs, virtError("getting path of volume", name, pool, err))
				continue
			}
			if inUse {
				log.V(1).Info("Not pruning image volume in use as a backing file", "volume", name)
				res.inUse(ci.digest)
				continue
			}
		}
		failed := false
		for _, m := range ci.markers {
			if err := deleteVolume(lv, m); err != nil {
				errs = append(errs, virtError("pruning marker", m.Name, pool, err))
				failed = true
				continue
			}
			log.Info("Pruned image marker", "volume", m.Name)
			res.Deleted = append(res.Deleted, m.Name)
		}
		if ci.vol == nil || failed {
			continue
		}
		if err := deleteVolume(lv, *ci.vol); err != nil {
			errs = append(errs, virtError("pruning volume", name, pool, err))
			continue
		}
		log.Info("Pruned image volume", "volume", name)
		res.Deleted = append(res.Deleted, name)
	}
	return res, errors.Join(errs...)
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
