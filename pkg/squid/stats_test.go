package squid

import (
	"strings"
	"testing"
)

// A real squid 5.7 answer (TestSquidStatsOnlyForTheOperator reads live
// ones), trimmed.
const countersPage = `sample_time = 1796479353.764668 (Sat, 05 Dec 2026 14:02:33 GMT)
client_http.requests = 9
client_http.hits = 0
client_http.errors = 6
client_http.kbytes_in = 1
client_http.kbytes_out = 22
client_http.hit_kbytes_out = 0
server.all.requests = 1
server.http.kbytes_in = 0
select_loops = 46
cpu_time = 0.103150
`

const clientListPage = `Cache Clients:
Address: 127.0.0.1
Name:    vm
Currently established connections: 1
    ICP  Requests 0
    HTTP Requests 11
        NONE_NONE                  1   9%
        TCP_MISS                   4  36%
        TCP_DENIED                 6  55%
Address: 10.0.0.7
Name:    10.0.0.7
Currently established connections: 0
    ICP  Requests 0
    HTTP Requests 3
        TCP_DENIED                 2  67%
        TCP_DENIED_REPLY           1  33%
TOTALS
ICP : 0 Queries, 0 Hits (  0%)
HTTP: 14 Requests, 0 Hits (  0%)
`

func TestParseCounters(t *testing.T) {
	for _, tc := range []struct {
		name, page string
		want       Counters
		err        string
	}{
		{name: "squid's page", page: countersPage, want: Counters{Requests: 9, BytesIn: 1024, BytesOut: 22 * 1024}},
		{name: "CRLF and spacing", page: "client_http.requests=3\r\nclient_http.kbytes_in =  0\r\nclient_http.kbytes_out= 4\r\n", want: Counters{Requests: 3, BytesOut: 4096}},
		{name: "empty", page: "", err: "no client_http."},
		{name: "an error page", page: "<html><body>Access Denied</body></html>", err: "not a mgr:counters answer"},
		{name: "one field missing", page: "client_http.requests = 1\nclient_http.kbytes_in = 1\n", err: "no client_http.kbytes_out"},
		{name: "negative", page: strings.Replace(countersPage, "requests = 9", "requests = -9", 1), err: `client_http.requests is not a count: "-9"`},
		{name: "fraction", page: strings.Replace(countersPage, "kbytes_out = 22", "kbytes_out = 2.5", 1), err: "client_http.kbytes_out is not a count"},
		{name: "KiB that overflow in bytes", page: strings.Replace(countersPage, "kbytes_in = 1", "kbytes_in = 18014398509481984", 1), err: "client_http.kbytes_in is not a count"},
		{name: "twice", page: countersPage + "client_http.requests = 10\n", err: "client_http.requests twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCounters([]byte(tc.page))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParseClientList(t *testing.T) {
	for _, tc := range []struct {
		name, page string
		want       uint64
		err        string
	}{
		{name: "denials of every client and kind", page: clientListPage, want: 9},
		{name: "no clients yet", page: "Cache Clients:\nTOTALS\nICP : 0 Queries, 0 Hits (  0%)\nHTTP: 0 Requests, 0 Hits (  0%)\n", want: 0},
		{name: "not the client list", page: countersPage, err: `does not start with "Cache Clients:"`},
		{name: "an error page", page: "<html>TCP_DENIED 5 10%</html>", err: "does not start with"},
		{name: "count not a number", page: "Cache Clients:\n        TCP_DENIED                 x  55%\n", err: `TCP_DENIED count is not a number: "x"`},
		{name: "overflow", page: "Cache Clients:\n TCP_DENIED 18446744073709551615 50%\n TCP_DENIED 1 50%\n", err: "overflows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseClientList([]byte(tc.page))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// FuzzParseStats: neither parser panics, and what ParseCounters accepts
// carries every kept field (bytes in whole KiB).
func FuzzParseStats(f *testing.F) {
	f.Add([]byte(countersPage))
	f.Add([]byte(clientListPage))
	f.Add([]byte("client_http.requests = 18446744073709551615\nclient_http.kbytes_in = 0\nclient_http.kbytes_out = 0\n"))
	f.Fuzz(func(t *testing.T, page []byte) {
		if c, err := ParseCounters(page); err == nil {
			if c.BytesIn%1024 != 0 || c.BytesOut%1024 != 0 || c.Denied != 0 {
				t.Fatalf("accepted %q as %+v", page, c)
			}
			for name := range counterFields {
				if !strings.Contains(string(page), name) {
					t.Fatalf("accepted a page without %s", name)
				}
			}
		}
		if _, err := ParseClientList(page); err == nil && !strings.HasPrefix(string(page), "Cache Clients:") {
			t.Fatalf("accepted %q as a client list", page)
		}
	})
}

func TestStatsCredentialValidation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stats Auth
		field string
	}{
		{"same user as the clients", Auth{Type: AuthBasic, Username: "crawler", Password: testPassword}, "stats.username"},
		{"short password", Auth{Type: AuthBasic, Username: "stats", Password: "short"}, "stats.password"},
		{"bad user", Auth{Type: AuthBasic, Username: "a b", Password: testPassword}, "stats.username"},
		{"type None", Auth{Type: AuthNone}, "stats.type"},
		{"credential without a type", Auth{Username: "stats", Password: testPassword}, "stats.type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConfig()
			c.Stats = tc.stats
			errs := c.ValidateFields(nil)
			if len(errs) != 1 || errs[0].Field != tc.field {
				t.Fatalf("errors %v, want one for %s", errs, tc.field)
			}
			if strings.Contains(errs.ToAggregate().Error(), testPassword) {
				t.Fatal("the password is in the error")
			}
		})
	}
	c := baseConfig()
	c.Stats = statsAuth
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestPasswordFileHoldsTheStatsUser(t *testing.T) {
	c := baseConfig()
	c.Stats = statsAuth
	users := c.PasswordUsers()
	if len(users) != 2 || users[0] != c.Auth || users[1] != c.Stats {
		t.Fatalf("users %v", users)
	}
	file, err := PasswordFile(users...)
	if err != nil {
		t.Fatal(err)
	}
	if !PasswordFileMatches(file, users...) {
		t.Error("file does not match its users")
	}
	if PasswordFileMatches(file, c.Auth) || PasswordFileMatches(file, c.Stats, c.Auth) {
		t.Error("file matches a part or another order of its users")
	}
	if _, err := PasswordFile(c.Auth, c.Auth); err == nil {
		t.Error("a user twice")
	}
	c.Auth = Auth{Type: AuthNone}
	if users := c.PasswordUsers(); len(users) != 1 || users[0] != statsAuth {
		t.Errorf("auth None: users %v, want the stats user alone", users)
	}
	c.Stats = Auth{}
	if users := c.PasswordUsers(); len(users) != 0 {
		t.Errorf("no password users expected, got %v", users)
	}
}
