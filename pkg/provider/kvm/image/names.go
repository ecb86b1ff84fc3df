package image

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// Volume naming. Every name this package creates is
//
//	image:  image-<name>-<digest[:12]>.<format>
//	marker: image-<name>-<digest[:12]>.<format>.<digest>.sha256
//
// The image name embeds the digest, so a changed checksum selects a new
// volume and a re-fetch happens without deleting anything in use. The
// marker's name carries the full digest because the fast path only looks
// names up (reading a volume back is not part of the seam): a marker vouches
// for the exact digest it was made for, not just for a 12-digit prefix.
// 12 hex digits (48 bits) keep image names readable; two versions of one
// image sharing them by accident is not a practical concern, and arranging
// it on purpose takes control of the image spec, which decides what boots
// anyway.
//
// <name> is the KVMImage name, shortened with a hash when long, or for a
// direct URL "url_" plus a hash of the URL. '_' never occurs in Kubernetes
// names, so neither form can collide with another image's names, and Prune
// can tell our volumes from anything else in the pool.
const (
	namePrefix     = "image-"
	shortDigestLen = 12
	markerSuffix   = ".sha256"
	// maxComponent bounds <name> so a marker name stays well under the
	// 255-byte file name limit of directory pools.
	maxComponent = 64
)

// Supported image formats.
const (
	FormatQCOW2 = "qcow2"
	FormatRaw   = "raw"
)

// names are the volume names of one image at one digest.
type names struct {
	component string // <name>
	volume    string
	marker    string
}

func newNames(img provider.Image, digest string) (names, error) {
	comp, err := nameComponent(img)
	if err != nil {
		return names{}, err
	}
	if err := checkFormat(img.Format); err != nil {
		return names{}, err
	}
	vol := namePrefix + comp + "-" + digest[:shortDigestLen] + "." + img.Format
	return names{
		component: comp,
		volume:    vol,
		marker:    vol + "." + digest + markerSuffix,
	}, nil
}

// VolumeName returns the name of img's volume in a storage pool.
func VolumeName(img provider.Image) (string, error) {
	n, err := namesOf(img)
	return n.volume, err
}

// MarkerName returns the name of the volume that records img's volume as
// verified. Its content is a sha256sum(1) line for the image volume, so
// `sha256sum -c` in the pool directory re-checks the image by hand.
func MarkerName(img provider.Image) (string, error) {
	n, err := namesOf(img)
	return n.marker, err
}

func namesOf(img provider.Image) (names, error) {
	digest, err := ParseChecksum(img.Checksum)
	if err != nil {
		return names{}, err
	}
	return newNames(img, digest)
}

func checkFormat(f string) error {
	switch f {
	case FormatQCOW2, FormatRaw:
		return nil
	}
	return provider.Permanentf("image format %q is not supported; want %s or %s", f, FormatQCOW2, FormatRaw)
}

// nameComponent returns <name> for img.
func nameComponent(img provider.Image) (string, error) {
	if img.Name == "" {
		return "url_" + shortHash(img.URL), nil
	}
	return imageComponent(img.Name)
}

func imageComponent(name string) (string, error) {
	if name == "" || len(name) > 253 {
		return "", provider.Permanentf("image name %q must be 1 to 253 characters", name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.') {
			// Volume names are file names on the host: never let a name
			// carry '/' or anything a shell or libvirt would read specially.
			return "", provider.Permanentf("image name %q has character %q; only a-z, 0-9, '-' and '.' are allowed", name, c)
		}
	}
	if len(name) <= maxComponent {
		return name, nil
	}
	// Keep a readable head and make the whole unique.
	head := name[:maxComponent-1-shortDigestLen]
	return head + "_" + shortHash(name), nil
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:shortDigestLen]
}

// parsedName is a volume name of ours, taken apart.
type parsedName struct {
	short  string // digest[:12]
	digest string // full digest; markers only
	marker bool
}

// parseName reports whether vol is an image or marker volume of the image
// whose <name> is comp, and its digests.
func parseName(vol, comp string) (parsedName, bool) {
	rest, ok := strings.CutPrefix(vol, namePrefix+comp+"-")
	if !ok || len(rest) < shortDigestLen+1 || rest[shortDigestLen] != '.' {
		return parsedName{}, false
	}
	p := parsedName{short: rest[:shortDigestLen]}
	if !isLowerHex(p.short) {
		return parsedName{}, false
	}
	rest = rest[shortDigestLen+1:]
	format, rest, _ := strings.Cut(rest, ".")
	if checkFormat(format) != nil {
		return parsedName{}, false
	}
	if rest == "" {
		return p, true
	}
	digest, ok := strings.CutSuffix(rest, markerSuffix)
	if !ok || len(digest) != digestHexLen || !isLowerHex(digest) {
		return parsedName{}, false
	}
	p.digest, p.marker = digest, true
	return p, true
}
