package image

import (
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider"
)

func TestParseChecksum(t *testing.T) {
	const hex64 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	for _, tc := range []struct {
		in, want, errHas string
	}{
		{in: "sha256:" + hex64, want: hex64},
		{in: "SHA256:" + strings.ToUpper(hex64), want: hex64},
		{in: "", errHas: "empty"},
		{in: hex64, errHas: "no algorithm prefix"},
		{in: "md5:d41d8cd98f00b204e9800998ecf8427e", errHas: `algorithm "md5" is not supported`},
		{in: "sha512:" + hex64 + hex64, errHas: `algorithm "sha512"`},
		{in: "sha256:" + hex64[:63], errHas: "63 characters, want 64"},
		{in: "sha256:" + hex64 + "0", errHas: "65 characters"},
		{in: "sha256:", errHas: "0 characters"},
		{in: "sha256:" + hex64[:10] + "g" + hex64[11:], errHas: `non-hex character 'g' at position 10`},
		{in: "sha256: " + hex64[1:], errHas: `non-hex character ' ' at position 0`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseChecksum(tc.in)
			if tc.errHas == "" {
				if err != nil || got != tc.want {
					t.Fatalf("ParseChecksum = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("ParseChecksum error = %v, want one mentioning %q", err, tc.errHas)
			}
			if provider.Class(err) != provider.ClassPermanent {
				t.Errorf("error class = %s, want permanent", provider.Class(err))
			}
		})
	}
}
