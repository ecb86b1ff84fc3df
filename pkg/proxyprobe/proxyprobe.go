// Package proxyprobe checks that a proxy endpoint works: either its port
// accepts a TCP connection, or an HTTP request sent through it to a probe URL
// gets a 2xx answer. It also asks whether the proxy serves a request
// without credentials (ProbeWithoutCredentials): a proxy that
// authenticates answers 407.
package proxyprobe

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Target is the proxy to probe.
type Target struct {
	Address string
	Port    int32
	// Username and Password, when Username is set, authenticate the probe
	// to the proxy (Proxy-Authorization: Basic). They travel only in that
	// header, never in a URL, and are scrubbed from every error.
	Username, Password string
}

func (t Target) hostPort() string {
	return net.JoinHostPort(t.Address, strconv.Itoa(int(t.Port)))
}

// Result of one probe.
type Result struct {
	// OK is true when the probe passed.
	OK bool
	// Through is true when a request went through the proxy (HTTP probe),
	// false when only the port was checked (TCP probe).
	Through bool
	Latency time.Duration
	// StatusCode is the proxy's (or the origin's) answer; 0 when there was
	// no HTTP answer (TCP probe, connection failed).
	StatusCode int
	// Upstream is true when the answer is the origin's as squid forwarded
	// it: plain HTTP, and not one squid made itself (those carry
	// X-Squid-Error). squid's access log counts those as upstream
	// answers (squid.UpstreamCounts); an answer inside a CONNECT tunnel
	// it never sees.
	Upstream bool
	// EgressAddress is what a 2xx answer says the origin saw the request
	// come from, when it is an address-echo answer (ParseEgress): one IP
	// address, or JSON with an "ip" field.
	EgressAddress string
	Err           error
}

// Prober checks a proxy.
type Prober interface {
	// Probe checks that the proxy serves (with the target's credentials).
	Probe(ctx context.Context, t Target) Result
	// ProbeWithoutCredentials sends one request through the proxy without
	// credentials and reports the answer; a proxy that authenticates its
	// clients answers 407 before looking at the destination.
	ProbeWithoutCredentials(ctx context.Context, t Target) Result
}

// AuthCheckURL is what TCP's ProbeWithoutCredentials requests: a name that
// never resolves (RFC 6761 .invalid), so a proxy that would serve it
// without credentials fetches nothing, and port 80, which a managed squid
// allows unless allowedPorts leaves it out.
const AuthCheckURL = "http://auth-check.proxy-operator.invalid/"

// TCP checks that the proxy port accepts a connection.
type TCP struct {
	Timeout time.Duration
	// Dial is injectable for tests; net.Dialer by default.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (p TCP) Probe(ctx context.Context, t Target) Result {
	ctx, cancel := context.WithTimeout(ctx, orDefault(p.Timeout))
	defer cancel()
	dial := p.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	start := time.Now()
	conn, err := dial(ctx, "tcp", t.hostPort())
	r := Result{Latency: time.Since(start)}
	if err != nil {
		r.Err = err
		return r
	}
	_ = conn.Close()
	r.OK = true
	return r
}

// ProbeWithoutCredentials requests AuthCheckURL through the proxy.
func (p TCP) ProbeWithoutCredentials(ctx context.Context, t Target) Result {
	return HTTP{URL: AuthCheckURL, Timeout: p.Timeout}.ProbeWithoutCredentials(ctx, t)
}

// HTTP sends GET URL through the proxy and expects Status, or any 2xx when
// Status is 0.
type HTTP struct {
	URL     string
	Status  int
	Timeout time.Duration
}

func (p HTTP) Probe(ctx context.Context, t Target) Result {
	return p.do(ctx, t, true)
}

// ProbeWithoutCredentials sends the probe request without credentials;
// OK reports only that an HTTP answer came (read StatusCode).
func (p HTTP) ProbeWithoutCredentials(ctx context.Context, t Target) Result {
	t.Username, t.Password = "", ""
	return p.do(ctx, t, false)
}

func (p HTTP) do(ctx context.Context, t Target, judge bool) Result {
	var body []byte
	r := p.request(ctx, t, judge, func(rd io.Reader) { body, _ = io.ReadAll(io.LimitReader(rd, maxEchoBody+1)) })
	if r.OK && judge && r.StatusCode/100 == 2 {
		if a, err := ParseEgress(body); err == nil {
			r.EgressAddress = a.String()
		}
	}
	return r
}

// request sends GET URL through the proxy; read sees the start of the body
// of an answer (the rest is drained).
func (p HTTP) request(ctx context.Context, t Target, judge bool, read func(io.Reader)) Result {
	ctx, cancel := context.WithTimeout(ctx, orDefault(p.Timeout))
	defer cancel()
	// No userinfo in the proxy URL: credentials go only into the header,
	// so no error of the transport can carry them.
	proxyURL := &url.URL{Scheme: "http", Host: t.hostPort()}
	tr := &http.Transport{
		Proxy:             http.ProxyURL(proxyURL),
		DisableKeepAlives: true, // every probe is a fresh connection through the proxy
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, nil)
	if err != nil {
		return Result{Through: true, Err: t.scrub(err)}
	}
	if t.Username != "" {
		auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(t.Username+":"+t.Password))
		// Plain HTTP goes to the proxy as a request with an absolute URL;
		// an https URL is a CONNECT, which takes its headers from here.
		req.Header.Set("Proxy-Authorization", auth)
		tr.ProxyConnectHeader = http.Header{"Proxy-Authorization": {auth}}
	}
	// An https URL is a CONNECT; a refused one surfaces as an error
	// carrying only the status text, so its code is caught here.
	var connectStatus int
	tr.OnProxyConnectResponse = func(_ context.Context, _ *url.URL, _ *http.Request, res *http.Response) error {
		connectStatus = res.StatusCode
		return nil
	}
	start := time.Now()
	resp, err := (&http.Client{Transport: tr, CheckRedirect: noRedirects}).Do(req)
	r := Result{Through: true, Latency: time.Since(start)}
	if err != nil {
		if connectStatus != 0 && connectStatus != http.StatusOK {
			r.StatusCode = connectStatus
			if !judge {
				r.OK = true
				return r
			}
			err = fmt.Errorf("CONNECT for %s through %s: status %d, want 200", p.URL, proxyURL.Host, connectStatus)
		}
		r.Err = t.scrub(err)
		return r
	}
	defer resp.Body.Close()
	r.StatusCode = resp.StatusCode
	r.Upstream = req.URL.Scheme == "http" && resp.Header.Get("X-Squid-Error") == ""
	read(resp.Body)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if !judge {
		r.OK = true
		return r
	}
	if !p.wants(resp.StatusCode) {
		want := "2xx"
		if p.Status != 0 {
			want = strconv.Itoa(p.Status)
		}
		r.Err = fmt.Errorf("GET %s through %s: status %d, want %s", p.URL, proxyURL.Host, resp.StatusCode, want)
		return r
	}
	r.OK = true
	return r
}

func (p HTTP) wants(status int) bool {
	if p.Status != 0 {
		return status == p.Status
	}
	return status/100 == 2
}

// noRedirects: the probe judges the probe URL's own answer; following a
// redirect would send a second request to wherever the answer points.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// scrub removes the password from err's text, in every spelling a URL or
// header could have carried it. The probe never puts it into a URL, so
// this is a second guard for the error messages that end up in conditions.
func (t Target) scrub(err error) error {
	if err == nil || t.Password == "" {
		return err
	}
	msg := err.Error()
	for _, s := range []string{t.Password, url.QueryEscape(t.Password), url.PathEscape(t.Password),
		url.UserPassword(t.Username, t.Password).String(), base64.StdEncoding.EncodeToString([]byte(t.Username + ":" + t.Password))} {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "[redacted]")
		}
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

func orDefault(d time.Duration) time.Duration {
	if d <= 0 {
		return 5 * time.Second
	}
	return d
}
