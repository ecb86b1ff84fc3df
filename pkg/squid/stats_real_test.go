package squid

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"

	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

var statsAuth = Auth{Type: AuthBasic, Username: "proxy-operator-stats", Password: testPassword + "-stats"}

var statsCreds = statsAuth.Username + ":" + statsAuth.Password

// getThrough sends GET target through s from client, as the operator reads
// the counters (an absolute URL naming squid itself), and returns the
// status and the body.
func getThrough(t *testing.T, s *squidtest.Squid, target, userpass string) (int, []byte) {
	t.Helper()
	r := s.Request(t, client, http.MethodGet, target, userpass)
	return r.Status, r.Body
}

func squidPort(t *testing.T, s *squidtest.Squid) int {
	_, portText, _ := net.SplitHostPort(s.Addr)
	port, err := strconv.Atoi(portText)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// readCounters reads both stats actions with the operator's credential.
func readCounters(t *testing.T, s *squidtest.Squid) Counters {
	t.Helper()
	port := squidPort(t, s)
	status, body := getThrough(t, s, StatsURL(port, StatsCounters), statsCreds)
	if status != http.StatusOK {
		t.Fatalf("counters with the operator's credential: status %d, want 200", status)
	}
	c, err := ParseCounters(body)
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	status, body = getThrough(t, s, StatsURL(port, StatsClientList), statsCreds)
	if status != http.StatusOK {
		t.Fatalf("client_list with the operator's credential: status %d, want 200", status)
	}
	if c.Denied, err = ParseClientList(body); err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	return c
}

func TestSquidStatsOnlyForTheOperator(t *testing.T) {
	t.Parallel()
	o := squidtest.NewOrigin(t, "127.0.0.1:0")
	c := loopbackConfig(o.Port())
	c.AllowedDestinationExceptions = []string{"127.0.0.1/32"}
	c.Stats = statsAuth
	s := startSquid(t, c)
	port := squidPort(t, s)
	origin := fmt.Sprintf("http://127.0.0.1:%d/", o.Port())

	t.Run("only the operator's credential reads the counters", func(t *testing.T) {
		for _, action := range StatsActions {
			for _, tc := range []struct {
				who, creds string
				want       int
			}{
				{"crawler", goodCreds, http.StatusForbidden},
				{"no credential", "", http.StatusProxyAuthRequired},
				{"wrong password", statsAuth.Username + ":" + testPassword, http.StatusProxyAuthRequired},
				{"operator", statsCreds, http.StatusOK},
			} {
				if status, _ := getThrough(t, s, StatsURL(port, action), tc.creds); status != tc.want {
					t.Errorf("%s reading %s: status %d, want %d", tc.who, action, status, tc.want)
				}
			}
		}
	})

	t.Run("the operator's credential reads nothing else", func(t *testing.T) {
		for _, target := range []string{
			StatsURL(port, "menu"), StatsURL(port, "shutdown"), StatsURL(port, "config"),
			// squid's own pages under another name or port would be
			// forwarded, to loopback or a private address: never.
			fmt.Sprintf("http://127.0.0.1:%d/squid-internal-mgr/counters", port),
			"http://10.1.2.3/squid-internal-mgr/counters",
			fmt.Sprintf("http://127.0.0.1:%d/squid-internal-mgr/counters", o.Port()),
		} {
			if status, _ := getThrough(t, s, target, statsCreds); status == http.StatusOK {
				t.Errorf("%s: status 200 for the operator's credential", target)
			}
		}
		if status, _ := getThrough(t, s, origin, statsCreds); status != http.StatusProxyAuthRequired {
			t.Errorf("the operator's credential as a client: status %d, want 407", status)
		}
		if n := len(o.Requests()); n != 0 {
			t.Errorf("%d requests reached the origin", n)
		}
	})

	t.Run("counts move with real requests", func(t *testing.T) {
		before := readCounters(t, s)
		const served, unauthenticated, refused = 5, 3, 2
		for range served {
			if r := s.Request(t, client, "GET", origin, goodCreds); r.Status != http.StatusNoContent {
				t.Fatalf("status %d, want 204", r.Status)
			}
		}
		for range unauthenticated {
			if r := s.Request(t, client, "GET", origin, ""); r.Status != http.StatusProxyAuthRequired {
				t.Fatalf("status %d, want 407", r.Status)
			}
		}
		for range refused {
			if r := s.Request(t, client, "GET", "http://10.1.2.3/", goodCreds); r.Status != http.StatusForbidden {
				t.Fatalf("status %d, want 403", r.Status)
			}
		}
		after := readCounters(t, s)
		// The two reads of before count too: the counters page is taken
		// before its own request ends, the client list after it.
		if got, want := after.Requests-before.Requests, uint64(served+unauthenticated+refused+2); got != want {
			t.Errorf("requests moved by %d, want %d", got, want)
		}
		if got, want := after.Denied-before.Denied, uint64(unauthenticated+refused); got != want {
			t.Errorf("denials moved by %d, want %d", got, want)
		}
		// Each refusal is an error page of some 3 KiB.
		if after.BytesOut-before.BytesOut < 1024*(unauthenticated+refused) {
			t.Errorf("bytes out moved by %d, want at least %d", after.BytesOut-before.BytesOut, 1024*(unauthenticated+refused))
		}
	})
}

// With auth None only the source list guards the proxy; the counters still
// take the operator's credential.
func TestSquidStatsWithoutClientAuth(t *testing.T) {
	t.Parallel()
	o := squidtest.NewOrigin(t, "127.0.0.1:0")
	c := loopbackConfig(o.Port())
	c.Auth = Auth{Type: AuthNone}
	c.AllowedDestinationExceptions = []string{"127.0.0.1/32"}
	c.Stats = statsAuth
	s := startSquid(t, c)
	port := squidPort(t, s)
	if r := s.Request(t, client, "GET", fmt.Sprintf("http://127.0.0.1:%d/", o.Port()), ""); r.Status != http.StatusNoContent {
		t.Fatalf("client without credentials: status %d, want 204", r.Status)
	}
	if status, _ := getThrough(t, s, StatsURL(port, StatsCounters), ""); status != http.StatusProxyAuthRequired {
		t.Errorf("counters without a credential: status %d, want 407", status)
	}
	if c := readCounters(t, s); c.Requests == 0 {
		t.Error("no request counted")
	}
	if r := s.Request(t, stranger, "GET", StatsURL(port, StatsCounters), statsCreds); r.Status != http.StatusForbidden {
		t.Errorf("the operator's credential from outside the source list: status %d, want 403", r.Status)
	}
}
