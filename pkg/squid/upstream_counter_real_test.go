package squid

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// upstreamCounterFile writes UpstreamCounter where squid's user can run
// it, as a provider delivers it.
func upstreamCounterFile(t *testing.T) string {
	t.Helper()
	dir := squidtest.TempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "upstream-counter")
	if err := os.WriteFile(path, UpstreamCounter, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// readUpstream reads the counter through s with the operator's
// credential until it answers what want says (squid hands log lines to
// the daemon in batches) or 10 s pass; it returns the last counts read.
func readUpstream(t *testing.T, s *squidtest.Squid, countsPort int, want func(UpstreamCounts) bool) UpstreamCounts {
	t.Helper()
	var u UpstreamCounts
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, body := getThrough(t, s, UpstreamURL(countsPort), statsCreds)
		var err error
		if status == http.StatusOK {
			if u, err = ParseUpstream(body); err != nil {
				t.Fatalf("%v\n%s", err, body)
			}
			if want(u) {
				return u
			}
		}
		if time.Now().After(deadline) {
			t.Logf("counter's last answer: status %d\n%s", status, body)
			return u
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startCountingSquid runs the rendered squid.conf with the counter, for
// clients on 127.0.0.1 of a statusOrigin there, on its own counts port.
func startCountingSquid(t *testing.T) (*squidtest.Squid, Config, int) {
	t.Helper()
	originPort := statusOrigin(t)
	c := loopbackConfig(originPort)
	c.AllowedDestinationExceptions = []string{"127.0.0.1/32"}
	c.Stats = statsAuth
	c.Paths.UpstreamCounter = upstreamCounterFile(t)
	c.UpstreamCountsPort = testutil.FreePort(t)
	return startSquid(t, c), c, originPort
}

// The rendered squid.conf with the counter: the target sites' answers are
// counted exactly by class, squid's own answers (407, 403 for a refused
// destination) and the counter's reads are not, only the operator's
// credential reads the counts, and the access log still gets every line.
func TestSquidCountsUpstreamAnswersByClass(t *testing.T) {
	t.Parallel()
	s, c, originPort := startCountingSquid(t)

	// Squid's own refusals: no credential, a denied destination.
	if r := s.Request(t, client, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/200", originPort), ""); r.Status != http.StatusProxyAuthRequired {
		t.Fatalf("without a credential: status %d, want 407", r.Status)
	}
	if r := s.Request(t, client, http.MethodGet, fmt.Sprintf("http://127.0.0.2:%d/200", originPort), goodCreds); r.Status != http.StatusForbidden {
		t.Fatalf("to a denied destination: status %d, want 403", r.Status)
	}
	sendAnswers(t, s, originPort, goodCreds)
	var want UpstreamCounts
	for code, n := range originAnswers {
		for range n {
			want.Add(code)
		}
	}
	if want != (UpstreamCounts{3, 2, 5, 2, 4, 1}) {
		t.Fatalf("UpstreamCounts.Add: %v for %v", want, originAnswers)
	}
	got := readUpstream(t, s, c.UpstreamCountsPort, func(u UpstreamCounts) bool { return u == want })
	if got != want {
		t.Fatalf("upstream counts %v, want %v (classes %v)", got, want, UpstreamClasses)
	}
	// Reading again changes nothing: the reads are not counted.
	if again := readUpstream(t, s, c.UpstreamCountsPort, func(UpstreamCounts) bool { return true }); again != want {
		t.Errorf("after reading: %v, want %v", again, want)
	}
	s.WaitForLogLine(t, fmt.Sprintf("http://127.0.0.1:%d/503", originPort))

	for _, tc := range []struct {
		who, creds string
		want       int
	}{
		{"crawler", goodCreds, http.StatusForbidden},
		{"no credential", "", http.StatusProxyAuthRequired},
	} {
		if status, body := getThrough(t, s, UpstreamURL(c.UpstreamCountsPort), tc.creds); status != tc.want || strings.Contains(string(body), "upstream.") {
			t.Errorf("%s reading the upstream counts: status %d, want %d\n%s", tc.who, status, tc.want, body)
		}
	}

	// A reconfigure starts the counter again; squid's own counters go on.
	before := readCounters(t, s)
	s.Reconfigure(t, filepath.Join(s.Dir, "cache.log"))
	if got := readUpstream(t, s, c.UpstreamCountsPort, func(u UpstreamCounts) bool { return u == UpstreamCounts{} }); got != (UpstreamCounts{}) {
		t.Errorf("after a reconfigure: %v, want zeros", got)
	}
	if after := readCounters(t, s); after.Requests < before.Requests {
		t.Errorf("squid's requests after a reconfigure: %d, before %d", after.Requests, before.Requests)
	}
}

// A connection that closes before its request (a TCP health check: the
// kubelet's probes of a kubernetes pod every few seconds, a load
// balancer's) is logged with no request, where the counter's url_regex
// cannot be evaluated: squid must not warn about it at each one, nor count
// it.
func TestUpstreamCounterSkipsConnectionsWithoutARequest(t *testing.T) {
	t.Parallel()
	s, c, originPort := startCountingSquid(t)

	for range 3 {
		s.Dial(t, "127.0.0.1").Close()
	}
	s.WaitForLogLine(t, "error:transaction-end-before-headers")
	if r := s.Request(t, client, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/204", originPort), goodCreds); r.Status != http.StatusNoContent {
		t.Fatalf("status %d, want 204", r.Status)
	}
	want := UpstreamCounts{1, 0, 0, 0, 0, 0}
	if got := readUpstream(t, s, c.UpstreamCountsPort, func(u UpstreamCounts) bool { return u == want }); got != want {
		t.Errorf("upstream counts %v, want %v", got, want)
	}
	cacheLog, err := os.ReadFile(filepath.Join(s.Dir, "cache.log"))
	if err != nil {
		t.Fatal(err)
	}
	if problems := squidtest.Problems(string(cacheLog)); len(problems) > 0 {
		t.Errorf("squid logged problems:\n%s", strings.Join(problems, "\n"))
	}
}
