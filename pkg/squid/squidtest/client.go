package squidtest

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// Response is what squid answered to one request.
type Response struct {
	Status int
	// SquidError is X-Squid-Error: which of squid's refusals it was.
	SquidError string
	Server     string
	// Body is the start of the answer's body (up to 1 MiB).
	Body []byte
}

// Dial connects to squid from source, an address on lo (127.0.0.0/8 or ::1).
func (s *Squid) Dial(t testing.TB, source string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	addr := s.Addr
	if netip.MustParseAddr(source).Is6() {
		addr = s.Addr6
	}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	return conn
}

// RoundTrip sends one proxy request on conn: a GET with an absolute URL,
// or CONNECT host:port. userpass "" sends no Proxy-Authorization.
func RoundTrip(t testing.TB, conn net.Conn, method, target, userpass string, keepAlive bool) Response {
	t.Helper()
	host := target
	if method != http.MethodConnect {
		host = strings.SplitN(strings.TrimPrefix(target, "http://"), "/", 2)[0]
	}
	var req strings.Builder
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, target, host)
	if userpass != "" {
		fmt.Fprintf(&req, "Proxy-Authorization: Basic %s\r\n", base64.StdEncoding.EncodeToString([]byte(userpass)))
	}
	if !keepAlive {
		req.WriteString("Connection: close\r\n")
	}
	req.WriteString("\r\n")
	if _, err := conn.Write([]byte(req.String())); err != nil {
		t.Fatal(err)
	}
	r, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	var body []byte
	if method != http.MethodConnect || r.StatusCode != http.StatusOK {
		body, _ = io.ReadAll(io.LimitReader(r.Body, 1<<20))
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return Response{Status: r.StatusCode, SquidError: r.Header.Get("X-Squid-Error"), Server: r.Header.Get("Server"), Body: body}
}

// Request sends one request on a new connection from source.
func (s *Squid) Request(t testing.TB, source, method, target, userpass string) Response {
	t.Helper()
	conn := s.Dial(t, source)
	defer conn.Close()
	return RoundTrip(t, conn, method, target, userpass, false)
}
