package controllers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/test/harness"
)

// echoRoute is the path from the manager through a guest's squid to the
// Internet, on loopback: each guest address gets its own HTTP forward
// proxy (requiring Basic credentials, as the managed squid does), whose
// upstream connections leave from the loopback address egressOf gives
// the guest (its "NAT"); a real echo server sees that source. The
// Echoer is proxyprobe.HTTPEcho, sent to the guest's forward proxy
// instead of the fake guest's address.
type echoRoute struct {
	mu       sync.Mutex
	pinned   map[string]string // guest address -> egress
	fallback string            // egress of the others
	proxies  map[string]*httptest.Server
	auth     map[string][]string // guest address -> Proxy-Authorization seen
}

func newEchoRoute() *echoRoute {
	return &echoRoute{pinned: map[string]string{}, fallback: "127.0.0.2", proxies: map[string]*httptest.Server{}, auth: map[string][]string{}}
}

func (e *echoRoute) egressOf(guest string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if a, ok := e.pinned[guest]; ok {
		return a
	}
	return e.fallback
}

// pin fixes guest's egress; pinAll fixes every guest seen so far at what
// it has now, and sends guests seen later out through fallback.
func (e *echoRoute) pin(guest, egress string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pinned[guest] = egress
}

func (e *echoRoute) pinAll(fallback string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for g := range e.proxies {
		if _, ok := e.pinned[g]; !ok {
			e.pinned[g] = e.fallback
		}
	}
	e.fallback = fallback
}

func (e *echoRoute) authSeen(guest string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.auth[guest]...)
}

func (e *echoRoute) proxyFor(guest string) *httptest.Server {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.proxies[guest]; ok {
		return s
	}
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		src := &net.TCPAddr{IP: net.ParseIP(e.egressOf(guest))}
		return (&net.Dialer{LocalAddr: src}).DialContext(ctx, network, addr)
	}}
	rp := &httputil.ReverseProxy{Transport: tr, Rewrite: func(r *httputil.ProxyRequest) {
		r.Out.URL = r.In.URL
		r.Out.Header.Del("Proxy-Authorization")
	}}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Proxy-Authorization")
		e.mu.Lock()
		e.auth[guest] = append(e.auth[guest], h)
		e.mu.Unlock()
		if !strings.HasPrefix(h, "Basic ") {
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	e.proxies[guest] = s
	return s
}

func (e *echoRoute) Echo(ctx context.Context, echoURL string, t proxyprobe.Target) (netip.Addr, error) {
	u, _ := url.Parse(e.proxyFor(t.Address).URL)
	port, _ := strconv.Atoi(u.Port())
	t.Address, t.Port = u.Hostname(), int32(port)
	return proxyprobe.HTTPEcho{Timeout: 2 * time.Second}.Echo(ctx, echoURL, t)
}

func (e *echoRoute) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.proxies {
		s.Close()
	}
}

// echoServer answers with the caller's source address, as JSON.
func echoServer() string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		_ = json.NewEncoder(w).Encode(map[string]string{"ip": host})
	}))
	DeferCleanup(srv.Close)
	return srv.URL + "/ip"
}

// basicAccess is a managed squid with Basic auth: the Proxy gets a
// credential, which the echo must carry.
func basicAccess() *crawlv1.ProxyAccess {
	return &crawlv1.ProxyAccess{Managed: ptr.To(true), AllowedSourceCIDRs: []string{"10.244.0.0/16"},
		Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthBasic}}
}

func egressEvents(ns, name string) []string {
	list := &corev1.EventList{}
	Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == name && ev.Reason == "EgressAddressChanged" {
			out = append(out, ev.Message)
		}
	}
	return out
}

var _ = Describe("Egress measured through the proxy", Ordered, func() {
	var (
		route *echoRoute
		image string
	)
	BeforeAll(func() {
		image = servedImage()
		route = newEchoRoute()
		DeferCleanup(route.close)
		echoURL := echoServer()
		harness.Replace(&mgr, startManager, managerConfig{proxy: func(o *ProxyOptions) {
			o.Egress = EgressOptions{EchoURL: echoURL, Interval: 2 * time.Second, StaleAfter: time.Minute}
			o.Echoer = route
		}})
	})

	It("records what the echo server saw, with its source, and an event when it changes", func() {
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		const guest = "192.0.2.61"
		route.pin(guest, "127.0.0.2")
		// Managed squid with Basic auth: the Proxy has a credential.
		Expect(k8sClient.Create(ctx, &crawlv1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "echoed"},
			Spec: crawlv1.ProxySpec{
				Provider:          crawlv1.ProviderKVM,
				Placement:         crawlv1.ProxyPlacement{Host: h.name, Image: image},
				InstallGuestAgent: ptr.To(true),
				Port:              3128,
				Access:            basicAccess(),
			},
		})).To(Succeed())
		giveAddress(h, ns, "echoed", guest)
		waitProxyPhase(ns, "echoed", crawlv1.ProxyReady, 30*time.Second)
		Eventually(func(g Gomega) {
			p := getProxy(ns, "echoed")
			g.Expect(p.Status.EgressAddress).To(Equal("127.0.0.2"))
			g.Expect(p.Status.EgressSource).To(Equal(crawlv1.EgressSourceEcho))
			g.Expect(p.Status.EgressMeasuredAt).NotTo(BeNil())
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() []string { return egressEvents(ns, "echoed") }).Should(ContainElement("egress address none -> 127.0.0.2"))

		By("the echo went through the proxy with the Proxy's own credential")
		p := getProxy(ns, "echoed")
		Expect(p.Status.CredentialsSecretRef).NotTo(BeNil())
		sec := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: p.Status.CredentialsSecretRef.Name}, sec)).To(Succeed())
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte(string(sec.Data["username"])+":"+string(sec.Data["password"])))
		Expect(route.authSeen(guest)).To(ContainElement(want))

		By("the NAT's address moves: measured again within the interval, with an event")
		route.pin(guest, "127.0.0.3")
		Eventually(func() string { return getProxy(ns, "echoed").Status.EgressAddress }).WithTimeout(20 * time.Second).Should(Equal("127.0.0.3"))
		Eventually(func() []string { return egressEvents(ns, "echoed") }).Should(ContainElement("egress address 127.0.0.2 -> 127.0.0.3"))
		deleteProxy(ns, "echoed")
		waitProxyGone(ns, "echoed", 20*time.Second)
	})

	It("counts a NAT host's one address once, refuses a duplicate under Required and replaces it where a new address is given", func() {
		label := map[string]string{"egress-hosts": uniqueName("nat")}
		first := readyLabelledHost(uniqueName("nathv"), label)
		second := readyLabelledHost(uniqueName("nathv"), nil)
		ns := newNamespace()
		booter := startPoolBooter([]*testHost{first, second}, ns)
		pool := poolOnHosts(ns, "nat", 2, label, image, func(p *crawlv1.ProxyPool) {
			p.Spec.Template.Spec.Access = basicAccess()
			p.Spec.Remediation.StartupTimeout = &metav1.Duration{Duration: 20 * time.Second}
			p.Spec.Egress.Distinct = crawlv1.EgressDistinctPreferred
		})
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())

		By("Preferred: both replicas on the one NAT host, both published, one address counted")
		waitPoolReady(pool, 2)
		Eventually(func(g Gomega) {
			got := getPool(pool)
			g.Expect(got.Status.DistinctEgressAddresses).To(BeEquivalentTo(1))
			c := conditions.Get(got, crawlv1.PoolEgressDistinctCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Message).To(ContainSubstring("2 replicas share 127.0.0.2 on host " + first.name + " (NAT)"))
			g.Expect(published.last(pool)).To(HaveLen(2))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		By("Required: the newer is unpublished, and no host gives a new address")
		updatePool(pool, func(p *crawlv1.ProxyPool) { p.Spec.Egress.Distinct = crawlv1.EgressDistinctRequired })
		Eventually(func(g Gomega) {
			got := getPool(pool)
			g.Expect(published.last(pool)).To(HaveLen(1))
			g.Expect(got.Status.AvailableReplicas).To(BeEquivalentTo(1))
			g.Expect(conditions.GetReason(got, crawlv1.PoolPlacementBlockedCondition)).To(Equal(crawlv1.PoolNoDistinctEgressReason))
			c := conditions.Get(got, crawlv1.PoolEgressDistinctCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(crawlv1.PoolNoDistinctEgressReason))
			g.Expect(c.Message).To(ContainSubstring("2 replicas share 127.0.0.2"))
			g.Expect(c.Message).To(ContainSubstring(first.name + " (NAT"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(poolReplicas(pool)).To(HaveLen(2), "Required created a replica on a NAT host already in use")

		By("a second NAT host joins: the replacement goes there, leaves from its own address, and the duplicate goes")
		route.pinAll("127.0.0.4")
		kh := &crawlv1.KVMHost{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: second.name}, kh)).To(Succeed())
		kh.Labels = label
		Expect(k8sClient.Update(ctx, kh)).To(Succeed())
		Eventually(func(g Gomega) {
			got := getPool(pool)
			g.Expect(poolReplicas(got)).To(HaveLen(2))
			g.Expect(published.last(pool)).To(HaveLen(2))
			g.Expect(got.Status.DistinctEgressAddresses).To(BeEquivalentTo(2))
			g.Expect(conditions.IsTrue(got, crawlv1.PoolEgressDistinctCondition)).To(BeTrue(), "%+v", conditions.Get(got, crawlv1.PoolEgressDistinctCondition))
			hostsUsed := map[string]bool{}
			for _, p := range poolReplicas(got) {
				hostsUsed[p.Status.Host] = true
			}
			g.Expect(hostsUsed).To(HaveLen(2))
		}).WithTimeout(60 * time.Second).Should(Succeed())
		booter.stop()
		Expect(k8sClient.Delete(ctx, pool)).To(Succeed())
	})
})
