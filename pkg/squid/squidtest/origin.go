package squidtest

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Origin is a local server that answers 204, or the status its path
// names (/429: 429, from 200 to 599), and remembers the headers of every
// request that reached it.
type Origin struct {
	*httptest.Server
	mu      sync.Mutex
	headers []http.Header
}

// NewOrigin serves on addr (host:port; port 0 picks one), e.g.
// "127.0.0.44:0": an address other than 127.0.0.1 lets a test allow the
// origin as a destination exception and still see 127.0.0.1 refused.
func NewOrigin(t testing.TB, addr string) *Origin {
	t.Helper()
	o := &Origin{}
	o.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.headers = append(o.headers, r.Header.Clone())
		o.mu.Unlock()
		status := http.StatusNoContent
		if n, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/")); err == nil && n >= 200 && n <= 599 {
			status = n
		}
		w.WriteHeader(status)
	}))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	o.Listener = l
	o.Start()
	t.Cleanup(o.Close)
	return o
}

// Requests returns the headers of the requests that reached the origin.
func (o *Origin) Requests() []http.Header {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]http.Header(nil), o.headers...)
}

// Host is the origin's IP address.
func (o *Origin) Host() string { return o.Listener.Addr().(*net.TCPAddr).IP.String() }

// Port is the origin's port.
func (o *Origin) Port() int { return o.Listener.Addr().(*net.TCPAddr).Port }

// HostPort is host:port.
func (o *Origin) HostPort() string { return net.JoinHostPort(o.Host(), strconv.Itoa(o.Port())) }
