package provider

import "testing"

func TestRedactURLDropsEveryCredential(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:secret@example.com/a.img":                       "https://redacted@example.com/a.img",
		"https://ghp_t0ken@example.com/a.img":                         "https://redacted@example.com/a.img",
		"https://:secret@example.com/a.img":                           "https://redacted@example.com/a.img",
		"https://bucket.s3.example.com/a.img?X-Amz-Signature=abc&x=1": "https://bucket.s3.example.com/a.img?redacted",
		"http://example.com/a.img#frag":                               "http://example.com/a.img",
		"http://example.com/a.img":                                    "http://example.com/a.img",
		"debian-12":                                                   "debian-12",
		"http://[::1":                                                 "<unparsable URL>",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
