package e2eutil

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestViaSourceAndCredentials: a Via with Source connects from that
// address, sends its credentials as Proxy-Authorization, and Fetch returns
// the body, as the e2e's 403 and egress checks rely on.
func TestViaSourceAndCredentials(t *testing.T) {
	type seen struct{ host, auth, target string }
	got := make(chan seen, 1)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		got <- seen{host, r.Header.Get("Proxy-Authorization"), r.URL.String()}
		_, _ = w.Write([]byte(host))
	}))
	defer proxy.Close()

	for _, tc := range []struct {
		name, source, wantHost string
		creds                  *url.Userinfo
		wantAuth               string
	}{
		{name: "default source, no credentials", wantHost: "127.0.0.1"},
		{name: "bound source, credentials", source: "127.0.0.2", wantHost: "127.0.0.2",
			creds: url.UserPassword("u", "p"), wantAuth: "Basic dTpw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Via{Endpoint: proxy.URL, Credentials: tc.creds, Source: tc.source}
			code, body, _, err := v.Fetch(context.Background(), "http://192.0.2.1/ip")
			if err != nil {
				t.Fatal(err)
			}
			s := <-got
			if code != http.StatusOK || string(body) != tc.wantHost || s.host != tc.wantHost {
				t.Errorf("code %d, body %q, proxy saw %s; want 200 from %s", code, body, s.host, tc.wantHost)
			}
			if s.auth != tc.wantAuth || s.target != "http://192.0.2.1/ip" {
				t.Errorf("proxy saw Proxy-Authorization %q for %s, want %q", s.auth, s.target, tc.wantAuth)
			}
		})
	}
	if _, err := WantStatus(context.Background(), Via{Endpoint: proxy.URL, Source: "not-an-ip"}, "http://192.0.2.1/", 200); err == nil {
		t.Error("a Source that is no IP address must fail")
	}
}

// TestManagerArgsGrantTheRunsOwnException: the manager the e2e and the
// demo start admits the Proxies they create: a probe server where only the
// operator may open exceptions (link-local, loopback) is granted by flag,
// a private one (the test hypervisor's 10.77.0.1) needs no grant.
func TestManagerArgsGrantTheRunsOwnException(t *testing.T) {
	for _, tc := range []struct{ probe, want string }{
		{"http://10.77.0.1:8204/", ""},
		{"http://169.254.10.1:8204/", "--allow-destination-exceptions=169.254.10.1/32"},
		{"http://[fe80::1]:8204/", "--allow-destination-exceptions=fe80::1/128"},
	} {
		args := ManagerArgs(Config{ProbeURL: tc.probe}, "/keys", "ns", "tag")
		var got string
		for _, a := range args {
			if strings.HasPrefix(a, "--allow-destination-exceptions") {
				got = a
			}
		}
		if got != tc.want {
			t.Errorf("probe %s: grant %q, want %q", tc.probe, got, tc.want)
		}
	}
}
