package squid

import (
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

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

func TestSquidEnforcesPolicy(t *testing.T) {
	t.Parallel()
	o := squidtest.NewOrigin(t, "127.0.0.1:0")
	op := o.Port()
	// The origin is on 127.0.0.1, which only the exception admits;
	// TestSquidDeniesLoopbackWithoutException is the same without it.
	c := loopbackConfig(op)
	c.AllowedDestinationExceptions = []string{"127.0.0.1/32"}
	squidtest.ServeDNS(t, map[string][]string{
		"origin.test":   {"127.0.0.1"},
		"mixed.test":    {"127.0.0.1", "127.0.0.2"}, // one excepted, one denied address
		"mixed6.test":   {"127.0.0.1", "fd00::1"},
		"private.test":  {"10.1.2.3"},
		"metadata.test": {"169.254.169.254"},
	})
	s := startSquid(t, c)
	target := fmt.Sprintf("http://127.0.0.1:%d/", op)

	t.Run("allowed source with credentials reaches the origin", func(t *testing.T) {
		if r := s.Request(t, client, "GET", target, goodCreds); r.Status != http.StatusNoContent {
			t.Fatalf("status %d (%s), want 204", r.Status, r.SquidError)
		}
		reqs := o.Requests()
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
			if r := s.Request(t, client, "GET", target, creds); r.Status != http.StatusProxyAuthRequired {
				t.Errorf("credentials %q: status %d, want 407", creds, r.Status)
			}
		}
	})

	t.Run("source outside the list gets 403 with or without credentials", func(t *testing.T) {
		for _, creds := range []string{goodCreds, ""} {
			r := s.Request(t, stranger, "GET", target, creds)
			if r.Status != http.StatusForbidden {
				t.Errorf("from %s (creds %v): status %d, want 403", stranger, creds != "", r.Status)
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
			r := s.Request(t, client, "GET", dst, goodCreds)
			squidtest.RequireRefusedBeforeConnecting(t, s, r, "GET", dst)
		}
		// Other spellings of a denied address: squid normalises them
		// before judging (and logs the normal form).
		for dst, logged := range map[string]string{
			fmt.Sprintf("http://[::ffff:127.0.0.2]:%d/", op): fmt.Sprintf("http://127.0.0.2:%d/", op),
			"http://2852039166/":                             "http://169.254.169.254/",
		} {
			r := s.Request(t, client, "GET", dst, goodCreds)
			squidtest.RequireRefusedBeforeConnecting(t, s, r, "GET", logged)
		}
	})

	t.Run("names are judged by every address they resolve to", func(t *testing.T) {
		if r := s.Request(t, client, "GET", fmt.Sprintf("http://origin.test:%d/", op), goodCreds); r.Status != http.StatusNoContent {
			t.Errorf("origin.test (127.0.0.1 only): %d %s, want 204", r.Status, r.SquidError)
		}
		// An exception admits an address, never a name that also has a
		// denied one: squid might connect to either.
		for _, dst := range []string{fmt.Sprintf("http://mixed.test:%d/", op), fmt.Sprintf("http://mixed6.test:%d/", op), "http://private.test/", "http://metadata.test/"} {
			squidtest.RequireRefusedBeforeConnecting(t, s, s.Request(t, client, "GET", dst, goodCreds), "GET", dst)
		}
	})

	t.Run("CONNECT only to 443", func(t *testing.T) {
		connectTarget := fmt.Sprintf("127.0.0.1:%d", op) // allowed port, but not 443
		squidtest.RequireRefusedBeforeConnecting(t, s, s.Request(t, client, "CONNECT", connectTarget, goodCreds), "CONNECT", connectTarget)
		for _, dst := range []string{"10.1.2.3:443", "169.254.169.254:443"} {
			squidtest.RequireRefusedBeforeConnecting(t, s, s.Request(t, client, "CONNECT", dst, goodCreds), "CONNECT", dst)
		}
		// 443 on the excepted address passes every rule: squid tries and
		// finds nothing listening (loopback only).
		if r := s.Request(t, client, "CONNECT", "127.0.0.1:443", goodCreds); r.Status == http.StatusForbidden || r.Status == http.StatusProxyAuthRequired {
			t.Errorf("CONNECT 127.0.0.1:443: %d %s, want the ACLs to pass", r.Status, r.SquidError)
		}
		if r := s.Request(t, client, "CONNECT", "127.0.0.1:443", ""); r.Status != http.StatusProxyAuthRequired {
			t.Errorf("CONNECT without credentials: %d, want 407", r.Status)
		}
	})

	t.Run("ports outside allowedPorts and the cache manager are refused", func(t *testing.T) {
		for _, dst := range []string{"http://127.0.0.1:25/", "http://127.0.0.1:" + strconv.Itoa(op) + "/squid-internal-mgr/info", "http://" + s.Addr + "/squid-internal-mgr/info"} {
			r := s.Request(t, client, "GET", dst, goodCreds)
			if r.Status != http.StatusForbidden {
				t.Errorf("%s: %d, want 403", dst, r.Status)
			}
			if r.Server != "squid" {
				t.Errorf("%s: Server %q, want squid without version", dst, r.Server)
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
			conn := s.Dial(t, capped)
			open = append(open, conn)
			if r := squidtest.RoundTrip(t, conn, "GET", target, goodCreds, true); r.Status != http.StatusNoContent {
				t.Fatalf("connection %d of %d: %d, want 204", i+1, maxConns, r.Status)
			}
		}
		if r := s.Request(t, capped, "GET", target, goodCreds); r.Status != http.StatusForbidden {
			t.Fatalf("connection %d: %d, want 403", maxConns+1, r.Status)
		}
		// Others are not affected, and a closed connection frees a slot.
		if r := s.Request(t, client, "GET", target, goodCreds); r.Status != http.StatusNoContent {
			t.Errorf("another client: %d, want 204", r.Status)
		}
		open[0].Close()
		open = open[1:]
		deadline := time.Now().Add(5 * time.Second)
		for {
			r := s.Request(t, capped, "GET", target, goodCreds)
			if r.Status == http.StatusNoContent {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after closing one connection: still %d", r.Status)
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
	o := squidtest.NewOrigin(t, "127.0.0.1:0")
	op := o.Port()
	s := startSquid(t, loopbackConfig(op))
	for _, dst := range []string{fmt.Sprintf("http://127.0.0.1:%d/", op), fmt.Sprintf("http://localhost:%d/", op)} {
		squidtest.RequireRefusedBeforeConnecting(t, s, s.Request(t, client, "GET", dst, goodCreds), "GET", dst)
	}
	if n := len(o.Requests()); n != 0 {
		t.Errorf("origin reached %d times", n)
	}
	// Authentication still comes first.
	if r := s.Request(t, client, "GET", fmt.Sprintf("http://localhost:%d/", op), ""); r.Status != http.StatusProxyAuthRequired {
		t.Errorf("without credentials: %d, want 407", r.Status)
	}
}

// Auth None (chosen explicitly): the source list alone decides.
func TestSquidWithoutAuthStillChecksSourceAndDestination(t *testing.T) {
	t.Parallel()
	o := squidtest.NewOrigin(t, "127.0.0.1:0")
	op := o.Port()
	s := startSquid(t, Config{
		AllowedSourceCIDRs:           []string{client + "/32"},
		Auth:                         Auth{Type: AuthNone},
		AllowedPorts:                 []int{80, op},
		AllowedDestinationExceptions: []string{"127.0.0.1/32"},
	})
	target := fmt.Sprintf("http://127.0.0.1:%d/", op)
	if r := s.Request(t, client, "GET", target, ""); r.Status != http.StatusNoContent {
		t.Errorf("allowed source: %d, want 204", r.Status)
	}
	if r := s.Request(t, stranger, "GET", target, ""); r.Status != http.StatusForbidden {
		t.Errorf("stranger: %d, want 403", r.Status)
	}
	squidtest.RequireRefusedBeforeConnecting(t, s, s.Request(t, client, "GET", "http://10.1.2.3/", ""), "GET", "http://10.1.2.3/")
	squidtest.RequireRefusedBeforeConnecting(t, s, s.Request(t, client, "CONNECT", "127.0.0.1:443", ""), "CONNECT", "127.0.0.1:443")
}

// IPv6 clients are judged by IPv6 sources, and an IPv6-only list admits no
// IPv4 client (squid keeps IPv4 as mapped IPv6 internally).
func TestSquidJudgesIPv6Clients(t *testing.T) {
	t.Parallel()
	o := squidtest.NewOrigin(t, "127.0.0.1:0")
	op := o.Port()
	s := startSquid(t, Config{
		ListenAddress:                "::", // both families; the namespace has only lo
		AllowedSourceCIDRs:           []string{"::1/128"},
		Auth:                         Auth{Type: AuthBasic, Username: testUser, Password: testPassword},
		AllowedPorts:                 []int{op},
		AllowedDestinationExceptions: []string{"127.0.0.1/32"},
	})
	target := fmt.Sprintf("http://127.0.0.1:%d/", op)
	if r := s.Request(t, "::1", "GET", target, goodCreds); r.Status != http.StatusNoContent {
		t.Errorf("from ::1: %d %s, want 204", r.Status, r.SquidError)
	}
	if r := s.Request(t, "::1", "GET", target, ""); r.Status != http.StatusProxyAuthRequired {
		t.Errorf("from ::1 without credentials: %d, want 407", r.Status)
	}
	if r := s.Request(t, client, "GET", target, goodCreds); r.Status != http.StatusForbidden {
		t.Errorf("from %s: %d, want 403", client, r.Status)
	}
}

// The rendered default list as a real squid applies it: the first and last
// address of every denied range (both sets, as the code lists them, and
// every non-global registry row, as registryRows lists them) and the other
// spellings of the metadata address and of loopback get 403 by ACL before
// squid connects. Every request goes to the origin's port, so a
// request squid let through to any loopback form (0.0.0.0 connects to the
// local host) would reach the origin, which must see none. Global
// neighbours pass the ACLs (squid then fails to connect: the namespace has
// only lo), the globally reachable registry rows among them, so the
// refusals come from the list, not from squid refusing IPv6 or everything.
func TestSquidRefusesEveryDefaultDeniedRange(t *testing.T) {
	t.Parallel()
	o := squidtest.NewOrigin(t, "127.0.0.1:0")
	op := o.Port()
	s := startSquid(t, Config{
		AllowedSourceCIDRs: []string{client + "/32"},
		Auth:               Auth{Type: AuthBasic, Username: testUser, Password: testPassword},
		AllowedPorts:       []int{80, 443, op},
	})

	var addrs, reachable []netip.Addr
	for _, p := range slices.Concat(defaultDenied, alwaysDenied) {
		addrs = append(addrs, p.Addr(), squidtest.LastAddr(p))
	}
	for _, row := range registryRows {
		p := netip.MustParsePrefix(row.block)
		if row.denied {
			addrs = append(addrs, p.Addr(), squidtest.LastAddr(p))
		} else {
			reachable = append(reachable, p.Addr(), squidtest.LastAddr(p))
		}
	}
	for _, spelling := range []string{
		"::ffff:a9fe:a9fe", "::ffff:7f00:1", // IPv4-mapped
		"::a9fe:a9fe", "::7f00:1", // IPv4-compatible
		"64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", // NAT64, RFC 6052 well-known prefix
		"64:ff9b:1::a9fe:a9fe", "64:ff9b:1::7f00:1", // NAT64, RFC 8215 local use, /96 layout
		"64:ff9b:1:a9fe:a9:fe00::", "64:ff9b:1:7f00:0:100::", // and /48 layout (RFC 6052 §2.2)
		"2002:a9fe:a9fe::1", "2002:7f00:1::1", // 6to4
		"2001:0:4136:e378:8000:63bf:5601:5601", // Teredo, client 169.254.169.254 (inverted)
		"2001:0:a9fe:a9fe:0:0:80ff:fffe",       // Teredo, server 169.254.169.254, client 127.0.0.1
	} {
		addrs = append(addrs, netip.MustParseAddr(spelling))
	}
	for i, a := range addrs {
		// squid logs some IPv6 forms its own way (::a9fe:a9fe as
		// ::169.254.169.254, :: without brackets): the path finds the line.
		path := fmt.Sprintf("/denied-%03d", i)
		dst := "http://" + netip.AddrPortFrom(a, uint16(op)).String() + path
		r := s.Request(t, client, "GET", dst, goodCreds)
		if r.Status != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", dst, r.Status, r.SquidError)
			continue
		}
		squidtest.RequireRefusedBeforeConnecting(t, s, r, "GET", path)
	}

	for _, a := range reachable {
		dst := "http://" + netip.AddrPortFrom(a, uint16(op)).String() + "/"
		if r := s.Request(t, client, "GET", dst, goodCreds); r.Status == http.StatusForbidden || r.Status == http.StatusProxyAuthRequired {
			t.Errorf("%s: %d %s, want the ACLs to pass", dst, r.Status, r.SquidError)
		}
	}
	if n := len(o.Requests()); n != 0 {
		t.Errorf("origin reached %d times", n)
	}
}

// The file of Paths.DeniedDestinationsFile, as a real squid applies it:
// what it lists is refused before squid connects, even where an exception
// lifts the default list, and squid re-reads it on reconfigure.
func TestSquidRefusesTheDeniedDestinationsFile(t *testing.T) {
	t.Parallel()
	o := squidtest.NewOrigin(t, "127.0.0.1:0")
	op := o.Port()
	c := loopbackConfig(op)
	c.AllowedDestinationExceptions = []string{"127.0.0.1/32"}
	dir := squidtest.TempDir(t)
	file := filepath.Join(dir, "denied")
	write := func(ranges ...string) {
		if err := os.WriteFile(file+".new", DeniedDestinationsFile(mustPrefixes(ranges)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".new", file); err != nil {
			t.Fatal(err)
		}
	}
	write()
	c.Paths.DeniedDestinationsFile = file
	s := startSquid(t, c)
	target := fmt.Sprintf("http://127.0.0.1:%d/", op)
	if r := s.Request(t, client, "GET", target, goodCreds); r.Status != http.StatusNoContent {
		t.Fatalf("with nothing in the file: %d %s, want 204", r.Status, r.SquidError)
	}

	write("127.0.0.1/32", "34.118.224.0/20")
	s.Reconfigure(t, filepath.Join(s.Dir, "cache.log"))
	reached := len(o.Requests())
	squidtest.RequireRefusedBeforeConnecting(t, s, s.Request(t, client, "GET", target, goodCreds), "GET", target)
	squidtest.RequireRefusedBeforeConnecting(t, s, s.Request(t, client, "CONNECT", "34.118.224.1:443", goodCreds), "CONNECT", "34.118.224.1:443")
	if n := len(o.Requests()); n != reached {
		t.Errorf("origin reached %d times after the file listed it", n-reached)
	}
	cacheLog, _ := os.ReadFile(filepath.Join(s.Dir, "cache.log"))
	if problems := squidtest.Problems(string(cacheLog)); len(problems) > 0 {
		t.Errorf("squid logged problems:\n%s", strings.Join(problems, "\n"))
	}
}
