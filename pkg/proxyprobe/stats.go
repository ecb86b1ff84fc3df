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
// client_list some 300 bytes per client address.
const maxStatsBody = 1 << 20

// StatsReader reads a managed squid's traffic counters through its port,
// with the target's credential being the operator's Stats one
// (squid.Config.Stats), never the clients'.
type StatsReader interface {
	ReadStats(ctx context.Context, t Target) (squid.Counters, error)
}

// HTTPStats reads squid.StatsCounters and squid.StatsClientList as plain
// GETs through the proxy (the credential only in Proxy-Authorization,
// scrubbed from errors, as the probe sends it).
type HTTPStats struct {
	Timeout time.Duration
}

func (h HTTPStats) ReadStats(ctx context.Context, t Target) (squid.Counters, error) {
	counters, err := h.page(ctx, t, squid.StatsCounters)
	if err != nil {
		return squid.Counters{}, err
	}
	c, err := squid.ParseCounters(counters)
	if err != nil {
		return squid.Counters{}, err
	}
	clients, err := h.page(ctx, t, squid.StatsClientList)
	if err != nil {
		return squid.Counters{}, err
	}
	if c.Denied, err = squid.ParseClientList(clients); err != nil {
		return squid.Counters{}, err
	}
	return c, nil
}

// ReadStats reads the counters with the probe's timeout.
func (p TCP) ReadStats(ctx context.Context, t Target) (squid.Counters, error) {
	return HTTPStats{Timeout: p.Timeout}.ReadStats(ctx, t)
}

// ReadStats reads the counters with the probe's timeout.
func (p HTTP) ReadStats(ctx context.Context, t Target) (squid.Counters, error) {
	return HTTPStats{Timeout: p.Timeout}.ReadStats(ctx, t)
}

func (h HTTPStats) page(ctx context.Context, t Target, action string) ([]byte, error) {
	var body []byte
	url := squid.StatsURL(int(t.Port), action)
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
