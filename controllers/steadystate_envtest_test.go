package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/util/conditions"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

var _ = Describe("steady state", func() {
	// Issue 30: at 1000 Proxies a status write per probe was 33 writes a
	// second for the API server; a probe that finds nothing new writes
	// nothing now, and one that does writes at once.
	It("writes a Ready Proxy only when a probe finds something new: not for probes alone, at once for a failure", func() {
		image := servedImage()
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		key := types.NamespacedName{Namespace: ns, Name: "steady"}
		Expect(k8sClient.Create(ctx, managedProxy(ns, key.Name, h.name, image))).To(Succeed())
		giveAddress(h, ns, key.Name, "192.0.2.61")
		waitProxyPhase(ns, key.Name, crawlv1.ProxyReady, 30*time.Second)
		probesOK := func() float64 {
			v, _ := probeMetric(GinkgoTB(), "proxy_operator_proxy_probes_total", key, "outcome", "ok")
			return v
		}

		// Two probes after Ready settle what the first ones measure
		// (Secure), then five more (1s apart) must leave it unwritten.
		settled := probesOK()
		Eventually(probesOK).WithTimeout(15 * time.Second).Should(BeNumerically(">=", settled+2))
		before := getProxy(ns, key.Name)
		probed := probesOK()
		Eventually(probesOK).WithTimeout(30 * time.Second).Should(BeNumerically(">=", probed+5))
		after := getProxy(ns, key.Name)
		Expect(after.ResourceVersion).To(Equal(before.ResourceVersion),
			"%.0f probes that found nothing new wrote the Proxy: lastProbeTime %v -> %v", probesOK()-probed, before.Status.Probe.LastProbeTime, after.Status.Probe.LastProbeTime)
		Expect(after.Status.Phase).To(Equal(crawlv1.ProxyReady))

		// The proxy stops answering: the threshold's failure turns it
		// unhealthy in status at once (not at a heartbeat), with the
		// probe's time.
		down := time.Now().Truncate(time.Second)
		prober.SetDown(after.Status.Address, true)
		DeferCleanup(prober.SetDown, after.Status.Address, false)
		Eventually(func(g Gomega) {
			p := getProxy(ns, key.Name)
			g.Expect(conditions.IsFalse(p, crawlv1.ProxyHealthyCondition)).To(BeTrue(), "ProxyHealthy %s", conditions.GetReason(p, crawlv1.ProxyHealthyCondition))
			g.Expect(p.Status.Probe.ConsecutiveFailures).To(BeNumerically(">=", 3))
			g.Expect(p.Status.Probe.LastProbeTime.Time).NotTo(BeTemporally("<", down))
		}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		failed, _ := probeMetric(GinkgoTB(), "proxy_operator_proxy_probes_total", key, "outcome", "failed")
		Expect(failed).To(BeNumerically(">=", 3))

		// Gone: its probe series go with it.
		deleteProxy(ns, key.Name)
		waitProxyGone(ns, key.Name, 20*time.Second)
		for _, name := range []string{"proxy_operator_proxy_probes_total", "proxy_operator_proxy_last_probe_timestamp_seconds", "proxy_operator_proxy_probe_latency_seconds"} {
			_, n := probeMetric(GinkgoTB(), name, key)
			Expect(n).To(BeZero(), "series of %s left after the Proxy went", name)
		}
	})

	It("leaves a steady ProxyPool and its replicas unwritten while the replicas are probed", func() {
		image, hostLabel, hosts := poolHosts("steady", 2)
		ns := newNamespace()
		booter := startPoolBooter(hosts, ns)
		defer booter.stop()
		pool := poolOnHosts(ns, "steady", 2, hostLabel, image)
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		names := waitPoolReady(pool, 2)
		probes := func() float64 {
			total := 0.0
			for _, n := range names {
				v, _ := probeMetric(GinkgoTB(), "proxy_operator_proxy_probes_total", types.NamespacedName{Namespace: ns, Name: n}, "outcome", "ok")
				total += v
			}
			return total
		}
		versions := func() map[string]string {
			v := map[string]string{"pool": getPool(pool).ResourceVersion}
			for _, n := range names {
				v[n] = getProxy(ns, n).ResourceVersion
			}
			return v
		}

		// Settled after two probes of each replica, then five more of
		// each must write neither the replicas nor the pool.
		settled := probes()
		Eventually(probes).WithTimeout(15 * time.Second).Should(BeNumerically(">=", settled+4))
		before := versions()
		probed := probes()
		Eventually(probes).WithTimeout(30 * time.Second).Should(BeNumerically(">=", probed+10))
		Expect(versions()).To(Equal(before), "%.0f probes that found nothing new wrote the pool or its replicas", probes()-probed)
		Expect(readyPoolReplicas(pool)).To(HaveLen(2))
	})
})
