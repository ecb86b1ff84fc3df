// Package proxyprobe checks that a proxy endpoint works: either its port
// accepts a TCP connection, or an HTTP request sent through it to a probe URL
// returns the expected status.
package proxyprobe

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Result of one probe.
type Result struct {
	// OK is true when the probe passed.
	OK bool
	// Through is true when a request went through the proxy (HTTP probe),
	// false when only the port was checked (TCP probe).
	Through bool
	Latency time.Duration
	Err     error
}

// Prober checks the proxy at address:port.
type Prober interface {
	Probe(ctx context.Context, address string, port int32) Result
}

// TCP checks that the proxy port accepts a connection.
type TCP struct {
	Timeout time.Duration
	// Dial is injectable for tests; net.Dialer by default.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (p TCP) Probe(ctx context.Context, address string, port int32) Result {
	ctx, cancel := context.WithTimeout(ctx, orDefault(p.Timeout))
	defer cancel()
	dial := p.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	start := time.Now()
	conn, err := dial(ctx, "tcp", net.JoinHostPort(address, strconv.Itoa(int(port))))
	r := Result{Latency: time.Since(start)}
	if err != nil {
		r.Err = err
		return r
	}
	_ = conn.Close()
	r.OK = true
	return r
}

// HTTP sends GET URL through the proxy and expects Status.
type HTTP struct {
	URL     string
	Status  int // http.StatusNoContent when 0
	Timeout time.Duration
}

func (p HTTP) Probe(ctx context.Context, address string, port int32) Result {
	ctx, cancel := context.WithTimeout(ctx, orDefault(p.Timeout))
	defer cancel()
	want := p.Status
	if want == 0 {
		want = http.StatusNoContent
	}
	proxyURL := &url.URL{Scheme: "http", Host: net.JoinHostPort(address, strconv.Itoa(int(port)))}
	tr := &http.Transport{
		Proxy:             http.ProxyURL(proxyURL),
		DisableKeepAlives: true, // every probe is a fresh connection through the proxy
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, nil)
	if err != nil {
		return Result{Through: true, Err: err}
	}
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	r := Result{Through: true, Latency: time.Since(start)}
	if err != nil {
		r.Err = err
		return r
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode != want {
		r.Err = fmt.Errorf("GET %s through %s: status %d, want %d", p.URL, proxyURL.Host, resp.StatusCode, want)
		return r
	}
	r.OK = true
	return r
}

func orDefault(d time.Duration) time.Duration {
	if d <= 0 {
		return 5 * time.Second
	}
	return d
}
