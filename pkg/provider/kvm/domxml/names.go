package domxml

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// MaxDomainNameLen bounds domain names. libvirt names files after the domain
// (<name>.xml, <name>.log, <name>_VARS.fd, ...) and a file name is at most
// 255 bytes, so this leaves room for the longest suffix.
const MaxDomainNameLen = 200

// maxImageNamePart bounds the KVMImage name inside a volume name, keeping the
// volume's file name well under 255 bytes.
const maxImageNamePart = 180

// Volume name prefixes. Everything a Proxy owns is named after its UID, so
// two Proxies with the same name (in two namespaces, or one deleted and
// created again) never share a volume.
const (
	ProxyVolumePrefix = "proxy-"
	ImageVolumePrefix = "image-"
)

// DomainName is the libvirt domain name of a Proxy: "<namespace>.<name>".
//
// Both parts are DNS-1123 labels (the Proxy webhook enforces it for the
// name), so neither holds a '.' and the first dot splits the name back
// unambiguously; a '/' cannot occur. Readable in virsh list, unique per
// namespace/name. Ownership is never inferred from the name: the provider
// checks the UID recorded in the domain's metadata. A name longer than
// MaxDomainNameLen, impossible for valid Kubernetes names, is cut and made
// unique again with a hash of the whole.
func DomainName(namespace, name string) string {
	full := namespace + "." + name
	if len(full) <= MaxDomainNameLen {
		return full
	}
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	suffix := "-" + hex.EncodeToString(sum[:])[:12]
	return full[:MaxDomainNameLen-len(suffix)] + suffix
}

// DiskVolumeName is the Proxy's qcow2 overlay: "proxy-<uid>-disk.qcow2".
// uid must be the non-empty Kubernetes UID (callers check Machine.UID
// first: an empty one would name the same volume for every Proxy).
func DiskVolumeName(uid string) string { return ProxyVolumePrefix + uid + "-disk.qcow2" }

// SeedVolumeName is the Proxy's cloud-init seed: "proxy-<uid>-seed.iso".
func SeedVolumeName(uid string) string { return ProxyVolumePrefix + uid + "-seed.iso" }

// VolumeOwnerUID returns the Proxy UID a volume named by DiskVolumeName or
// SeedVolumeName belongs to, for collecting volumes whose domain is gone.
func VolumeOwnerUID(volume string) (string, bool) {
	rest, ok := strings.CutPrefix(volume, ProxyVolumePrefix)
	if !ok {
		return "", false
	}
	for _, suffix := range []string{"-disk.qcow2", "-seed.iso"} {
		if uid, ok := strings.CutSuffix(rest, suffix); ok && uid != "" {
			return uid, true
		}
	}
	return "", false
}

// ImageVolumeName is the cached base image of a KVMImage (or of a direct URL
// when imageName is empty): "image-<name>-<sha12>.<format>", sha12 being the
// first 12 hex digits of the sha256 checksum. A new checksum gives a new
// volume, so a changed image never reuses stale bytes, while overlays of
// running VMs keep their old backing file. checksum is "sha256:<64 hex>";
// format is qcow2 or raw. Errors are permanent.
func ImageVolumeName(imageName, checksum, format string) (string, error) {
	sha12, err := checksumPrefix(checksum)
	if err != nil {
		return "", err
	}
	if format != FormatQCOW2 && format != FormatRaw {
		return "", provider.Permanentf("image format %q: want %s or %s", format, FormatQCOW2, FormatRaw)
	}
	return ImageVolumePrefix + imageNamePart(imageName) + "-" + sha12 + "." + format, nil
}

// ImageMarkerName is the empty volume recording that ImageVolumeName(...)
// matched its checksum: that name plus ".verified". Tied to the exact volume
// name, so it never vouches for another format or checksum.
func ImageMarkerName(imageName, checksum, format string) (string, error) {
	vol, err := ImageVolumeName(imageName, checksum, format)
	if err != nil {
		return "", err
	}
	return vol + ".verified", nil
}

func checksumPrefix(checksum string) (string, error) {
	hexsum, ok := strings.CutPrefix(checksum, "sha256:")
	if !ok || len(hexsum) != 64 {
		return "", provider.Permanentf("checksum %q: want sha256:<64 hex digits>", checksum)
	}
	if _, err := hex.DecodeString(hexsum); err != nil {
		return "", provider.Permanentf("checksum %q: want sha256:<64 hex digits>", checksum)
	}
	return strings.ToLower(hexsum[:12]), nil
}

// imageNamePart keeps the characters Kubernetes names use and caps the
// length; an empty name (a direct URL) becomes "url". Collisions after
// cutting are harmless: the checksum part keeps the content the same.
func imageNamePart(name string) string {
	if name == "" {
		return "url"
	}
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
		if b.Len() >= maxImageNamePart {
			break
		}
	}
	return b.String()
}

// validVolumeName rejects names libvirt would turn into a path outside the
// pool or refuse.
func validVolumeName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > 255 {
		return provider.Permanentf("volume name %q is not a plain file name", name)
	}
	return nil
}
