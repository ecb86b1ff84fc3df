package proxyprobe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// maxEchoBody is the longest answer an address-echo endpoint may give: a
// JSON object with an "ip" field and a few others (ipify's, httpbin's)
// fits; a page of HTML does not and is no address.
const maxEchoBody = 1024

// ParseEgress reads the answer of an address-echo endpoint: either the
// address alone (surrounding whitespace allowed: "203.0.113.9\n", as
// ipify, checkip.amazonaws.com and icanhazip answer), or a JSON object
// whose "ip" field is the address ({"ip":"203.0.113.9"}, ipify's
// ?format=json). Anything else is an error: a page that merely contains an
// address is not a measurement. The address comes back in its canonical
// form (IPv4-mapped IPv6 unmapped); zones are refused.
func ParseEgress(body []byte) (netip.Addr, error) {
	if len(body) > maxEchoBody {
		return netip.Addr{}, fmt.Errorf("answer longer than %d bytes", maxEchoBody)
	}
	s := strings.TrimSpace(string(body))
	if strings.HasPrefix(s, "{") {
		var v struct {
			IP *string `json:"ip"`
		}
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			return netip.Addr{}, fmt.Errorf("answer is not a JSON object: %w", err)
		}
		if v.IP == nil {
			return netip.Addr{}, errors.New(`JSON answer has no "ip" field`)
		}
		s = strings.TrimSpace(*v.IP)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("answer is not an IP address (nor JSON with an \"ip\" field): %q", truncate(s, 64))
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("answer %q has a zone: not an address target sites see", a)
	}
	return a.Unmap(), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Echoer measures a proxy's egress address: the source address an
// address-echo endpoint sees a request through the proxy come from.
type Echoer interface {
	Echo(ctx context.Context, url string, t Target) (netip.Addr, error)
}

// HTTPEcho requests the echo URL through the proxy with the target's
// credential (as HTTP's probe does: the credential only in
// Proxy-Authorization, scrubbed from errors) and parses the answer
// (ParseEgress).
type HTTPEcho struct {
	Timeout time.Duration
}

func (e HTTPEcho) Echo(ctx context.Context, url string, t Target) (netip.Addr, error) {
	var body []byte
	res := HTTP{URL: url, Timeout: e.Timeout}.request(ctx, t, true, func(r io.Reader) {
		body, _ = io.ReadAll(io.LimitReader(r, maxEchoBody+1))
	})
	if res.Err != nil {
		return netip.Addr{}, res.Err
	}
	if res.StatusCode != http.StatusOK {
		return netip.Addr{}, fmt.Errorf("GET %s through the proxy: status %d, want 200", url, res.StatusCode)
	}
	a, err := ParseEgress(body)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("GET %s through the proxy: %w", url, err)
	}
	return a, nil
}

// ValidateEchoURL refuses an echo URL the measurement cannot use: not
// http(s), without a host, or carrying credentials (they would reach
// logs and messages; the proxy's own credential goes in its header).
// Empty is valid: no echo.
func ValidateEchoURL(raw string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("not a URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("scheme %q: want http or https", u.Scheme)
	case u.Host == "":
		return errors.New("no host")
	case u.User != nil:
		return errors.New("must not carry credentials")
	}
	return nil
}
