package squid

import (
	"bytes"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

const testPassword = "correct-horse-battery-staple-42"

// baseConfig is valid; tests change one thing at a time.
func baseConfig() Config {
	return Config{
		AllowedSourceCIDRs: []string{"192.0.2.0/24"},
		Auth:               Auth{Type: AuthBasic, Username: "crawler", Password: testPassword},
	}
}

func TestValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		field  string
	}{
		{"no sources", func(c *Config) { c.AllowedSourceCIDRs = nil }, "allowedSourceCIDRs"},
		{"source not a CIDR", func(c *Config) { c.AllowedSourceCIDRs = []string{"192.0.2.1"} }, "allowedSourceCIDRs[0]"},
		{"source with host bits", func(c *Config) { c.AllowedSourceCIDRs = []string{"192.0.2.0/24", "10.0.0.1/8"} }, "allowedSourceCIDRs[1]"},
		{"source IPv4-mapped", func(c *Config) { c.AllowedSourceCIDRs = []string{"::ffff:10.0.0.0/104"} }, "allowedSourceCIDRs[0]"},
		{"source ::/0 covers the mapped range", func(c *Config) { c.AllowedSourceCIDRs = []string{"::/0"} }, "allowedSourceCIDRs[0]"},
		{"auth type missing", func(c *Config) { c.Auth = Auth{} }, "auth.type"},
		{"auth type unknown", func(c *Config) { c.Auth.Type = "Digest" }, "auth.type"},
		{"no username", func(c *Config) { c.Auth.Username = "" }, "auth.username"},
		{"username with colon", func(c *Config) { c.Auth.Username = "a:b" }, "auth.username"},
		{"no password", func(c *Config) { c.Auth.Password = "" }, "auth.password"},
		{"short password", func(c *Config) { c.Auth.Password = "short" }, "auth.password"},
		{"password beyond bcrypt's 72 bytes", func(c *Config) { c.Auth.Password = strings.Repeat("x", 73) }, "auth.password"},
		{"password with newline", func(c *Config) { c.Auth.Password = testPassword + "\n" }, "auth.password"},
		{"None with credentials", func(c *Config) { c.Auth = Auth{Type: AuthNone, Username: "crawler"} }, "auth"},
		{"None with a wide IPv4 source", func(c *Config) {
			c.Auth = Auth{Type: AuthNone}
			c.AllowedSourceCIDRs = []string{"192.0.2.0/24", "10.0.0.0/8"}
		}, "allowedSourceCIDRs[1]"},
		{"None with a wide IPv6 source", func(c *Config) {
			c.Auth = Auth{Type: AuthNone}
			c.AllowedSourceCIDRs = []string{"2001:db8::/32"}
		}, "allowedSourceCIDRs[0]"},
		{"port zero", func(c *Config) { c.AllowedPorts = []int{80, 0} }, "allowedPorts[1]"},
		{"port too big", func(c *Config) { c.AllowedPorts = []int{65536} }, "allowedPorts[0]"},
		{"extra denied not a CIDR", func(c *Config) { c.ExtraDeniedDestinations = []string{"cluster"} }, "extraDeniedDestinations[0]"},
		{"exception outside the default list", func(c *Config) { c.AllowedDestinationExceptions = []string{"8.8.8.0/24"} }, "allowedDestinationExceptions[0]"},
		{"exception in a range no exception lifts", func(c *Config) { c.AllowedDestinationExceptions = []string{"64:ff9b::a9fe:a9fe/128"} }, "allowedDestinationExceptions[0]"},
		{"exception spanning the whole space", func(c *Config) { c.AllowedDestinationExceptions = []string{"0.0.0.0/0"} }, "allowedDestinationExceptions[0]"},
		{"exception overlapping extra denied", func(c *Config) {
			c.ExtraDeniedDestinations = []string{"10.96.0.0/12"}
			c.AllowedDestinationExceptions = []string{"10.96.0.10/32"}
		}, "allowedDestinationExceptions[0]"},
		{"negative connection cap", func(c *Config) { c.MaxConnectionsPerClient = -1 }, "maxConnectionsPerClient"},
		{"listen address not an IP", func(c *Config) { c.ListenAddress = "proxy.example" }, "listenAddress"},
		{"listen address with zone", func(c *Config) { c.ListenAddress = "fe80::1%eth0" }, "listenAddress"},
		{"port out of range", func(c *Config) { c.Port = 70000 }, "port"},
		{"relative password file", func(c *Config) { c.Paths.PasswordFile = "passwd" }, "paths.passwordFile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConfig()
			tc.change(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			if !strings.Contains(err.Error(), tc.field+":") {
				t.Errorf("error does not name %s: %v", tc.field, err)
			}
			if _, rerr := Render(c); rerr == nil {
				t.Error("Render accepted what Validate refuses")
			}
		})
	}
}

func TestValidateAcceptsExplicitNoneWithNarrowSources(t *testing.T) {
	c := Config{AllowedSourceCIDRs: []string{"192.0.2.0/24", "2001:db8::/64"}, Auth: Auth{Type: AuthNone}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// BroadSourcesWithoutAuth is a provider's switch for its built-in policy
// (the cluster's private ranges, no auth): it lifts the /24 limit of auth
// None and nothing else.
func TestBroadSourcesWithoutAuth(t *testing.T) {
	broad := Config{AllowedSourceCIDRs: []string{"10.0.0.0/8", "fc00::/7"}, Auth: Auth{Type: AuthNone}}
	if err := broad.Validate(); err == nil || !strings.Contains(err.Error(), "allowedSourceCIDRs[0]") {
		t.Errorf("auth None with 10.0.0.0/8 and without the switch: %v, want refused", err)
	}
	broad.BroadSourcesWithoutAuth = true
	if err := broad.Validate(); err != nil {
		t.Errorf("with the switch: %v", err)
	}
	basic := baseConfig()
	basic.BroadSourcesWithoutAuth = true
	if err := basic.Validate(); err == nil || !strings.Contains(err.Error(), "broadSourcesWithoutAuth") {
		t.Errorf("the switch with Basic: %v, want refused", err)
	}
}

// A user string must never end a squid.conf token or line: each of these
// would add a directive or comment out the rest of a rule if rendered.
func TestValidateRejectsConfigInjection(t *testing.T) {
	for _, bad := range []string{
		"crawler\nhttp_access allow all", "crawler http_access", "crawler#", "crawler\t", "crawler\r", "%h", "\"crawler\"",
	} {
		for name, change := range map[string]func(*Config){
			"auth.username":                   func(c *Config) { c.Auth.Username = bad },
			"allowedSourceCIDRs[0]":           func(c *Config) { c.AllowedSourceCIDRs = []string{"10.0.0.0/8" + bad} },
			"extraDeniedDestinations[0]":      func(c *Config) { c.ExtraDeniedDestinations = []string{"10.0.0.0/8" + bad} },
			"allowedDestinationExceptions[0]": func(c *Config) { c.AllowedDestinationExceptions = []string{"10.0.0.1/32" + bad} },
			"listenAddress":                   func(c *Config) { c.ListenAddress = "127.0.0.1" + bad },
			"paths.passwordFile":              func(c *Config) { c.Paths.PasswordFile = "/etc/squid/passwd" + bad },
			"paths.accessLog":                 func(c *Config) { c.Paths.AccessLog = "/var/log/squid/access.log" + bad },
			"paths.deniedDestinationsFile":    func(c *Config) { c.Paths.DeniedDestinationsFile = "/etc/squid/conf/denied" + bad },
		} {
			c := baseConfig()
			change(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), name+":") {
				t.Errorf("%s = %q: want an error naming %s, got %v", name, bad, name, err)
			}
		}
	}
}

func TestValidateNeverEchoesThePassword(t *testing.T) {
	for _, pw := range []string{"tooshort-secret", testPassword + "\x01", strings.Repeat("secret", 13)} {
		c := baseConfig()
		c.Auth.Password = pw
		errs := c.ValidateFields(nil)
		if len(errs) == 0 {
			t.Fatalf("password %q accepted", pw)
		}
		for _, e := range errs {
			if strings.Contains(e.Error(), "secret") || strings.Contains(e.Error(), testPassword) || e.BadValue == pw {
				t.Errorf("error reveals the password: %v (value %q)", e, e.BadValue)
			}
		}
	}
}

func TestRenderIsDeterministicAndHidesThePassword(t *testing.T) {
	c := baseConfig()
	c.AllowedSourceCIDRs = []string{"198.51.100.0/24", "192.0.2.0/24", "2001:db8::/48"}
	c.AllowedPorts = []int{443, 8080, 80, 443}
	c.ExtraDeniedDestinations = []string{"10.96.0.0/12", "192.0.2.128/25"}
	first, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(c.AllowedSourceCIDRs)
	slices.Reverse(c.AllowedPorts)
	slices.Reverse(c.ExtraDeniedDestinations)
	second, _ := Render(c)
	if !bytes.Equal(first, second) {
		t.Errorf("input order changed the output:\n%s\n---\n%s", first, second)
	}
	if bytes.Contains(first, []byte(testPassword)) {
		t.Error("squid.conf contains the password")
	}
	if !bytes.HasPrefix(first, []byte("# Generated by proxy-operator")) {
		t.Error("no generated-file header")
	}
	for _, want := range []string{
		"acl allowed_sources src 192.0.2.0/24 198.51.100.0/24 2001:db8::/48\n",
		"acl allowed_ports port 80 443 8080\n",
		"acl connect_ports port 443\n",
		"acl too_many_connections maxconn 256\n",
		"http_port 3128\n",
		"auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/passwd\n",
		"via off\n", "forwarded_for delete\n", "httpd_suppress_version_string on\n", "cache deny all\n",
	} {
		if !bytes.Contains(first, []byte(want)) {
			t.Errorf("missing %q in:\n%s", want, first)
		}
	}
}

// httpAccessLines returns the http_access rules in order.
func httpAccessLines(conf []byte) []string {
	var out []string
	for _, l := range strings.Split(string(conf), "\n") {
		if strings.HasPrefix(l, "http_access ") {
			out = append(out, l)
		}
	}
	return out
}

func TestRenderRuleOrder(t *testing.T) {
	for _, auth := range []Auth{baseConfig().Auth, {Type: AuthNone}} {
		c := baseConfig()
		c.Auth = auth
		conf, err := Render(c)
		if err != nil {
			t.Fatal(err)
		}
		rules := httpAccessLines(conf)
		if rules[0] != "http_access deny !allowed_sources" {
			t.Errorf("%s: strangers are not refused first: %q", auth.Type, rules[0])
		}
		if last := rules[len(rules)-1]; last != "http_access deny all" {
			t.Errorf("%s: last http_access is %q, not deny all", auth.Type, last)
		}
		allows := 0
		for i, r := range rules {
			if strings.HasPrefix(r, "http_access allow") {
				allows++
				if i != len(rules)-2 {
					t.Errorf("%s: allow rule %q before a deny rule", auth.Type, r)
				}
				if !strings.Contains(r, "allowed_sources") || (auth.Type == AuthBasic && !strings.Contains(r, "authenticated")) {
					t.Errorf("%s: allow rule does not require source and auth: %q", auth.Type, r)
				}
			}
		}
		if allows != 1 {
			t.Errorf("%s: %d allow rules", auth.Type, allows)
		}
		idx := func(rule string) int { return slices.Index(rules, rule) }
		if auth.Type == AuthBasic && !(idx("http_access deny !authenticated") >= 0 && idx("http_access deny !authenticated") < idx("http_access deny denied_destinations")) {
			t.Errorf("destinations are judged (DNS lookup) before authentication: %q", rules)
		}
		if idx("http_access deny file_denied_destinations") >= 0 {
			t.Errorf("%s: a file ACL without Paths.DeniedDestinationsFile: %q", auth.Type, rules)
		}
		c.Paths.DeniedDestinationsFile = "/etc/squid/conf/denied"
		withFile, err := Render(c)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(withFile, []byte("acl file_denied_destinations dst \"/etc/squid/conf/denied\"\n")) {
			t.Errorf("%s: no ACL reading the file:\n%s", auth.Type, withFile)
		}
		fileRules := httpAccessLines(withFile)
		if i := slices.Index(fileRules, "http_access deny denied_destinations"); i < 0 || i+1 >= len(fileRules) || fileRules[i+1] != "http_access deny file_denied_destinations" {
			t.Errorf("%s: the file's destinations are not refused right after the list's: %q", auth.Type, fileRules)
		}
		for _, forbidden := range []string{`(?m)^follow_x_forwarded_for`, `(?m)^http_access allow all$`, `(?m)^cache_dir`} {
			if regexp.MustCompile(forbidden).Match(conf) {
				t.Errorf("%s: config contains %q", auth.Type, forbidden)
			}
		}
	}
}

// aclEntries returns the entries of one ACL, over all of its lines.
func aclEntries(conf []byte, name string) []string {
	var out []string
	re := regexp.MustCompile(`(?m)^acl ` + name + ` \S+ (.*)$`)
	for _, m := range re.FindAllSubmatch(conf, -1) {
		out = append(out, strings.Fields(string(m[1]))...)
	}
	return out
}

func TestRenderCarvesExceptionsOutOfTheDefaultListOnly(t *testing.T) {
	c := baseConfig()
	c.ExtraDeniedDestinations = []string{"10.96.0.0/12", "10.1.0.0/16"}
	c.AllowedDestinationExceptions = []string{"127.0.0.1/32", "10.0.0.0/16"}
	conf, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	var denied []netip.Prefix
	for _, e := range aclEntries(conf, "denied_destinations") {
		denied = append(denied, netip.MustParsePrefix(e))
	}
	contains := func(s string) bool {
		a := netip.MustParseAddr(s)
		return slices.ContainsFunc(denied, func(p netip.Prefix) bool { return p.Contains(a) })
	}
	for _, a := range []string{"127.0.0.0", "127.0.0.2", "127.255.255.255", "10.1.2.3", "10.96.0.1", "10.255.0.1", "169.254.169.254", "172.16.0.1", "192.168.0.1", "100.64.0.1", "0.0.0.0", "::1", "::", "fd00::1", "fe80::1"} {
		if !contains(a) {
			t.Errorf("%s is no longer denied", a)
		}
	}
	for _, a := range []string{"127.0.0.1", "10.0.0.1", "10.0.255.255", "8.8.8.8", "2001:4860:4860::8888"} {
		if contains(a) {
			t.Errorf("%s is denied", a)
		}
	}
	if got := normalize(denied); len(got) != len(denied) {
		t.Errorf("denied list has nested ranges, which squid mishandles: %v", denied)
	}
}

func TestNormalizeDropsNestedRanges(t *testing.T) {
	got := normalize(mustPrefixes([]string{"10.1.0.0/16", "2001:db8::/48", "10.0.0.0/8", "10.1.2.0/24", "2001:db8::/32", "192.0.2.1/32", "10.0.0.0/8"}))
	want := mustPrefixes([]string{"10.0.0.0/8", "192.0.2.1/32", "2001:db8::/32"})
	if !slices.Equal(got, want) {
		t.Errorf("normalize = %v, want %v", got, want)
	}
}

func TestSubtractCoversExactlyTheRest(t *testing.T) {
	for _, tc := range []struct{ p, ex string }{
		{"127.0.0.0/8", "127.0.0.1/32"}, {"10.0.0.0/8", "10.128.0.0/9"}, {"fc00::/7", "fd12:3456::/32"},
		{"10.0.0.0/8", "10.0.0.0/8"}, {"10.0.0.0/8", "192.0.2.0/24"}, {"10.1.0.0/16", "10.0.0.0/8"},
	} {
		p, ex := netip.MustParsePrefix(tc.p), netip.MustParsePrefix(tc.ex)
		rest := subtract(p, ex)
		for _, r := range rest {
			if r.Overlaps(ex) || !(p.Bits() <= r.Bits() && p.Contains(r.Addr())) {
				t.Errorf("%s - %s: %s overlaps the exception or lies outside", tc.p, tc.ex, r)
			}
		}
		// Sizes add up: |rest| + |p ∩ ex| = |p|, counted in units of the
		// longest prefix involved.
		unit := max(p.Bits(), ex.Bits())
		for _, r := range rest {
			unit = max(unit, r.Bits())
		}
		size := func(q netip.Prefix) uint64 { return 1 << min(63, unit-q.Bits()) }
		var sum uint64
		for _, r := range rest {
			sum += size(r)
		}
		if p.Overlaps(ex) {
			if ex.Bits() >= p.Bits() {
				sum += size(ex)
			} else {
				sum += size(p)
			}
		}
		if sum != size(p) {
			t.Errorf("%s - %s = %v does not cover the rest of the range", tc.p, tc.ex, rest)
		}
	}
}

func TestGeneratePassword(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		pw := GeneratePassword()
		if len(pw) < 32 || !regexp.MustCompile(`^[A-Za-z0-9]+$`).MatchString(pw) {
			t.Fatalf("GeneratePassword = %q", pw)
		}
		if seen[pw] {
			t.Fatalf("repeated password %q", pw)
		}
		seen[pw] = true
		c := baseConfig()
		c.Auth.Password = pw
		if err := c.Validate(); err != nil {
			t.Fatalf("generated password refused: %v", err)
		}
	}
}

func TestPasswordFileMatches(t *testing.T) {
	a := baseConfig().Auth
	file, err := PasswordFile(a)
	if err != nil {
		t.Fatal(err)
	}
	// Cost 05, htpasswd -B's (PasswordHashCost): the helper pays it on
	// the serving path.
	if !regexp.MustCompile(`^crawler:\$2[aby]\$05\$[./A-Za-z0-9]{53}\n$`).Match(file) {
		t.Fatalf("not a bcrypt line of cost 05: %q", file)
	}
	// A file written at the cost of earlier releases still matches, so an
	// instance made before is not rewritten for it.
	old, err := bcrypt.GenerateFromPassword([]byte(a.Password), bcrypt.DefaultCost)
	if err != nil {
		t.Fatal(err)
	}
	if !PasswordFileMatches(fmt.Appendf(nil, "crawler:%s\n", old), a) {
		t.Error("a file hashed at bcrypt.DefaultCost no longer matches its credential")
	}
	if bytes.Contains(file, []byte(a.Password)) {
		t.Fatal("password in clear")
	}
	if !PasswordFileMatches(file, a) {
		t.Error("file does not match its own credentials")
	}
	for _, other := range []Auth{{Type: AuthBasic, Username: "crawler", Password: testPassword + "x"}, {Type: AuthBasic, Username: "crawler2", Password: testPassword}} {
		if PasswordFileMatches(file, other) {
			t.Errorf("file matches %s", other.Username)
		}
	}
	if _, err := PasswordFile(Auth{Type: AuthNone}); err == nil {
		t.Error("PasswordFile for auth None")
	}
	for _, bad := range []Auth{{Type: AuthBasic, Username: "crawler", Password: "short"}, {Type: AuthBasic, Username: "a:b", Password: testPassword}} {
		if _, err := PasswordFile(bad); err == nil {
			t.Errorf("PasswordFile accepted %q / %d-byte password", bad.Username, len(bad.Password))
		}
	}
}

// The file squid reads for Paths.DeniedDestinationsFile: never without an
// entry (squid warns about an empty ACL), normalised, 0.0.0.0/0 in halves
// as in squid.conf, entries as given (WithNAT64Spellings adds spellings).
func TestDeniedDestinationsFile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ranges []string
		want   []string
	}{
		{"nothing", nil, []string{"0.0.0.0/32"}},
		{"normalised", []string{"34.118.224.0/20", "34.118.224.1/32", "2600:1900:4000:1::/64", "240.16.0.0/24"},
			[]string{"0.0.0.0/32", "34.118.224.0/20", "240.16.0.0/24", "2600:1900:4000:1::/64"}},
		{"all of IPv4 in halves", []string{"0.0.0.0/0"}, []string{"0.0.0.0/1", "128.0.0.0/1"}},
		{"spellings", toStrings(WithNAT64Spellings(mustPrefixes([]string{"34.118.224.0/20"}))),
			[]string{"0.0.0.0/32", "34.118.224.0/20", "64:ff9b::2276:e000/116"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, l := range strings.Split(string(DeniedDestinationsFile(mustPrefixes(tc.ranges))), "\n") {
				if l != "" && !strings.HasPrefix(l, "#") {
					got = append(got, l)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("entries %q, want %q", got, tc.want)
			}
		})
	}
}

func toStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// DeniedDestinations is the list squid.conf's denied_destinations holds.
func TestDeniedDestinationsIsTheRenderedList(t *testing.T) {
	c := baseConfig()
	c.ExtraDeniedDestinations = []string{"34.118.224.0/20"}
	c.AllowedDestinationExceptions = []string{"10.20.0.0/16"}
	got, err := c.DeniedDestinations()
	if err != nil {
		t.Fatal(err)
	}
	conf, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	if want := aclEntries(conf, "denied_destinations"); !slices.Equal(toStrings(got), want) {
		t.Errorf("DeniedDestinations %q, squid.conf %q", got, want)
	}
	c.Auth.Password = ""
	if _, err := c.DeniedDestinations(); err == nil {
		t.Error("an invalid config has a list")
	}
}

func TestAggregateMergesHalvesAndKeepsTheAddresses(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"10.0.0.0/9", "10.128.0.0/9"}, []string{"10.0.0.0/8"}},
		{[]string{"10.128.0.0/9", "10.0.0.0/9", "10.1.0.0/16"}, []string{"10.0.0.0/8"}},
		{[]string{"10.0.0.0/9", "11.0.0.0/9"}, []string{"10.0.0.0/9", "11.0.0.0/9"}}, // adjacent, not halves
		{[]string{"10.128.0.0/9", "11.0.0.0/9"}, []string{"10.128.0.0/9", "11.0.0.0/9"}},
		{[]string{"0.0.0.0/1", "128.0.0.0/1", "::/1"}, []string{"0.0.0.0/0", "::/1"}},
		{[]string{"::/128", "::1/128"}, []string{"::/127"}},
		{nil, nil},
	} {
		got := toStrings(Aggregate(mustPrefixes(tc.in)))
		if !slices.Equal(got, tc.want) && (len(got) != 0 || len(tc.want) != 0) {
			t.Errorf("Aggregate(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// ::/96 less :: and ::1, then :: and ::1 again: all of ::/96.
	cut := append(subtract(netip.MustParsePrefix("::/96"), netip.MustParsePrefix("::/127")), mustPrefixes([]string{"::/128", "::1/128"})...)
	if got := toStrings(Aggregate(cut)); !slices.Equal(got, []string{"::/96"}) {
		t.Errorf("Aggregate(%d pieces of ::/96) = %q", len(cut), got)
	}
}
