package provider

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// DNSLabel makes base+suffix a DNS label of at most maxLen characters, the
// shape both Kubernetes object names and Compute Engine instance names take
// (their limits differ, hence the parameter). base is lowercased, each run
// of characters outside [a-z0-9] becomes one '-', and it is cut so suffix
// fits; leading and trailing dashes are dropped. suffix is appended as is
// and must already be valid (e.g. UIDSuffix). The result is deterministic:
// the same inputs always name the same object.
func DNSLabel(base, suffix string, maxLen int) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(base) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
			continue
		}
		if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	s := b.String()
	if room := maxLen - len(suffix); len(s) > room {
		s = s[:max(room, 0)]
	}
	return strings.TrimRight(s, "-") + suffix
}

// UIDSuffix is "-" and the first 8 hex digits of sha256(uid): it keeps two
// owners whose names sanitize or truncate alike apart, and gives an owner
// recreated under the same name a fresh object name.
func UIDSuffix(uid string) string {
	sum := sha256.Sum256([]byte(uid))
	return "-" + hex.EncodeToString(sum[:])[:8]
}
