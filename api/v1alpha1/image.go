package v1alpha1

import "strings"

// IsImageURL reports whether a placement image is a URL rather than a
// KVMImage name (names cannot contain "://"). The webhooks and the Proxy controller share this rule.
func IsImageURL(image string) bool {
	return strings.Contains(image, "://")
}
