package e2eutil

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// ListMirror is what the kubelet does for a crawler pod that mounts the
// pool's Secret as a directory, only faster: every Interval it reads the
// Secret through the API and, when it changed, lays its keys out in Dir
// as the kubelet does (..data swapped atomically). The crawlers of the
// pool e2e read the list from it: the Scrapy recipe from Dir, the Go
// crawler through Lines. Before a list is written, the addresses it names
// join the Origin's egress set (the guests reach the origin from their own
// address), so the origin can tell a request through a listed replica from
// any other.
type ListMirror struct {
	Client          client.Reader
	Namespace, Pool string
	Dir             string
	Interval        time.Duration
	Origin          *Origin

	dir      squidtest.KubeletDir
	mu       sync.Mutex
	lines    []string
	version  string
	stats    MirrorStats
	cancel   context.CancelFunc
	done     chan struct{}
	stopOnce sync.Once
}

// MirrorStats is what the mirror read.
type MirrorStats struct {
	// Reads of the Secret and how many failed (the last list stays); one
	// cut short by Stop is neither.
	Reads, ReadErrors int
	// FirstReadError is the first failed read's error.
	FirstReadError error
	// ListChanges counts the lists written after the first.
	ListChanges int
	// ShortestList and LongestList are the list lengths written.
	ShortestList, LongestList int
	// WriteError is the first failure to lay the files out.
	WriteError error
}

// Start reads the Secret until it has written a list, then keeps it
// current until Stop.
func (m *ListMirror) Start(ctx context.Context) error {
	m.dir = squidtest.KubeletDir{Dir: m.Dir}
	m.stats.ShortestList = -1
	if err := os.MkdirAll(m.Dir, 0o755); err != nil {
		return err
	}
	if err := m.refresh(ctx); err != nil {
		return err
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.done = make(chan struct{})
	go func() {
		defer close(m.done)
		every(ctx, m.Interval, func() {
			if err := m.refresh(ctx); err != nil && ctx.Err() == nil {
				m.mu.Lock()
				if m.stats.WriteError == nil {
					m.stats.WriteError = err
				}
				m.mu.Unlock()
			}
		})
	}()
	return nil
}

// refresh reads the Secret and writes it out when it changed; an error is
// one of writing the files.
func (m *ListMirror) refresh(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sec := &corev1.Secret{}
	err := m.Client.Get(rctx, client.ObjectKey{Namespace: m.Namespace, Name: crawlv1.PublishedName(m.Pool)}, sec)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil && ctx.Err() != nil {
		return nil // cut short by Stop: no read failed
	}
	m.stats.Reads++
	if err != nil {
		m.stats.ReadErrors++
		if m.stats.FirstReadError == nil {
			m.stats.FirstReadError = err
		}
		if m.version == "" {
			return fmt.Errorf("the pool's Secret: %w", err)
		}
		return nil
	}
	if sec.ResourceVersion == m.version {
		return nil
	}
	lines := publishedLines(sec)
	for _, l := range lines {
		if u, err := url.Parse(l); err == nil {
			m.Origin.Allow(u.Hostname())
		}
	}
	if err := m.dir.Swap(sec.Data, 0o644); err != nil {
		return err
	}
	if m.version != "" && strings.Join(lines, "\n") != strings.Join(m.lines, "\n") {
		m.stats.ListChanges++
	}
	m.version, m.lines = sec.ResourceVersion, lines
	if m.stats.ShortestList < 0 || len(lines) < m.stats.ShortestList {
		m.stats.ShortestList = len(lines)
	}
	m.stats.LongestList = max(m.stats.LongestList, len(lines))
	return nil
}

// Lines is the list last written.
func (m *ListMirror) Lines() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lines
}

// Stop ends the refreshing and returns the figures.
func (m *ListMirror) Stop() MirrorStats {
	m.stopOnce.Do(func() {
		if m.cancel != nil {
			m.cancel()
			<-m.done
		}
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

// Stats returns the figures so far.
func (m *ListMirror) Stats() MirrorStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

// Crawler is the pool e2e's own client, as a crawler uses a pool: Workers
// requests in flight, each through the next listed proxy (round robin over
// List), alternately to the HTTP and the HTTPS target (through CONNECT),
// over kept-alive connections (one transport per proxy, dropped when the
// proxy leaves the list). Every answer that is not 2xx, every 407 and
// every error or timeout is a failed request.
type Crawler struct {
	// List returns the proxies.txt lines to use now.
	List func() []string
	// Targets are fetched in turn, with a sequence number appended.
	Targets []string
	RootCAs *x509.CertPool
	Workers int
	// Pause between the requests of one worker.
	Pause time.Duration
	// RequestTimeout bounds one request (default 10 s).
	RequestTimeout time.Duration

	mu         sync.Mutex
	next, seq  int
	transports map[string]*http.Transport
	stats      CrawlerStats
	used       map[string]bool
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	stopOnce   sync.Once
}

// CrawlerStats is what the crawler saw.
type CrawlerStats struct {
	Sent, Failed, HTTPS int
	// DistinctEntries is how many different proxies requests went through.
	DistinctEntries int
	// The failures by kind: Refused (the proxy's address refused or reset
	// the connection: a replica gone or not serving), TimedOut, ProxyAuth
	// (407), BadStatus (any other answer that is not 2xx), EmptyList (no
	// proxy to send through); the rest are other errors.
	Refused, TimedOut, ProxyAuth, BadStatus, EmptyList int
	// Failures describes the first failed requests (passwords masked).
	Failures []string
	// Latencies of the requests that succeeded, sorted.
	Latencies []time.Duration
}

// Minus is s less the figures of before (a phase's share), without the
// lists.
func (s CrawlerStats) Minus(before CrawlerStats) CrawlerStats {
	return CrawlerStats{Sent: s.Sent - before.Sent, Failed: s.Failed - before.Failed, HTTPS: s.HTTPS - before.HTTPS,
		DistinctEntries: s.DistinctEntries, Refused: s.Refused - before.Refused, TimedOut: s.TimedOut - before.TimedOut,
		ProxyAuth: s.ProxyAuth - before.ProxyAuth, BadStatus: s.BadStatus - before.BadStatus, EmptyList: s.EmptyList - before.EmptyList}
}

// String is the figures in a line.
func (s CrawlerStats) String() string {
	return fmt.Sprintf("%d requests (%d HTTPS through CONNECT), %d failed (%d refused, %d timed out, %d answered 407, %d another non-2xx, %d with an empty list)",
		s.Sent, s.HTTPS, s.Failed, s.Refused, s.TimedOut, s.ProxyAuth, s.BadStatus, s.EmptyList)
}

// Start runs the crawler until Stop.
func (cr *Crawler) Start(ctx context.Context) {
	ctx, cr.cancel = context.WithCancel(ctx)
	cr.used = map[string]bool{}
	cr.transports = map[string]*http.Transport{}
	for range max(1, cr.Workers) {
		cr.wg.Go(func() {
			for ctx.Err() == nil {
				cr.request(ctx)
				select {
				case <-ctx.Done():
				case <-time.After(cr.Pause):
				}
			}
		})
	}
}

// Stop ends the crawler and returns its figures.
func (cr *Crawler) Stop() CrawlerStats {
	cr.stopOnce.Do(func() {
		cr.cancel()
		cr.wg.Wait()
		cr.mu.Lock()
		for _, tr := range cr.transports {
			tr.CloseIdleConnections()
		}
		cr.mu.Unlock()
	})
	s := cr.Stats()
	cr.mu.Lock()
	defer cr.mu.Unlock()
	s.Latencies = append([]time.Duration(nil), cr.stats.Latencies...)
	sort.Slice(s.Latencies, func(i, j int) bool { return s.Latencies[i] < s.Latencies[j] })
	return s
}

// Stats returns the figures so far (without the latencies).
func (cr *Crawler) Stats() CrawlerStats {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	s := cr.stats
	s.DistinctEntries = len(cr.used)
	s.Failures = append([]string(nil), s.Failures...)
	s.Latencies = nil
	return s
}

func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// request sends one request through the next listed proxy and records how
// it went.
func (cr *Crawler) request(ctx context.Context) {
	line, tr, target := cr.nextEntry()
	took, err := cr.send(ctx, tr, target)
	if ctx.Err() != nil {
		return // stopped mid-request: not the proxy's failure
	}
	cr.record(line, strings.HasPrefix(target, "https:"), took, err)
}

// nextEntry is the list's next entry (round robin) with its transport and
// the next target; "" and nil while the list is empty.
func (cr *Crawler) nextEntry() (string, *http.Transport, string) {
	lines := cr.List()
	cr.mu.Lock()
	defer cr.mu.Unlock()
	target := ""
	if len(cr.Targets) > 0 {
		target = fmt.Sprintf("%s%d", cr.Targets[cr.seq%len(cr.Targets)], cr.seq)
		cr.seq++
	}
	listed := map[string]bool{}
	for _, l := range lines {
		listed[l] = true
	}
	// A proxy that left the list is not used again: its idle connections go.
	for l, tr := range cr.transports {
		if !listed[l] {
			tr.CloseIdleConnections()
			delete(cr.transports, l)
		}
	}
	if len(lines) == 0 {
		return "", nil, target
	}
	line := lines[cr.next%len(lines)]
	cr.next++
	tr := cr.transports[line]
	if tr == nil {
		tr = cr.transport(line)
		cr.transports[line] = tr
	}
	return line, tr, target
}

// transport is a keep-alive transport through the proxy of line; nil when
// the line is no proxy URL (send reports it).
func (cr *Crawler) transport(line string) *http.Transport {
	if _, err := ViaURL(line); err != nil {
		return nil
	}
	u, _ := url.Parse(line)
	return &http.Transport{
		Proxy:               http.ProxyURL(u),
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: cr.RootCAs, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: max(1, cr.Workers),
		IdleConnTimeout:     30 * time.Second,
	}
}

// statusError is an answer that is not 2xx.
type statusError struct{ code int }

func (e statusError) Error() string { return fmt.Sprintf("status %d, want 2xx", e.code) }

// errEmptyList: nothing to send through.
var errEmptyList = errors.New("the published list is empty")

// send fetches target through tr and wants 2xx.
func (cr *Crawler) send(ctx context.Context, tr *http.Transport, target string) (time.Duration, error) {
	if tr == nil {
		if target == "" {
			return 0, errors.New("no target")
		}
		return 0, errEmptyList
	}
	code, _, took, err := fetch(ctx, tr, target, cr.RequestTimeout)
	if err == nil && (code < 200 || code > 299) {
		return took, statusError{code}
	}
	return took, err
}

// record counts a request through line (HTTPS or not) that took took, or
// failed with err.
func (cr *Crawler) record(line string, https bool, took time.Duration, err error) {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	cr.stats.Sent++
	if https {
		cr.stats.HTTPS++
	}
	if line != "" {
		cr.used[MaskURL(line)] = true
	}
	if err == nil {
		cr.stats.Latencies = append(cr.stats.Latencies, took)
		return
	}
	cr.stats.Failed++
	msg := err.Error()
	var status statusError
	var netErr net.Error
	switch {
	case errors.Is(err, errEmptyList):
		cr.stats.EmptyList++
	case errors.As(err, &status) && status.code == http.StatusProxyAuthRequired,
		// A 407 to CONNECT comes back as an error, not a response.
		strings.Contains(msg, "Proxy Authentication Required"):
		cr.stats.ProxyAuth++
	case errors.As(err, &status):
		cr.stats.BadStatus++
	case strings.Contains(msg, "connection refused") || strings.Contains(msg, "connection reset") || strings.Contains(msg, "no route to host"):
		cr.stats.Refused++
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout() || strings.Contains(msg, "Timeout"):
		cr.stats.TimedOut++
	}
	if len(cr.stats.Failures) < 20 {
		cr.stats.Failures = append(cr.stats.Failures, fmt.Sprintf("%s via %s: %s", time.Now().UTC().Format("15:04:05.000"), MaskURL(line), withoutPassword(msg, line)))
	}
}

// withoutPassword is msg with the password of the list entry line masked.
func withoutPassword(msg, line string) string {
	if via, err := ViaURL(line); err == nil && via.Credentials != nil {
		if pass, ok := via.Credentials.Password(); ok && pass != "" {
			return strings.ReplaceAll(msg, pass, "xxxxx")
		}
	}
	return msg
}
