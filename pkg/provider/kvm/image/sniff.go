package image

import (
	"bytes"
	"encoding/binary"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// sniffLen is how much of the stream is inspected before a volume is made:
// a qcow2 version 3 header up to header_length.
const sniffLen = 104

var qcow2Magic = []byte{'Q', 'F', 'I', 0xfb}

// compressed lists containers that are sometimes published as "images" but
// which neither format can boot without unpacking first.
var compressed = []struct {
	name  string
	magic []byte
}{
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
	{"gzip", []byte{0x1f, 0x8b}},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}},
	{"bzip2", []byte("BZh")},
}

// qcow2 header fields used here (all big-endian), see qemu docs/interop/qcow2.txt.
const (
	qcowVersionOff        = 4
	qcowBackingOffsetOff  = 8
	qcowClusterBitsOff    = 20
	qcowSizeOff           = 24
	qcowCryptMethodOff    = 32
	qcowV2HeaderLen       = 72
	qcowIncompatOff       = 72
	qcowIncompatCorrupt   = 1 << 1
	qcowIncompatDataFile  = 1 << 2
	qcowMinClusterBits    = 9
	qcowMaxClusterBits    = 21
	qcowIncompatKnownMask = 1<<5 - 1
)

// sniff checks that the first bytes of the image agree with format and
// returns the capacity to declare for the volume: for raw the byte size
// (size, or 0 when unknown), for qcow2 the virtual disk size from the
// header. head is the first up to sniffLen bytes; size is the Content-Length
// or -1.
//
// Everything refused here is refused for good: the bytes at the URL would
// not boot, or (a qcow2 naming a backing or data file) would make libvirt
// and qemu open a path on the host chosen by whoever built the image.
func sniff(format string, head []byte, size int64) (capacity uint64, err error) {
	if len(head) == 0 {
		return 0, provider.Permanentf("image is empty")
	}
	for _, c := range compressed {
		if bytes.HasPrefix(head, c.magic) {
			return 0, provider.Permanentf("image is %s-compressed; publish or point at the uncompressed %s image", c.name, format)
		}
	}
	isQCOW2 := bytes.HasPrefix(head, qcow2Magic)
	switch format {
	case FormatRaw:
		if isQCOW2 {
			return 0, provider.Permanentf("image is qcow2 but its format is declared raw")
		}
		return uint64(max(size, 0)), nil
	case FormatQCOW2:
		if !isQCOW2 {
			return 0, provider.Permanentf("image is not qcow2 (no qcow2 magic) but its format is declared qcow2")
		}
		return qcow2VirtualSize(head)
	}
	return 0, checkFormat(format)
}

func qcow2VirtualSize(h []byte) (uint64, error) {
	if len(h) < qcowV2HeaderLen {
		return 0, provider.Permanentf("qcow2 header is truncated (%d bytes)", len(h))
	}
	be := binary.BigEndian
	version := be.Uint32(h[qcowVersionOff:])
	if version != 2 && version != 3 {
		return 0, provider.Permanentf("qcow2 version %d is not supported", version)
	}
	if version == 3 {
		if len(h) < qcowIncompatOff+8 {
			return 0, provider.Permanentf("qcow2 v3 header is truncated (%d bytes)", len(h))
		}
		switch f := be.Uint64(h[qcowIncompatOff:]); {
		case f&qcowIncompatDataFile != 0:
			return 0, provider.Permanentf("qcow2 image uses an external data file; refusing it")
		case f&qcowIncompatCorrupt != 0:
			return 0, provider.Permanentf("qcow2 image is marked corrupt")
		case f&^qcowIncompatKnownMask != 0:
			return 0, provider.Permanentf("qcow2 image has unknown incompatible features %#x", f)
		}
	}
	if be.Uint64(h[qcowBackingOffsetOff:]) != 0 {
		return 0, provider.Permanentf("qcow2 image refers to a backing file; only standalone images are accepted")
	}
	if be.Uint32(h[qcowCryptMethodOff:]) != 0 {
		return 0, provider.Permanentf("qcow2 image is encrypted")
	}
	if cb := be.Uint32(h[qcowClusterBitsOff:]); cb < qcowMinClusterBits || cb > qcowMaxClusterBits {
		return 0, provider.Permanentf("qcow2 cluster_bits %d is out of range", cb)
	}
	vsize := be.Uint64(h[qcowSizeOff:])
	if vsize == 0 {
		return 0, provider.Permanentf("qcow2 image has a virtual size of 0")
	}
	return vsize, nil
}
