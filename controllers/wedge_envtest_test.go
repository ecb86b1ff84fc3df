package controllers

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/test/harness"
)

// Issue 31: a libvirtd that stops answering while SSH stays up. With the
// manager wired as main wires it (16 Proxy workers, so 4 provider calls in
// flight per host; the 10-minute --provider-call-timeout; the kvm
// provider's default RPC deadlines), a Proxy reconcile on that host gives
// its worker back at the lookup's deadline, not at the call's.
var _ = Describe("a KVM host whose libvirtd stops answering lookups", Ordered, func() {
	BeforeAll(withProductionProxyDefaults)

	It("fails the Proxy's reconcile transiently at the lookup's deadline", func() {
		Expect(mgr.Wiring.Proxy.ProviderCallTimeout).To(Equal(DefaultProviderCallTimeout), "the harness must run main's call budget")
		h := readyHost(uniqueName("hv"))
		image := servedImage()
		release := h.fake.Block(virt.RPCDomainLookupByName)
		DeferCleanup(release)
		ns := newNamespace()

		created := time.Now()
		createProxy(ns, "wedged", h.name, image)
		want := fmt.Sprintf("libvirt %s on host %s did not answer within %s", virt.RPCDomainLookupByName, h.name, virt.DefaultQueryDeadline)
		// Every condition seen on the way (abandoned lookups hold the
		// host's call slots until they return, and later reconciles are
		// turned away as busy, which leaves the condition as it was). A
		// failure says what the reconcile reported instead.
		var seen []string
		last := ""
		// Generous for a loaded machine, and far below the call's 10
		// minutes: without per-RPC deadlines the reconcile is still
		// waiting here.
		Eventually(func(g Gomega) {
			p := getProxy(ns, "wedged")
			c := conditions.Get(p, crawlv1.InstanceProvisionedCondition)
			g.Expect(c).NotTo(BeNil())
			if now := c.Reason + ": " + c.Message; now != last {
				last = now
				seen = append(seen, fmt.Sprintf("%v %s", time.Since(created).Round(time.Millisecond), now))
			}
			g.Expect(seen).To(ContainElement(SatisfyAll(ContainSubstring(crawlv1.ProxyTransientErrorReason+": "), ContainSubstring(want))), "seen: %q", seen)
		}).WithTimeout(virt.DefaultQueryDeadline + time.Minute).WithPolling(50 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("Proxy created -> transient error at the lookup's deadline in %v\n", time.Since(created))
		Expect(h.fake.Blocked(virt.RPCDomainLookupByName)).To(BeNumerically(">=", 1), "the lookup was answered after all")
		Expect(h.fake.Calls(virt.RPCDomainDefineXMLFlags)).To(BeZero())

		// The daemon answers again: the Proxy can go.
		release()
		deleteProxy(ns, "wedged")
		waitProxyGone(ns, "wedged", 30*time.Second)
	})
})

// Issue 31, the rest: a libvirtd stopped altogether (SIGSTOP: every RPC
// hangs, the health check's too, while sshd answers). Once the KVMHost's
// check reports Timeout, the kvm provider calls the host no more: its
// Proxies' reconciles return at once, keep what is known of the
// instances and say why; when the host answers again they converge. The
// manager runs the production Proxy defaults: 16 workers, so 4 provider
// calls in flight per host, the 10-minute call budget, the 5 s provision
// poll and the 30 s probe interval.
var _ = Describe("a KVM host whose libvirtd stops answering altogether", Ordered, func() {
	BeforeAll(withProductionProxyDefaults)

	It("turns its Proxies away without an RPC, keeps what is known of them, and converges once it answers", func() {
		Expect(mgr.Wiring.Proxy.ProviderCallTimeout).To(Equal(DefaultProviderCallTimeout))
		h := stoppableHost(uniqueName("hv"))
		image := servedImage()
		ns := newNamespace()
		readyProxy(h, ns, "serving", image, "192.0.2.41")

		cont := h.fake.Stop()
		DeferCleanup(cont)
		stopped := time.Now()
		waitHostReason(h.name, crawlv1.HostTimeoutReason, 30*time.Second)
		GinkgoWriter.Printf("libvirtd stopped -> KVMHost Timeout in %v\n", time.Since(stopped))
		// RPCs sent before the verdict (the check's, a read) hang until
		// the daemon answers; from the verdict on, none is sent. A call
		// that passed the provider's gate just before the verdict may
		// still reach the daemon after the KVMHost says Timeout: count
		// from when the host has taken no RPC for a second.
		var before int
		Eventually(func(g Gomega) {
			n := h.fake.TotalCalls()
			g.Consistently(h.fake.TotalCalls).WithTimeout(time.Second).WithPolling(100 * time.Millisecond).Should(Equal(n))
			before = n
		}).WithTimeout(10 * time.Second).Should(Succeed())
		beforeCalls := h.fake.CallCounts()

		createProxy(ns, "new", h.name, image)
		reread(ns, "serving")
		notAnswering := fmt.Sprintf("KVM host %q is not answering", h.name)
		Eventually(func(g Gomega) {
			p := getProxy(ns, "new")
			g.Expect(p.Status.Phase).To(Equal(crawlv1.ProxyPending))
			c := conditions.Get(p, crawlv1.InstanceProvisionedCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(crawlv1.ProxyHostNotAnsweringReason), "message: %s", c.Message)
			g.Expect(c.Message).To(ContainSubstring(notAnswering))
			g.Expect(conditions.IsTrue(p, crawlv1.HostUnavailableCondition)).To(BeTrue())
		}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		Eventually(func(g Gomega) {
			p := getProxy(ns, "serving")
			g.Expect(conditions.GetReason(p, crawlv1.HostUnavailableCondition)).To(Equal(crawlv1.ProxyHostNotAnsweringReason))
			g.Expect(conditions.GetMessage(p, crawlv1.HostUnavailableCondition)).To(ContainSubstring(notAnswering))
		}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		// The serving Proxy keeps its instance and its Ready: its proxy
		// still serves, and a stopped libvirtd stops no guest.
		served := getProxy(ns, "serving")
		Expect(served.Status.Phase).To(Equal(crawlv1.ProxyReady))
		Expect(served.Status.ProviderID).NotTo(BeEmpty())
		Expect(conditions.IsTrue(served, crawlv1.InstanceProvisionedCondition)).To(BeTrue())

		deleteProxy(ns, "new")
		Eventually(func(g Gomega) {
			p := getProxy(ns, "new")
			g.Expect(conditions.IsTrue(p, crawlv1.DeletionBlockedCondition)).To(BeTrue())
			g.Expect(conditions.GetReason(p, crawlv1.DeletionBlockedCondition)).To(Equal(crawlv1.ProxyHostNotAnsweringReason))
		}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		createProxy(ns, "later", h.name, image)
		Consistently(func(g Gomega) {
			g.Expect(getProxy(ns, "serving").Status.Phase).To(Equal(crawlv1.ProxyReady))
			g.Expect(conditions.GetReason(getProxy(ns, "later"), crawlv1.InstanceProvisionedCondition)).NotTo(Equal(crawlv1.ProxyTransientErrorReason))
		}).WithTimeout(3 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		Expect(h.fake.TotalCalls()).To(Equal(before), "RPCs sent to a host whose health check got no answer: before %v, after %v", beforeCalls, h.fake.CallCounts())

		cont()
		answered := time.Now()
		waitHostReason(h.name, crawlv1.HostReadyReason, 30*time.Second)
		waitProxyGone(ns, "new", 30*time.Second)
		giveAddress(h, ns, "later", "192.0.2.42")
		waitProxyPhase(ns, "later", crawlv1.ProxyReady, 30*time.Second)
		Eventually(func(g Gomega) {
			p := getProxy(ns, "serving")
			g.Expect(conditions.Get(p, crawlv1.HostUnavailableCondition)).To(BeNil())
			g.Expect(p.Status.Phase).To(Equal(crawlv1.ProxyReady))
			g.Expect(p.Status.ProviderID).To(Equal(served.Status.ProviderID), "the same instance")
		}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		Expect(conditions.Get(getProxy(ns, "later"), crawlv1.HostUnavailableCondition)).To(BeNil())
		GinkgoWriter.Printf("libvirtd answers -> every Proxy converged in %v\n", time.Since(answered))
		Expect(domainNames(h, ns+".")).To(ConsistOf(ns+".serving", ns+".later"))
	})

	It("with more Proxies on the stopped host than workers, a Proxy on a healthy host becomes Ready in its usual bound", func() {
		const onWedged = 40
		wedged := stoppableHost(uniqueName("hv-wedged"))
		healthy := readyHost(uniqueName("hv"))
		image := servedImage()
		ns := newNamespace()
		for i := range onWedged {
			createProxy(ns, fmt.Sprintf("w%02d", i), wedged.name, image)
		}
		// Stopped while those Proxies are being created: a wave of
		// reconciles meets the wedge before the health check does.
		cont := wedged.fake.Stop()
		DeferCleanup(cont)
		created := time.Now()
		readyProxy(healthy, ns, "elsewhere", image, "192.0.2.43")
		GinkgoWriter.Printf("Proxy on the healthy host Ready %v after the other host stopped, with %d Proxies on it\n", time.Since(created), onWedged)

		waitHostReason(wedged.name, crawlv1.HostTimeoutReason, 30*time.Second)
		Eventually(func(g Gomega) {
			for i := range onWedged {
				p := getProxy(ns, fmt.Sprintf("w%02d", i))
				g.Expect(conditions.GetReason(p, crawlv1.HostUnavailableCondition)).To(Equal(crawlv1.ProxyHostNotAnsweringReason), "%s", p.Name)
			}
		}).WithTimeout(time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("RPCs hanging on the stopped host: %d\n", wedged.fake.Stopped())

		cont()
		Eventually(func(g Gomega) {
			for i := range onWedged {
				p := getProxy(ns, fmt.Sprintf("w%02d", i))
				g.Expect(p.Status.ProviderID).NotTo(BeEmpty(), "%s: %s", p.Name, conditions.GetMessage(p, crawlv1.InstanceProvisionedCondition))
				g.Expect(conditions.Get(p, crawlv1.HostUnavailableCondition)).To(BeNil(), "%s", p.Name)
			}
		}).WithTimeout(2 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
		// Nothing lost or made twice: one domain and one overlay per Proxy.
		Expect(domainNames(wedged, ns+".")).To(HaveLen(onWedged))
		for i := range onWedged {
			p := getProxy(ns, fmt.Sprintf("w%02d", i))
			_, disk := wedged.fake.Volume(kvmtest.PoolName, domxml.DiskVolumeName(string(p.UID)))
			Expect(disk).To(BeTrue(), "%s has its overlay", p.Name)
			deleteProxy(ns, p.Name)
		}
		for i := range onWedged {
			waitProxyGone(ns, fmt.Sprintf("w%02d", i), time.Minute)
		}
		Expect(domainNames(wedged, ns+".")).To(BeEmpty())
	})
})

// stoppableHost is readyHost checked every 5 s: a host stopped now is
// reported Timeout within one interval and the check timeout, and its
// verdict stands three intervals, however late a loaded machine runs the
// next check.
func stoppableHost(name string) *testHost {
	h := hosts.add(name)
	createSecret(h)
	createKVMHost(name, h.ssh.Addr(), nil, func(s *crawlv1.KVMHostSpec) {
		s.CheckInterval = &metav1.Duration{Duration: 5 * time.Second}
	})
	waitHostReason(name, crawlv1.HostReadyReason, 20*time.Second)
	return h
}

// reread makes the Proxy's next reconcile read its instance, and asks for
// that reconcile now, as a libvirt event about it would.
func reread(ns, name string) {
	mgr.Wiring.Proxy.MarkDirty(client.ObjectKey{Namespace: ns, Name: name})
	Eventually(func() error {
		p := getProxy(ns, name)
		orig := p.DeepCopy()
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations["test.crawl.example.com/reread"] = time.Now().Format(time.RFC3339Nano)
		return k8sClient.Patch(ctx, p, client.MergeFrom(orig))
	}).Should(Succeed())
}

// withProductionProxyDefaults runs the suite's manager with the Proxy
// options main ships (workers, call budget, poll and probe intervals)
// until the container's specs are done.
func withProductionProxyDefaults() {
	harness.Replace(&mgr, startManager, managerConfig{proxy: func(o *ProxyOptions) { *o = ProxyOptions{PortWatch: o.PortWatch} }})
}
