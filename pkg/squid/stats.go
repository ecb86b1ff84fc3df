package squid

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
)

// The cache manager actions the Stats credential reads: counters (the
// totals since squid started) and client_list (per client address, the
// requests by how squid handled them, TCP_DENIED among them).
const (
	StatsCounters   = "counters"
	StatsClientList = "client_list"
)

// StatsActions are the only cache manager actions squid.conf admits.
var StatsActions = []string{StatsCounters, StatsClientList}

// visibleHostname is squid.conf's visible_hostname: squid answers a URL
// naming it and its own port itself (never forwarding it anywhere).
const visibleHostname = "proxy"

// statsURLPattern matches StatsURL(port, a) for the StatsActions a only:
// pinned to squid's own name and port, since the line admitting it comes
// before the destination rules and must never admit a request squid would
// forward.
func statsURLPattern(port int) string {
	return `^http://` + visibleHostname + `:` + strconv.Itoa(port) + `/squid-internal-mgr/(` + strings.Join(StatsActions, "|") + `)$`
}

// StatsURL is what a client sends through the proxy on port (a plain GET
// with this absolute URL, to the proxy's address) to read a cache manager
// action: squid answers it itself.
func StatsURL(port int, action string) string {
	return "http://" + net.JoinHostPort(visibleHostname, strconv.Itoa(port)) + "/squid-internal-mgr/" + action
}

// Counters are a squid's traffic totals since it started, from its cache
// manager (ParseCounters, then ParseClientList for Denied).
type Counters struct {
	// Requests are the client requests squid answered, denied ones
	// included (client_http.requests).
	Requests uint64
	// Denied are the requests squid refused by its http_access rules,
	// 407 and 403 alike: TCP_DENIED in client_list, summed over clients.
	Denied uint64
	// BytesIn are received from clients, BytesOut sent to them
	// (client_http.kbytes_in and kbytes_out, so in whole KiB).
	BytesIn, BytesOut uint64
	// Upstream are the target sites' answers by class, from the counter
	// beside squid (ParseUpstream); nil when they were not read (no
	// counter there, or it did not answer).
	Upstream *UpstreamCounts
}

// counterFields are the lines of mgr:counters that Counters keeps.
var counterFields = map[string]func(*Counters, uint64){
	"client_http.requests":   func(c *Counters, v uint64) { c.Requests = v },
	"client_http.kbytes_in":  func(c *Counters, v uint64) { c.BytesIn = v * 1024 },
	"client_http.kbytes_out": func(c *Counters, v uint64) { c.BytesOut = v * 1024 },
}

// ParseCounters reads the answer of mgr:counters ("name = value" lines).
// Every field Counters keeps must be there, once, as a whole number:
// anything else is not squid's counters page (an error page, a proxy in
// between) and is refused rather than read as zero. Denied is left zero.
func ParseCounters(body []byte) (Counters, error) {
	var c Counters
	seen := map[string]bool{}
	for line := range strings.Lines(string(body)) {
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		name = strings.TrimSpace(name)
		set, kept := counterFields[name]
		if !kept {
			continue
		}
		if seen[name] {
			return Counters{}, fmt.Errorf("squid counters: %s twice", name)
		}
		seen[name] = true
		v, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
		if err != nil || v > math.MaxUint64/1024 {
			return Counters{}, fmt.Errorf("squid counters: %s is not a count: %q", name, truncate(strings.TrimSpace(value), 32))
		}
		set(&c, v)
	}
	for name := range counterFields {
		if !seen[name] {
			return Counters{}, fmt.Errorf("squid counters: no %s (not a mgr:counters answer)", name)
		}
	}
	return c, nil
}

// ParseClientList reads the answer of mgr:client_list and returns the
// requests squid denied (TCP_DENIED and its variants), summed over every
// client address. The page must start as squid's does ("Cache Clients:").
func ParseClientList(body []byte) (denied uint64, err error) {
	s := string(body)
	if !strings.HasPrefix(s, "Cache Clients:") {
		return 0, fmt.Errorf("squid client list: answer does not start with %q", "Cache Clients:")
	}
	for line := range strings.Lines(s) {
		// "            TCP_DENIED                 6  55%"
		f := strings.Fields(line)
		if len(f) != 3 || !strings.HasPrefix(f[0], "TCP_DENIED") || !strings.HasSuffix(f[2], "%") {
			continue
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("squid client list: %s count is not a number: %q", f[0], truncate(f[1], 32))
		}
		if denied+n < denied {
			return 0, fmt.Errorf("squid client list: %s count overflows", f[0])
		}
		denied += n
	}
	return denied, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
