package proxyaccess

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/squid"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// TestMain runs the tests in a network namespace holding only lo: the
// real squid below is asked for the metadata address and private ones,
// which exist there only as addresses on lo. Needs root.
func TestMain(m *testing.M) { squidtest.Main(m) }

func TestRunsInIsolatedNetworkNamespace(t *testing.T) { squidtest.RequireOnlyLoopback(t) }

func mustGrants(t *testing.T, s string) Grants {
	t.Helper()
	g, err := ParseGrants(s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestOnlyTheOperatorGrantsHostLocalExceptions: an exception reaching
// loopback, link-local or a metadata address is refused, naming the
// exception and the flag, unless a grant contains all of its part there;
// exceptions in private ranges are the Proxy author's.
func TestOnlyTheOperatorGrantsHostLocalExceptions(t *testing.T) {
	cases := []struct {
		exceptions []string
		grants     string
		refused    []int // indexes refused
	}{
		{[]string{"169.254.169.254/32"}, "", []int{0}},
		{[]string{"10.0.0.0/8", "169.254.0.0/16"}, "", []int{1}},
		{[]string{"169.254.128.0/17"}, "", []int{0}},
		{[]string{"127.0.0.1/32"}, "", []int{0}},
		{[]string{"127.0.0.0/8"}, "", []int{0}},
		{[]string{"0.0.0.0/32"}, "", []int{0}},
		{[]string{"::1/128"}, "", []int{0}},
		{[]string{"::/128"}, "", []int{0}},
		{[]string{"fe80::/64"}, "", []int{0}},
		{[]string{"fd00:ec2::254/128"}, "", []int{0}},
		{[]string{"fd00::/8"}, "", []int{0}},      // holds EC2's IPv6 metadata address
		{[]string{"100.64.0.0/10"}, "", []int{0}}, // holds Alibaba Cloud's metadata address
		{[]string{"10.0.0.0/8", "192.168.7.0/24", "100.64.0.0/16", "fd12::/16", "198.18.0.0/15"}, "", nil},
		{[]string{"169.254.169.254/32"}, "169.254.169.254/32", nil},
		{[]string{"169.254.169.254/32"}, "169.254.0.0/16", nil},
		{[]string{"169.254.0.0/16"}, "169.254.169.254/32", []int{0}}, // the grant covers a part only
		{[]string{"169.254.169.254/32"}, "127.0.0.1/32", []int{0}},
		{[]string{"127.0.0.1/32", "169.254.169.254/32"}, "127.0.0.1/32,169.254.169.254/32", nil},
		{[]string{"fd00::/8"}, "fd00:ec2::254/128", nil}, // the rest of fd00::/8 is private space
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.exceptions, ",")+" granted "+tc.grants, func(t *testing.T) {
			a := &crawlv1.ProxyAccess{Managed: ptr.To(true), AllowedSourceCIDRs: []string{"192.0.2.0/24"},
				Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthBasic}, AllowedDestinationExceptions: tc.exceptions}
			errs := Validate(a, mustGrants(t, tc.grants))
			var refused []int
			for _, e := range errs {
				var i int
				if _, err := fmt.Sscanf(e.Field, "spec.access.allowedDestinationExceptions[%d]", &i); err != nil || e.Type != field.ErrorTypeForbidden {
					t.Fatalf("unexpected error %v", e)
				}
				if !strings.Contains(e.Detail, GrantFlag) {
					t.Errorf("%s: %q does not name %s", e.Field, e.Detail, GrantFlag)
				}
				refused = append(refused, i)
			}
			if !slices.Equal(refused, tc.refused) {
				t.Fatalf("refused %v, want %v (errors: %v)", refused, tc.refused, errs.ToAggregate())
			}
			if len(tc.refused) == 0 && len(NeedsGrant(a)) > 0 != (tc.grants != "") {
				t.Errorf("NeedsGrant = %v with grants %q", NeedsGrant(a), tc.grants)
			}
		})
	}
}

func TestParseGrants(t *testing.T) {
	for _, tc := range []struct{ value, want, err string }{
		{"", "", ""},
		{" 169.254.169.254/32 , fe80::/64,", "169.254.169.254/32,fe80::/64", ""},
		{"169.254.169.254", "", "must be a CIDR"},
		{"169.254.169.1/24", "", "host bits"},
		{"192.168.0.0/16", "", "needs no grant"},
		{"64:ff9b::a9fe:a9fe/128", "", "no exception lifts"},
		{"8.8.8.8/32", "", "must lie inside one default denied range"},
	} {
		g, err := ParseGrants(tc.value)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), GrantFlag)):
			t.Errorf("ParseGrants(%q) error %v, want one naming %s and saying %q", tc.value, err, GrantFlag, tc.err)
		case tc.err == "" && (err != nil || g.String() != tc.want):
			t.Errorf("ParseGrants(%q) = %q, %v; want %q", tc.value, g, err, tc.want)
		}
	}
}

func TestWarningsNameEachException(t *testing.T) {
	a := &crawlv1.ProxyAccess{AllowedDestinationExceptions: []string{"10.1.0.0/16", "fd12::/16"}}
	w := Warnings(field.NewPath("spec", "template", "spec", "access"), a)
	if len(w) != 2 || !strings.HasPrefix(w[0], "spec.template.spec.access.allowedDestinationExceptions[0] is 10.1.0.0/16") ||
		!strings.HasPrefix(w[1], "spec.template.spec.access.allowedDestinationExceptions[1] is fd12::/16") {
		t.Fatalf("warnings %q", w)
	}
	if w := Warnings(AccessPath, &crawlv1.ProxyAccess{}); len(w) != 0 {
		t.Fatalf("warnings %q without exceptions", w)
	}
}

// TestRealSquidReachesMetadataOnlyWhenTheOperatorGrants plays the attack
// with Debian's squid: a Proxy author lists the metadata address as an
// exception. The squid.conf a Proxy gets is built only from access that
// Validate admits (admission and the controller), so without the grant no
// squid is configured with it, and one configured without it refuses
// the metadata server; with the grant the same access fetches from it, and
// a private exception works for anyone, as before.
func TestRealSquidReachesMetadataOnlyWhenTheOperatorGrants(t *testing.T) {
	metadata := netip.MustParseAddr("169.254.169.254")
	internal := netip.MustParseAddr("10.77.0.1")
	squidtest.AddLoopbackAddress(t, metadata)
	squidtest.AddLoopbackAddress(t, internal)
	meta := squidtest.NewOrigin(t, net.JoinHostPort(metadata.String(), "0"))
	origin := squidtest.NewOrigin(t, net.JoinHostPort(internal.String(), strconv.Itoa(meta.Port())))
	port := int32(meta.Port())
	metaURL, internalURL := "http://"+meta.HostPort()+"/computeMetadata/v1/", "http://"+origin.HostPort()+"/"

	access := func(exceptions ...string) *crawlv1.ProxyAccess {
		return &crawlv1.ProxyAccess{Managed: ptr.To(true), AllowedSourceCIDRs: []string{"127.0.0.1/32"},
			Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthNone}, AllowedPorts: []int32{80, 443, port},
			AllowedDestinationExceptions: exceptions}
	}
	// configured is the squid a Proxy with a gets under grants: none when
	// its access is refused.
	configured := func(a *crawlv1.ProxyAccess, grants Grants) *squidtest.Squid {
		if errs := Validate(a, grants); len(errs) > 0 {
			return nil
		}
		return startSquid(t, SquidConfig(a, 0, squid.Auth{}, nil))
	}

	attack := access(metadata.String() + "/32")
	if s := configured(attack, nil); s != nil {
		r := s.Request(t, "127.0.0.1", http.MethodGet, metaURL, "")
		t.Fatalf("a Proxy author's exception for the metadata address was admitted, and squid answered %d from the metadata server", r.Status)
	}
	if len(meta.Requests()) != 0 {
		t.Fatal("the metadata server was reached")
	}

	granted := configured(attack, mustGrants(t, "169.254.169.254/32"))
	if granted == nil {
		t.Fatal("the access was refused although the operator granted the metadata address")
	}
	if r := granted.Request(t, "127.0.0.1", http.MethodGet, metaURL, ""); r.Status != http.StatusNoContent {
		t.Fatalf("granted: status %d (%s) from the metadata server, want 204", r.Status, r.SquidError)
	}

	private := configured(access(internal.String()+"/32"), nil)
	if private == nil {
		t.Fatal("an exception for a private address was refused")
	}
	if r := private.Request(t, "127.0.0.1", http.MethodGet, internalURL, ""); r.Status != http.StatusNoContent {
		t.Fatalf("private exception: status %d (%s), want 204", r.Status, r.SquidError)
	}
	before := len(meta.Requests())
	r := private.Request(t, "127.0.0.1", http.MethodGet, metaURL, "")
	squidtest.RequireRefusedBeforeConnecting(t, private, r, http.MethodGet, metaURL)
	if len(meta.Requests()) != before {
		t.Fatal("the squid with a private exception reached the metadata server")
	}
}

// startSquid runs squid with c (auth None) on 127.0.0.1.
func startSquid(t *testing.T, c squid.Config) *squidtest.Squid {
	t.Helper()
	dir := squidtest.TempDir(t)
	if err := os.Chmod(dir, 0o777); err != nil { // squid writes its logs as the proxy user
		t.Fatal(err)
	}
	c.ListenAddress, c.Port = "127.0.0.1", testutil.FreePort(t)
	c.Paths = squid.Paths{PidFile: filepath.Join(dir, "squid.pid"), CacheLog: filepath.Join(dir, "cache.log"),
		AccessLog: filepath.Join(dir, "access.log"), CoredumpDir: dir}
	conf, err := squid.Render(c)
	if err != nil {
		t.Fatal(err)
	}
	return squidtest.Start(t, squidtest.Options{Conf: conf, Dir: dir, AccessLog: c.Paths.AccessLog,
		Listen: net.JoinHostPort(c.ListenAddress, strconv.Itoa(c.Port))})
}
