package proxyprobe

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"testing"
	"time"
)

// forwardProxy is a minimal HTTP forward proxy, like squid for plain HTTP.
func forwardProxy(t *testing.T) (host string, port int32, requests *int) {
	t.Helper()
	n := 0
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		n++
		r.Out.URL = r.In.URL // absolute-form request line names the target
	}}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	h, p, _ := net.SplitHostPort(u.Host)
	pn, _ := strconv.Atoi(p)
	return h, int32(pn), &n
}

func TestHTTPProbeGoesThroughTheProxy(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/generate_204" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	defer target.Close()
	host, port, requests := forwardProxy(t)

	cases := []struct {
		name   string
		url    string
		wantOK bool
	}{
		{"204 passes", target.URL + "/generate_204", true},
		{"404 fails", target.URL + "/missing", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := *requests
			r := HTTP{URL: tc.url, Timeout: 2 * time.Second}.Probe(context.Background(), host, port)
			if r.OK != tc.wantOK || !r.Through {
				t.Fatalf("result %+v, want OK=%v", r, tc.wantOK)
			}
			if *requests != before+1 {
				t.Fatalf("the request did not go through the proxy")
			}
			if !tc.wantOK && r.Err == nil {
				t.Fatalf("failure without an error")
			}
		})
	}
}

func TestHTTPProbeProxyDown(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := HTTP{URL: "http://127.0.0.1:1/", Timeout: time.Second}.Probe(context.Background(), "127.0.0.1", int32(port))
	if r.OK || r.Err == nil {
		t.Fatalf("probe through a closed port passed: %+v", r)
	}
}

func TestTCPProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := int32(l.Addr().(*net.TCPAddr).Port)
	if r := (TCP{Timeout: time.Second}).Probe(context.Background(), "127.0.0.1", port); !r.OK || r.Through {
		t.Fatalf("open port: %+v", r)
	}
	l.Close()
	if r := (TCP{Timeout: time.Second}).Probe(context.Background(), "127.0.0.1", port); r.OK || r.Err == nil {
		t.Fatalf("closed port: %+v", r)
	}
}
