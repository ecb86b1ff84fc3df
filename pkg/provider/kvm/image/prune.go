package image

import (
	"context"
	"errors"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// VolumeLister is the listing call Prune needs on top of virt.Client, with
// go-libvirt's signature (*libvirt.Libvirt has it). It is separate because
// virt.Client does not include it yet.
type VolumeLister interface {
	StoragePoolListAllVolumes(pool libvirt.StoragePool, needResults int32, flags uint32) ([]libvirt.StorageVol, uint32, error)
}

// Prune deletes the volumes Ensure made for the KVMImage imageName in pool
// under any checksum other than keepChecksum, markers first so an image
// volume never outlives its marker's claim. An empty keepChecksum deletes
// every version (the KVMImage is gone). Only names of our exact pattern are
// touched, and volumes this Cache is uploading are skipped.
//
// The caller must know no domain still uses the old versions: libvirt lets a
// volume that backs a running domain's disk be deleted.
//
// lv must also implement VolumeLister. Deletion continues past failures;
// the names deleted are returned with the joined errors.
func (c *Cache) Prune(ctx context.Context, lv virt.Client, pool libvirt.StoragePool, imageName, keepChecksum string) (deleted []string, err error) {
	comp, err := imageComponent(imageName)
	if err != nil {
		return nil, err
	}
	keep := ""
	if keepChecksum != "" {
		if keep, err = ParseChecksum(keepChecksum); err != nil {
			return nil, err
		}
	}
	lister, ok := lv.(VolumeLister)
	if !ok {
		return nil, provider.Permanentf("pruning image %s: the libvirt client cannot list volumes", imageName)
	}
	vols, _, err := lister.StoragePoolListAllVolumes(pool, 1, 0)
	if err != nil {
		return nil, virtError("listing volumes of image", imageName, pool, err)
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("image", imageName, "pool", pool.Name)

	var markers, images []libvirt.StorageVol
	for _, v := range vols {
		p, ours := parseName(v.Name, comp)
		switch {
		case !ours:
		case p.marker && p.digest != keep:
			markers = append(markers, v)
		case !p.marker && (keep == "" || p.short != keep[:shortDigestLen]):
			images = append(images, v)
		}
	}
	var errs []error
	for _, v := range append(markers, images...) {
		if c.busy(pool, imageVolumeOf(v.Name)) {
			log.V(1).Info("Not pruning volume being uploaded", "volume", v.Name)
			continue
		}
		if err := deleteVolume(lv, v); err != nil {
			errs = append(errs, virtError("pruning volume", v.Name, pool, err))
			continue
		}
		log.Info("Pruned image volume", "volume", v.Name)
		deleted = append(deleted, v.Name)
	}
	return deleted, errors.Join(errs...)
}

// imageVolumeOf returns the image volume a name of ours belongs to: the
// name itself, or for a marker the name without its digest and suffix.
func imageVolumeOf(name string) string {
	if base, ok := strings.CutSuffix(name, markerSuffix); ok {
		if i := strings.LastIndexByte(base, '.'); i >= 0 {
			return base[:i]
		}
	}
	return name
}
