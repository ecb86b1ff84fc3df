package proxyprobe

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"crawl.example.com/proxy-operator/pkg/squid"
)

// maxStatsBody bounds a cache manager page: counters is about 2 KiB, and
// client_list some 300 bytes per client address (the upstream counts,
// some 100 bytes).
const maxStatsBody = 1 << 20

// StatsReader reads a managed squid's traffic counters through its port,
// with the target's credential being the operator's Stats one
// (squid.Config.Stats), never the clients'.
type StatsReader interface {
	ReadStats(ctx context.Context, t Target) (squid.Counters, error)
	// ReadUpstream reads the target sites' answers by class from the
	// counter beside squid (squid.UpstreamURL), through the same port
	// with the same credential.
	ReadUpstream(ctx context.Context, t Target) (squid.UpstreamCounts, error)
}

// HTTPStats reads squid.StatsCounters and squid.StatsClientList as plain
// GETs through the proxy (the credential only in Proxy-Authorization,
// scrubbed from errors, as the probe sends it).
type HTTPStats struct {
	Timeout time.Duration
	// UpstreamCountsPort is the counter's port; 0 means
	// squid.UpstreamCountsPort of the proxy port, as providers render it.
	UpstreamCountsPort int
}

func (h HTTPStats) ReadStats(ctx context.Context, t Target) (squid.Counters, error) {
	counters, err := h.page(ctx, t, squid.StatsURL(int(t.Port), squid.StatsCounters))
	if err != nil {
		return squid.Counters{}, err
	}
	c, err := squid.ParseCounters(counters)
	if err != nil {
		return squid.Counters{}, err
	}
	clients, err := h.page(ctx, t, squid.StatsURL(int(t.Port), squid.StatsClientList))
	if err != nil {
		return squid.Counters{}, err
	}
	if c.Denied, err = squid.ParseClientList(clients); err != nil {
		return squid.Counters{}, err
	}
	return c, nil
}

func (h HTTPStats) ReadUpstream(ctx context.Context, t Target) (squid.UpstreamCounts, error) {
	port := h.UpstreamCountsPort
	if port == 0 {
		port = squid.UpstreamCountsPort(int(t.Port))
	}
	body, err := h.page(ctx, t, squid.UpstreamURL(port))
	if err != nil {
		return squid.UpstreamCounts{}, err
	}
	return squid.ParseUpstream(body)
}

// ReadUpstream reads the upstream counts with the probe's timeout.
func (p TCP) ReadUpstream(ctx context.Context, t Target) (squid.UpstreamCounts, error) {
	return HTTPStats{Timeout: p.Timeout}.ReadUpstream(ctx, t)
}

// ReadUpstream reads the upstream counts with the probe's timeout.
func (p HTTP) ReadUpstream(ctx context.Context, t Target) (squid.UpstreamCounts, error) {
	return HTTPStats{Timeout: p.Timeout}.ReadUpstream(ctx, t)
}

// ReadStats reads the counters with the probe's timeout.
func (p TCP) ReadStats(ctx context.Context, t Target) (squid.Counters, error) {
	return HTTPStats{Timeout: p.Timeout}.ReadStats(ctx, t)
}

// ReadStats reads the counters with the probe's timeout.
func (p HTTP) ReadStats(ctx context.Context, t Target) (squid.Counters, error) {
	return HTTPStats{Timeout: p.Timeout}.ReadStats(ctx, t)
}

// page GETs url through the proxy and returns the answer's body.
func (h HTTPStats) page(ctx context.Context, t Target, url string) ([]byte, error) {
	var body []byte
	res := HTTP{URL: url, Timeout: h.Timeout}.request(ctx, t, true, func(r io.Reader) {
		body, _ = io.ReadAll(io.LimitReader(r, maxStatsBody+1))
	})
	if res.Err != nil {
		return nil, res.Err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s through the proxy: status %d, want 200", url, res.StatusCode)
	}
	if len(body) > maxStatsBody {
		return nil, fmt.Errorf("GET %s through the proxy: answer longer than %d bytes", url, maxStatsBody)
	}
	return body, nil
}
