package squid

import (
	_ "embed"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// UpstreamCounter is the program squid runs as its logfile daemon to count
// the target sites' answers by class (upstream-counter.pl, perl-base only:
// Essential on Debian and Ubuntu, started by a sh preamble that, without
// perl, says so and keeps squid running uncounted). A provider delivers
// it, executable, at Paths.UpstreamCounter. squid's cache manager cannot count them: its
// forward action never prints a row before squid 7
// (TestSquidCountsUpstreamAnswersOnlyInItsAccessLog).
//
//go:embed upstream-counter.pl
var UpstreamCounter []byte

// DefaultUpstreamCountsPort is where the counter listens on 127.0.0.1,
// unless the proxy port is that one (UpstreamCountsPort).
const DefaultUpstreamCountsPort = 3131

// UpstreamCountsPort is the counter's loopback port beside a squid on
// proxyPort (0: DefaultPort): never the proxy port itself, which squid
// binds on every address.
func UpstreamCountsPort(proxyPort int) int {
	if proxyPort == DefaultUpstreamCountsPort {
		return DefaultUpstreamCountsPort + 1
	}
	return DefaultUpstreamCountsPort
}

// CountsUpstream reports whether squid.conf runs the counter: only with a
// counter delivered and the Stats credential, the one that reads it.
func (c Config) CountsUpstream() bool {
	return c.Stats.Type == AuthBasic && c.Paths.UpstreamCounter != ""
}

// UpstreamURL is what the operator sends through the proxy (a plain GET
// with the Stats credential) to read the counter listening on countsPort.
func UpstreamURL(countsPort int) string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(countsPort)) + "/upstream"
}

func upstreamURLPattern(countsPort int) string {
	return "^" + regexp.QuoteMeta(UpstreamURL(countsPort)) + "$"
}

// UpstreamClasses are the classes the counter counts, in the order of
// UpstreamCounts. 403 and 429, the usual ban signals, are counted in 4xx
// too.
var UpstreamClasses = [...]string{"2xx", "3xx", "4xx", "5xx", "403", "429"}

// Indexes of the ban signals in UpstreamCounts.
const (
	Upstream403 = 4
	Upstream429 = 5
)

// UpstreamCounts are the answers of target sites squid forwarded, by
// class (UpstreamClasses), since the counter started: squid starts it anew
// on every start and reconfigure, unlike its own counters, which survive a
// reconfigure. Answers inside a CONNECT tunnel (HTTPS) are not among them:
// squid never sees them.
type UpstreamCounts [len(UpstreamClasses)]uint64

// Add counts one answer with status as the counter does; a status outside
// 200-599 is none.
func (u *UpstreamCounts) Add(status int) {
	if status < 200 || status > 599 {
		return
	}
	u[status/100-2]++
	switch status {
	case 403:
		u[Upstream403]++
	case 429:
		u[Upstream429]++
	}
}

// BanSignals are the 403 and 429 answers.
func (u UpstreamCounts) BanSignals() uint64 { return u[Upstream403] + u[Upstream429] }

// ParseUpstream reads the counter's answer ("upstream.<class> = <n>"
// lines). Every class must be there once, as a whole number; lines of
// other names are ignored, and anything else is refused rather than read
// as zero (an error page is not a count).
func ParseUpstream(body []byte) (UpstreamCounts, error) {
	var u UpstreamCounts
	var seen [len(UpstreamClasses)]bool
	for line := range strings.Lines(string(body)) {
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		class, ok := strings.CutPrefix(strings.TrimSpace(name), "upstream.")
		if !ok {
			continue
		}
		i := slices.Index(UpstreamClasses[:], class)
		if i < 0 {
			continue
		}
		if seen[i] {
			return UpstreamCounts{}, fmt.Errorf("upstream counts: upstream.%s twice", class)
		}
		seen[i] = true
		v, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
		if err != nil {
			return UpstreamCounts{}, fmt.Errorf("upstream counts: upstream.%s is not a count: %q", class, truncate(strings.TrimSpace(value), 32))
		}
		u[i] = v
	}
	for i, ok := range seen {
		if !ok {
			return UpstreamCounts{}, fmt.Errorf("upstream counts: no upstream.%s (not the counter's answer)", UpstreamClasses[i])
		}
	}
	return u, nil
}
