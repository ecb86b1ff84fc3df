package controllers

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// Ban reports (ProxyBan) through the real controllers, over the suite's
// in-memory libvirt hosts, as the ProxyPool specs run.
var _ = Describe("ProxyPool ban reports", Ordered, func() {
	var (
		image     string
		hostLabel map[string]string
		hosts     []*testHost
	)
	BeforeAll(func() { image, hostLabel, hosts = poolHosts("ban", 2) })

	// banPool is a ready pool of n whose replicas boot in about a second.
	banPool := func(ns, name string, n int32, tune ...func(*crawlv1.ProxyPool)) (*crawlv1.ProxyPool, []string) {
		startPoolBooter(hosts, ns)
		pool := poolOnHosts(ns, name, n, hostLabel, image, tune...)
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		return pool, waitPoolReady(pool, int(n))
	}
	report := func(pool *crawlv1.ProxyPool, name, proxy, domain string, replace bool) *crawlv1.ProxyBan {
		b := &crawlv1.ProxyBan{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: name},
			Spec: crawlv1.ProxyBanSpec{Pool: pool.Name, Proxy: proxy, Domain: domain, Replace: replace, Reason: "HTTP 403 x9"}}
		Expect(k8sClient.Create(ctx, b)).To(Succeed())
		return b
	}
	entry := func(pool *crawlv1.ProxyPool, name string) (PublishedProxy, bool) {
		i := slices.IndexFunc(publishedJSON(pool), func(e PublishedProxy) bool { return e.Name == name })
		if i < 0 {
			return PublishedProxy{}, false
		}
		return publishedJSON(pool)[i], true
	}

	It("lists a domain ban with its expiry in proxies.json and keeps the replica published", func() {
		ns := newNamespace()
		w := watchPool(ns, "dom")
		pool, names := banPool(ns, "dom", 2, func(p *crawlv1.ProxyPool) {
			p.Spec.Bans.DomainBanDuration = &metav1.Duration{Duration: time.Hour}
		})
		b := report(pool, "shop", names[0], "shop.example.com", false)
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(b), b)).To(Succeed())
		want := []BannedDomain{{Domain: "shop.example.com", ExpiresAt: b.CreationTimestamp.Add(time.Hour).UTC().Format(time.RFC3339)}}
		Eventually(func(g Gomega) {
			e, ok := entry(pool, names[0])
			g.Expect(ok).To(BeTrue(), "the banned replica left the list")
			g.Expect(e.BannedDomains).To(Equal(want))
		}).WithTimeout(10 * time.Second).Should(Succeed())
		other, _ := entry(pool, names[1])
		Expect(other.BannedDomains).To(BeEmpty())
		Expect(published.last(pool)).To(ConsistOf(names))
		Expect(w.createdNames()).To(ConsistOf(names), "a domain ban replaced a replica")
		// The report goes with its replica: owned by the Proxy.
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(b), b)).To(Succeed())
			g.Expect(b.OwnerReferences).To(ContainElement(HaveField("Name", names[0])))
		}).Should(Succeed())
	})

	It("unpublishes a replica reported for replacement within 2 s, then replaces it surge-first", func() {
		ns := newNamespace()
		w := watchPool(ns, "swap")
		pool, names := banPool(ns, "swap", 2)
		w.arm(2, 1, 0)
		banned := names[0]

		// The API server's own record of when the Secret changed.
		wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		secrets := &corev1.SecretList{}
		Expect(wc.List(ctx, secrets, client.InNamespace(ns))).To(Succeed())
		wi, err := wc.Watch(ctx, &corev1.SecretList{}, client.InNamespace(ns),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: secrets.ResourceVersion}})
		Expect(err).NotTo(HaveOccurred())
		defer wi.Stop()

		reported := time.Now()
		report(pool, "swap-ban", banned, "", true)
		var unpublished time.Duration
		Eventually(wi.ResultChan()).WithTimeout(10 * time.Second).Should(Receive(Satisfy(func(e watch.Event) bool {
			s, ok := e.Object.(*corev1.Secret)
			if !ok || e.Type != watch.Modified || s.Name != crawlv1.PublishedName(pool.Name) {
				return false
			}
			var entries []PublishedProxy
			Expect(json.Unmarshal(s.Data[crawlv1.ProxiesJSONKey], &entries)).To(Succeed())
			if slices.ContainsFunc(entries, func(p PublishedProxy) bool { return p.Name == banned }) {
				return false
			}
			unpublished = time.Since(reported)
			return true
		})))
		GinkgoWriter.Printf("report to unpublished: %s\n", unpublished)
		Expect(unpublished).To(BeNumerically("<", 2*time.Second))

		waitProxyGone(ns, banned, 30*time.Second)
		ready := waitPoolReady(pool, 2)
		Expect(ready).NotTo(ContainElement(banned))
		// Surge first: the replacement existed before the banned one was
		// taken out (the watch's budget check: never fewer than 2 Ready
		// and not draining when one goes, never more than 3).
		var replacement string
		for _, c := range w.creations() {
			if !slices.Contains(names, c.name) {
				replacement = c.name
			}
		}
		Expect(replacement).NotTo(BeEmpty())
		gone := w.object(banned)
		Expect(gone.DeletionTimestamp).NotTo(BeNil())
		Expect(w.object(replacement).CreationTimestamp.Time).NotTo(BeTemporally(">", gone.DeletionTimestamp.Time))
		w.expectBudgetKept()
		Expect(w.maxExisting()).To(BeNumerically("<=", 3))
		got := getPool(pool)
		Expect(got.Status.BanReplacements).To(ContainElement(HaveField("Replica", banned)))
	})

	It("past maxReplacementsPerHour records the report, says replacement is paused and replaces nothing more", func() {
		ns := newNamespace()
		pool, names := banPool(ns, "budget", 3, func(p *crawlv1.ProxyPool) {
			p.Spec.Bans.MaxReplacementsPerHour = ptr.To(int32(1))
			p.Spec.Bans.MaxBanned = ptr.To(intstr.FromString("100%"))
		})
		report(pool, "first", names[0], "", true)
		waitProxyGone(ns, names[0], 30*time.Second)
		waitPoolReady(pool, 3)

		report(pool, "second", names[1], "", true)
		Eventually(func(g Gomega) {
			c := conditions.Get(getPool(pool), crawlv1.PoolBanReplacementPausedCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(crawlv1.PoolBanBudgetExhaustedReason))
			g.Expect(c.Message).To(ContainSubstring(names[1]))
		}).WithTimeout(10 * time.Second).Should(Succeed())
		// The decision that paused it is the one the condition reports:
		// the reported replica is neither replaced nor unpublished.
		got := getPool(pool)
		Expect(got.Status.BanReplacements).To(HaveLen(1))
		Expect(got.Status.BanReplacements[0].Replica).To(Equal(names[0]))
		Expect(getProxy(ns, names[1]).DeletionTimestamp.IsZero()).To(BeTrue())
		Expect(published.last(pool)).To(ContainElement(names[1]))
		Expect(poolReplicas(pool)).To(HaveLen(3))
		expectEvent(ns, "ProxyPool", crawlv1.PoolBanBudgetExhaustedReason, names[1])
	})

	It("quarantines the reported egress address: a replacement leaving from it is never published and is replaced", func() {
		ns := newNamespace()
		pool, names := banPool(ns, "quar", 2, func(p *crawlv1.ProxyPool) {
			p.Spec.Bans.MaxBanned = ptr.To(intstr.FromString("100%"))
		})
		const banned = "203.0.113.50"
		banAddr := getProxy(ns, names[0]).Status.Address
		prober.SetEgress(banAddr, banned)
		DeferCleanup(prober.SetEgress, banAddr, "")
		setEgressSource(ns, names[0], banned)

		// The NAT case: the next replica leaves from the same address,
		// from its first probe (the one that makes it Ready).
		prober.SetEgress(getProxy(ns, names[1]).Status.Address, "")
		prober.SetEgress("*", banned)
		DeferCleanup(prober.SetEgress, "*", "")

		report(pool, "quar-ban", names[0], "", true)
		Eventually(func(g Gomega) {
			q := getPool(pool).Status.Quarantine
			g.Expect(q).To(HaveLen(1))
			g.Expect(q[0].Address).To(Equal(banned))
			g.Expect(q[0].Replica).To(Equal(names[0]))
			g.Expect(q[0].ExpiresAt.Time).To(BeTemporally("~", time.Now().Add(24*time.Hour), time.Minute))
		}).WithTimeout(10 * time.Second).Should(Succeed())

		var shared string
		Eventually(func(g Gomega) {
			for _, p := range poolReplicas(pool) {
				if !slices.Contains(names, p.Name) && p.Status.EgressAddress == banned {
					shared = p.Name
				}
			}
			g.Expect(shared).NotTo(BeEmpty())
			// Taken for replacement before its egress changes below.
			g.Expect(getPool(pool).Status.BanReplacements).To(ContainElement(HaveField("Replica", shared)))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		// Its replacement leaves from elsewhere.
		prober.SetEgress("*", "")
		waitProxyGone(ns, shared, 30*time.Second)
		ready := waitPoolReady(pool, 2)
		Expect(ready).NotTo(ContainElements(names[0], shared))
		for _, c := range published.all(pool) {
			Expect(c.names).NotTo(ContainElement(shared), "a replica leaving from a quarantined address was published")
		}
		Expect(getPool(pool).Status.BanReplacements).To(ContainElement(HaveField("Replica", shared)))
	})

	It("records a report naming no replica of its pool as a Warning event, and changes nothing else", func() {
		ns := newNamespace()
		w := watchPool(ns, "stray")
		pool, names := banPool(ns, "stray", 2)
		before := getPool(pool)
		report(pool, "stray-ban", "stray-nobody", "", true)
		expectEvent(ns, "ProxyBan", "BanIgnored", "stray-nobody")
		got := getPool(pool)
		Expect(got.Status.BanReplacements).To(BeEmpty())
		Expect(got.Status.Quarantine).To(BeEmpty())
		Expect(got.Status.AvailableReplicas).To(Equal(before.Status.AvailableReplicas))
		Expect(proxyNames(poolReplicas(pool))).To(ConsistOf(names))
		Expect(published.last(pool)).To(ConsistOf(names))
		Expect(w.createdNames()).To(ConsistOf(names))
	})

	It("refuses a malformed report naming the field, and nothing about the pool changes", func() {
		ns := newNamespace()
		w := watchPool(ns, "bad")
		pool, names := banPool(ns, "bad", 2)
		before, secret := getPool(pool), publishedSecret(pool)
		for _, tc := range []struct {
			spec crawlv1.ProxyBanSpec
			want string
		}{
			{crawlv1.ProxyBanSpec{Pool: pool.Name, Proxy: names[0], Domain: "Shop.Example.COM/cart"}, "spec.domain"},
			{crawlv1.ProxyBanSpec{Pool: pool.Name, Proxy: names[0]}, "must ask for replacement"},
			{crawlv1.ProxyBanSpec{Pool: pool.Name, Proxy: names[0], Replace: true, Reason: strings.Repeat("x", 257)}, "spec.reason"},
			{crawlv1.ProxyBanSpec{Pool: pool.Name, Domain: "shop.example.com", Replace: true}, "spec.proxy"},
		} {
			b := &crawlv1.ProxyBan{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "bad-ban-"}, Spec: tc.spec}
			err := k8sClient.Create(ctx, b)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%+v: %v", tc.spec, err)
			Expect(err.Error()).To(ContainSubstring(tc.want))
		}
		// Given the reconciler time to act on anything: nothing moves.
		Consistently(func(g Gomega) {
			got := getPool(pool)
			g.Expect(got.Generation).To(Equal(before.Generation))
			g.Expect(got.Status.BanReplacements).To(BeEmpty())
			g.Expect(got.Status.Quarantine).To(BeEmpty())
			g.Expect(got.Status.AvailableReplicas).To(Equal(before.Status.AvailableReplicas))
			g.Expect(publishedSecret(pool).ResourceVersion).To(Equal(secret.ResourceVersion), "the published Secret was rewritten")
			g.Expect(w.createdNames()).To(ConsistOf(names))
		}).WithTimeout(3 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
		bans := &crawlv1.ProxyBanList{}
		Expect(k8sClient.List(ctx, bans, client.InNamespace(ns))).To(Succeed())
		Expect(bans.Items).To(BeEmpty())
	})
})

// setEgressSource says the replica's egress was measured by an echo URL
// (what the egress measurement writes), once the probe has seen addr.
func setEgressSource(ns, name, addr string) {
	Eventually(func(g Gomega) {
		p := getProxy(ns, name)
		g.Expect(p.Status.EgressAddress).To(Equal(addr))
		orig := p.DeepCopy()
		p.Status.EgressSource = crawlv1.EgressSourceEcho
		g.Expect(k8sClient.Status().Patch(ctx, p, client.MergeFrom(orig))).To(Succeed())
	}).WithTimeout(10 * time.Second).Should(Succeed())
}

// expectEvent waits for a Warning event on an object of kind whose message
// has substr.
func expectEvent(ns, kind, reason, substr string) {
	Eventually(func(g Gomega) {
		events := &corev1.EventList{}
		g.Expect(k8sClient.List(ctx, events, client.InNamespace(ns))).To(Succeed())
		g.Expect(events.Items).To(ContainElement(Satisfy(func(e corev1.Event) bool {
			return e.InvolvedObject.Kind == kind && e.Type == corev1.EventTypeWarning && e.Reason == reason && strings.Contains(e.Message, substr)
		})), "no Warning %s on a %s naming %s", reason, kind, substr)
	}).WithTimeout(10 * time.Second).Should(Succeed())
}
