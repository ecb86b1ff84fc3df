package v1alpha1

import (
	"encoding/base64"
	"unicode/utf8"
)

// GCEMaxMetadataValue is Compute Engine's limit for one instance metadata
// value, user-data included. The gcp provider enforces it at Create and the
// Proxy webhook at admission, both through GCEUserDataValue.
const GCEMaxMetadataValue = 256 * 1024

// GCEUserDataValue is user-data as it is written to instance metadata: byte
// for byte when it is UTF-8 (metadata values are strings), else base64 with
// encoding "base64" (for "user-data-encoding").
func GCEUserDataValue(b []byte) (value, encoding string) {
	if utf8.Valid(b) {
		return string(b), ""
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}
