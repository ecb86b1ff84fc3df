package controllers

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func TestPublishCredentialURL(t *testing.T) {
	creds := func(kv ...string) map[string][]byte {
		m := map[string][]byte{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = []byte(kv[i+1])
		}
		return m
	}
	for _, tc := range []struct {
		name, endpoint string
		data           map[string][]byte
		want           string
		wantLeftOut    bool
	}{
		{name: "url of the endpoint", endpoint: "http://192.0.2.1:3128",
			data: creds("url", "http://u:p@192.0.2.1:3128", "username", "u", "password", "p"), want: "http://u:p@192.0.2.1:3128"},
		{name: "url normalised: no path", endpoint: "http://192.0.2.1:3128",
			data: creds("url", "http://u:p@192.0.2.1:3128/"), want: "http://u:p@192.0.2.1:3128"},
		{name: "escaped characters survive", endpoint: "http://192.0.2.1:3128",
			data: creds("url", "http://us%40r:p%3As%2Fw%25d@192.0.2.1:3128"), want: "http://us%40r:p%3As%2Fw%25d@192.0.2.1:3128"},
		{name: "no url: composed and escaped", endpoint: "http://192.0.2.1:3128",
			data: creds("username", "us@r", "password", "p:s/w%d@#?"), want: "http://us%40r:p%3As%2Fw%25d%40%23%3F@192.0.2.1:3128"},
		{name: "url of an old address: the endpoint wins", endpoint: "http://192.0.2.9:3128",
			data: creds("url", "http://u:p@192.0.2.1:3128", "username", "u", "password", "p"), want: "http://u:p@192.0.2.9:3128"},
		{name: "url of an old address and nothing to compose", endpoint: "http://192.0.2.9:3128",
			data: creds("url", "http://u:p@192.0.2.1:3128"), wantLeftOut: true},
		{name: "url without password", endpoint: "http://192.0.2.1:3128",
			data: creds("url", "http://u@192.0.2.1:3128"), wantLeftOut: true},
		{name: "url with a control character, composed instead", endpoint: "http://192.0.2.1:3128",
			data: creds("url", "http://u:p\n@192.0.2.1:3128", "username", "u", "password", "p\n"), want: "http://u:p%0A@192.0.2.1:3128"},
		{name: "no endpoint yet: the url", endpoint: "",
			data: creds("url", "http://u:p@192.0.2.1:3128"), want: "http://u:p@192.0.2.1:3128"},
		{name: "no endpoint and no url", endpoint: "", data: creds("username", "u", "password", "s3cr3t-pw"), wantLeftOut: true},
		{name: "empty Secret", endpoint: "http://192.0.2.1:3128", data: nil, wantLeftOut: true},
		{name: "https url refused", endpoint: "http://192.0.2.1:3128",
			data: creds("url", "https://u:p@192.0.2.1:3128"), wantLeftOut: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := credentialURL(tc.endpoint, tc.data)
			if tc.wantLeftOut {
				if why == "" {
					t.Fatalf("got %q, want left out", got)
				}
				if pw := string(tc.data[crawlv1.CredentialsPasswordKey]); pw != "" && strings.Contains(why, pw) {
					t.Errorf("reason %q holds the password", why)
				}
				return
			}
			if why != "" || got != tc.want {
				t.Errorf("got %q (%s), want %q", got, why, tc.want)
			}
		})
	}
}

// FuzzPublishCredentialURL: whatever the credential, a published line is
// one line that gives back exactly that user and password.
func FuzzPublishCredentialURL(f *testing.F) {
	f.Add("user", "pass", "192.0.2.1:3128")
	f.Add("us@r", "p:s/w%d@#?\n", "192.0.2.1:3128")
	f.Add("", "x", "192.0.2.1:80")
	f.Fuzz(func(t *testing.T, user, pass, hostport string) {
		publish := func(user, pass string) (string, string) {
			return credentialURL("http://"+hostport, map[string][]byte{
				crawlv1.CredentialsUsernameKey: []byte(user), crawlv1.CredentialsPasswordKey: []byte(pass),
			})
		}
		got, why := publish(user, pass)
		if why != "" {
			// The reason says nothing about the credential: another one
			// gives the same.
			if user != "" && pass != "" {
				if _, other := publish("someone", "another password"); other != why {
					t.Fatalf("reason %q depends on the credential (another gives %q)", why, other)
				}
			}
			return
		}
		if strings.ContainsAny(got, "\r\n") {
			t.Fatalf("%q is more than one line", got)
		}
		u, err := url.Parse(got)
		if err != nil {
			t.Fatalf("%q does not parse: %v", got, err)
		}
		p, _ := u.User.Password()
		if u.User.Username() != user || p != pass || u.Scheme != "http" || u.Path != "" {
			t.Fatalf("%q reads back as user %q password %q scheme %q path %q", got, u.User.Username(), p, u.Scheme, u.Path)
		}
	})
}

func TestPublishEndpointOf(t *testing.T) {
	proxy := func(name, addr, endpoint, host string) *crawlv1.Proxy {
		return &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: "uid-" + types.UID(name)},
			Status: crawlv1.ProxyStatus{Address: addr, Endpoint: endpoint, Host: host}}
	}
	for _, tc := range []struct {
		name                 string
		p                    *crawlv1.Proxy
		wantPort             int32
		wantHostname, wantZn *string
		wantNone             bool
	}{
		{name: "all set", p: proxy("a", "192.0.2.1", "http://192.0.2.1:8080", "hv1"), wantPort: 8080, wantHostname: ptr.To("a"), wantZn: ptr.To("hv1")},
		{name: "no endpoint: default port", p: proxy("a", "192.0.2.1", "", ""), wantPort: 3128, wantHostname: ptr.To("a")},
		{name: "name not a DNS label: no hostname", p: proxy("a.b", "192.0.2.1", "http://192.0.2.1:3128", "hv1"), wantPort: 3128, wantZn: ptr.To("hv1")},
		{name: "host not a label value: no zone", p: proxy("a", "192.0.2.1", "http://192.0.2.1:3128", "europe-west1/b"), wantPort: 3128, wantHostname: ptr.To("a")},
		{name: "IPv6", p: proxy("a", "2001:db8::1", "http://[2001:db8::1]:3128", ""), wantNone: true},
		{name: "loopback", p: proxy("a", "127.0.0.1", "", ""), wantNone: true},
		{name: "link-local", p: proxy("a", "169.254.1.1", "", ""), wantNone: true},
		{name: "no address", p: proxy("a", "", "", ""), wantNone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := endpointOf(tc.p)
			if tc.wantNone {
				if why == "" {
					t.Fatalf("got %+v, want none", got)
				}
				return
			}
			if why != "" {
				t.Fatal(why)
			}
			e := got.ep
			if got.port != tc.wantPort || !slices.Equal(e.Addresses, []string{tc.p.Status.Address}) ||
				!ptr.Equal(e.Hostname, tc.wantHostname) || !ptr.Equal(e.Zone, tc.wantZn) || e.NodeName != nil ||
				!ptr.Equal(e.Conditions.Ready, ptr.To(true)) || e.TargetRef == nil || e.TargetRef.Name != tc.p.Name || e.TargetRef.UID != tc.p.UID {
				t.Errorf("got port %d %+v (hostname %v zone %v)", got.port, e, ptr.Deref(e.Hostname, "<nil>"), ptr.Deref(e.Zone, "<nil>"))
			}
		})
	}
}

func TestPublishRenderProxies(t *testing.T) {
	txt, js, err := renderProxies(nil)
	if err != nil || string(txt) != "" || string(js) != "[]\n" {
		t.Errorf("empty: %q %q %v", txt, js, err)
	}
	in := []PublishedProxy{
		{Name: "a", URL: "http://u:p@192.0.2.1:3128", Host: "hv1", EgressAddress: "198.51.100.1", CreatedAt: "2026-12-01T10:00:00Z", ExpiresAt: "2026-12-01T16:00:00Z"},
		{Name: "b", URL: "http://192.0.2.2:3128", CreatedAt: "2026-12-01T11:00:00Z"},
	}
	txt, js, err = renderProxies(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := "http://u:p@192.0.2.1:3128\nhttp://192.0.2.2:3128\n"; string(txt) != want {
		t.Errorf("proxies.txt %q, want %q", txt, want)
	}
	var back []map[string]any
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if len(back) != 2 || back[0]["expiresAt"] != "2026-12-01T16:00:00Z" || back[0]["egressAddress"] != "198.51.100.1" ||
		back[1]["url"] != "http://192.0.2.2:3128" || back[1]["createdAt"] != "2026-12-01T11:00:00Z" {
		t.Errorf("proxies.json %s", js)
	}
	if _, ok := back[1]["expiresAt"]; ok {
		t.Errorf("proxies.json has expiresAt for a replica without one: %s", js)
	}
	if lines := strings.Split(strings.TrimSuffix(string(js), "\n"), "\n"); len(lines) != 4 {
		t.Errorf("proxies.json is not one entry per line: %s", js)
	}
}

// TestPublishedListFitsASecret: a pool of 5,000 replicas surged by 5%
// during a rotation by age (BenchmarkProxyPoolScale's: no credentials in
// the URLs, every entry with its expiresAt) publishes both keys within a
// Secret's 1 MiB. Indented JSON overflowed there (1.1 MB), and a list
// that cannot be written holds every drain, so the rotation stopped.
func TestPublishedListFitsASecret(t *testing.T) {
	const secretLimit = 1 << 20
	var in []PublishedProxy
	for i := range 5250 {
		in = append(in, PublishedProxy{
			Name: fmt.Sprintf("scale-%05d", i), URL: fmt.Sprintf("http://10.0.%d.%d:3128", i/250, i%250),
			Host: fmt.Sprintf("scale-hv-0-948298-%d", i%250), CreatedAt: "2026-12-06T05:06:42Z", ExpiresAt: "2026-12-06T05:06:43Z",
		})
	}
	txt, js, err := renderProxies(in)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d replicas: proxies.txt %d bytes, proxies.json %d", len(in), len(txt), len(js))
	if n := len(txt) + len(js); n > secretLimit {
		t.Errorf("%d replicas publish %d bytes (proxies.txt %d, proxies.json %d): over a Secret's %d", len(in), n, len(txt), len(js), secretLimit)
	}
}

// planWant is the endpoints of replicas names on port.
func planWant(port int32, names ...string) []sliceEndpoint {
	var out []sliceEndpoint
	for _, n := range names {
		out = append(out, sliceEndpoint{name: n, port: port, ep: discoveryv1.Endpoint{
			Addresses: []string{"192.0.2.1"}, Hostname: ptr.To(n),
			TargetRef: &corev1.ObjectReference{Kind: "Proxy", Name: n},
		}})
	}
	return out
}

func names(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s%03d", prefix, i))
	}
	return out
}

// applyPlan stores a plan's result the way the API server would, naming
// created slices s0, s1, ...
func applyPlan(stored []discoveryv1.EndpointSlice, plan slicePlan) []discoveryv1.EndpointSlice {
	byName := map[string]discoveryv1.EndpointSlice{}
	for _, s := range stored {
		byName[s.Name] = s
	}
	for _, s := range plan.delete {
		delete(byName, s.Name)
	}
	for _, s := range plan.update {
		byName[s.Name] = *s
	}
	n := len(stored) + 100
	for _, s := range plan.create {
		c := *s
		c.Name = fmt.Sprintf("s%04d", n)
		n++
		byName[c.Name] = c
	}
	var out []discoveryv1.EndpointSlice
	for _, s := range byName {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func sliceMembers(stored []discoveryv1.EndpointSlice) (all []string, sizes []int) {
	for _, s := range stored {
		sizes = append(sizes, len(s.Endpoints))
		for _, e := range s.Endpoints {
			all = append(all, e.TargetRef.Name)
		}
	}
	slices.Sort(all)
	return all, sizes
}

func TestPublishPlanEndpointSlices(t *testing.T) {
	owned := func(*discoveryv1.EndpointSlice) bool { return true }
	stamp := func(*discoveryv1.EndpointSlice) {}
	plan := func(stored []discoveryv1.EndpointSlice, want []sliceEndpoint) slicePlan {
		return planEndpointSlices(stored, want, 100, owned, stamp)
	}

	// 250 replicas: three slices of at most 100.
	want := planWant(3128, names("r", 0, 250)...)
	p := plan(nil, want)
	if len(p.create) != 3 || len(p.update)+len(p.delete) != 0 {
		t.Fatalf("first plan: create %d update %d delete %d, want 3 creates", len(p.create), len(p.update), len(p.delete))
	}
	stored := applyPlan(nil, p)
	all, sizes := sliceMembers(stored)
	if !slices.Equal(all, names("r", 0, 250)) || !slices.Equal(sizes, []int{100, 100, 50}) {
		t.Fatalf("stored sizes %v, members %d", sizes, len(all))
	}

	// The same again: nothing to do.
	if p := plan(stored, want); len(p.create)+len(p.update)+len(p.delete) != 0 {
		t.Fatalf("unchanged input: %d creates, %d updates, %d deletes", len(p.create), len(p.update), len(p.delete))
	}

	// One replica of the first slice goes: only that slice is rewritten,
	// not every slice after it.
	want = planWant(3128, slices.DeleteFunc(names("r", 0, 250), func(n string) bool { return n == "r005" })...)
	p = plan(stored, want)
	if len(p.create) != 0 || len(p.delete) != 0 || len(p.update) != 1 || p.update[0].Name != stored[0].Name {
		t.Fatalf("removing r005: creates %d deletes %d updates %v, want only %s updated", len(p.create), len(p.delete), sliceNames(p.update), stored[0].Name)
	}
	stored = applyPlan(stored, p)

	// A new replica fills the first slice with room.
	want = append(want, planWant(3128, "r999")...)
	p = plan(stored, want)
	if len(p.create) != 0 || len(p.delete) != 0 || len(p.update) != 1 || p.update[0].Name != stored[0].Name {
		t.Fatalf("adding r999: creates %d deletes %d updates %v, want only %s updated", len(p.create), len(p.delete), sliceNames(p.update), stored[0].Name)
	}
	stored = applyPlan(stored, p)
	all, _ = sliceMembers(stored)
	wantNames := append(slices.DeleteFunc(names("r", 0, 250), func(n string) bool { return n == "r005" }), "r999")
	slices.Sort(wantNames)
	if !slices.Equal(all, wantNames) {
		t.Fatalf("members after add: %d, want %d", len(all), len(wantNames))
	}

	// The last slice's replicas all go: it is deleted, the others stay.
	want = planWant(3128, names("r", 0, 200)...)
	p = plan(stored, want)
	if len(p.delete) != 1 || p.delete[0].Name != stored[2].Name || len(p.create) != 0 {
		t.Fatalf("removing r200-r249: deletes %v creates %d", sliceNames(p.delete), len(p.create))
	}
	stored = applyPlan(stored, p)
	if all, sizes := sliceMembers(stored); !slices.Equal(all, names("r", 0, 200)) || len(sizes) != 2 {
		t.Fatalf("after removal: sizes %v members %d", sizes, len(all))
	}

	// A port change moves every endpoint to slices of the new port, and the
	// old slices go only after (plan order is the caller's; here: sets).
	want = planWant(8080, names("r", 0, 200)...)
	p = plan(stored, want)
	if len(p.create) != 2 || len(p.delete) != 2 || len(p.update) != 0 {
		t.Fatalf("port change: creates %d deletes %d updates %d", len(p.create), len(p.delete), len(p.update))
	}
	stored = applyPlan(stored, p)
	for _, s := range stored {
		if port, ok := slicePort(&s); !ok || port != 8080 {
			t.Errorf("slice %s port %v", s.Name, s.Ports)
		}
	}

	// Nothing published: no slice left.
	if p := plan(stored, nil); len(p.delete) != len(stored) || len(p.create)+len(p.update) != 0 {
		t.Fatalf("empty: deletes %d of %d, creates %d updates %d", len(p.delete), len(stored), len(p.create), len(p.update))
	}
}

func TestPublishPlanDropsForeignAndDuplicates(t *testing.T) {
	want := planWant(3128, "a", "b")
	foreign := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "x-foreign"}, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: slicePorts(3128), Endpoints: endpointsOf(want)}
	dupA := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "a-first"}, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: slicePorts(3128), Endpoints: endpointsOf(want)}
	dupB := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "b-second"}, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: slicePorts(3128), Endpoints: endpointsOf(want[:1])}
	ipv6 := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "c-ipv6"}, AddressType: discoveryv1.AddressTypeIPv6,
		Ports: slicePorts(3128)}
	p := planEndpointSlices([]discoveryv1.EndpointSlice{foreign, dupB, ipv6, dupA}, want, 100,
		func(s *discoveryv1.EndpointSlice) bool { return s.Name != "x-foreign" }, func(*discoveryv1.EndpointSlice) {})
	got := sliceNames(p.delete)
	slices.Sort(got)
	if !slices.Equal(got, []string{"b-second", "c-ipv6", "x-foreign"}) {
		t.Errorf("deleted %v, want the foreign, the IPv6 and the duplicate", got)
	}
	if len(p.create)+len(p.update) != 0 {
		t.Errorf("creates %d updates %v: a-first already holds both", len(p.create), sliceNames(p.update))
	}
}

func sliceNames(ss []*discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name)
	}
	return out
}

func TestPublishLeftOutErrorIsBounded(t *testing.T) {
	var l []LeftOutReplica
	for _, n := range names("r", 0, 25) {
		l = append(l, LeftOutReplica{n, "no endpoint in status"})
	}
	msg := leftOutError("ns/p", l).Error()
	if !strings.Contains(msg, "(25)") || !strings.Contains(msg, "r009") || strings.Contains(msg, "r010") || !strings.Contains(msg, "and 15 more") {
		t.Errorf("message %q", msg)
	}
}
