package providers

import (
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/api/compute/v1"

	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/gcp"
	"crawl.example.com/proxy-operator/pkg/provider/gcp/gcptest"
)

var _ = Describe("gcp provider", func() {
	It("takes a Proxy from apply to Ready on a Compute instance and back to nothing", func() {
		ns := newNamespace()
		p := createProxy(ns, "cloud", crawlv1.ProviderGCP)
		name := instanceName(p)

		inst := waitInstanceStatus(name, "STAGING")
		for k, v := range gcpLabels(testTag, ns, "cloud", string(p.UID)) {
			Expect(inst.Labels).To(HaveKeyWithValue(k, v))
		}
		Expect(metadata(inst.Metadata.Items)).To(HaveKeyWithValue(gcp.MetadataUserData, p.Spec.CloudInit.UserData))
		p = waitProxyPhase(ns, "cloud", crawlv1.ProxyProvisioning, 15*time.Second)
		Expect(p.Status.Address).To(BeEmpty())

		Expect(computeFake.SetRunning(gcpProject, gcpZone, name, "203.0.113.10")).To(Succeed())
		p = waitProxyPhase(ns, "cloud", crawlv1.ProxyReady, 15*time.Second)
		Expect(p.Status.ProviderID).To(Equal("gce://" + gcpProject + "/" + gcpZone + "/" + name))
		Expect(p.Status.Host).To(Equal(gcpZone))
		Expect(p.Status.Address).To(Equal("203.0.113.10"))
		Expect(p.Status.AddressSource).To(Equal(provider.AddressSourceNIC))
		Expect(p.Status.Endpoint).To(Equal("http://203.0.113.10:3128"))
		Expect(conditions.IsTrue(p, crawlv1.InstanceProvisionedCondition)).To(BeTrue())
		Expect(conditions.IsTrue(p, crawlv1.ProxyHealthyCondition)).To(BeTrue())
		Expect(controllerutil.ContainsFinalizer(p, crawlv1.ProxyFinalizer)).To(BeTrue())

		deletes := computeFake.Count(gcptest.CallDelete)
		deleteProxy(ns, "cloud")
		waitProxyGone(ns, "cloud", 15*time.Second)
		_, ok := instance(name)
		Expect(ok).To(BeFalse(), "instance left behind")
		Expect(computeFake.Count(gcptest.CallDelete)).To(Equal(deletes + 1))
	})

	It("says a missing firewall rule is why a gcp proxy's port is closed", func() {
		ns := newNamespace()
		p := createProxy(ns, "walled", crawlv1.ProviderGCP)
		prober.SetDown("203.0.113.20", true)
		bootInstance(p, "203.0.113.20")

		// As the Checker does at start-up: the fake project has no rule.
		checker := &provider.Checker{Registry: mgr.Wiring.Registry}
		checker.CheckAll(ctx)
		Eventually(func(g Gomega) {
			p := getProxy(ns, "walled")
			g.Expect(conditions.GetReason(p, crawlv1.ReadyCondition)).To(Equal(crawlv1.ProxyPortClosedReason), describe(p))
			g.Expect(conditions.GetMessage(p, crawlv1.ReadyCondition)).To(ContainSubstring("no firewall rule"))
			g.Expect(conditions.GetMessage(p, crawlv1.ReadyCondition)).To(ContainSubstring("tcp:3128"))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		computeFake.PutFirewall(gcpProject, &compute.Firewall{Name: "allow-proxy", TargetTags: []string{gcp.DefaultNetworkTag},
			SourceRanges: []string{"10.0.0.0/8"}, Allowed: []*compute.FirewallAllowed{{IPProtocol: "tcp", Ports: []string{"3128"}}}})
		checker.CheckAll(ctx)
		Expect(mgr.Wiring.Registry.CheckError(gcp.Name)).To(BeNil())
	})

	It("releases a Proxy with skip-cleanup and leaves its instance running", func() {
		ns := newNamespace()
		p := createProxy(ns, "kept", crawlv1.ProviderGCP)
		name := instanceName(p)
		DeferCleanup(deleteInstance, ns, "kept", string(p.UID), name)
		bootInstance(p, "203.0.113.11")
		waitProxyPhase(ns, "kept", crawlv1.ProxyReady, 15*time.Second)

		deletes := computeFake.Count(gcptest.CallDelete)
		setSkipCleanup(ns, "kept")
		deleteProxy(ns, "kept")
		waitProxyGone(ns, "kept", 15*time.Second)
		inst, ok := instance(name)
		Expect(ok).To(BeTrue(), "skip-cleanup deleted the instance")
		Expect(inst.Status).To(Equal("RUNNING"))
		Expect(computeFake.Count(gcptest.CallDelete)).To(Equal(deletes))
	})

	It("never deletes a same-named instance of another Proxy, and keeps the Proxy until skip-cleanup", func() {
		ns := newNamespace()
		p := createProxy(ns, "contested", crawlv1.ProviderGCP)
		name := instanceName(p)
		bootInstance(p, "203.0.113.12")
		waitProxyPhase(ns, "contested", crawlv1.ProxyReady, 15*time.Second)

		// Someone else's instance now has the name (another install, a
		// restore from a snapshot, ...).
		otherUID := string(uuid.NewUUID())
		putInstance(name, gcpLabels("other-install", ns, "contested", otherUID))
		DeferCleanup(deleteInstance, ns, "contested", otherUID, name)
		mgr.Wiring.Proxy.MarkDirty(client.ObjectKeyFromObject(p))
		p = waitPhaseReason(ns, "contested", crawlv1.ProxyFailed, crawlv1.ProxyForeignInstanceReason, 15*time.Second)
		Expect(conditions.GetMessage(p, crawlv1.ReadyCondition)).To(ContainSubstring("is not this Proxy's"))

		deletes := computeFake.Count(gcptest.CallDelete)
		deleteProxy(ns, "contested")
		expectDeletionBlocked(ns, "contested", crawlv1.ProxyForeignInstanceReason)
		expectInstanceOf(name, otherUID)
		Expect(computeFake.Count(gcptest.CallDelete)).To(Equal(deletes), "delete called on a foreign instance")

		setSkipCleanup(ns, "contested")
		waitProxyGone(ns, "contested", 15*time.Second)
		expectInstanceOf(name, otherUID)
		Expect(computeFake.Count(gcptest.CallDelete)).To(Equal(deletes), "delete called on a foreign instance")
	})

	It("sweeps tagged instances whose Proxy is gone and leaves untagged ones and live Proxies' alone", func() {
		ns := newNamespace()
		live := createProxy(ns, "live", crawlv1.ProviderGCP)
		liveName := instanceName(live)
		bootInstance(live, "203.0.113.13")
		waitProxyPhase(ns, "live", crawlv1.ProxyReady, 15*time.Second)

		put := func(proxy, tag string, install ...string) string {
			uid := string(uuid.NewUUID())
			name := gcp.InstanceName(ns, proxy, uid)
			labels := gcpLabels(tag, ns, proxy, uid)
			delete(labels, gcp.LabelInstall)
			if len(install) > 0 {
				labels[gcp.LabelInstall] = install[0]
			}
			putInstance(name, labels)
			DeferCleanup(deleteInstance, ns, proxy, uid, name)
			return name
		}
		// A Proxy deleted while the operator was down.
		orphan := put("ghost", testTag, testInstallID)
		// An instance of an earlier Proxy of the live one's name: recreated
		// since, so its UID is not the live Proxy's.
		stale := put("live", testTag, testInstallID)
		// Another operator install's instance (with our tag or its own),
		// one made before install ids, and one with no tag at all.
		otherInstall := put("ghost", testTag, "other-install")
		otherTag := put("ghost", "other-tag", testInstallID)
		noInstall := put("ghost", testTag)
		untagged := put("ghost", "")

		n, err := mgr.Wiring.Sweep.Sweep(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(BeNumerically(">=", 2))
		for _, name := range []string{orphan, stale} {
			_, ok := instance(name)
			Expect(ok).To(BeFalse(), "%s not swept", name)
		}
		for _, name := range []string{otherInstall, otherTag, noInstall, untagged, liveName} {
			inst, ok := instance(name)
			Expect(ok).To(BeTrue(), "%s swept", name)
			Expect(inst.Status).To(Equal("RUNNING"), "%s touched", name)
		}
		Expect(getProxy(ns, "live").Status.Phase).To(Equal(crawlv1.ProxyReady))
	})

	It("fails a Proxy whose insert is refused for quota, without a hot loop, and heals once quota is back", func() {
		// Quota stays exhausted for as many inserts as the spec may make.
		for range 20 {
			computeFake.FailNext(gcptest.CallInsert, http.StatusForbidden, "quotaExceeded",
				"Quota 'CPUS' exceeded.  Limit: 8.0 in region us-central1.")
		}
		DeferCleanup(drainInsertFaults, http.StatusForbidden)
		before := computeFake.Count(gcptest.CallInsert)

		ns := newNamespace()
		createProxy(ns, "quota", crawlv1.ProviderGCP)
		p := waitPhaseReason(ns, "quota", crawlv1.ProxyFailed, crawlv1.ProxyPermanentErrorReason, 15*time.Second)
		Expect(conditions.GetMessage(p, crawlv1.ReadyCondition)).To(ContainSubstring("Quota 'CPUS' exceeded"))
		Expect(conditions.GetReason(p, crawlv1.InstanceProvisionedCondition)).To(Equal(crawlv1.ProxyPermanentErrorReason))

		// No hot loop: a permanent error waits for the resync (or a
		// change), it is not retried with the controller's backoff, which
		// would make a dozen inserts in these seconds.
		Consistently(func() crawlv1.ProxyPhase { return getProxy(ns, "quota").Status.Phase }).
			WithTimeout(3 * time.Second).WithPolling(200 * time.Millisecond).Should(Equal(crawlv1.ProxyFailed))
		inserts := computeFake.Count(gcptest.CallInsert) - before
		GinkgoWriter.Printf("%d inserts refused for quota\n", inserts)
		Expect(inserts).To(BeNumerically("<=", 4), "inserts while Failed")
		_, ok := instance(instanceName(p))
		Expect(ok).To(BeFalse())
		Eventually(func() []string { return eventReasons(ns, "quota") }).Should(ContainElement("PhaseFailed"))

		// The quota is raised: the next resync inserts again, unprompted.
		drainInsertFaults(http.StatusForbidden)
		bootInstance(p, "203.0.113.14")
		waitProxyPhase(ns, "quota", crawlv1.ProxyReady, 15*time.Second)
	})

	It("retries rate limiting and unavailability on insert and becomes Ready", func() {
		computeFake.FailNext(gcptest.CallInsert, http.StatusTooManyRequests, "rateLimitExceeded", "Rate Limit Exceeded")
		computeFake.FailNext(gcptest.CallInsert, http.StatusServiceUnavailable, "", "")
		before := computeFake.Count(gcptest.CallInsert)

		ns := newNamespace()
		p := createProxy(ns, "busy", crawlv1.ProviderGCP)
		bootInstance(p, "203.0.113.15")
		p = waitProxyPhase(ns, "busy", crawlv1.ProxyReady, 15*time.Second)
		Expect(p.Status.Address).To(Equal("203.0.113.15"))
		Expect(computeFake.Count(gcptest.CallInsert)-before).To(BeNumerically(">=", 3), "both faults consumed, then an insert that worked")
		Expect(eventReasons(ns, "busy")).NotTo(ContainElement("PhaseFailed"))
	})

	It("retries an insert whose operation fails for lack of zone capacity", func() {
		computeFake.FailNextOperation(gcptest.CallInsert, "ZONE_RESOURCE_POOL_EXHAUSTED",
			"The zone 'projects/envtest-project/zones/us-central1-a' does not have enough resources available to fulfill the request.",
			http.StatusServiceUnavailable)
		before := computeFake.Count(gcptest.CallInsert)

		ns := newNamespace()
		p := createProxy(ns, "capacity", crawlv1.ProviderGCP)
		bootInstance(p, "203.0.113.16")
		waitProxyPhase(ns, "capacity", crawlv1.ProxyReady, 15*time.Second)
		Expect(computeFake.Count(gcptest.CallInsert) - before).To(BeNumerically(">=", 2))
		Expect(eventReasons(ns, "capacity")).NotTo(ContainElement("PhaseFailed"))
	})
})
