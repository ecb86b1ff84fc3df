package controllers

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"sigs.k8s.io/cluster-api/util/conditions"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// Issue 31: a libvirtd that stops answering while SSH stays up. With the
// manager wired as main wires it (the 10-minute --provider-call-timeout,
// the kvm provider's default RPC deadlines), a Proxy reconcile on that host
// gives its worker back at the lookup's deadline, not at the call's.
var _ = Describe("a KVM host whose libvirtd stops answering lookups", func() {
	It("fails the Proxy's reconcile transiently at the lookup's deadline", func() {
		Expect(mgr.proxy.ProviderCallTimeout).To(Equal(DefaultProviderCallTimeout), "the harness must run main's call budget")
		h := readyHost(uniqueName("hv"))
		image := servedImage()
		release := h.fake.Block(virt.RPCDomainLookupByName)
		DeferCleanup(release)
		ns := newNamespace()

		created := time.Now()
		createProxy(ns, "wedged", h.name, image)
		want := fmt.Sprintf("libvirt %s on host %s did not answer within %s", virt.RPCDomainLookupByName, h.name, virt.DefaultQueryDeadline)
		// Every condition seen on the way, so a failure says what the
		// reconcile reported instead.
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
			g.Expect(c.Reason).To(Equal(crawlv1.ProxyTransientErrorReason), "seen: %q", seen)
			g.Expect(c.Message).To(ContainSubstring(want), "seen: %q", seen)
		}).WithTimeout(virt.DefaultQueryDeadline + time.Minute).WithPolling(100 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("Proxy created -> transient error at the lookup's deadline in %v\n", time.Since(created))
		Expect(h.fake.Blocked(virt.RPCDomainLookupByName)).To(BeNumerically(">=", 1), "the lookup was answered after all")
		Expect(h.fake.Calls(virt.RPCDomainDefineXMLFlags)).To(BeZero())

		// The daemon answers again: the Proxy can go.
		release()
		deleteProxy(ns, "wedged")
		waitProxyGone(ns, "wedged", 30*time.Second)
	})
})
