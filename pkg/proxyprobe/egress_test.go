package proxyprobe

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

func TestParseEgress(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string // want "" = an error
	}{
		{"bare IPv4 with newline", "203.0.113.9\n", "203.0.113.9"},
		{"bare IPv6 with spaces", "  2001:db8::7 ", "2001:db8::7"},
		{"IPv4-mapped IPv6 unmapped", "::ffff:192.0.2.1", "192.0.2.1"},
		{"JSON ip field", `{"ip":"203.0.113.9"}`, "203.0.113.9"},
		{"JSON with other fields and whitespace", "\n{ \"country\": \"NL\", \"ip\": \" 2001:db8::1 \" }\n", "2001:db8::1"},
		{"JSON without ip", `{"origin":"203.0.113.9"}`, ""},
		{"JSON ip not an address", `{"ip":"example.com"}`, ""},
		{"JSON ip of the wrong type", `{"ip":17}`, ""},
		{"JSON broken", `{"ip":"203.0.113.9"`, ""},
		{"a zone", "fe80::1%eth0", ""},
		{"prose around an address", "your address is 203.0.113.9", ""},
		{"HTML", "<html>203.0.113.9</html>", ""},
		{"empty", "", ""},
		{"too long", strings.Repeat(" ", maxEchoBody) + "203.0.113.9", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ParseEgress([]byte(tc.body))
			switch {
			case tc.want == "" && err == nil:
				t.Fatalf("ParseEgress(%q) = %s, want an error", tc.body, a)
			case tc.want != "" && err != nil:
				t.Fatalf("ParseEgress(%q): %v, want %s", tc.body, err, tc.want)
			case tc.want != "" && a.String() != tc.want:
				t.Fatalf("ParseEgress(%q) = %s, want %s", tc.body, a, tc.want)
			}
		})
	}
}

// FuzzParseEgress: never panics; an address it returns is valid, has no
// zone, is not IPv4-mapped, and was in the answer.
func FuzzParseEgress(f *testing.F) {
	for _, s := range []string{"203.0.113.9\n", `{"ip":"2001:db8::1"}`, "::ffff:1.2.3.4", `{"ip":null}`, "fe80::1%lo", "{}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		a, err := ParseEgress(body)
		if err != nil {
			return
		}
		if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
			t.Fatalf("ParseEgress(%q) = %v", body, a)
		}
		if len(body) > maxEchoBody {
			t.Fatalf("ParseEgress accepted %d bytes", len(body))
		}
	})
}

// TestHTTPEchoThroughTheProxy: the echo goes through the proxy with the
// credential, reads both answer formats, and refuses what is no address.
func TestHTTPEchoThroughTheProxy(t *testing.T) {
	fp := newForwardProxy(t, "u", "secret")
	ctx := context.Background()
	for _, tc := range []struct {
		body, want string
	}{
		{"198.51.100.4\n", "198.51.100.4"},
		{`{"ip":"198.51.100.5"}`, "198.51.100.5"},
		{"<html>hello</html>", ""},
	} {
		t.Run(tc.body, func(t *testing.T) {
			target := origin(t, tc.body)
			a, err := HTTPEcho{Timeout: 2 * time.Second}.Echo(ctx, target.URL+"/ip", fp.target("u", "secret"))
			if tc.want == "" {
				if err == nil {
					t.Fatalf("Echo = %s, want an error", a)
				}
				return
			}
			if err != nil || a.String() != tc.want {
				t.Fatalf("Echo = %s, %v; want %s", a, err, tc.want)
			}
		})
	}
	t.Run("wrong credential: an error with the status, without the password", func(t *testing.T) {
		target := origin(t, "198.51.100.4")
		_, err := HTTPEcho{Timeout: 2 * time.Second}.Echo(ctx, target.URL+"/ip", fp.target("u", "wrong-secret"))
		if err == nil || !strings.Contains(err.Error(), "407") || strings.Contains(err.Error(), "wrong-secret") {
			t.Fatalf("err %v, want one naming 407 and not the password", err)
		}
	})
	n, auth, _ := fp.seen()
	if n != 4 || auth[0] != "Basic "+base64.StdEncoding.EncodeToString([]byte("u:secret")) {
		t.Fatalf("the forward proxy saw %d requests, the first with Proxy-Authorization %q: want 4, through it with the credential", n, auth[0])
	}
}

func TestValidateEchoURL(t *testing.T) {
	for raw, ok := range map[string]bool{
		"":                           true,
		"http://echo.example/ip":     true,
		"https://api.ipify.org":      true,
		"ftp://echo.example/":        false,
		"http:///ip":                 false,
		"http://u:p@echo.example/ip": false,
		"http://echo.example/%zz":    false,
		"echo.example/ip":            false,
	} {
		if err := ValidateEchoURL(raw); (err == nil) != ok {
			t.Errorf("ValidateEchoURL(%q) = %v, want ok %v", raw, err, ok)
		}
	}
}
