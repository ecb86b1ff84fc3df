package controllers

import (
	"net/netip"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/seed"
	"crawl.example.com/proxy-operator/test/ipamtest"
)

// The suite's IPAM pools (served by ipamtest in every manager the suite
// starts): a routed documentation block with virtual MACs, an empty one,
// one whose gateway lies outside its prefix, and two that share one
// address (a misconfiguration an IPAM provider cannot see across pools).
const (
	routedPool     = "routed"
	emptyPool      = "empty"
	badGatewayPool = "bad-gateway"
	overlapPoolA   = "overlap-a"
	overlapPoolB   = "overlap-b"
	heldPool       = "held"
	handPool       = "held-by-hand"
	staticDNS      = "192.0.2.53"
)

func ipamPools() map[string]ipamtest.Pool {
	shared := ipamtest.Pool{Addresses: []ipamtest.Address{{IP: "198.51.100.9"}}, Prefix: 24, Gateway: "198.51.100.1"}
	return map[string]ipamtest.Pool{
		routedPool:     ipamtest.DocumentationPool(),
		emptyPool:      {Prefix: 28, Gateway: "203.0.113.1"},
		badGatewayPool: {Addresses: []ipamtest.Address{{IP: "203.0.113.20"}}, Prefix: 28, Gateway: "198.51.100.1"},
		overlapPoolA:   shared,
		overlapPoolB:   shared,
		// The quarantine spec's alone: which address is the lowest free
		// one is what it checks.
		heldPool: {Addresses: []ipamtest.Address{{IP: "203.0.113.34"}, {IP: "203.0.113.35"}, {IP: "203.0.113.36"}, {IP: "203.0.113.37"},
			{IP: "203.0.113.38"}, {IP: "203.0.113.39"}}, Prefix: 28, Gateway: "203.0.113.33"},
		handPool: {Addresses: []ipamtest.Address{{IP: "203.0.113.50"}, {IP: "203.0.113.51"}, {IP: "203.0.113.52"}, {IP: "203.0.113.53"}},
			Prefix: 28, Gateway: "203.0.113.49"},
	}
}

// bridgedHost starts a test host whose VMs sit on bridge br0, with
// nameservers for static addresses, and waits Ready.
func bridgedHost(name string) *testHost {
	h := hosts.add(name)
	createSecret(h)
	createKVMHost(name, h.ssh.Addr(), nil, func(s *crawlv1.KVMHostSpec) {
		s.NetworkMode, s.Network, s.Nameservers = crawlv1.NetworkModeBridge, "br0", []string{staticDNS}
	})
	waitHostReason(name, crawlv1.HostReadyReason, 20*time.Second)
	return h
}

// createStaticProxy creates a Proxy on host that takes its address from
// the suite's IPAM pool.
func createStaticProxy(ns, name, host, image, pool string) {
	p := &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1.ProxySpec{
			Provider:          crawlv1.ProviderKVM,
			Placement:         crawlv1.ProxyPlacement{Host: host, Image: image},
			InstallGuestAgent: ptr.To(true),
			Port:              3128,
			Network:           &crawlv1.ProxyNetwork{AddressesFromPools: []ipamv1.IPPoolReference{ipamtest.Ref(pool)}},
		},
	}
	Expect(k8sClient.Create(ctx, p)).To(Succeed())
}

// waitProvisionedReason waits for the Proxy's InstanceProvisioned reason
// and returns the Proxy.
func waitProvisionedReason(ns, name, reason string, within time.Duration) *crawlv1.Proxy {
	p := &crawlv1.Proxy{}
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
		g.Expect(conditions.GetReason(p, crawlv1.InstanceProvisionedCondition)).To(Equal(reason),
			"message: %s", conditions.GetMessage(p, crawlv1.InstanceProvisionedCondition))
	}).WithTimeout(within).WithPolling(100 * time.Millisecond).Should(Succeed())
	return p
}

func getClaim(ns, name string) (*ipamv1.IPAddressClaim, error) {
	c := &ipamv1.IPAddressClaim{}
	return c, k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, c)
}

// staticProxyOnNewHost starts a bridged host and creates, in a new
// namespace, the Proxy name on it claiming from pool; it returns the
// host, the namespace and the image.
func staticProxyOnNewHost(name, pool string) (*testHost, string, string) {
	h := bridgedHost(uniqueName("hv"))
	ns, image := newNamespace(), servedImage()
	createStaticProxy(ns, name, h.name, image, pool)
	return h, ns, image
}

// deleteAndExpectReleased deletes the Proxy and waits until it, its
// claim and the claim's IPAddress are all gone.
func deleteAndExpectReleased(ns, proxy string) {
	deleteProxy(ns, proxy)
	claim := proxy + "-0"
	waitProxyGone(ns, proxy, 30*time.Second)
	Eventually(func() bool {
		_, err := getClaim(ns, claim)
		return apierrors.IsNotFound(err)
	}).WithTimeout(10*time.Second).Should(BeTrue(), "IPAddressClaim %s left behind", claim)
	Eventually(func() bool {
		return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: claim}, &ipamv1.IPAddress{}))
	}).WithTimeout(10*time.Second).Should(BeTrue(), "IPAddress %s left behind", claim)
}

func noDomain(h *testHost, ns, name string) {
	Consistently(func() bool { _, ok := h.fake.Domain(ns + "." + name); return ok }).
		WithTimeout(time.Second).WithPolling(100*time.Millisecond).Should(BeFalse(), "a domain was defined for %s/%s", ns, name)
}

var _ = Describe("Static addresses from an IPAM pool", func() {
	It("claims the address, owned by the Proxy, and waits naming the pool while it is not bound, creating nothing", func() {
		h, ns, _ := staticProxyOnNewHost("p1", emptyPool)

		// First "created ...", then, once the provider has looked at the
		// claim (its update wakes the Proxy), what its Ready says.
		p := &crawlv1.Proxy{}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "p1"}, p)).To(Succeed())
			g.Expect(conditions.GetReason(p, crawlv1.InstanceProvisionedCondition)).To(Equal(crawlv1.ProxyWaitingForIPAddressReason))
			g.Expect(conditions.GetMessage(p, crawlv1.InstanceProvisionedCondition)).To(
				And(ContainSubstring("InClusterIPPool/"+emptyPool), ContainSubstring(ipamv1.IPAddressClaimReadyPoolExhaustedReason)))
		}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		Expect(p.Status.Phase).To(Equal(crawlv1.ProxyPending))

		claim, err := getClaim(ns, "p1-0")
		Expect(err).NotTo(HaveOccurred())
		Expect(claim.Spec.PoolRef).To(Equal(ipamtest.Ref(emptyPool)))
		Expect(claim.Spec.ClusterName).To(BeEmpty(), "the in-cluster provider never serves a claim naming a Cluster that does not exist")
		owner := metav1.GetControllerOf(claim)
		Expect(owner).NotTo(BeNil())
		Expect(owner.UID).To(Equal(p.UID))
		Expect(owner.BlockOwnerDeletion).To(Equal(ptr.To(true)))
		noDomain(h, ns, "p1")

		deleteAndExpectReleased(ns, "p1")
	})

	It("boots the instance with the bound address, its MAC and the host's DNS, reports it as the egress, and releases the claim on delete", func() {
		h, ns, _ := staticProxyOnNewHost("p1", routedPool)

		addr := &ipamv1.IPAddress{}
		Eventually(func() error { return k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "p1-0"}, addr) }).
			WithTimeout(20 * time.Second).Should(Succeed())
		ip, mac := addr.Spec.Address, addr.Annotations[crawlv1.MACAddressAnnotation]
		Expect(mac).NotTo(BeEmpty())

		giveAddress(h, ns, "p1", ip)
		p := waitProxyPhase(ns, "p1", crawlv1.ProxyReady, 30*time.Second)
		Expect(p.Status.AssignedAddress).To(Equal(ip + "/28"))
		Expect(p.Status.EgressAddress).To(Equal(ip))
		Expect(p.Status.EgressSource).To(Equal(crawlv1.EgressSourceStatic))

		d, ok := h.fake.Domain(ns + ".p1")
		Expect(ok).To(BeTrue())
		Expect(d.ConfigXML).To(And(ContainSubstring(`<mac address="`+mac+`">`), ContainSubstring(`<source bridge="br0">`)))
		files, err := kvmtest.SeedFiles(h.fake, string(p.UID))
		Expect(err).NotTo(HaveOccurred())
		want, err := seed.NetworkConfig(seed.Network{
			Address: netip.MustParsePrefix(ip + "/28"), Gateway: netip.MustParseAddr("203.0.113.1"),
			MAC: mac, Nameservers: []netip.Addr{netip.MustParseAddr(staticDNS)},
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(string(files[seed.NetworkConfigFile])).To(Equal(string(want)))

		deleteAndExpectReleased(ns, "p1")
		_, ok = h.fake.Domain(ns + ".p1")
		Expect(ok).To(BeFalse(), "domain left behind")
	})

	It("refuses an IPAddress whose gateway lies outside its prefix, naming the field, and boots nothing", func() {
		h, ns, _ := staticProxyOnNewHost("p1", badGatewayPool)

		p := waitProvisionedReason(ns, "p1", crawlv1.ProxyPermanentErrorReason, 20*time.Second)
		Expect(conditions.GetMessage(p, crawlv1.InstanceProvisionedCondition)).To(
			And(ContainSubstring("IPAddress p1-0 spec.gateway"), ContainSubstring("198.51.100.1"), ContainSubstring("outside 203.0.113.16/28")))
		Expect(p.Status.Phase).To(Equal(crawlv1.ProxyFailed))
		noDomain(h, ns, "p1")

		deleteAndExpectReleased(ns, "p1")
	})

	It("never boots two Proxies with one address: the second waits naming the first, and boots when it is gone", func() {
		h, ns, image := staticProxyOnNewHost("first", overlapPoolA)
		giveAddress(h, ns, "first", "198.51.100.9")
		waitProxyPhase(ns, "first", crawlv1.ProxyReady, 30*time.Second)

		createStaticProxy(ns, "second", h.name, image, overlapPoolB)
		p := waitProvisionedReason(ns, "second", crawlv1.ProxyAddressInUseReason, 20*time.Second)
		Expect(conditions.GetMessage(p, crawlv1.InstanceProvisionedCondition)).To(ContainSubstring("198.51.100.9 is held by Proxy " + ns + "/first"))
		Expect(p.Status.AssignedAddress).To(BeEmpty())
		noDomain(h, ns, "second")

		deleteAndExpectReleased(ns, "first")
		giveAddress(h, ns, "second", "198.51.100.9")
		Expect(waitProxyPhase(ns, "second", crawlv1.ProxyReady, 30*time.Second).Status.EgressAddress).To(Equal("198.51.100.9"))

		deleteAndExpectReleased(ns, "second")
	})

	It("refuses a static address on a host whose VMs sit behind libvirt's NAT network", func() {
		h := readyHost(uniqueName("hv"))
		ns, image := newNamespace(), servedImage()
		createStaticProxy(ns, "p1", h.name, image, routedPool)

		p := waitProvisionedReason(ns, "p1", crawlv1.ProxyPermanentErrorReason, 20*time.Second)
		Expect(conditions.GetMessage(p, crawlv1.InstanceProvisionedCondition)).To(ContainSubstring("needs a KVMHost with networkMode bridge"))
		noDomain(h, ns, "p1")

		deleteAndExpectReleased(ns, "p1")
	})
})

var _ = Describe("A pool's quarantined static address", func() {
	It("holds the banned replica's claim while quarantined, releases it when the quarantine ends, and every held claim with the pool", func() {
		ns, image := newNamespace(), servedImage()
		label := map[string]string{"held-hosts": uniqueName("hv")}
		h := hosts.add(uniqueName("hvheld"))
		createSecret(h)
		createKVMHost(h.name, h.ssh.Addr(), label, func(s *crawlv1.KVMHostSpec) {
			s.NetworkMode, s.Network, s.Nameservers = crawlv1.NetworkModeBridge, "br0", []string{staticDNS}
		})
		waitHostReason(h.name, crawlv1.HostReadyReason, 20*time.Second)
		startPoolBooter([]*testHost{h}, ns)
		pool := poolOnHosts(ns, "held", 2, label, image, func(p *crawlv1.ProxyPool) {
			p.Spec.Template.Spec.Network = &crawlv1.ProxyNetwork{AddressesFromPools: []ipamv1.IPPoolReference{ipamtest.Ref(heldPool)}}
			p.Spec.Egress.Quarantine = &metav1.Duration{Duration: time.Minute}
			p.Spec.Bans.MaxBanned = ptr.To(intstr.FromString("100%"))
		})
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		pool = getPool(pool) // its UID
		names := waitPoolReady(pool, 2)
		assigned := func(name string) string { return assignedAddress(getProxy(ns, name)) }
		ban := func(replica string) string {
			addr := assigned(replica)
			Expect(addr).NotTo(BeEmpty())
			Expect(k8sClient.Create(ctx, &crawlv1.ProxyBan{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: replica + "-ban"},
				Spec: crawlv1.ProxyBanSpec{Pool: pool.Name, Proxy: replica, Replace: true, Reason: "HTTP 403"}})).To(Succeed())
			waitProxyGone(ns, replica, 30*time.Second)
			return addr
		}
		// held: the replica's claim, controlled by the pool now, still
		// bound to the banned address.
		expectHeld := func(replica, addr string) {
			claim, err := getClaim(ns, replica+"-0")
			Expect(err).NotTo(HaveOccurred(), "the banned replica's claim was released")
			Expect(metav1.IsControlledBy(claim, pool)).To(BeTrue(), "owners: %v", claim.OwnerReferences)
			Expect(claim.OwnerReferences).To(HaveLen(1))
			Expect(claim.DeletionTimestamp).To(BeNil())
			ip := &ipamv1.IPAddress{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: claim.Status.AddressRef.Name}, ip)).To(Succeed())
			Expect(ip.Spec.Address).To(Equal(addr))
		}
		released := func(name string, within time.Duration) {
			Eventually(func(g Gomega) {
				_, err := getClaim(ns, name)
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "IPAddressClaim %s still there", name)
				g.Expect(apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ipamv1.IPAddress{}))).To(BeTrue(),
					"IPAddress %s still there", name)
			}).WithTimeout(within).WithPolling(100 * time.Millisecond).Should(Succeed())
		}

		banned := ban(names[0])
		expectHeld(names[0], banned)
		// The banned address is the lowest free one were it released: a
		// replica added now would get it.
		setScale(pool, 3)
		ready := waitPoolReady(pool, 3)
		for _, n := range ready {
			Expect(assigned(n)).NotTo(Equal(banned), "%s booted with the quarantined address", n)
		}
		expectHeld(names[0], banned)

		// A second ban, quarantined for longer: still held when the
		// first quarantine ends and when the pool is deleted.
		updatePool(pool, func(p *crawlv1.ProxyPool) { p.Spec.Egress.Quarantine = &metav1.Duration{Duration: time.Hour} })
		second := ban(names[1])
		expectHeld(names[1], second)

		// The first quarantine ends a minute after its report.
		released(names[0]+"-0", 90*time.Second)
		Expect(getPool(pool).Status.Quarantine).To(ConsistOf(HaveField("Address", second)))
		expectHeld(names[1], second)

		Expect(k8sClient.Delete(ctx, getPool(pool))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(pool), &crawlv1.ProxyPool{}))
		}).WithTimeout(60*time.Second).Should(BeTrue(), "the pool was never released")
		Eventually(func(g Gomega) {
			claims := &ipamv1.IPAddressClaimList{}
			g.Expect(k8sClient.List(ctx, claims, client.InNamespace(ns))).To(Succeed())
			g.Expect(claims.Items).To(BeEmpty())
			addrs := &ipamv1.IPAddressList{}
			g.Expect(k8sClient.List(ctx, addrs, client.InNamespace(ns))).To(Succeed())
			g.Expect(addrs.Items).To(BeEmpty())
		}).WithTimeout(20*time.Second).Should(Succeed(), "claims or addresses left behind by the pool's deletion")
	})

	It("holds it when the banned replica is deleted by hand, and releases it when the pool is deleted orphaning its replicas", func() {
		ns, image := newNamespace(), servedImage()
		label := map[string]string{"held-hosts": uniqueName("hv")}
		h := hosts.add(uniqueName("hvhand"))
		createSecret(h)
		createKVMHost(h.name, h.ssh.Addr(), label, func(s *crawlv1.KVMHostSpec) {
			s.NetworkMode, s.Network, s.Nameservers = crawlv1.NetworkModeBridge, "br0", []string{staticDNS}
		})
		waitHostReason(h.name, crawlv1.HostReadyReason, 20*time.Second)
		booter := startPoolBooter([]*testHost{h}, ns)
		pool := poolOnHosts(ns, "hand", 2, label, image, func(p *crawlv1.ProxyPool) {
			p.Spec.Template.Spec.Network = &crawlv1.ProxyNetwork{AddressesFromPools: []ipamv1.IPPoolReference{ipamtest.Ref(handPool)}}
			p.Spec.Bans.MaxBanned = ptr.To(intstr.FromString("100%"))
		})
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		pool = getPool(pool)
		names := waitPoolReady(pool, 2)
		banned, kept := names[0], names[1]
		addr := assignedAddress(getProxy(ns, banned))
		Expect(addr).NotTo(BeEmpty())

		// The replacement never boots, so the pool keeps the banned
		// replica (drain before delete) with its address quarantined; the
		// user deletes it first.
		booter.neverBoot(pool.Name)
		Expect(k8sClient.Create(ctx, &crawlv1.ProxyBan{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: banned + "-ban"},
			Spec: crawlv1.ProxyBanSpec{Pool: pool.Name, Proxy: banned, Replace: true, Reason: "HTTP 403"}})).To(Succeed())
		Eventually(func() []crawlv1.QuarantinedAddress { return getPool(pool).Status.Quarantine }).
			WithTimeout(20 * time.Second).Should(ConsistOf(HaveField("Address", addr)))
		Expect(getProxy(ns, banned).DeletionTimestamp).To(BeNil(), "the pool deleted the banned replica before its replacement served")
		Expect(k8sClient.Delete(ctx, getProxy(ns, banned))).To(Succeed())
		waitProxyGone(ns, banned, 30*time.Second)
		claim, err := getClaim(ns, banned+"-0")
		Expect(err).NotTo(HaveOccurred(), "the hand-deleted replica released its quarantined address")
		Expect(metav1.IsControlledBy(claim, pool)).To(BeTrue(), "owners: %v", claim.OwnerReferences)
		Expect(claim.Labels).To(HaveKeyWithValue(crawlv1.QuarantineHoldLabel, string(pool.UID)))
		Expect(claim.Annotations).To(HaveKeyWithValue(crawlv1.QuarantinedAddressAnnotation, addr))

		// Orphaned, the replicas stay with their addresses; the held
		// claim has no one left to release it but the pool.
		Expect(k8sClient.Delete(ctx, getPool(pool), client.PropagationPolicy(metav1.DeletePropagationOrphan))).To(Succeed())
		Eventually(func() bool {
			_, err := getClaim(ns, banned+"-0")
			return apierrors.IsNotFound(err)
		}).WithTimeout(20*time.Second).Should(BeTrue(), "the held claim outlived its pool deleted with propagation Orphan")
		Expect(getProxy(ns, kept).DeletionTimestamp).To(BeNil())
		_, err = getClaim(ns, kept+"-0")
		Expect(err).NotTo(HaveOccurred(), "an orphaned replica's own claim was released")

		// Act as the garbage collector would, then clean up.
		Eventually(func(g Gomega) {
			p := getPool(pool)
			g.Expect(p.Finalizers).To(Equal([]string{metav1.FinalizerOrphanDependents}))
			p.Finalizers = nil
			g.Expect(k8sClient.Update(ctx, p)).To(Succeed())
		}).WithTimeout(20 * time.Second).Should(Succeed())
		left := &crawlv1.ProxyList{}
		Expect(k8sClient.List(ctx, left, client.InNamespace(ns))).To(Succeed())
		for i := range left.Items {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, &left.Items[i]))).To(Succeed())
			waitProxyGone(ns, left.Items[i].Name, 30*time.Second)
		}
	})
})
