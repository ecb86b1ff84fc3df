package squidtest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// RequireRefusedBeforeConnecting checks that squid denied by ACL (403
// ERR_ACCESS_DENIED, not a failed connection) and forwarded nothing: its
// access log says HIER_NONE. target is as squid logs it (absolute URL for
// GET, host:port for CONNECT).
func RequireRefusedBeforeConnecting(t testing.TB, s *Squid, r Response, method, target string) {
	t.Helper()
	if r.Status != http.StatusForbidden || !strings.HasPrefix(r.SquidError, "ERR_ACCESS_DENIED") {
		t.Errorf("%s %s: %d %q, want 403 ERR_ACCESS_DENIED", method, target, r.Status, r.SquidError)
		return
	}
	line := s.WaitForLogLine(t, "TCP_DENIED/403", method, strings.TrimPrefix(target, "http://"))
	if !strings.Contains(line, "HIER_NONE/-") {
		t.Errorf("%s %s: squid forwarded it: %s", method, target, line)
	}
}

// Policy says who asks a squid running an operator-managed config.
type Policy struct {
	// Client is an address on lo inside allowedSourceCIDRs; Stranger one
	// outside.
	Client, Stranger string
	// Username and Password are the Basic credential (auth None: empty).
	Username, Password string
	// Origin must be reachable through the proxy: its address an allowed
	// destination exception other than 127.0.0.1, its port allowed.
	Origin *Origin
}

// CheckManagedPolicy proves what every delivered config must do, whatever
// the provider (issue 14): from an allowed source with the credential, 204
// from the origin, which learns neither the client (no X-Forwarded-For,
// Forwarded) nor the proxy (no Via) nor the credential; without or with a
// wrong credential, 407; from outside the allow list, 403 with or without
// it; to 127.0.0.1, 169.254.169.254 (cloud metadata, also as NAT64's
// 64:ff9b::a9fe:a9fe) and 10.x, 403 before any connection is tried; CONNECT to a port other than 443, 403.
func CheckManagedPolicy(t *testing.T, s *Squid, p Policy) {
	t.Helper()
	if p.Origin.Host() == "127.0.0.1" {
		t.Fatal("squidtest: the origin must not be on 127.0.0.1, which the policy must refuse")
	}
	creds := ""
	if p.Username != "" {
		creds = p.Username + ":" + p.Password
	}
	target := fmt.Sprintf("http://%s/", p.Origin.HostPort())

	t.Run("allowed source with the credential reaches the origin", func(t *testing.T) {
		if r := s.Request(t, p.Client, http.MethodGet, target, creds); r.Status != http.StatusNoContent {
			t.Fatalf("status %d (%s), want 204\n%s", r.Status, r.SquidError, s.Output())
		}
		reqs := p.Origin.Requests()
		if len(reqs) == 0 {
			t.Fatal("nothing reached the origin")
		}
		for _, h := range reqs {
			for _, name := range []string{"Via", "X-Forwarded-For", "Forwarded", "Proxy-Authorization"} {
				if v := h.Values(name); len(v) > 0 {
					t.Errorf("origin received %s: %q", name, v)
				}
			}
		}
	})

	if p.Username != "" {
		t.Run("no or a wrong credential gets 407", func(t *testing.T) {
			for _, c := range []string{"", p.Username + ":wrong-" + p.Password, "someone-else:" + p.Password} {
				if r := s.Request(t, p.Client, http.MethodGet, target, c); r.Status != http.StatusProxyAuthRequired {
					t.Errorf("credential %q: status %d, want 407", strings.ReplaceAll(c, p.Password, "<password>"), r.Status)
				}
			}
		})
	}

	t.Run("a source outside the list gets 403 with or without the credential", func(t *testing.T) {
		for _, c := range []string{creds, ""} {
			if r := s.Request(t, p.Stranger, http.MethodGet, target, c); r.Status != http.StatusForbidden {
				t.Errorf("from %s (credential sent: %v): status %d, want 403", p.Stranger, c != "", r.Status)
			}
		}
	})

	t.Run("loopback, metadata and private destinations are refused before connecting", func(t *testing.T) {
		for _, dst := range []string{
			fmt.Sprintf("http://127.0.0.1:%d/", p.Origin.Port()),
			"http://169.254.169.254/computeMetadata/v1/",
			"http://[64:ff9b::a9fe:a9fe]/computeMetadata/v1/", // the same behind NAT64
			"http://10.1.2.3/",
		} {
			RequireRefusedBeforeConnecting(t, s, s.Request(t, p.Client, http.MethodGet, dst, creds), http.MethodGet, dst)
		}
	})

	t.Run("CONNECT goes only to 443", func(t *testing.T) {
		dst := p.Origin.HostPort() // an allowed destination and port, but not 443
		RequireRefusedBeforeConnecting(t, s, s.Request(t, p.Client, http.MethodConnect, dst, creds), http.MethodConnect, dst)
	})

	t.Run("squid does not name its version", func(t *testing.T) {
		if r := s.Request(t, p.Stranger, http.MethodGet, target, ""); r.Server != "squid" {
			t.Errorf("Server %q, want squid without a version", r.Server)
		}
	})
}
