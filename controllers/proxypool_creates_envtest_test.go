package controllers

import (
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"sigs.k8s.io/cluster-api/util/conditions"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	poolfleet "crawl.example.com/proxy-operator/pkg/fleet"
)

// Issue 30: creates follow what the hosts can boot (maxConcurrentCreates
// per KVMHost), with no pool-wide per-minute cap by default.
var _ = Describe("ProxyPool create concurrency", Ordered, func() {
	It("creates at most maxConcurrentCreates per host at once, waits without calling it blocked, and is not held to a per-minute rate", func() {
		image, hostLabel, hs := poolHosts("creates", 2)
		ns := newNamespace()
		w := watchPool(ns, "fill")
		pool := poolOnHosts(ns, "fill", 20, hostLabel, image)
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())

		// No guest boots yet, so none becomes Ready: the default per host
		// on each of the two, then nothing more.
		inFlight := 2 * poolfleet.DefaultMaxConcurrentCreates
		Eventually(func() []crawlv1.Proxy { return poolReplicas(pool) }).WithTimeout(30 * time.Second).Should(HaveLen(inFlight))
		Consistently(func() []crawlv1.Proxy { return poolReplicas(pool) }).WithTimeout(3 * time.Second).Should(HaveLen(inFlight))
		perHost := map[string]int{}
		for _, p := range poolReplicas(pool) {
			perHost[p.Spec.Placement.Host]++
		}
		Expect(perHost).To(HaveLen(2))
		for h, n := range perHost {
			Expect(n).To(Equal(poolfleet.DefaultMaxConcurrentCreates), "replicas created on %s", h)
		}
		Expect(conditions.IsTrue(getPool(pool), crawlv1.PoolPlacementBlockedCondition)).To(BeFalse(),
			"waiting for creates in flight is not PlacementBlocked")

		// Guests boot: each Ready replica frees its host for the next.
		booter := startPoolBooter(hs, ns)
		waitPoolReady(pool, 20)
		Expect(w.maxCreatingOnHost()).To(Equal(poolfleet.DefaultMaxConcurrentCreates), "most replicas being created on one host at once")
		// The old default, 10 a minute, could not have made an 11th
		// within a minute of the first.
		created := w.creations()
		Expect(created).To(HaveLen(20))
		slices.SortFunc(created, func(a, b creation) int { return a.at.Compare(b.at) })
		Expect(created[10].at.Sub(created[0].at)).To(BeNumerically("<", time.Minute))

		// The field sets the bound: one per host, with guests not booting.
		booter.stop()
		updatePool(pool, func(p *crawlv1.ProxyPool) { p.Spec.Placement.MaxConcurrentCreates = 1 })
		setScale(pool, 24)
		Eventually(func() []crawlv1.Proxy { return poolReplicas(pool) }).WithTimeout(30 * time.Second).Should(HaveLen(22))
		Consistently(func() []crawlv1.Proxy { return poolReplicas(pool) }).WithTimeout(3 * time.Second).Should(HaveLen(22))

		// Its replicas are probed for as long as they exist.
		Expect(k8sClient.Delete(ctx, pool)).To(Succeed())
		Eventually(func() []crawlv1.Proxy { return poolReplicas(pool) }).WithTimeout(60 * time.Second).Should(BeEmpty())
	})
})
