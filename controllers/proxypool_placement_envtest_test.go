package controllers

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// Placement against the real stack: KVMHosts checked by the KVMHost
// controller on in-memory hypervisors of different sizes, replicas created
// in the API server and run by the Proxy controller.
var _ = Describe("ProxyPool placement over KVMHosts of different sizes", Ordered, func() {
	const gi = int64(1) << 30
	var (
		image    string
		ns       string
		label    string
		small    string // 2Gi free
		mid      string // 4Gi free
		big      string // 8Gi free
		outside  string // 64Gi free, not selected
		pool     *crawlv1.ProxyPool
		replicas []crawlv1.Proxy
		r        *ProxyPoolReconciler
	)

	// sizedReadyHost starts a hypervisor whose free memory is free (the
	// fake host itself takes 1Gi) and waits until it is Ready and has
	// reported that figure.
	sizedReadyHost := func(prefix string, free int64, labels map[string]string) string {
		name := uniqueName(prefix)
		h := hosts.add(name, fake.WithHostSize(16, uint64(free+fake.DefaultHostUsedBytes)))
		createSecret(h)
		createKVMHost(name, h.ssh.Addr(), labels)
		// Checked less often and with more time than the suite's other
		// hosts: a host missing a check under load would leave the spread
		// for a moment, and the burst below assumes the three stay in it.
		kh := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: name}}
		Expect(k8sClient.Patch(ctx, kh, client.RawPatch(types.MergePatchType,
			[]byte(`{"spec":{"checkInterval":"3s","checkTimeout":"3s"}}`)))).To(Succeed())
		Eventually(func(g Gomega) {
			kh := waitHostReason(name, crawlv1.HostReadyReason, 20*time.Second)
			g.Expect(kh.Status.Capacity).NotTo(BeNil())
			g.Expect(kh.Status.Capacity.FreeMemoryBytes).To(Equal(free))
			g.Expect(kh.Status.Capacity.CPUs).To(BeEquivalentTo(16))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		return name
	}

	replicaOf := func(n int) *crawlv1.Proxy {
		return &crawlv1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("r%d", n), Labels: map[string]string{crawlv1.PoolNameLabel: pool.Name}},
			Spec:       *pool.Spec.Template.Spec.DeepCopy(),
		}
	}

	// place runs placement for one new replica and, when it is placed,
	// creates it as the pool would.
	place := func(n int) (*crawlv1.Proxy, *PlacementBlocked) {
		p := replicaOf(n)
		blocked, err := r.placeReplica(ctx, pool, replicas, p, nil)
		Expect(err).NotTo(HaveOccurred())
		if blocked != nil {
			return nil, blocked
		}
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		replicas = append(replicas, *p)
		return p, nil
	}

	// relist reads the pool's replicas as the pool does at the start of a
	// reconcile: from the manager's cache, status included.
	relist := func() {
		list := &crawlv1.ProxyList{}
		Expect(mgr.Client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{crawlv1.PoolNameLabel: pool.Name})).To(Succeed())
		replicas = list.Items
	}

	perHost := func() map[string]int {
		out := map[string]int{}
		for _, p := range replicas {
			out[p.Spec.Placement.Host]++
		}
		return out
	}

	checksOf := func(name string) hostChecks {
		kh := &crawlv1.KVMHost{}
		Expect(mgr.Client.Get(ctx, client.ObjectKey{Name: name}, kh)).To(Succeed())
		return r.checksOf(kh)
	}

	capacityOn := func(name string) *crawlv1.HostCapacity {
		kh := &crawlv1.KVMHost{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, kh)).To(Succeed())
		return kh.Status.Capacity
	}

	// The Proxies are probed every second for as long as they exist:
	// remove them so later specs do not pay for them (createKVMHost
	// removes the hosts).
	AfterAll(func() {
		relistAll := &crawlv1.ProxyList{}
		Expect(k8sClient.List(ctx, relistAll, client.InNamespace(ns))).To(Succeed())
		for _, p := range relistAll.Items {
			deleteProxy(ns, p.Name)
		}
		for _, p := range relistAll.Items {
			waitProxyGone(ns, p.Name, 30*time.Second)
		}
	})

	BeforeAll(func() {
		image = servedImage()
		ns = newNamespace()
		label = uniqueName("sizes")
		sel := map[string]string{"placement-test": label}
		small = sizedReadyHost("small", 2*gi, sel)
		mid = sizedReadyHost("mid", 4*gi, sel)
		big = sizedReadyHost("big", 8*gi, sel)
		outside = sizedReadyHost("outside", 64*gi, map[string]string{"placement-test": "other"})
		pool = &crawlv1.ProxyPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fleet"},
			Spec: crawlv1.ProxyPoolSpec{
				Placement: crawlv1.ProxyPoolPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: sel}},
				Template: crawlv1.ProxyTemplate{Spec: crawlv1.ProxySpec{
					Provider:          crawlv1.ProviderKVM,
					Placement:         crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{}, Image: image},
					Resources:         crawlv1.ProxyResources{CPUs: 1, Memory: ptr.To(resource.MustParse("1Gi")), Disk: ptr.To(resource.MustParse("10Gi"))},
					CloudInit:         crawlv1.ProxyCloudInit{UserData: "#cloud-config\n"},
					InstallGuestAgent: ptr.To(true),
					Port:              3128,
				}},
			},
		}
		r = &ProxyPoolReconciler{Client: mgr.Client, Plugins: Plugins()}
		// Placement reads the manager's cache, which may lag the reads above.
		Eventually(func(g Gomega) {
			for _, name := range []string{small, mid, big} {
				kh := &crawlv1.KVMHost{}
				g.Expect(mgr.Client.Get(ctx, client.ObjectKey{Name: name}, kh)).To(Succeed())
				g.Expect(kh.Status.Capacity).NotTo(BeNil(), name)
			}
		}).WithTimeout(10 * time.Second).Should(Succeed())
	})

	It("places a burst of ten 1Gi replicas 2/3/3 over hosts with 2, 4 and 8Gi free, then blocks on the spread", func() {
		// One pass, nothing in between: the hosts' figures do not move.
		var blocked *PlacementBlocked
		for n := range 10 {
			if _, blocked = place(n); blocked != nil {
				break
			}
		}
		Expect(perHost()).To(Equal(map[string]int{small: 2, mid: 3, big: 3}), "blocked: %+v", blocked)
		Expect(blocked).NotTo(BeNil())
		Expect(blocked.Reason).To(Equal(crawlv1.PoolSpreadUnsatisfiableReason))
		Expect(blocked.Message).To(ContainSubstring(small + " (2 replicas) memory 0 free, 1Gi needed"))
		Expect(blocked.Message).NotTo(ContainSubstring(outside))
	})

	It("runs each replica where it was placed, and the hosts report what the domains take", func() {
		for i, p := range replicas {
			giveAddress(hosts.get(p.Spec.Placement.Host), ns, p.Name, fmt.Sprintf("192.0.2.%d", 100+i))
		}
		for _, p := range replicas {
			waitProxyPhase(ns, p.Name, crawlv1.ProxyReady, 30*time.Second)
			Expect(getProxy(ns, p.Name).Status.Host).To(Equal(p.Spec.Placement.Host))
		}
		for host, n := range map[string]int{small: 2, mid: 3, big: 3} {
			Expect(domainNames(hosts.get(host), ns+".")).To(HaveLen(n), "domains on %s", host)
			Eventually(func(g Gomega) {
				c := capacityOn(host)
				g.Expect(c.RunningDomains).To(BeEquivalentTo(n))
				g.Expect(c.AllocatedVCPUs).To(BeEquivalentTo(n))
				g.Expect(c.AllocatedMemoryBytes).To(Equal(int64(n) * gi))
			}).WithTimeout(20*time.Second).Should(Succeed(), "capacity of %s", host)
		}
		Expect(capacityOn(small).FreeMemory).To(Equal("0Mi"))
		Expect(capacityOn(big).FreeMemory).To(Equal("5.0Gi"))
		Expect(domainNames(hosts.get(outside), ns+".")).To(BeEmpty())

		// Now settled in the hosts' figures (not reserved twice): still no
		// room on the small host, 1Gi left on the middle one, 5Gi on the big.
		Eventually(func(g Gomega) {
			relist()
			g.Expect(replicas).To(HaveLen(8))
			for _, p := range replicas {
				g.Expect(checksOf(p.Spec.Placement.Host).settled(&p, time.Now())).To(BeTrue(), "%s settled", p.Name)
			}
		}).WithTimeout(30 * time.Second).Should(Succeed())
		_, blocked := place(10)
		Expect(blocked).NotTo(BeNil())
		Expect(blocked.Reason).To(Equal(crawlv1.PoolSpreadUnsatisfiableReason))
		Expect(blocked.Message).To(ContainSubstring(small + " (2 replicas) memory 0 free, 1Gi needed"))
		Expect(blocked.Message).To(ContainSubstring("have room"))
	})

	It("uses the room a deleted replica leaves once its host has been checked again", func() {
		var gone string
		for i, p := range replicas {
			if p.Spec.Placement.Host == small {
				gone = p.Name
				replicas = append(replicas[:i], replicas[i+1:]...)
				break
			}
		}
		deleteProxy(ns, gone)
		waitProxyGone(ns, gone, 20*time.Second)
		Eventually(func(g Gomega) {
			g.Expect(capacityOn(small).RunningDomains).To(BeEquivalentTo(1))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		// The manager's cache may lag the read above by a moment.
		Eventually(func() string {
			relist()
			p, blocked := place(11)
			if blocked != nil {
				return blocked.Message
			}
			return p.Spec.Placement.Host
		}).WithTimeout(10 * time.Second).Should(Equal(small))
	})
})
