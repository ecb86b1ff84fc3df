package squid

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// directives Render may write; any other first word on a line means a user
// string broke out of its token.
var renderedDirectives = map[string]bool{
	"http_port": true, "visible_hostname": true, "auth_param": true, "acl": true, "http_access": true,
	"icp_port": true, "htcp_port": true, "snmp_port": true, "icp_access": true, "htcp_access": true,
	"snmp_access": true, "pinger_enable": true, "netdb_filename": true, "via": true, "forwarded_for": true,
	"httpd_suppress_version_string": true, "cache": true, "cache_mem": true, "shutdown_lifetime": true,
	"pid_filename": true, "cache_log": true, "coredump_dir": true, "access_log": true,
	"logformat": true, "logfile_daemon": true,
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// FuzzRender: whatever Validate accepts renders to a config that squid
// parses without complaint, made only of Render's own directives and
// ending in deny all; whatever it refuses, Render refuses too. counts
// brings the Stats credential and the upstream counter (a provider's
// path, which squid -k parse requires to exist).
func FuzzRender(f *testing.F) {
	f.Add("192.0.2.0/24", "Basic", "crawler", testPassword, "80,443", "", "", 0, "", 0, "", false, 0)
	f.Add("127.0.0.1/32,127.0.0.3/32", "Basic", "Crawler", testPassword, "80,443,8080", "10.1.0.0/16", "127.0.0.1/32", 3, "127.0.0.1", 3128, "/tmp/access.log", true, 0)
	f.Add("0.0.0.0/0,2000::/3", "Basic", "u", GeneratePassword(), "443", "0.0.0.0/0", "", 1, "::1", 8080, "none", true, 9000)
	f.Add("192.0.2.7/32", "None", "", "", "80", "10.96.0.0/12,fd00:10::/64", "10.20.30.40/32,169.254.1.0/24", 64, "192.0.2.10", 1, "", true, 1)
	f.Add("10.0.0.0/8\nhttp_access allow all", "Basic", "a b", "short", "0", "x", "0.0.0.0/0", -1, "x", -1, "rel", true, 3128)
	f.Add("::ffff:10.0.0.0/104", "", "crawler#", testPassword+"\n", "65536", "::/0", "::/0", 0, "fe80::1%lo", 70000, "/a b", true, -1)
	squidtest.Binary(f)
	counter := filepath.Join(f.TempDir(), "upstream-counter")
	if err := os.WriteFile(counter, UpstreamCounter, 0o755); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, sources, authType, user, password, ports, extra, exceptions string, maxConns int, listen string, port int, accessLog string, counts bool, countsPort int) {
		c := Config{
			ListenAddress:                listen,
			Port:                         port,
			AllowedSourceCIDRs:           splitList(sources),
			Auth:                         Auth{Type: AuthType(authType), Username: user, Password: password},
			ExtraDeniedDestinations:      splitList(extra),
			AllowedDestinationExceptions: splitList(exceptions),
			MaxConnectionsPerClient:      maxConns,
			Paths:                        Paths{AccessLog: accessLog},
			UpstreamCountsPort:           countsPort,
		}
		if counts {
			c.Stats, c.Paths.UpstreamCounter = statsAuth, counter
		}
		for _, p := range splitList(ports) {
			n, err := strconv.Atoi(p)
			if err != nil {
				return
			}
			c.AllowedPorts = append(c.AllowedPorts, n)
		}
		verr := c.Validate()
		conf, rerr := Render(c)
		if (verr == nil) != (rerr == nil) {
			t.Fatalf("Validate: %v, Render: %v", verr, rerr)
		}
		if verr != nil {
			return
		}
		var lastAccess string
		for _, l := range strings.Split(string(conf), "\n") {
			if l == "" || strings.HasPrefix(l, "# ") {
				continue
			}
			if first, _, _ := strings.Cut(l, " "); !renderedDirectives[first] {
				t.Fatalf("line %q is not one of Render's directives:\n%s", l, conf)
			}
			if strings.HasPrefix(l, "http_access ") {
				lastAccess = l
			}
		}
		if lastAccess != "http_access deny all" {
			t.Fatalf("last http_access is %q:\n%s", lastAccess, conf)
		}
		squidtest.RequireParses(t, conf)
	})
}
