package squid

import (
	"strings"
	"testing"
)

const upstreamPage = `upstream.2xx = 3
upstream.3xx = 2
upstream.4xx = 5
upstream.5xx = 2
upstream.403 = 4
upstream.429 = 1
`

func TestParseUpstream(t *testing.T) {
	for _, tc := range []struct {
		name, page string
		want       UpstreamCounts
		err        string
	}{
		{name: "the counter's answer", page: upstreamPage, want: UpstreamCounts{3, 2, 5, 2, 4, 1}},
		{name: "CRLF, spacing, other names", page: "upstream.none=7\r\nupstream.2xx=1\r\nupstream.3xx =0\r\nupstream.4xx= 0\r\nupstream.5xx = 0\r\nupstream.403 = 0\r\nupstream.429 = 0\r\n", want: UpstreamCounts{1}},
		{name: "empty", page: "", err: "no upstream.2xx (not the counter's answer)"},
		{name: "squid's error page", page: "<html><body>Access Denied</body></html>", err: "not the counter's answer"},
		{name: "one class missing", page: strings.Replace(upstreamPage, "upstream.429 = 1\n", "", 1), err: "no upstream.429"},
		{name: "negative", page: strings.Replace(upstreamPage, "3xx = 2", "3xx = -2", 1), err: `upstream.3xx is not a count: "-2"`},
		{name: "twice", page: upstreamPage + "upstream.403 = 5\n", err: "upstream.403 twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseUpstream([]byte(tc.page))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestUpstreamCountsAdd(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   UpstreamCounts
	}{
		{200, UpstreamCounts{1, 0, 0, 0, 0, 0}},
		{304, UpstreamCounts{0, 1, 0, 0, 0, 0}},
		{404, UpstreamCounts{0, 0, 1, 0, 0, 0}},
		{403, UpstreamCounts{0, 0, 1, 0, 1, 0}},
		{429, UpstreamCounts{0, 0, 1, 0, 0, 1}},
		{599, UpstreamCounts{0, 0, 0, 1, 0, 0}},
		{101, UpstreamCounts{}},
		{0, UpstreamCounts{}},
		{600, UpstreamCounts{}},
	} {
		var u UpstreamCounts
		u.Add(tc.status)
		if u != tc.want {
			t.Errorf("Add(%d): %v, want %v", tc.status, u, tc.want)
		}
	}
	if b := (UpstreamCounts{9, 9, 9, 9, 4, 1}).BanSignals(); b != 5 {
		t.Errorf("BanSignals: %d, want 5", b)
	}
}

func FuzzParseUpstream(f *testing.F) {
	f.Add([]byte(upstreamPage))
	f.Add([]byte("upstream.2xx = 18446744073709551615\n"))
	f.Fuzz(func(t *testing.T, page []byte) {
		if _, err := ParseUpstream(page); err == nil {
			for _, class := range UpstreamClasses {
				if !strings.Contains(string(page), "upstream."+class) {
					t.Fatalf("accepted a page without upstream.%s: %q", class, page)
				}
			}
		}
	})
}

func TestRenderUpstreamCounter(t *testing.T) {
	base := func() Config {
		c := loopbackConfig(8080)
		c.Stats = statsAuth
		c.Paths.UpstreamCounter = "/usr/local/lib/proxy-operator/upstream-counter"
		return c
	}
	counterLines := []string{
		"acl upstream_counts url_regex ^http://127\\.0\\.0\\.1:3131/upstream$\n",
		"acl has_request has request\n",
		"http_access allow upstream_counts stats_reader\n",
		"logformat upstream_status %<Hs\n",
		"logfile_daemon /usr/local/lib/proxy-operator/upstream-counter\n",
		"access_log daemon:/127.0.0.1:3131 upstream_status has_request !upstream_counts\n",
	}
	for _, tc := range []struct {
		name   string
		config func(*Config)
		// in order; absent must not be there.
		want, absent []string
	}{
		{name: "squid's default log kept, written by squid", config: func(*Config) {},
			want: append(counterLines, "access_log stdio:/var/log/squid/access.log\n")},
		{name: "the counter's line before access_log none", config: func(c *Config) { c.Paths.AccessLog = "none" },
			want: append(counterLines, "access_log none\n"), absent: []string{"stdio:"}},
		{name: "a log file", config: func(c *Config) { c.Paths.AccessLog = "/var/log/a.log" },
			want: append(counterLines, "access_log stdio:/var/log/a.log\n"), absent: []string{DefaultAccessLog}},
		{name: "the operator's rule before the port and destination rules", config: func(*Config) {},
			want: []string{"http_access allow manager stats_actions stats_reader\n", "http_access allow upstream_counts stats_reader\n", "http_access deny manager\n", "http_access deny !allowed_ports\n", "http_access deny denied_destinations\n"}},
		{name: "the proxy on the default counts port", config: func(c *Config) { c.Port = DefaultUpstreamCountsPort },
			want: []string{"url_regex ^http://127\\.0\\.0\\.1:3132/upstream$\n", "access_log daemon:/127.0.0.1:3132 "}},
		{name: "no Stats credential: nobody could read them", config: func(c *Config) { c.Stats = Auth{} },
			absent: []string{"upstream", "logfile_daemon", "access_log", "has_request"}},
		{name: "no counter delivered", config: func(c *Config) { c.Paths.UpstreamCounter = "" },
			absent: []string{"upstream", "logfile_daemon", "access_log", "has_request"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.config(&c)
			out, err := Render(c)
			if err != nil {
				t.Fatal(err)
			}
			conf, rest := string(out), string(out)
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("no %q (in this order) in:\n%s", w, conf)
				}
				rest = rest[i+len(w):]
			}
			for _, a := range tc.absent {
				if strings.Contains(conf, a) {
					t.Errorf("%q in:\n%s", a, conf)
				}
			}
		})
	}
}

func TestUpstreamCounterValidation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config func(*Config)
		field  string
	}{
		{"the proxy port", func(c *Config) { c.Port, c.UpstreamCountsPort = 3128, 3128 }, "upstreamCountsPort"},
		{"the default proxy port", func(c *Config) { c.UpstreamCountsPort = DefaultPort }, "upstreamCountsPort"},
		{"out of range", func(c *Config) { c.UpstreamCountsPort = 70000 }, "upstreamCountsPort"},
		{"a relative path", func(c *Config) { c.Paths.UpstreamCounter = "upstream-counter" }, "paths.upstreamCounter"},
		{"a path with a space", func(c *Config) { c.Paths.UpstreamCounter = "/usr/lib/a b" }, "paths.upstreamCounter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := loopbackConfig(8080)
			c.Stats = statsAuth
			tc.config(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %v, want one naming %s", err, tc.field)
			}
		})
	}
}
