package image

import (
	"strings"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// Algorithm is the only checksum algorithm images may declare.
const Algorithm = "sha256"

// digestHexLen is the length of a sha256 digest in hex digits.
const digestHexLen = 64

// ParseChecksum parses "sha256:<64 hex digits>" and returns the digest in
// lower case. The algorithm prefix is matched case-insensitively and upper
// case hex is accepted, as published checksum files vary; the returned
// digest is canonical so names and comparisons never depend on spelling.
// Errors are permanent: a malformed checksum never becomes valid on retry.
func ParseChecksum(s string) (hexDigest string, err error) {
	const want = "want sha256:<64 hex digits>"
	if s == "" {
		return "", provider.Permanentf("checksum is empty; %s", want)
	}
	algo, digest, ok := strings.Cut(s, ":")
	if !ok {
		return "", provider.Permanentf("checksum %q has no algorithm prefix; %s", s, want)
	}
	if !strings.EqualFold(algo, Algorithm) {
		return "", provider.Permanentf("checksum algorithm %q is not supported; %s", algo, want)
	}
	if len(digest) != digestHexLen {
		return "", provider.Permanentf("checksum %q: digest has %d characters, want %d hex digits", s, len(digest), digestHexLen)
	}
	for i := 0; i < len(digest); i++ {
		if !isHex(digest[i]) {
			return "", provider.Permanentf("checksum %q: digest has non-hex character %q at position %d", s, digest[i], i)
		}
	}
	return strings.ToLower(digest), nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
