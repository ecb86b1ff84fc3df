package squid

import (
	"bufio"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// squid's cache manager action forward ("Request Forwarding Statistics")
// looks like the place to count the target sites' answers by status, but
// from squid 3.2 to 6.x it skips every status whose count at try index 0
// is zero, and every forwarded reply is counted at index 1 or more: the
// table never gets a row. squid 7.0.1 works around it (squid commit
// 32218e04a5, "Work around some mgr:forward accounting/reporting bugs").
// The access log has each answer (%<Hs). This pins both, against the
// squid the operator deploys (Debian 12's 5.7): should forward start
// counting, upstream classes can come from it through the counters'
// channel (docs/known-gaps.md, "Traffic counts squid's own side only").
func TestSquidCountsUpstreamAnswersOnlyInItsAccessLog(t *testing.T) {
	t.Parallel()
	originPort := statusOrigin(t)

	dir := squidtest.TempDir(t)
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	port := testutil.FreePort(t)
	accessLog := filepath.Join(dir, "access.log")
	// The manager for loopback alone, nothing cached: every request is
	// forwarded once, and the log line says what came back from where.
	conf := fmt.Sprintf(`http_port 127.0.0.1:%d
visible_hostname %s
pid_filename %s/squid.pid
cache_log %s/cache.log
coredump_dir %s
cache deny all
logformat upstream %%rm %%>Hs %%<Hs %%ru
access_log stdio:%s upstream
http_access allow localhost manager
http_access deny manager
http_access allow localhost
http_access deny all
`, port, visibleHostname, dir, dir, dir, accessLog)
	s := squidtest.Start(t, squidtest.Options{Conf: []byte(conf), Dir: dir, Listen: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), AccessLog: accessLog})

	sent := sendAnswers(t, s, originPort, "")
	// Through CONNECT the origin's answer travels inside the tunnel.
	conn := s.Dial(t, client)
	if r := squidtest.RoundTrip(t, conn, http.MethodConnect, fmt.Sprintf("127.0.0.1:%d", originPort), "", true); r.Status != http.StatusOK {
		t.Fatalf("CONNECT: status %d", r.Status)
	}
	fmt.Fprintf(conn, "GET /429 HTTP/1.1\r\nHost: origin\r\nConnection: close\r\n\r\n")
	if r, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil || r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("GET /429 through the tunnel: %v, %v", r, err)
	}
	conn.Close()
	s.WaitForLogLine(t, "CONNECT ") // the tunnel ends when squid sees the close

	status, body := getThrough(t, s, StatsURL(port, "forward"), "")
	if status != http.StatusOK || !strings.HasPrefix(string(body), "Status\ttry#1\t") {
		t.Fatalf("mgr:forward: status %d, want 200 and squid's table:\n%s", status, body)
	}
	if rows := strings.Count(strings.TrimSpace(string(body)), "\n"); rows != 0 {
		t.Errorf("mgr:forward counts upstream answers now (%d rows after %d replies): "+
			"the classes can be read from it, see this test's comment\n%s", rows, sent, body)
	}

	// The access log holds every answer the origin gave but the one in
	// the tunnel, which squid never saw (%<Hs "-"). The manager's read
	// came last: once it is logged, so is everything before it.
	s.WaitForLogLine(t, "/squid-internal-mgr/forward")
	logged := map[string]int{}
	originAddr := fmt.Sprintf("127.0.0.1:%d", originPort)
	data, err := os.ReadFile(accessLog)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) != 4 || !strings.Contains(f[3], originAddr) {
			continue // the manager's page, squidtest's readiness check
		}
		logged[f[0]+" "+f[2]]++
	}
	want := map[string]int{"CONNECT -": 1}
	for code, n := range originAnswers {
		want[fmt.Sprintf("GET %d", code)] = n
	}
	if !maps.Equal(logged, want) {
		t.Errorf("the origin's answers in the access log (method, %%<Hs): %v, want %v\n%s", logged, want, data)
	}
}

// originAnswers are what sendAnswers asks statusOrigin for: status, times.
var originAnswers = map[int]int{200: 3, 302: 2, 403: 4, 429: 1, 503: 2}

// statusOrigin serves on 127.0.0.1 an answer of the status its path names
// (GET /429: 429), never cached; it returns its port.
func statusOrigin(t *testing.T) int {
	t.Helper()
	origin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		if err != nil {
			code = http.StatusBadRequest
		}
		if code == http.StatusFound {
			w.Header().Set("Location", "/elsewhere")
		}
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
	})}
	go func() { _ = srv.Serve(origin) }()
	t.Cleanup(func() { _ = srv.Close() })
	return origin.Addr().(*net.TCPAddr).Port
}

// sendAnswers asks statusOrigin on originPort for originAnswers through s
// with userpass, and returns how many requests it sent.
func sendAnswers(t *testing.T, s *squidtest.Squid, originPort int, userpass string) int {
	t.Helper()
	sent := 0
	for code, n := range originAnswers {
		for range n {
			if r := s.Request(t, client, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/%d", originPort, code), userpass); r.Status != code {
				t.Fatalf("GET /%d through squid: status %d", code, r.Status)
			}
			sent++
		}
	}
	return sent
}
