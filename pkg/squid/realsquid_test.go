package squid

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// The checker must be able to fail: nested ranges in the wrong order are
// only a WARNING to squid, and a FATAL does not change its exit status.
func TestParseProblemsCatchesWarningsAndFatals(t *testing.T) {
	for name, conf := range map[string]string{
		"nested ranges":     "http_port 3128\nacl a dst 10.1.0.0/16 10.0.0.0/8\nhttp_access deny a\nhttp_access deny all\n",
		"missing helper":    "http_port 3128\nauth_param basic program /nonexistent/helper /x\nacl u proxy_auth REQUIRED\nhttp_access deny !u\nhttp_access deny all\n",
		"unknown directive": "http_port 3128\nallow_everything on\n",
	} {
		if len(squidtest.ParseProblems(t, []byte(conf))) == 0 {
			t.Errorf("%s: no problem reported", name)
		}
	}
}

func TestRenderedConfigsParse(t *testing.T) {
	for name, change := range map[string]func(*Config){
		"defaults":         func(*Config) {},
		"auth None":        func(c *Config) { c.Auth = Auth{Type: AuthNone} },
		"stats":            func(c *Config) { c.Stats = statsAuth },
		"stats, auth None": func(c *Config) { c.Auth = Auth{Type: AuthNone}; c.Stats = statsAuth },
		"auth None, broad sources": func(c *Config) {
			c.Auth = Auth{Type: AuthNone}
			c.AllowedSourceCIDRs = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"}
			c.BroadSourcesWithoutAuth = true
		},
		"IPv6 listen":   func(c *Config) { c.ListenAddress = "::1"; c.Port = 8080 },
		"IPv4 listen":   func(c *Config) { c.ListenAddress = "192.0.2.10" },
		"mixed sources": func(c *Config) { c.AllowedSourceCIDRs = []string{"0.0.0.0/0", "2000::/3", "fc00::/7", "192.0.2.0/24"} },
		"many sources": func(c *Config) {
			c.AllowedSourceCIDRs = nil
			for i := range 200 {
				c.AllowedSourceCIDRs = append(c.AllowedSourceCIDRs, fmt.Sprintf("198.51.%d.%d/32", i/100, i%100))
			}
		},
		"ports":     func(c *Config) { c.AllowedPorts = []int{443, 8443, 8080, 80, 1, 65535} },
		"HTTP only": func(c *Config) { c.AllowedPorts = []int{80} },
		"many ports": func(c *Config) { // one line would pass squid's 8 KiB line buffer
			for p := 1; p <= 2000; p++ {
				c.AllowedPorts = append(c.AllowedPorts, p)
			}
		},
		"extra nested in defaults": func(c *Config) {
			c.ExtraDeniedDestinations = []string{"10.96.0.0/12", "10.244.0.0/16", "172.20.0.0/16", "fd00:10::/64", "198.18.0.0/15"}
		},
		"exceptions": func(c *Config) {
			c.AllowedDestinationExceptions = []string{"127.0.0.1/32", "10.20.30.40/32", "192.168.0.0/17", "fd00::1/128", "169.254.1.0/24"}
			c.ExtraDeniedDestinations = []string{"10.96.0.0/12"}
		},
		"exceptions in registry ranges": func(c *Config) {
			c.AllowedDestinationExceptions = []string{"198.18.0.0/24", "240.0.0.0/8", "203.0.113.7/32", "2001:db8:1::/48", "::1/128"}
			c.ExtraDeniedDestinations = []string{"8.8.4.0/24", "2001:4860::/32"}
		},
		"connection cap": func(c *Config) { c.MaxConnectionsPerClient = 1 },
		"all paths": func(c *Config) {
			c.Paths = Paths{PasswordFile: "/run/squid/passwd", PidFile: "/run/squid/squid.pid", CacheLog: "/var/log/squid/cache.log", AccessLog: "/dev/stdout", CoredumpDir: "/var/spool/squid"}
		},
		"no access log": func(c *Config) { c.Paths.AccessLog = "none" },
	} {
		t.Run(name, func(t *testing.T) {
			c := baseConfig()
			change(&c)
			conf, err := Render(c)
			if err != nil {
				t.Fatal(err)
			}
			squidtest.RequireParses(t, conf)
		})
	}
}

// startSquid renders c for loopback (127.0.0.1 unless c says otherwise)
// with every file in a fresh directory, and runs it with squidtest.Start.
// The directory is world-writable: squid, started as root, switches to the
// proxy user before it writes its logs. The one addition to the rendered
// config keeps name lookups on loopback: squid asks squidtest.DNSAddress
// (squidtest.ServeDNS) for names not in /etc/hosts.
func startSquid(t *testing.T, c Config) *squidtest.Squid {
	t.Helper()
	dir := squidtest.TempDir(t)
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if c.ListenAddress == "" {
		c.ListenAddress = "127.0.0.1"
	}
	c.Port = testutil.FreePort(t)
	c.Paths = Paths{
		PasswordFile: filepath.Join(dir, "passwd"), PidFile: filepath.Join(dir, "squid.pid"),
		CacheLog: filepath.Join(dir, "cache.log"), AccessLog: filepath.Join(dir, "access.log"), CoredumpDir: dir,
		DeniedDestinationsFile: c.Paths.DeniedDestinationsFile, UpstreamCounter: c.Paths.UpstreamCounter,
	}
	conf, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	squidtest.RequireParses(t, conf)
	conf = append(conf, "dns_nameservers "+squidtest.DNSAddress+"\n"...)
	if users := c.PasswordUsers(); len(users) > 0 {
		pw, err := PasswordFile(users...)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c.Paths.PasswordFile, pw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return squidtest.Start(t, squidtest.Options{
		Conf: conf, Dir: dir, AccessLog: c.Paths.AccessLog,
		Listen: net.JoinHostPort(c.ListenAddress, strconv.Itoa(c.Port)),
	})
}
