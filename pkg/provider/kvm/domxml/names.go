package domxml

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// MaxDomainNameLen bounds domain names. libvirt names files after the domain
// (<name>.xml, <name>.log, <name>_VARS.fd, ...) and a file name is at most
// 255 bytes, so this leaves room for the longest suffix.
const MaxDomainNameLen = 200

// Volume name prefixes. Everything a Proxy owns is named after its UID, so
// two Proxies with the same name (in two namespaces, or one deleted and
// created again) never share a volume.
const (
	ProxyVolumePrefix = "proxy-"
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

// validVolumeName rejects names libvirt would turn into a path outside the
// pool or refuse.
func validVolumeName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > 255 {
		return provider.Permanentf("volume name %q is not a plain file name", name)
	}
	return nil
}

// ProxyMAC is the MAC a Proxy's NIC gets when its configuration must name
// one and none was given (a static address without a virtual MAC): QEMU's
// 52:54:00 prefix, whose locally administered bit keeps it off every
// vendor's range, as libvirt would generate, and the first three bytes of
// the sha256 of the Proxy UID, so a rebuilt domain keeps it.
func ProxyMAC(uid string) string {
	sum := sha256.Sum256([]byte(uid))
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", sum[0], sum[1], sum[2])
}
