package proxyprobe

import (
	"context"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// forwardProxy is a minimal HTTP forward proxy, like squid for plain HTTP.
// With user set it answers 407 to requests without that user's
// Proxy-Authorization (GET and CONNECT alike), as squid with Basic auth
// does; a CONNECT it admits is answered 403 (no tunnel: the tests look at
// the header and the status only).
type forwardProxy struct {
	host       string
	port       int32
	user, pass string

	mu       sync.Mutex
	requests int
	// authHeaders are the Proxy-Authorization headers received, in order.
	authHeaders []string
	targets     []string
}

func newForwardProxy(t *testing.T, user, pass string) *forwardProxy {
	t.Helper()
	fp := &forwardProxy{user: user, pass: pass}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.Out.URL = r.In.URL // absolute-form request line names the target
		r.Out.Header.Del("Proxy-Authorization")
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fp.mu.Lock()
		fp.requests++
		fp.authHeaders = append(fp.authHeaders, r.Header.Get("Proxy-Authorization"))
		fp.targets = append(fp.targets, r.Method+" "+r.RequestURI)
		fp.mu.Unlock()
		if fp.user != "" && r.Header.Get("Proxy-Authorization") != "Basic "+base64.StdEncoding.EncodeToString([]byte(fp.user+":"+fp.pass)) {
			w.Header().Set("Proxy-Authenticate", `Basic realm="proxy"`)
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		if r.Method == http.MethodConnect {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		if strings.HasSuffix(r.URL.Hostname(), ".invalid") {
			w.WriteHeader(http.StatusServiceUnavailable) // squid's answer to a name that does not resolve
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	h, p, _ := net.SplitHostPort(u.Host)
	pn, _ := strconv.Atoi(p)
	fp.host, fp.port = h, int32(pn)
	return fp
}

func (fp *forwardProxy) target(user, pass string) Target {
	return Target{Address: fp.host, Port: fp.port, Username: user, Password: pass}
}

func (fp *forwardProxy) seen() (requests int, auth []string, targets []string) {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return fp.requests, append([]string(nil), fp.authHeaders...), append([]string(nil), fp.targets...)
}

// origin answers /generate_204 with 204, /ip with body, the rest 404.
func origin(t *testing.T, body string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/generate_204":
			w.WriteHeader(http.StatusNoContent)
		case "/ip":
			_, _ = w.Write([]byte(body))
		case "/redirect":
			http.Redirect(w, r, "/generate_204", http.StatusFound)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestHTTPProbeGoesThroughTheProxy(t *testing.T) {
	target := origin(t, "")
	fp := newForwardProxy(t, "", "")
	cases := []struct {
		name   string
		probe  HTTP
		wantOK bool
	}{
		{"204 passes", HTTP{URL: target.URL + "/generate_204"}, true},
		{"200 passes when any 2xx will do", HTTP{URL: target.URL + "/ip"}, true},
		{"200 fails when 204 is asked for", HTTP{URL: target.URL + "/ip", Status: http.StatusNoContent}, false},
		{"404 fails", HTTP{URL: target.URL + "/missing"}, false},
		{"a redirect is an answer, not followed", HTTP{URL: target.URL + "/redirect"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, _, _ := fp.seen()
			tc.probe.Timeout = 2 * time.Second
			r := tc.probe.Probe(context.Background(), fp.target("", ""))
			if r.OK != tc.wantOK || !r.Through {
				t.Fatalf("result %+v, want OK=%v", r, tc.wantOK)
			}
			if after, _, _ := fp.seen(); after != before+1 {
				t.Fatalf("%d requests reached the proxy, want 1", after-before)
			}
			if !tc.wantOK && r.Err == nil {
				t.Fatalf("failure without an error")
			}
		})
	}
}

// TestHTTPProbeAuthenticates: the probe sends the credential as
// Proxy-Authorization (plain HTTP and CONNECT), a refused one is a 407
// result, and the check without credentials sends none.
func TestHTTPProbeAuthenticates(t *testing.T) {
	const user, pass = "egress-1", "Zb8QpL2xV9mT4kR7sW1yN6cH3jF5gD0a"
	target := origin(t, "")
	fp := newForwardProxy(t, user, pass)
	probe := HTTP{URL: target.URL + "/generate_204", Timeout: 2 * time.Second}
	wantAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))

	if r := probe.Probe(context.Background(), fp.target(user, pass)); !r.OK || r.StatusCode != http.StatusNoContent {
		t.Fatalf("with the credential: %+v, want OK with 204", r)
	}
	if _, auth, _ := fp.seen(); auth[len(auth)-1] != wantAuth {
		t.Fatalf("Proxy-Authorization %q, want %q", auth[len(auth)-1], wantAuth)
	}

	r := probe.Probe(context.Background(), fp.target(user, "wrong-password-wrong-password"))
	if r.OK || r.StatusCode != http.StatusProxyAuthRequired || r.Err == nil || !strings.Contains(r.Err.Error(), "407") {
		t.Fatalf("with a wrong password: %+v, want a failure with status 407", r)
	}

	r = probe.ProbeWithoutCredentials(context.Background(), fp.target(user, pass))
	if r.StatusCode != http.StatusProxyAuthRequired {
		t.Fatalf("without credentials: %+v, want status 407", r)
	}
	if _, auth, _ := fp.seen(); auth[len(auth)-1] != "" {
		t.Fatalf("the check without credentials sent Proxy-Authorization %q", auth[len(auth)-1])
	}

	// https: the credential rides on the CONNECT; the proxy's refusal
	// code comes back although Go reports a refused CONNECT as an error.
	tls := HTTP{URL: "https://" + net.JoinHostPort("127.0.0.1", "443") + "/", Timeout: 2 * time.Second}
	r = tls.Probe(context.Background(), fp.target(user, pass))
	if r.OK || r.StatusCode != http.StatusForbidden {
		t.Fatalf("CONNECT with the credential: %+v, want the proxy's 403", r)
	}
	if _, auth, targets := fp.seen(); auth[len(auth)-1] != wantAuth || !strings.HasPrefix(targets[len(targets)-1], "CONNECT ") {
		t.Fatalf("last request %q with Proxy-Authorization %q, want a CONNECT with the credential", targets[len(targets)-1], auth[len(auth)-1])
	}
	if r := tls.ProbeWithoutCredentials(context.Background(), fp.target(user, pass)); r.StatusCode != http.StatusProxyAuthRequired {
		t.Fatalf("CONNECT without credentials: %+v, want status 407", r)
	}
}

// TestTCPProbeChecksAuthWithAnUnresolvableName: without a probe URL the
// check without credentials asks for a .invalid name, so an open proxy
// fetches nothing; a proxy that authenticates answers 407 first.
func TestTCPProbeChecksAuthWithAnUnresolvableName(t *testing.T) {
	for _, tc := range []struct {
		name       string
		user, pass string
		want       int
	}{
		{"authenticating proxy", "u", "p", http.StatusProxyAuthRequired},
		{"open proxy", "", "", http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := newForwardProxy(t, tc.user, tc.pass)
			r := TCP{Timeout: 2 * time.Second}.ProbeWithoutCredentials(context.Background(), fp.target(tc.user, tc.pass))
			if r.StatusCode != tc.want {
				t.Fatalf("%+v, want status %d", r, tc.want)
			}
			_, auth, targets := fp.seen()
			if targets[0] != "GET "+AuthCheckURL || auth[0] != "" {
				t.Fatalf("the proxy saw %q with Proxy-Authorization %q, want GET %s without", targets[0], auth[0], AuthCheckURL)
			}
		})
	}
}

// TestHTTPProbeRecordsTheEgressAddress: a 2xx body that is one IP address
// (what-is-my-IP services) is the egress address; anything else is not.
func TestHTTPProbeRecordsTheEgressAddress(t *testing.T) {
	fp := newForwardProxy(t, "", "")
	for _, tc := range []struct {
		body, path, want string
	}{
		{"203.0.113.9\n", "/ip", "203.0.113.9"},
		{"  2001:db8::7 ", "/ip", "2001:db8::7"},
		{"::ffff:192.0.2.1", "/ip", "192.0.2.1"},
		{"fe80::1%eth0", "/ip", ""},
		{"your address is 203.0.113.9", "/ip", ""},
		{"<html>" + strings.Repeat("x", 100) + "</html>", "/ip", ""},
		{"", "/generate_204", ""},
	} {
		t.Run(tc.body, func(t *testing.T) {
			target := origin(t, tc.body)
			r := HTTP{URL: target.URL + tc.path, Timeout: 2 * time.Second}.Probe(context.Background(), fp.target("", ""))
			if !r.OK || r.EgressAddress != tc.want {
				t.Fatalf("%+v, want OK with egress address %q", r, tc.want)
			}
		})
	}
}

// TestProbeErrorsNeverCarryThePassword: failing probes' errors end up in
// conditions and logs.
func TestProbeErrorsNeverCarryThePassword(t *testing.T) {
	const pass = "p@ss:w/rd?with#all&the=specials%20"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := int32(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	tgt := Target{Address: "127.0.0.1", Port: closed, Username: "user", Password: pass}
	for name, r := range map[string]Result{
		"closed proxy port":   HTTP{URL: "http://127.0.0.1:1/", Timeout: time.Second}.Probe(context.Background(), tgt),
		"closed, https":       HTTP{URL: "https://127.0.0.1:1/", Timeout: time.Second}.Probe(context.Background(), tgt),
		"malformed probe URL": HTTP{URL: "http://[::1/" + url.PathEscape(pass), Timeout: time.Second}.Probe(context.Background(), tgt),
	} {
		if r.OK || r.Err == nil {
			t.Fatalf("%s: %+v, want a failure", name, r)
		}
		for _, leak := range []string{pass, url.QueryEscape(pass), url.PathEscape(pass)} {
			if strings.Contains(r.Err.Error(), leak) {
				t.Errorf("%s: error %q carries the password", name, r.Err)
			}
		}
	}
	// scrub itself, on the spellings an HTTP client could produce.
	for _, raw := range []string{
		"proxyconnect tcp: http://user:" + url.PathEscape(pass) + "@127.0.0.1:3128",
		"Get " + (&url.URL{Scheme: "http", User: url.UserPassword("user", pass), Host: "h"}).String(),
		"bad header Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+pass)),
		"plain " + pass,
	} {
		got := tgt.scrub(errors.New(raw)).Error()
		if strings.Contains(got, pass) || strings.Contains(got, url.PathEscape(pass)) || strings.Contains(got, base64.StdEncoding.EncodeToString([]byte("user:"+pass))) ||
			!strings.Contains(got, "[redacted]") {
			t.Errorf("scrub(%q) = %q", raw, got)
		}
	}
}

func TestHTTPProbeProxyDown(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := HTTP{URL: "http://127.0.0.1:1/", Timeout: time.Second}.Probe(context.Background(), Target{Address: "127.0.0.1", Port: int32(port)})
	if r.OK || r.Err == nil || r.StatusCode != 0 {
		t.Fatalf("probe through a closed port passed: %+v", r)
	}
}

func TestTCPProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tgt := Target{Address: "127.0.0.1", Port: int32(l.Addr().(*net.TCPAddr).Port)}
	if r := (TCP{Timeout: time.Second}).Probe(context.Background(), tgt); !r.OK || r.Through {
		t.Fatalf("open port: %+v", r)
	}
	l.Close()
	if r := (TCP{Timeout: time.Second}).Probe(context.Background(), tgt); r.OK || r.Err == nil {
		t.Fatalf("closed port: %+v", r)
	}
}
