package squid

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// origin is a local server that answers 204 and remembers what reached it.
type origin struct {
	*httptest.Server
	mu      sync.Mutex
	headers []http.Header
}

func newOrigin(t *testing.T) *origin {
	o := &origin{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.headers = append(o.headers, r.Header.Clone())
		o.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(o.Close)
	return o
}

func (o *origin) requests() []http.Header {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]http.Header(nil), o.headers...)
}

func (o *origin) port(t *testing.T) int {
	u, _ := url.Parse(o.URL)
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	client   = "127.0.0.1" // allowed
	stranger = "127.0.0.2" // not in allowedSourceCIDRs
	capped   = "127.0.0.3" // allowed; used only by the connection-cap test
	// Mixed case on purpose: squid lowercases user names unless told not to.
	testUser = "Crawler"
	maxConns = 3
)

var goodCreds = testUser + ":" + testPassword

// loopbackConfig admits client and capped with Basic auth; the origin's
// port is allowed as well as 80 and 443.
func loopbackConfig(originPort int) Config {
	return Config{
		AllowedSourceCIDRs:      []string{capped + "/32", client + "/32"},
		Auth:                    Auth{Type: AuthBasic, Username: testUser, Password: testPassword},
		AllowedPorts:            []int{80, 443, originPort},
		ExtraDeniedDestinations: []string{"10.1.0.0/16"}, // nested in 10/8: must not shrink it
		MaxConnectionsPerClient: maxConns,
	}
}

// requireRefusedBeforeConnecting checks that squid denied by ACL (not by a
// failed connection) and forwarded nothing: its log says HIER_NONE.
func requireRefusedBeforeConnecting(t *testing.T, s *runningSquid, r proxyResponse, method, target string) {
	t.Helper()
	if r.status != http.StatusForbidden || !strings.HasPrefix(r.squidError, "ERR_ACCESS_DENIED") {
		t.Errorf("%s %s: %d %q, want 403 ERR_ACCESS_DENIED", method, target, r.status, r.squidError)
		return
	}
	logTarget := strings.TrimPrefix(target, "http://")
	line := s.waitForLogLine(t, "TCP_DENIED/403", method, logTarget)
	if !strings.Contains(line, "HIER_NONE/-") {
		t.Errorf("%s %s: squid forwarded it: %s", method, target, line)
	}
}

func TestSquidEnforcesPolicy(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)
	op := o.port(t)
	// The origin is on 127.0.0.1, which only the exception admits;
	// TestSquidDeniesLoopbackWithoutException is the same without it.
	c := loopbackConfig(op)
	c.AllowedDestinationExceptions = []string{"127.0.0.1/32"}
	serveDNS(t, map[string][]string{
		"origin.test":   {"127.0.0.1"},
		"mixed.test":    {"127.0.0.1", "127.0.0.2"}, // one excepted, one denied address
		"mixed6.test":   {"127.0.0.1", "fd00::1"},
		"private.test":  {"10.1.2.3"},
		"metadata.test": {"169.254.169.254"},
	})
	s := startSquid(t, c)
	target := fmt.Sprintf("http://127.0.0.1:%d/", op)

	t.Run("allowed source with credentials reaches the origin", func(t *testing.T) {
		if r := s.request(t, client, "GET", target, goodCreds); r.status != http.StatusNoContent {
			t.Fatalf("status %d (%s), want 204", r.status, r.squidError)
		}
		reqs := o.requests()
		if len(reqs) == 0 {
			t.Fatal("nothing reached the origin")
		}
		for _, h := range reqs {
			for _, name := range []string{"Via", "X-Forwarded-For", "Forwarded", "Proxy-Authorization", "X-Squid-Error"} {
				if v := h.Values(name); len(v) > 0 {
					t.Errorf("origin received %s: %q", name, v)
				}
			}
		}
	})

	t.Run("missing or wrong credentials get 407", func(t *testing.T) {
		for _, creds := range []string{"", testUser + ":wrong-password-wrong-password", "crawler:" + testPassword, "nobody:" + testPassword} {
			if r := s.request(t, client, "GET", target, creds); r.status != http.StatusProxyAuthRequired {
				t.Errorf("credentials %q: status %d, want 407", creds, r.status)
			}
		}
	})

	t.Run("source outside the list gets 403 with or without credentials", func(t *testing.T) {
		for _, creds := range []string{goodCreds, ""} {
			r := s.request(t, stranger, "GET", target, creds)
			if r.status != http.StatusForbidden {
				t.Errorf("from %s (creds %v): status %d, want 403", stranger, creds != "", r.status)
			}
		}
	})

	t.Run("denied destinations are refused before connecting", func(t *testing.T) {
		for _, dst := range []string{
			fmt.Sprintf("http://127.0.0.2:%d/", op), // loopback beside the exception
			"http://169.254.169.254/latest/meta-data/",
			"http://10.1.2.3/", "http://10.200.0.1/", "http://172.16.0.1/", "http://192.168.1.1/",
			"http://100.64.0.1/", "http://0.0.0.0/", "http://[fd00::1]/", "http://[fe80::1]/", fmt.Sprintf("http://[::1]:%d/", op),
		} {
			r := s.request(t, client, "GET", dst, goodCreds)
			requireRefusedBeforeConnecting(t, s, r, "GET", dst)
		}
		// Other spellings of a denied address: squid normalises them
		// before judging (and logs the normal form).
		for dst, logged := range map[string]string{
			fmt.Sprintf("http://[::ffff:127.0.0.2]:%d/", op): fmt.Sprintf("http://127.0.0.2:%d/", op),
			"http://2852039166/":                             "http://169.254.169.254/",
		} {
			r := s.request(t, client, "GET", dst, goodCreds)
			requireRefusedBeforeConnecting(t, s, r, "GET", logged)
		}
	})

	t.Run("names are judged by every address they resolve to", func(t *testing.T) {
		if r := s.request(t, client, "GET", fmt.Sprintf("http://origin.test:%d/", op), goodCreds); r.status != http.StatusNoContent {
			t.Errorf("origin.test (127.0.0.1 only): %d %s, want 204", r.status, r.squidError)
		}
		// An exception admits an address, never a name that also has a
		// denied one: squid might connect to either.
		for _, dst := range []string{fmt.Sprintf("http://mixed.test:%d/", op), fmt.Sprintf("http://mixed6.test:%d/", op), "http://private.test/", "http://metadata.test/"} {
			requireRefusedBeforeConnecting(t, s, s.request(t, client, "GET", dst, goodCreds), "GET", dst)
		}
	})

	t.Run("CONNECT only to 443", func(t *testing.T) {
		connectTarget := fmt.Sprintf("127.0.0.1:%d", op) // allowed port, but not 443
		requireRefusedBeforeConnecting(t, s, s.request(t, client, "CONNECT", connectTarget, goodCreds), "CONNECT", connectTarget)
		for _, dst := range []string{"10.1.2.3:443", "169.254.169.254:443"} {
			requireRefusedBeforeConnecting(t, s, s.request(t, client, "CONNECT", dst, goodCreds), "CONNECT", dst)
		}
		// 443 on the excepted address passes every rule: squid tries and
		// finds nothing listening (loopback only).
		if r := s.request(t, client, "CONNECT", "127.0.0.1:443", goodCreds); r.status == http.StatusForbidden || r.status == http.StatusProxyAuthRequired {
			t.Errorf("CONNECT 127.0.0.1:443: %d %s, want the ACLs to pass", r.status, r.squidError)
		}
		if r := s.request(t, client, "CONNECT", "127.0.0.1:443", ""); r.status != http.StatusProxyAuthRequired {
			t.Errorf("CONNECT without credentials: %d, want 407", r.status)
		}
	})

	t.Run("ports outside allowedPorts and the cache manager are refused", func(t *testing.T) {
		for _, dst := range []string{"http://127.0.0.1:25/", "http://127.0.0.1:" + strconv.Itoa(op) + "/squid-internal-mgr/info", "http://" + s.addr + "/squid-internal-mgr/info"} {
			r := s.request(t, client, "GET", dst, goodCreds)
			if r.status != http.StatusForbidden {
				t.Errorf("%s: %d, want 403", dst, r.status)
			}
			if r.server != "squid" {
				t.Errorf("%s: Server %q, want squid without version", dst, r.server)
			}
		}
	})

	t.Run("connection cap refuses the next connection from one client", func(t *testing.T) {
		var open []interface{ Close() error }
		defer func() {
			for _, c := range open {
				c.Close()
			}
		}()
		for i := range maxConns {
			conn := s.dial(t, capped)
			open = append(open, conn)
			if r := roundTrip(t, conn, "GET", target, goodCreds, true); r.status != http.StatusNoContent {
				t.Fatalf("connection %d of %d: %d, want 204", i+1, maxConns, r.status)
			}
		}
		if r := s.request(t, capped, "GET", target, goodCreds); r.status != http.StatusForbidden {
			t.Fatalf("connection %d: %d, want 403", maxConns+1, r.status)
		}
		// Others are not affected, and a closed connection frees a slot.
		if r := s.request(t, client, "GET", target, goodCreds); r.status != http.StatusNoContent {
			t.Errorf("another client: %d, want 204", r.status)
		}
		open[0].Close()
		open = open[1:]
		deadline := time.Now().Add(5 * time.Second)
		for {
			r := s.request(t, capped, "GET", target, goodCreds)
			if r.status == http.StatusNoContent {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after closing one connection: still %d", r.status)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// Without the exception, the request that TestSquidEnforcesPolicy sees
// answered is refused: the exception is what admits it. A name resolving to
// loopback is refused as well (dst ACLs resolve names; localhost comes from
// /etc/hosts, so no DNS server is involved).
func TestSquidDeniesLoopbackWithoutException(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)
	op := o.port(t)
	s := startSquid(t, loopbackConfig(op))
	for _, dst := range []string{fmt.Sprintf("http://127.0.0.1:%d/", op), fmt.Sprintf("http://localhost:%d/", op)} {
		requireRefusedBeforeConnecting(t, s, s.request(t, client, "GET", dst, goodCreds), "GET", dst)
	}
	if n := len(o.requests()); n != 0 {
		t.Errorf("origin reached %d times", n)
	}
	// Authentication still comes first.
	if r := s.request(t, client, "GET", fmt.Sprintf("http://localhost:%d/", op), ""); r.status != http.StatusProxyAuthRequired {
		t.Errorf("without credentials: %d, want 407", r.status)
	}
}

// Auth None (chosen explicitly): the source list alone decides.
func TestSquidWithoutAuthStillChecksSourceAndDestination(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)
	op := o.port(t)
	s := startSquid(t, Config{
		AllowedSourceCIDRs:           []string{client + "/32"},
		Auth:                         Auth{Type: AuthNone},
		AllowedPorts:                 []int{80, op},
		AllowedDestinationExceptions: []string{"127.0.0.1/32"},
	})
	target := fmt.Sprintf("http://127.0.0.1:%d/", op)
	if r := s.request(t, client, "GET", target, ""); r.status != http.StatusNoContent {
		t.Errorf("allowed source: %d, want 204", r.status)
	}
	if r := s.request(t, stranger, "GET", target, ""); r.status != http.StatusForbidden {
		t.Errorf("stranger: %d, want 403", r.status)
	}
	requireRefusedBeforeConnecting(t, s, s.request(t, client, "GET", "http://10.1.2.3/", ""), "GET", "http://10.1.2.3/")
	requireRefusedBeforeConnecting(t, s, s.request(t, client, "CONNECT", "127.0.0.1:443", ""), "CONNECT", "127.0.0.1:443")
}

// IPv6 clients are judged by IPv6 sources, and an IPv6-only list admits no
// IPv4 client (squid keeps IPv4 as mapped IPv6 internally).
func TestSquidJudgesIPv6Clients(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)
	op := o.port(t)
	s := startSquid(t, Config{
		ListenAddress:                "::", // both families; the namespace has only lo
		AllowedSourceCIDRs:           []string{"::1/128"},
		Auth:                         Auth{Type: AuthBasic, Username: testUser, Password: testPassword},
		AllowedPorts:                 []int{op},
		AllowedDestinationExceptions: []string{"127.0.0.1/32"},
	})
	target := fmt.Sprintf("http://127.0.0.1:%d/", op)
	if r := s.request(t, "::1", "GET", target, goodCreds); r.status != http.StatusNoContent {
		t.Errorf("from ::1: %d %s, want 204", r.status, r.squidError)
	}
	if r := s.request(t, "::1", "GET", target, ""); r.status != http.StatusProxyAuthRequired {
		t.Errorf("from ::1 without credentials: %d, want 407", r.status)
	}
	if r := s.request(t, client, "GET", target, goodCreds); r.status != http.StatusForbidden {
		t.Errorf("from %s: %d, want 403", client, r.status)
	}
}
