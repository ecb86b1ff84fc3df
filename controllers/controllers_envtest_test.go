package controllers

import (
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/test/harness"
)

var _ = Describe("KVM fleet", Ordered, func() {
	var (
		img   *kvmtest.ImageServer
		image string
	)
	BeforeAll(func() {
		img = kvmtest.NewImageServer("debian", 256<<10)
		DeferCleanup(img.Close)
		image = uniqueName("debian")
		createImage(image, img)
	})

	It("takes a Proxy from apply to Ready and back to nothing", func() {
		h := readyHost(uniqueName("hv"))
		kh := &crawlv1.KVMHost{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: h.name}, kh)).To(Succeed())
		Expect(kh.Status.LibvirtVersion).To(Equal("11.6.0"))
		Expect(kh.Status.Pool).NotTo(BeNil())
		Expect(kh.Status.Pool.AvailableBytes).To(BeNumerically(">", 0))
		Expect(kh.Status.LastCheckTime).NotTo(BeNil())

		ns := newNamespace()
		p := readyProxy(h, ns, "p1", image, "192.0.2.11")

		_, uuid, err := provider.ParseKVMProviderID(p.Status.ProviderID)
		Expect(err).NotTo(HaveOccurred())
		d, ok := h.fake.Domain(ns + ".p1")
		Expect(ok).To(BeTrue())
		Expect(virt.FormatUUID(d.UUID)).To(Equal(uuid))
		Expect(p.Status.Address).To(Equal("192.0.2.11"))
		Expect(p.Status.AddressSource).To(Equal(provider.AddressSourceAgent))
		Expect(p.Status.Endpoint).To(Equal("http://192.0.2.11:3128"))
		Expect(conditions.GetReason(p, crawlv1.ProxyHealthyCondition)).To(Equal(crawlv1.ProxyNotProbedReason))
		Expect(controllerutil.ContainsFinalizer(p, crawlv1.ProxyFinalizer)).To(BeTrue())

		// The image controller reports the cache on this host.
		Eventually(func(g Gomega) {
			ki := &crawlv1.KVMImage{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: image}, ki)).To(Succeed())
			hs := ki.Status.HostStatus(h.name)
			g.Expect(hs).NotTo(BeNil())
			g.Expect(hs.Phase).To(Equal(crawlv1.ImageHostVerified))
			g.Expect(hs.Checksum).To(Equal(img.Image.Checksum))
		}).WithTimeout(20 * time.Second).Should(Succeed())

		uid := string(p.UID)
		deleteProxy(ns, "p1")
		waitProxyGone(ns, "p1", 20*time.Second)
		_, ok = h.fake.Domain(ns + ".p1")
		Expect(ok).To(BeFalse(), "domain left behind")
		for _, vol := range []string{domxml.DiskVolumeName(uid), domxml.SeedVolumeName(uid)} {
			_, ok := h.fake.Volume(kvmtest.PoolName, vol)
			Expect(ok).To(BeFalse(), "volume %s left behind", vol)
		}
		Expect(h.fake.NVRAMRemoved(ns + ".p1")).To(BeTrue())
	})

	It("releases a Proxy with skip-cleanup without touching its domain", func() {
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		readyProxy(h, ns, "keep", image, "192.0.2.12")

		setSkipCleanup(ns, "keep")
		deleteProxy(ns, "keep")
		waitProxyGone(ns, "keep", 20*time.Second)
		d, ok := h.fake.Domain(ns + ".keep")
		Expect(ok).To(BeTrue())
		Expect(d.State).To(Equal(libvirt.DomainRunning))
	})

	It("holds a KVMHost with Proxies until they are gone, and delete still converges", func() {
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		readyProxy(h, ns, "p", image, "192.0.2.13")

		Expect(k8sClient.Delete(ctx, &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: h.name}})).To(Succeed())
		waitHostReason(h.name, crawlv1.HostProxiesRemainingReason, 10*time.Second)

		deleteProxy(ns, "p")
		waitProxyGone(ns, "p", 20*time.Second)
		Expect(domainNames(h, ns)).To(BeEmpty())
		Eventually(func() bool {
			err := k8sClient.Get(ctx, client.ObjectKey{Name: h.name}, &crawlv1.KVMHost{})
			return client.IgnoreNotFound(err) == nil && err != nil
		}).WithTimeout(20*time.Second).Should(BeTrue(), "KVMHost not released after its last Proxy")
	})

	It("converges deletion when the KVMHost was force-removed from the cluster", func() {
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		readyProxy(h, ns, "orphaned", image, "192.0.2.14")

		kh := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: h.name}}
		Expect(k8sClient.Delete(ctx, kh)).To(Succeed())
		Eventually(func() error {
			if err := k8sClient.Get(ctx, client.ObjectKey{Name: h.name}, kh); err != nil {
				return client.IgnoreNotFound(err)
			}
			orig := kh.DeepCopy()
			kh.Finalizers = nil
			return k8sClient.Patch(ctx, kh, client.MergeFrom(orig))
		}).Should(Succeed())

		deleteProxy(ns, "orphaned")
		waitProxyGone(ns, "orphaned", 20*time.Second)
	})

	It("still deletes when Get fails permanently", func() {
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		readyProxy(h, ns, "broken", image, "192.0.2.15")

		h.fake.Fail(virt.RPCDomainGetState, virt.NewError(libvirt.ErrAccessDenied, "access denied by policy"))
		mgr.Wiring.Proxy.MarkDirty(client.ObjectKey{Namespace: ns, Name: "broken"})
		p := waitProxyPhase(ns, "broken", crawlv1.ProxyFailed, 20*time.Second)
		Expect(conditions.GetReason(p, crawlv1.ReadyCondition)).To(Equal(crawlv1.ProxyPermanentErrorReason))

		deleteProxy(ns, "broken")
		waitProxyGone(ns, "broken", 20*time.Second)
		h.fake.Fail(virt.RPCDomainGetState, nil)
		Expect(domainNames(h, ns)).To(BeEmpty())
	})

	It("heals a host whose Secret is created after the manager started, without restart", func() {
		name := uniqueName("hv")
		h := hosts.add(name)
		createKVMHost(name, h.ssh.Addr(), nil)
		waitHostReason(name, crawlv1.HostSSHMaterialMissingReason, 10*time.Second)
		createSecret(h)
		waitHostReason(name, crawlv1.HostReadyReason, 10*time.Second)
	})

	It("reports a blackholed host as Timeout within its timeout while another host's Proxy becomes Ready", func() {
		dead := uniqueName("hv-dead")
		h := hosts.add(dead)
		createSecret(h)
		// A timeout shorter than the suite's SSH handshake timeout (5 s), so
		// the check's deadline, not the dial's, ends the wait.
		createKVMHost(dead, blackhole(), nil, func(s *crawlv1.KVMHostSpec) {
			s.CheckTimeout = &metav1.Duration{Duration: 700 * time.Millisecond}
		})
		live := readyHost(uniqueName("hv"))

		start := time.Now()
		kh := waitHostReason(dead, crawlv1.HostTimeoutReason, 10*time.Second)
		Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second))
		Expect(conditions.GetMessage(kh, crawlv1.ReadyCondition)).To(ContainSubstring("no answer within 700ms"))

		ns := newNamespace()
		readyProxy(live, ns, "meanwhile", image, "192.0.2.16")
	})

	It("re-fetches an image when its checksum changes", func() {
		h := readyHost(uniqueName("hv"))
		first := kvmtest.NewImageServer("v1", 128<<10)
		DeferCleanup(first.Close)
		name := uniqueName("rotating")
		createImage(name, first)
		waitImageVerified(name, h.name, first.Image.Checksum)

		second := kvmtest.NewImageServer("v2", 200<<10)
		DeferCleanup(second.Close)
		Eventually(func() error {
			ki := &crawlv1.KVMImage{}
			if err := k8sClient.Get(ctx, client.ObjectKey{Name: name}, ki); err != nil {
				return err
			}
			orig := ki.DeepCopy()
			ki.Spec.URL, ki.Spec.Checksum = second.Image.URL, second.Image.Checksum
			return k8sClient.Patch(ctx, ki, client.MergeFrom(orig))
		}).Should(Succeed())
		waitImageVerified(name, h.name, second.Image.Checksum)
		Expect(second.Downloads()).To(BeNumerically(">=", 1))
	})

	It("marks a host's image Failed on a checksum mismatch", func() {
		h := readyHost(uniqueName("hv"))
		srv := kvmtest.NewImageServer("bad", 64<<10)
		DeferCleanup(srv.Close)
		name := uniqueName("corrupt")
		// The server's bytes no longer match the published checksum.
		srv.Image.Checksum = "sha256:" + "ab" + srv.Image.Checksum[9:]
		ki := createImage(name, srv)
		Eventually(func(g Gomega) {
			got := &crawlv1.KVMImage{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, got)).To(Succeed())
			hs := got.Status.HostStatus(h.name)
			g.Expect(hs).NotTo(BeNil())
			g.Expect(hs.Phase).To(Equal(crawlv1.ImageHostFailed))
			g.Expect(hs.Message).To(ContainSubstring("checksum"))
			g.Expect(hs.Checksum).To(Equal(ki.Spec.Checksum))
		}).WithTimeout(20 * time.Second).Should(Succeed())
	})

	It("collects orphan domains and never touches foreign ones or live Proxies'", func() {
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		readyProxy(h, ns, "alive", image, "192.0.2.17")

		gone := func(name, uid, install string) {
			orphan, err := domxml.Domain(domxml.Params{Name: ns + "." + name, DomainType: "kvm", VCPUs: 1, MemoryBytes: 256 << 20,
				DiskPath: "/var/lib/libvirt/images/x.qcow2", SeedPath: "/var/lib/libvirt/images/x.iso",
				Network:  domxml.Network{Name: kvmtest.NetworkName},
				Metadata: domxml.Metadata{Namespace: ns, Name: name, UID: uid, Tag: testTag, InstallID: install}})
			Expect(err).NotTo(HaveOccurred())
			Expect(h.fake.AddDomain(orphan, true)).To(Succeed())
		}
		gone("gone", "0c7f0d0e-dead-4bee-8000-000000000001", testInstallID)
		// Another install's, and one made before install ids: whose they
		// are cannot be told from this cluster.
		gone("theirs", "0c7f0d0e-dead-4bee-8000-000000000002", "other-install")
		gone("old", "0c7f0d0e-dead-4bee-8000-000000000003", "")
		foreign := `<domain type="kvm"><name>` + ns + `.alien</name><memory unit="MiB">64</memory><os><type arch="x86_64" machine="q35">hvm</type></os></domain>`
		Expect(h.fake.AddDomain(foreign, true)).To(Succeed())

		// Hosts of earlier specs that are down fail their part of the sweep,
		// not this host's.
		n, err := mgr.Wiring.Sweep.Sweep(ctx)
		if err != nil {
			Expect(err.Error()).NotTo(ContainSubstring(h.name))
		}
		Expect(n).To(BeNumerically(">=", 1))
		Expect(domainNames(h, ns)).To(ConsistOf(ns+".alive", ns+".alien", ns+".theirs", ns+".old"))
		// The Proxy is gone; the Event is on the host it was swept from.
		Eventually(func(g Gomega) {
			events := &corev1.EventList{}
			g.Expect(k8sClient.List(ctx, events, client.MatchingFields{"involvedObject.name": h.name})).To(Succeed())
			var reasons []string
			for _, e := range events.Items {
				if e.InvolvedObject.Kind == "KVMHost" && strings.Contains(e.Message, ns+".gone") {
					reasons = append(reasons, e.Reason)
				}
			}
			g.Expect(reasons).To(ConsistOf(OrphanDeletedReason))
		}).WithTimeout(10 * time.Second).Should(Succeed())
	})

	It("refuses a foreign domain with the Proxy's name and holds deletion until skip-cleanup", func() {
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		foreign := `<domain type="kvm"><name>` + ns + `.taken</name><memory unit="MiB">64</memory><os><type arch="x86_64" machine="q35">hvm</type></os></domain>`
		Expect(h.fake.AddDomain(foreign, true)).To(Succeed())

		createProxy(ns, "taken", h.name, image)
		p := waitProxyPhase(ns, "taken", crawlv1.ProxyFailed, 20*time.Second)
		Expect(conditions.GetReason(p, crawlv1.ReadyCondition)).To(Equal(crawlv1.ProxyForeignInstanceReason))
		Expect(conditions.GetMessage(p, crawlv1.ReadyCondition)).To(ContainSubstring(ns + ".taken"))

		deleteProxy(ns, "taken")
		Eventually(func(g Gomega) {
			p := getProxy(ns, "taken")
			g.Expect(conditions.GetReason(p, crawlv1.DeletionBlockedCondition)).To(Equal(crawlv1.ProxyForeignInstanceReason))
			g.Expect(conditions.GetMessage(p, crawlv1.DeletionBlockedCondition)).To(ContainSubstring("no proxy-operator metadata"))
			g.Expect(controllerutil.ContainsFinalizer(p, crawlv1.ProxyFinalizer)).To(BeTrue())
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Consistently(func() bool { _, ok := h.fake.Domain(ns + ".taken"); return ok }).WithTimeout(2 * time.Second).Should(BeTrue())
		Expect(h.fake.Calls(virt.RPCDomainDestroyFlags) + h.fake.Calls(virt.RPCDomainUndefineFlags)).To(BeZero())

		setSkipCleanup(ns, "taken")
		waitProxyGone(ns, "taken", 20*time.Second)
		d, ok := h.fake.Domain(ns + ".taken")
		Expect(ok).To(BeTrue())
		Expect(d.State).To(Equal(libvirt.DomainRunning))
	})

	It("reacts to a libvirt lifecycle event, not to polling", func() {
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		readyProxy(h, ns, "evented", image, "192.0.2.19")
		starts := h.fake.Calls(virt.RPCDomainCreate)

		// The resync interval is 10 minutes: only the "stopped" event can
		// make the reconciler re-read the domain and start it again.
		Expect(h.fake.GuestShutdown(ns + ".evented")).To(Succeed())
		Eventually(func() int { return h.fake.Calls(virt.RPCDomainCreate) }).WithTimeout(15 * time.Second).Should(BeNumerically(">", starts))
		d, _ := h.fake.Domain(ns + ".evented")
		Expect(d.State).To(Equal(libvirt.DomainRunning))
	})

	It("reads the address as soon as the guest agent connects, not at the next provision poll", func() {
		harness.Replace(&mgr, startManager, managerConfig{proxy: func(o *ProxyOptions) { o.ProvisionPollInterval, o.AddressTimeout = time.Minute, 5*time.Minute }})
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		dom := ns + ".agent"
		h.fake.SetAgentConnected(dom, false) // the guest is still booting
		createProxy(ns, "agent", h.name, image)
		giveAddress(h, ns, "agent", "192.0.2.19")
		// The reconciler has looked for the address, found none and settled
		// (no address reads for 2 s): its next poll is a minute away.
		Eventually(func(g Gomega) {
			g.Expect(conditions.GetReason(getProxy(ns, "agent"), crawlv1.InstanceProvisionedCondition)).To(Equal(crawlv1.ProxyWaitingForAddressReason))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		last := -1
		Eventually(func() bool {
			n := h.fake.Calls(virt.RPCDomainInterfaceAddresses)
			settled := n == last
			last = n
			return settled
		}).WithPolling(2 * time.Second).WithTimeout(20 * time.Second).Should(BeTrue())

		connected := time.Now()
		h.fake.SetAgentConnected(dom, true)
		// Well inside the minute the next poll is away, with room for a
		// loaded machine.
		p := waitProxyPhase(ns, "agent", crawlv1.ProxyReady, 20*time.Second)
		Expect(p.Status.Address).To(Equal("192.0.2.19"))
		GinkgoWriter.Printf("agent connected -> Ready in %v\n", time.Since(connected))
	})

	// Issue 17, Ready lag: a guest's squid opens its port tens of seconds
	// after the address, when the probe backoff is long; the port watch
	// brings the probe forward. The port opens right after a probe, with
	// the next one 8 s away and the provision poll a minute.
	DescribeTable("makes a booting proxy Ready promptly once its port opens",
		func(ip string, restart bool) {
			slow := func(o *ProxyOptions) { o.ProvisionPollInterval, o.AddressTimeout = time.Minute, 5*time.Minute }
			harness.Replace(&mgr, startManager, managerConfig{proxy: slow})
			h := readyHost(uniqueName("hv"))
			ns := newNamespace()
			// The guest's squid: a loopback port nobody listens on yet.
			squidAddr := harness.FreeAddr()
			prober.ListenAt(ip, squidAddr)
			// The address comes with the agent's connected event, as on a
			// real guest (the poll is a minute away).
			dom := ns + ".booting"
			h.fake.SetAgentConnected(dom, false)
			createProxy(ns, "booting", h.name, image)
			giveAddress(h, ns, "booting", ip)
			Eventually(func(g Gomega) {
				g.Expect(conditions.GetReason(getProxy(ns, "booting"), crawlv1.InstanceProvisionedCondition)).To(Equal(crawlv1.ProxyWaitingForAddressReason))
			}).WithTimeout(time.Minute).Should(Succeed())
			h.fake.SetAgentConnected(dom, true)

			failures := func() int32 {
				if ps := getProxy(ns, "booting").Status.Probe; ps != nil {
					return ps.ConsecutiveFailures
				}
				return 0
			}
			// Probes 0, 0.5, 1.5, 3.5 and 7.5 s after the first: the fifth
			// failure leaves the next probe 8 s away.
			// The waits before the port opens only set the scene: a freshly
			// started manager reconnects to every host of the suite first,
			// which took 26 s under a loaded -race run.
			want := int32(5)
			if restart {
				Eventually(failures).WithTimeout(time.Minute).Should(BeNumerically(">=", 2))
				mgr.Stop()
				// A manager that did not see the first probe (fault 6): it
				// must back off too, not wait out the poll interval.
				want = failures() + 5
				mgr = startManager(managerConfig{proxy: slow})
			}
			// main's restarted manager probed once, then a minute later:
			// it never got here.
			Eventually(failures).WithTimeout(90 * time.Second).WithPolling(20 * time.Millisecond).Should(BeNumerically(">=", want))

			opened := time.Now()
			l, err := net.Listen("tcp", squidAddr)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(l.Close)
			testutil.AcceptAndClose(l)
			// Well before the next probe, with room for a loaded machine.
			waitProxyPhase(ns, "booting", crawlv1.ProxyReady, 5*time.Second)
			GinkgoWriter.Printf("port opened -> Ready in %v\n", time.Since(opened))
		},
		Entry("seen by this manager from its first probe", "192.0.2.41", false),
		Entry("seen first by a restarted manager", "192.0.2.42", true),
	)

	It("creates no duplicate domain when the manager restarts mid-Create", func() {
		h := readyHost(uniqueName("hv"))
		release := h.fake.Block(virt.RPCDomainCreate)
		ns := newNamespace()
		createProxy(ns, "restart", h.name, image)
		Eventually(func() int { return h.fake.Blocked(virt.RPCDomainCreate) }).WithTimeout(20 * time.Second).Should(BeNumerically(">=", 1))
		defines := h.fake.Calls(virt.RPCDomainDefineXMLFlags)

		mgr.Stop()
		release()
		mgr = startManager(managerConfig{})

		giveAddress(h, ns, "restart", "192.0.2.18")
		waitProxyPhase(ns, "restart", crawlv1.ProxyReady, 30*time.Second)
		Expect(domainNames(h, ns)).To(ConsistOf(ns + ".restart"))
		Expect(h.fake.Calls(virt.RPCDomainDefineXMLFlags)).To(Equal(defines), "the restarted manager defined the domain again")
	})
})

func waitImageVerified(image, host, checksum string) {
	Eventually(func(g Gomega) {
		ki := &crawlv1.KVMImage{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: image}, ki)).To(Succeed())
		hs := ki.Status.HostStatus(host)
		g.Expect(hs).NotTo(BeNil())
		g.Expect(hs.Phase).To(Equal(crawlv1.ImageHostVerified), "message: %s", hs.Message)
		g.Expect(hs.Checksum).To(Equal(checksum))
	}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
}

var _ = Describe("metrics endpoint", func() {
	It("serves host, proxy and libvirt RPC metrics beside controller-runtime's", func() {
		img := kvmtest.NewImageServer("metrics", 64<<10)
		DeferCleanup(img.Close)
		image := uniqueName("metrics")
		createImage(image, img)
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		readyProxy(h, ns, "scraped", image, "192.0.2.30")

		var body string
		Eventually(func(g Gomega) {
			resp, err := http.Get("http://" + mgr.MetricsAddr + "/metrics")
			g.Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			g.Expect(err).NotTo(HaveOccurred())
			body = string(b)
			g.Expect(body).To(ContainSubstring(`proxy_operator_kvmhost_ready{host="` + h.name + `",reason="Ready"} 1`))
			g.Expect(body).To(ContainSubstring(`proxy_operator_kvmhost_up{host="` + h.name + `"} 1`))
			g.Expect(body).To(MatchRegexp(`proxy_operator_proxies\{phase="Ready",provider="kvm"\} [1-9]`))
			g.Expect(body).To(ContainSubstring(`proxy_operator_libvirt_rpc_duration_seconds_count{rpc="virDomainDefineXMLFlags"}`))
			g.Expect(body).To(ContainSubstring(`proxy_operator_kvmhost_check_duration_seconds_bucket`))
			g.Expect(body).To(MatchRegexp(`proxy_operator_image_upload_bytes_total\{host="` + h.name + `"\} [1-9]`))
			g.Expect(body).To(ContainSubstring(`controller_runtime_reconcile_total{controller="proxy"`))
		}).WithTimeout(20 * time.Second).Should(Succeed())
	})
})
