package e2eutil

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// forwardProxy is a minimal squid stand-in: absolute-URI GETs and CONNECT,
// Basic credentials user:pass or 407, and a count of the client
// connections it accepted (keep-alive shows as fewer connections than
// requests).
type forwardProxy struct {
	url   string
	conns atomic.Int32
}

func startForwardProxy(t *testing.T, user, pass string) *forwardProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &forwardProxy{url: fmt.Sprintf("http://%s:%s@%s", user, pass, l.Addr())}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	direct := &http.Transport{}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			p.conns.Add(1)
		}
	}, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != want {
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		if r.Method == http.MethodConnect {
			up, err := net.Dial("tcp", r.Host)
			if err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusOK)
			c, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				_ = up.Close()
				return
			}
			if n := rw.Reader.Buffered(); n > 0 {
				b, _ := rw.Reader.Peek(n)
				_, _ = up.Write(b)
			}
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			_, _ = io.Copy(c, up)
			_ = c.Close()
			return
		}
		r.RequestURI = ""
		r.Header.Del("Proxy-Authorization")
		resp, err := direct.RoundTrip(r)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close(); direct.CloseIdleConnections() })
	return p
}

// The crawler against a real origin through a proxy: requests in flight
// at once over kept-alive connections, HTTP and HTTPS through CONNECT with
// the test's own CA, every request counted; a proxy that answers 407
// counts as failed (plain and CONNECT alike) without its password in
// what is reported; the origin tells requests through a listed egress from
// direct ones.
func TestCrawlerThroughAProxy(t *testing.T) {
	o, err := startOrigin("127.0.0.1", "0", "0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	good := startForwardProxy(t, "crawl-ab12c", "s3cr/t")
	var mu sync.Mutex
	list := []string{strings.Replace(good.url, "s3cr/t", url.PathEscape("s3cr/t"), 1)}
	cr := &Crawler{List: func() []string { mu.Lock(); defer mu.Unlock(); return list },
		Targets: []string{o.HTTPURL + "/go/", o.HTTPSURL + "/go/"}, RootCAs: o.RootCAs, Workers: 8, RequestTimeout: 5 * time.Second}
	cr.Start(context.Background())
	deadline := time.Now().Add(30 * time.Second)
	for cr.Stats().Sent < 200 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ok := cr.Stats()
	if ok.Sent < 200 || ok.Failed != 0 || ok.HTTPS == 0 || ok.HTTPS == ok.Sent {
		t.Fatalf("through a good proxy: %s; failures %v; want 200 or more, none failed, HTTP and HTTPS", ok, ok.Failures)
	}
	// Kept alive: far fewer connections than requests (without keep-alive
	// every request is a connection of its own). Not exactly 16 (8 plain, 8
	// tunnels): a connection goes back to the idle pool a moment after its
	// body is read, and a worker that is quicker dials another.
	if n := good.conns.Load(); int(n) > ok.Sent/4 {
		t.Errorf("%d connections to the proxy for %d requests: not kept alive", n, ok.Sent)
	}

	// The password changed under the crawler: every request now 407.
	mu.Lock()
	list = []string{strings.Replace(list[0], "s3cr", "wrong", 1)}
	mu.Unlock()
	before := cr.Stats()
	deadline = time.Now().Add(30 * time.Second)
	for cr.Stats().Sent < before.Sent+50 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	st := cr.Stop()
	d := st.Minus(before)
	if d.Sent == 0 || d.Failed < d.Sent-8 || d.ProxyAuth != d.Failed {
		t.Errorf("through a proxy answering 407: %s, want every request failed as 407", d)
	}
	if len(st.Latencies) < ok.Sent {
		t.Errorf("%d latencies for %d successful requests", len(st.Latencies), ok.Sent)
	}
	for _, f := range st.Failures {
		if strings.Contains(f, "wrong") || strings.Contains(f, "s3cr") {
			t.Errorf("failure %q carries a password", f)
		}
	}

	// Only 127.0.0.1 reached the origin; it is the proxy's egress once allowed.
	if c := o.Counts("/go/"); c.Direct != c.Requests || c.HTTPS == 0 {
		t.Errorf("before the egress is allowed: %+v, want every request direct, some HTTPS", c)
	}
	o.Allow("127.0.0.1")
	if c := o.Counts("/go/"); c.Direct != 0 || c.Requests < ok.Sent {
		t.Errorf("after: %+v, want none direct and %d or more requests", c, ok.Sent)
	}
	if got := o.From("127.0.0.1", time.Now(), time.Now().Add(time.Hour)); len(got) != 0 {
		t.Errorf("%d requests in a window after the crawl", len(got))
	}
}

// Each failure is classed once, and an empty list is a failure, not a
// request skipped.
func TestCrawlerRecord(t *testing.T) {
	const line = "http://crawl-ab12c:s3cr%2Ft@10.77.0.5:3128"
	cr := &Crawler{used: map[string]bool{}}
	for _, err := range []error{
		nil,
		errors.New("proxyconnect tcp: dial tcp 10.77.0.5:3128: connect: connection refused"),
		fmt.Errorf("Get %q: %w", "http://crawl-ab12c:s3cr/t@target", context.DeadlineExceeded),
		statusError{http.StatusProxyAuthRequired},
		errors.New("Get \"https://10.77.0.1:443/go/1\": Proxy Authentication Required"),
		statusError{http.StatusBadGateway},
	} {
		cr.record(line, false, time.Millisecond, err)
	}
	cr.record("", true, 0, errEmptyList)
	s := cr.Stats()
	want := CrawlerStats{Sent: 7, Failed: 6, HTTPS: 1, DistinctEntries: 1, Refused: 1, TimedOut: 1, ProxyAuth: 2, BadStatus: 1, EmptyList: 1}
	if got := s.Minus(CrawlerStats{}); !reflect.DeepEqual(got, want) {
		t.Errorf("stats %s (%d entries), want %s (%d)", got, got.DistinctEntries, want, want.DistinctEntries)
	}
	for _, f := range s.Failures {
		if strings.Contains(f, "s3cr") {
			t.Errorf("failure %q carries the password", f)
		}
	}
	if !strings.Contains(s.Failures[1], "crawl-ab12c:xxxxx@target") {
		t.Errorf("failure %q: want the password masked in place", s.Failures[1])
	}
}

// The pool e2e's Scrapy crawl (the shipped recipe in the e2e's spider)
// through a proxy read from a kubelet-like directory: HTTP and HTTPS
// through CONNECT with the credential, until stopped, then a summary that
// counts every response; nothing fails.
func TestScrapyCrawlThroughAProxy(t *testing.T) {
	o, err := startOrigin("127.0.0.1", "0", "0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	p := startForwardProxy(t, "crawl-ab12c", "s3cret")
	dir := t.TempDir()
	list := squidtest.KubeletDir{Dir: dir}
	js, _ := json.Marshal([]map[string]string{{"name": "crawl-ab12c", "url": p.url}})
	list.Write(t, map[string][]byte{"proxies.json": js}, 0o644)
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	s := &ScrapyCrawl{Root: root, ListPath: filepath.Join(dir, "proxies.json"), URLs: []string{o.HTTPURL + "/scrapy/", o.HTTPSURL + "/scrapy/"},
		Dir: t.TempDir(), Reload: time.Second, Concurrency: 4}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	deadline := time.Now().Add(time.Minute)
	for o.Counts("/scrapy/").Requests < 60 && time.Now().Before(deadline) && s.Running() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	sum, err := s.Stop(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c := o.Counts("/scrapy/")
	if sum.Responses < 60 || sum.Failed != 0 || sum.Responses != c.Requests || c.HTTPS == 0 || c.HTTPS == c.Requests {
		t.Errorf("summary %d responses, %d failed %v; the origin saw %+v: want 60 or more, each answered, HTTP and HTTPS", sum.Responses, sum.Failed, sum.Failures, c)
	}
	if got := sum.Stat("downloader/response_status_count/200"); got != sum.Responses {
		t.Errorf("Scrapy counted %d answers 200, the spider %d responses", got, sum.Responses)
	}
}
