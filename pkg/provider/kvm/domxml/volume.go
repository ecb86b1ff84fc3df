package domxml

import (
	"strings"

	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// Volume formats.
const (
	FormatQCOW2 = "qcow2"
	FormatRaw   = "raw"
)

// OverlayVolume returns the XML of a qcow2 volume backed by backingPath, the
// VM's copy-on-write root disk. capacityBytes is the guest's disk size and
// should be at least the backing image's virtual size. The backing format is
// recorded in the overlay's header: libvirt (>= 6.0) and QEMU refuse to probe
// it, and virt-aa-helper follows the chain to grant access.
func OverlayVolume(name string, capacityBytes int64, backingPath, backingFormat string) (string, error) {
	if capacityBytes <= 0 {
		return "", provider.Permanentf("volume %q: capacity %d: want > 0", name, capacityBytes)
	}
	if !strings.HasPrefix(backingPath, "/") {
		return "", provider.Permanentf("volume %q: backing path %q is not absolute", name, backingPath)
	}
	if err := validFormat(name, backingFormat); err != nil {
		return "", err
	}
	return volume(name, capacityBytes, FormatQCOW2, &libvirtxml.StorageVolumeBackingStore{
		Path:   backingPath,
		Format: &libvirtxml.StorageVolumeTargetFormat{Type: backingFormat},
	})
}

// ImageVolume returns the XML of a volume of the given format (qcow2 or raw)
// to upload a file of capacityBytes into, e.g. a cached cloud image: the
// upload overwrites the whole file, so the volume's own header does not
// matter, only that libvirt records the right format.
func ImageVolume(name string, capacityBytes int64, format string) (string, error) {
	if capacityBytes < 0 {
		return "", provider.Permanentf("volume %q: capacity %d: want >= 0", name, capacityBytes)
	}
	if err := validFormat(name, format); err != nil {
		return "", err
	}
	return volume(name, capacityBytes, format, nil)
}

// RawVolume returns the XML of a raw volume: the seed ISO (capacity = ISO
// size, then uploaded) or an empty marker (capacity 0).
func RawVolume(name string, capacityBytes int64) (string, error) {
	return ImageVolume(name, capacityBytes, FormatRaw)
}

func volume(name string, capacityBytes int64, format string, backing *libvirtxml.StorageVolumeBackingStore) (string, error) {
	if err := validVolumeName(name); err != nil {
		return "", err
	}
	vol := &libvirtxml.StorageVolume{
		Name:         name,
		Capacity:     &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: uint64(capacityBytes)},
		Target:       &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: format}},
		BackingStore: backing,
	}
	s, err := vol.Marshal()
	if err != nil {
		return "", provider.Permanentf("volume %q: encoding XML: %w", name, err)
	}
	return s, nil
}

func validFormat(name, format string) error {
	if format != FormatQCOW2 && format != FormatRaw {
		return provider.Permanentf("volume %q: format %q: want %s or %s", name, format, FormatQCOW2, FormatRaw)
	}
	return nil
}
