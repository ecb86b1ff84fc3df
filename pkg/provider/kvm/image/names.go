package image

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// Volume naming. An image is stored once per pool and content:
//
//	image:  image-sha256_<digest>.<format>
//	marker: image-sha256_<digest>.<format>.sha256
//
// so every KVMImage and direct-URL image with one digest shares one volume
// (the format stays in the name: the same bytes declared raw and qcow2 boot
// differently). A changed checksum selects a new volume and a re-fetch
// happens without deleting anything in use. The marker's name carries the
// full digest because the fast path only looks names up: a marker vouches
// for the exact digest it was made for.
//
// Builds before the shared cache named volumes per image:
//
//	legacy image:  image-<name>-<digest[:12]>.<format>
//	legacy marker: image-<name>-<digest[:12]>.<format>.<digest>.sha256
//
// with <name> the KVMImage name (shortened with a hash when long) or "url_"
// plus a hash of a direct URL. Lookup still serves a legacy copy vouched for
// by its full-digest marker, so Proxies boot during an upgrade; Ensure
// re-caches under the shared name. '_' never occurs in Kubernetes names and
// the shared name has no '-' after "image-", so no form collides with
// another.
//
// Several operator installs may share a pool, so a shared volume records who
// holds it, one empty claim volume per install:
//
//	claim: image-sha256_<digest>.<format>.held-by-<install id>
//
// ("_" stands for an install without an id). Only the last holder deletes
// the image (see Prune). A volume cached before claims existed, legacy or
// shared, has none: who holds it cannot be known, so it is served but never
// pruned.
const (
	namePrefix     = "image-"
	sharedPrefix   = namePrefix + Algorithm + "_"
	shortDigestLen = 12
	markerSuffix   = ".sha256"
	claimInfix     = ".held-by-"
	// noInstall is the holder name of an install without an id; '_' is
	// not allowed in install ids.
	noInstall = "_"
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
	volume, marker             string // shared
	legacyVolume, legacyMarker string
}

func newNames(img provider.Image, digest string) (names, error) {
	comp, err := nameComponent(img)
	if err != nil {
		return names{}, err
	}
	if err := checkFormat(img.Format); err != nil {
		return names{}, err
	}
	vol := sharedPrefix + digest + "." + img.Format
	legacy := namePrefix + comp + "-" + digest[:shortDigestLen] + "." + img.Format
	return names{
		volume:       vol,
		marker:       vol + markerSuffix,
		legacyVolume: legacy,
		legacyMarker: legacy + "." + digest + markerSuffix,
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

// claimName is the claim of holder (an install id, may be empty) on the
// shared image volume vol.
func claimName(vol, holder string) string {
	return vol + claimInfix + holderName(holder)
}

// holderName is how a claim names the install with id (may be empty).
func holderName(id string) string {
	if id == "" {
		return noInstall
	}
	return id
}

// ClaimName returns the name of the volume by which the install installID
// (empty for one without an id) holds img's volume in a storage pool.
func ClaimName(img provider.Image, installID string) (string, error) {
	n, err := namesOf(img)
	return claimName(n.volume, installID), err
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
	digest string // full digest; empty for a legacy image volume
	short  string // digest[:12]
	image  string // the image volume a marker vouches for, or the name itself
	legacy bool
	marker bool
	// holder is the install a claim volume names (noInstall for none);
	// empty when the volume is not a claim.
	holder string
}

// parseName reports whether vol is an image or marker volume of this
// package, shared or legacy, and its digests.
func parseName(vol string) (parsedName, bool) {
	if rest, ok := strings.CutPrefix(vol, sharedPrefix); ok {
		return parseSharedName(rest)
	}
	if rest, ok := strings.CutPrefix(vol, namePrefix); ok {
		return parseLegacyName(rest)
	}
	return parsedName{}, false
}

// parseSharedName parses what follows sharedPrefix:
// <digest>.<format>, then nothing (the image), the marker suffix or a claim.
func parseSharedName(rest string) (parsedName, bool) {
	digest, rest, _ := strings.Cut(rest, ".")
	format, rest, _ := strings.Cut(rest, ".")
	if len(digest) != digestHexLen || !isLowerHex(digest) || checkFormat(format) != nil {
		return parsedName{}, false
	}
	p := parsedName{digest: digest, short: digest[:shortDigestLen], image: sharedPrefix + digest + "." + format}
	switch holder, claim := strings.CutPrefix("."+rest, claimInfix); {
	case rest == "":
	case "."+rest == markerSuffix:
		p.marker = true
	case claim && (holder == noInstall || provider.ValidateInstallID(holder) == nil):
		p.holder = holder
	default:
		return parsedName{}, false
	}
	return p, true
}

// parseLegacyName parses what follows namePrefix:
// <name>-<short digest>.<format>, a marker adding .<digest> and the suffix.
func parseLegacyName(rest string) (parsedName, bool) {
	p := parsedName{legacy: true}
	if base, ok := strings.CutSuffix(rest, markerSuffix); ok {
		i := strings.LastIndexByte(base, '.')
		if i < 0 || len(base)-i-1 != digestHexLen || !isLowerHex(base[i+1:]) {
			return parsedName{}, false
		}
		p.digest, p.marker, rest = base[i+1:], true, base[:i]
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 || checkFormat(rest[i+1:]) != nil {
		return parsedName{}, false
	}
	head := rest[:i]
	j := len(head) - shortDigestLen
	if j < 2 || head[j-1] != '-' || !isLowerHex(head[j:]) || !validComponent(head[:j-1]) {
		return parsedName{}, false
	}
	p.short, p.image = head[j:], namePrefix+rest
	if p.marker && p.digest[:shortDigestLen] != p.short {
		return parsedName{}, false
	}
	return p, true
}

// validComponent reports whether s can be a <name> of a legacy volume.
func validComponent(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return s != ""
}
