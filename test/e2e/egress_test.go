//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/controllers"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
	"crawl.example.com/proxy-operator/test/envtestutil"
	"crawl.example.com/proxy-operator/test/ipamtest"
)

// The egress e2e (label egress, `make test-e2e-egress`): the pool's egress
// promise (docs/egress.md) on the real hypervisor, seen from an "internet"
// that is a network namespace of the test's own behind the hypervisor's,
// where an address-echo server sees real source addresses (no NAT in
// between but the hypervisor's own).
//
//	hypervisor netns                               the test's "internet" netns
//	pxbr0 10.77.0.1/24 (libvirt NAT) ─┐            198.51.100.2/24
//	pxe2epub0 203.0.113.1/28 (routed) ┴─ veth ──── echo http://198.51.100.2/
//	                                  198.51.100.1/24
//
// NAT: two replicas on one host leave through the hypervisor's address on
// the veth (198.51.100.1): Preferred publishes both and counts one address;
// Required unpublishes the newer, says why, and boots nothing (no host
// could give another). Static: a routed block on a bridge, served by the
// ipamtest provider (as the in-cluster provider would) in a manager of the
// test's own; a pool of three with Required gets three addresses, the echo
// sees three sources, equal to the status and proxies.json; a ban report
// quarantines one, whose claim the pool holds, and the replacement leaves
// from a new address; scaled to 0 and deleted, every claim is released and
// nothing is left on the host.
//
// The echo lives in 198.51.100.0/24, a documentation range the managed
// squid denies by default: the pools' Access excepts its one address, as
// the pool e2e excepts its origin (the run's probe address).
var _ = Describe("a ProxyPool's egress on a real KVM host", Ordered, ContinueOnFailure, Label("egress"), func() {
	const (
		ipamPool   = "routed"
		bridgeName = "pxe2epub0"
		// A ban quarantines the address for longer than the run.
		quarantine = time.Hour
	)
	var (
		// The hypervisor's end of the veth and the echo's.
		hostSide = netip.MustParsePrefix("198.51.100.1/24")
		echoSide = netip.MustParsePrefix("198.51.100.2/24")
		// The routed block: the bridge is its gateway.
		block   = netip.MustParsePrefix("203.0.113.0/28")
		gateway = netip.MustParsePrefix("203.0.113.1/28")
	)
	var (
		inet        *e2eutil.Internet
		bridge      *e2eutil.Bridge
		routedHost  *crawlv1.KVMHost
		c           client.Client // the IPAM kinds too
		stopIPAM    context.CancelFunc
		ipamDone    chan error
		natPool     *crawlv1.ProxyPool
		staticPool  *crawlv1.ProxyPool
		watches     []*e2eutil.PoolWatch
		poolsDumped bool
		// The static pool's replicas' addresses before the ban, the banned
		// one and its replica.
		staticFirst        []string
		bannedAddr, banned string
	)

	// access is the run's Access (the test's address as client, the probe
	// server as destination) with the echo admitted and more client
	// sources: the manager and the test reach a bridged guest from the
	// bridge's address.
	access := func(sources ...string) *crawlv1.ProxyAccess {
		a := objs.Proxy.Spec.Access.DeepCopy()
		a.AllowedDestinationExceptions = append(a.AllowedDestinationExceptions, netip.PrefixFrom(echoSide.Addr(), 32).String())
		a.AllowedSourceCIDRs = append(a.AllowedSourceCIDRs, sources...)
		return a
	}
	published := func(ctx context.Context, pool *crawlv1.ProxyPool) ([]controllers.PublishedProxy, error) {
		sec := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: crawlv1.PublishedName(pool.Name)}, sec); err != nil {
			return nil, err
		}
		var list []controllers.PublishedProxy
		if err := json.Unmarshal(sec.Data[crawlv1.ProxiesJSONKey], &list); err != nil {
			return nil, fmt.Errorf("%s: %w", crawlv1.ProxiesJSONKey, err)
		}
		return list, nil
	}
	// serving waits until pool serves n replicas (e2eutil.PoolServingFrom)
	// and extra holds of it, its replicas and proxies.json.
	serving := func(ctx context.Context, pool *crawlv1.ProxyPool, n int32, host, addressSource string, timeout time.Duration,
		extra func(*crawlv1.ProxyPool, []crawlv1.Proxy, []controllers.PublishedProxy) error) ([]crawlv1.Proxy, []controllers.PublishedProxy) {
		var reps []crawlv1.Proxy
		var list []controllers.PublishedProxy
		last, start := "", time.Now()
		Eventually(func(ctx context.Context) error {
			got, r, _, err := e2eutil.PoolServingFrom(ctx, c, client.ObjectKeyFromObject(pool), n, host, addressSource)
			reps = r
			if err == nil {
				list, err = published(ctx, pool)
			}
			if err == nil {
				err = extra(got, reps, list)
			}
			if msg := fmt.Sprint(err); msg != last {
				last = msg
				GinkgoWriter.Printf("[+%s] pool %s: %s\n", e2eutil.Seconds(time.Since(start)), pool.Name, msg)
			}
			return err
		}).WithContext(ctx).WithTimeout(timeout).WithPolling(2 * time.Second).Should(Succeed())
		return reps, list
	}
	// echoes asks the echo through every published entry and returns
	// what it saw, by replica.
	echoes := func(ctx context.Context, list []controllers.PublishedProxy) map[string]string {
		seen := map[string]string{}
		for _, e := range list {
			via, err := e2eutil.ViaURL(e.URL)
			Expect(err).NotTo(HaveOccurred())
			addr, err := e2eutil.EchoThrough(ctx, via, inet.EchoURL)
			Expect(err).NotTo(HaveOccurred(), "the echo through %s", e2eutil.MaskURL(e.URL))
			seen[e.Name] = addr
		}
		return seen
	}
	inBlock := func(addrs []string) []string {
		var out []string
		for _, a := range addrs {
			if ip, err := netip.ParseAddr(a); err == nil && block.Contains(ip) {
				out = append(out, a)
			}
		}
		return out
	}
	claims := func(ctx context.Context) ([]ipamv1.IPAddressClaim, error) {
		list := &ipamv1.IPAddressClaimList{}
		err := c.List(ctx, list, client.InNamespace(objs.Namespace.Name))
		return list.Items, err
	}
	names := func(reps []crawlv1.Proxy) []string {
		var out []string
		for _, p := range reps {
			out = append(out, p.Name)
		}
		sort.Strings(out)
		return out
	}
	deletePool := func(ctx context.Context, pool *crawlv1.ProxyPool) error {
		if err := client.IgnoreNotFound(c.Delete(ctx, pool.DeepCopy())); err != nil {
			return err
		}
		return e2eutil.Poll(ctx, cfg.DeleteTimeout, 2*time.Second, func(ctx context.Context) error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &crawlv1.ProxyPool{}); err == nil {
				return fmt.Errorf("ProxyPool %s still exists", pool.Name)
			} else if !apierrors.IsNotFound(err) {
				return err
			}
			reps, err := e2eutil.PoolReplicas(ctx, c, pool)
			if err == nil && len(reps) > 0 {
				return fmt.Errorf("%d replicas of %s left", len(reps), pool.Name)
			}
			return err
		})
	}

	BeforeAll(func(ctx SpecContext) {
		Expect(cfg.InNetNS).To(BeTrue(), "the egress suite builds its internet inside the test hypervisor's namespace (test/e2e/run.sh)")
		restCfg, err := clientcmd.BuildConfigFromFlags("", op.Kubeconfig())
		Expect(err).NotTo(HaveOccurred())
		c, err = client.New(restCfg, client.Options{Scheme: envtestutil.Scheme()})
		Expect(err).NotTo(HaveOccurred())

		inet, err = e2eutil.StartInternet(ctx, hostSide, echoSide)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(inet.Close)
		bridge, err = e2eutil.AddBridge(ctx, bridgeName, gateway)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(bridge.Delete)

		// The IPAM provider: the operator's manager is another process, so
		// the test runs ipamtest in a manager of its own.
		mgr, err := ctrl.NewManager(restCfg, ctrl.Options{Scheme: envtestutil.Scheme(),
			Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
		Expect(err).NotTo(HaveOccurred())
		Expect((&ipamtest.Provider{Pools: map[string]ipamtest.Pool{ipamPool: ipamtest.DocumentationPool()}}).SetupWithManager(mgr)).To(Succeed())
		var mctx context.Context
		mctx, stopIPAM = context.WithCancel(context.Background())
		ipamDone = make(chan error, 1)
		go func() { ipamDone <- mgr.Start(mctx) }()

		createHostAndImage(ctx)
		// The same hypervisor as a second KVMHost whose guests take static
		// addresses on the routed bridge (no NAT, no DHCP).
		routedHost = &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: objs.Host.Name + "-routed"}, Spec: *objs.Host.Spec.DeepCopy()}
		routedHost.Spec.NetworkMode = crawlv1.NetworkModeBridge
		routedHost.Spec.Network = bridgeName
		routedHost.Spec.Nameservers = []string{gateway.Addr().String()}
		Expect(k8s.Create(ctx, routedHost)).To(Succeed())
		Eventually(func(ctx context.Context) error {
			if _, err := e2eutil.HostReady(ctx, k8s, routedHost.Name); err != nil {
				return err
			}
			_, err := e2eutil.ImageVerified(ctx, k8s, objs.Image.Name, routedHost.Name)
			return err
		}).WithContext(ctx).WithTimeout(cfg.ImageTimeout).WithPolling(2 * time.Second).Should(Succeed())

		natPool = objs.NewPool("nat", 2)
		natPool.Spec.Template.Spec.Access = access()
		natPool.Spec.Egress = crawlv1.ProxyPoolEgress{Distinct: crawlv1.EgressDistinctPreferred, EchoURL: inet.EchoURL}

		staticPool = objs.NewPool("static", 3)
		staticPool.Spec.Template.Spec.Placement.Host = routedHost.Name
		staticPool.Spec.Template.Spec.Network = &crawlv1.ProxyNetwork{AddressesFromPools: []ipamv1.IPPoolReference{ipamtest.Ref(ipamPool)}}
		staticPool.Spec.Template.Spec.Access = access(gateway.Addr().String() + "/32")
		staticPool.Spec.Egress = crawlv1.ProxyPoolEgress{Distinct: crawlv1.EgressDistinctRequired, EchoURL: inet.EchoURL,
			Quarantine: &metav1.Duration{Duration: quarantine}}
		for _, p := range []*crawlv1.ProxyPool{natPool, staticPool} {
			w, err := e2eutil.WatchPool(context.Background(), op.Kubeconfig(), p.Namespace, p.Name)
			Expect(err).NotTo(HaveOccurred())
			watches = append(watches, w)
		}
	}, NodeTimeout(15*time.Minute))

	AfterEach(func(ctx SpecContext) {
		if !CurrentSpecReport().Failed() || poolsDumped {
			return
		}
		poolsDumped = true
		for _, p := range []*crawlv1.ProxyPool{natPool, staticPool} {
			if p != nil {
				e2eutil.DumpPool(ctx, GinkgoWriter, c, client.ObjectKeyFromObject(p))
			}
		}
		if list, err := claims(ctx); err == nil {
			for _, cl := range list {
				GinkgoWriter.Printf("IPAddressClaim %s: address %q, labels %v, owners %v, deleting %v\n", cl.Name, cl.Status.AddressRef.Name,
					cl.Labels, cl.OwnerReferences, !cl.DeletionTimestamp.IsZero())
			}
		}
	}, NodeTimeout(time.Minute))
	AfterEach(dumpOnFailure, NodeTimeout(2*time.Minute))

	AfterAll(func(ctx SpecContext) {
		// The pools first, while the IPAM provider still serves their
		// claims' release; then the rest. Bounded; the hypervisor's
		// teardown catches the rest.
		for _, p := range []*crawlv1.ProxyPool{natPool, staticPool} {
			if p == nil || c == nil {
				continue
			}
			if err := deletePool(ctx, p); err != nil {
				GinkgoWriter.Printf("cleanup: %v\n", err)
			}
		}
		for _, w := range watches {
			w.Stop()
		}
		if stopIPAM != nil {
			stopIPAM()
			if err := <-ipamDone; err != nil {
				GinkgoWriter.Printf("cleanup: the IPAM provider's manager: %v\n", err)
			}
		}
		objects := []client.Object{objs.Image.DeepCopy(), objs.Host.DeepCopy(), objs.Secret.DeepCopy(), objs.Namespace.DeepCopy()}
		if routedHost != nil {
			objects = append(objects, routedHost.DeepCopy())
		}
		for _, o := range objects {
			_ = client.IgnoreNotFound(k8s.Delete(ctx, o))
		}
	}, NodeTimeout(8*time.Minute))

	It("NAT: two replicas on one host, Preferred: both published, one egress address counted, the echo sees the NAT's address", func(ctx SpecContext) {
		Expect(k8s.Create(ctx, natPool)).To(Succeed())
		start := time.Now()
		reps, list := serving(ctx, natPool, 2, objs.Host.Name, provider.AddressSourceLease, cfg.ProxyReadyTimeout+time.Minute,
			func(pool *crawlv1.ProxyPool, reps []crawlv1.Proxy, list []controllers.PublishedProxy) error {
				for _, p := range reps {
					if p.Status.EgressSource != crawlv1.EgressSourceEcho || p.Status.EgressAddress != inet.HostAddress {
						return fmt.Errorf("replica %s: egress %q (%s), want %s measured by the echo", p.Name, p.Status.EgressAddress, p.Status.EgressSource, inet.HostAddress)
					}
				}
				for _, e := range list {
					if e.EgressAddress != inet.HostAddress || e.EgressSource != crawlv1.EgressSourceEcho {
						return fmt.Errorf("proxies.json entry %s: egress %q (%s)", e.Name, e.EgressAddress, e.EgressSource)
					}
				}
				if pool.Status.DistinctEgressAddresses != 1 {
					return fmt.Errorf("status.distinctEgressAddresses %d, want 1", pool.Status.DistinctEgressAddresses)
				}
				if conditions.IsTrue(pool, crawlv1.PoolEgressDistinctCondition) {
					return fmt.Errorf("EgressDistinct is %s, want False: two replicas share one address", e2eutil.CondString(pool, crawlv1.PoolEgressDistinctCondition))
				}
				return nil
			})
		took := time.Since(start)
		Expect(list).To(HaveLen(2))
		seen := echoes(ctx, list)
		for name, addr := range seen {
			Expect(addr).To(Equal(inet.HostAddress), "the echo's answer through %s", name)
		}
		// Nothing else has reached the internet yet: every request, the
		// operator's measurements included, came from the NAT's address.
		Expect(inet.Sources()).To(Equal([]string{inet.HostAddress}), "sources the echo saw")
		pool := &crawlv1.ProxyPool{}
		Expect(c.Get(ctx, client.ObjectKeyFromObject(natPool), pool)).To(Succeed())
		record("egress_nat_preferred", took, fmt.Sprintf("(ProxyPool of 2 on one NAT host, distinct Preferred → both Ready, published and measured; %d vCPU %s guests; the echo saw %v; EgressDistinct %s)",
			e2eutil.PoolReplicaCPUs, cfg.DomainType, inet.Sources(), e2eutil.CondString(pool, crawlv1.PoolEgressDistinctCondition)))
		Expect(names(reps)).To(HaveLen(2))
	}, NodeTimeout(15*time.Minute))

	It("NAT: Required unpublishes the replica that shares the address, says why, and boots nothing", func(ctx SpecContext) {
		before, err := e2eutil.PoolReplicas(ctx, c, natPool)
		Expect(err).NotTo(HaveOccurred())
		Expect(before).To(HaveLen(2))
		updatePool(ctx, c, natPool, func(p *crawlv1.ProxyPool) { p.Spec.Egress.Distinct = crawlv1.EgressDistinctRequired })
		start := time.Now()
		var cond string
		Eventually(func(ctx context.Context) error {
			pool := &crawlv1.ProxyPool{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(natPool), pool); err != nil {
				return err
			}
			if pool.Status.ObservedGeneration != pool.Generation {
				return errors.New("the pool has not observed Required yet")
			}
			cond = e2eutil.CondString(pool, crawlv1.PoolEgressDistinctCondition)
			if !conditions.IsFalse(pool, crawlv1.PoolEgressDistinctCondition) || !strings.Contains(conditions.GetMessage(pool, crawlv1.PoolEgressDistinctCondition), inet.HostAddress) {
				return fmt.Errorf("EgressDistinct is %s, want False naming %s", cond, inet.HostAddress)
			}
			list, err := published(ctx, pool)
			if err != nil {
				return err
			}
			if len(list) != 1 {
				return fmt.Errorf("%d replicas published, want 1", len(list))
			}
			return nil
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		took := time.Since(start)
		// No host gives another address: nothing is created, the two stay.
		Consistently(func(ctx context.Context) ([]string, error) {
			reps, err := e2eutil.PoolReplicas(ctx, c, natPool)
			return names(reps), err
		}).WithContext(ctx).WithTimeout(30*time.Second).WithPolling(time.Second).Should(Equal(names(before)), "replicas (no new boot)")
		list, err := published(ctx, natPool)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(HaveLen(1))
		record("egress_nat_required", took, fmt.Sprintf("(distinct Preferred → Required on one NAT host: one of 2 unpublished, no replica created in 30 s after; EgressDistinct %s)", cond))
		start = time.Now()
		Expect(deletePool(ctx, natPool)).To(Succeed())
		record("egress_nat_deleted", time.Since(start), "(the NAT pool and its 2 replicas gone)")
	}, NodeTimeout(10*time.Minute))

	It("static: a pool of 3 with Required on a routed block gets 3 addresses; the echo sees 3 sources, equal to the status and proxies.json", func(ctx SpecContext) {
		Expect(k8s.Create(ctx, staticPool)).To(Succeed())
		start := time.Now()
		// Three TCG guests boot at once.
		reps, list := serving(ctx, staticPool, 3, routedHost.Name, provider.AddressSourceAgent, cfg.ProxyReadyTimeout+3*time.Minute,
			func(pool *crawlv1.ProxyPool, reps []crawlv1.Proxy, list []controllers.PublishedProxy) error {
				for _, p := range reps {
					if p.Status.EgressSource != crawlv1.EgressSourceStatic || p.Status.EgressAddress != p.Status.Address {
						return fmt.Errorf("replica %s at %s: egress %q (%s), want its static address", p.Name, p.Status.Address, p.Status.EgressAddress, p.Status.EgressSource)
					}
				}
				for _, e := range list {
					if e.EgressSource != crawlv1.EgressSourceStatic {
						return fmt.Errorf("proxies.json entry %s: egress %q (%s)", e.Name, e.EgressAddress, e.EgressSource)
					}
				}
				if pool.Status.DistinctEgressAddresses != 3 {
					return fmt.Errorf("status.distinctEgressAddresses %d, want 3", pool.Status.DistinctEgressAddresses)
				}
				if !conditions.IsTrue(pool, crawlv1.PoolEgressDistinctCondition) {
					return fmt.Errorf("EgressDistinct is %s", e2eutil.CondString(pool, crawlv1.PoolEgressDistinctCondition))
				}
				return nil
			})
		took := time.Since(start)
		Expect(list).To(HaveLen(3))
		statusOf := map[string]string{}
		for _, p := range reps {
			statusOf[p.Name] = p.Status.EgressAddress
			ip := netip.MustParseAddr(p.Status.Address)
			Expect(block.Contains(ip)).To(BeTrue(), "replica %s's address %s is in %s", p.Name, ip, block)
		}
		jsonOf := map[string]string{}
		for _, e := range list {
			jsonOf[e.Name] = e.EgressAddress
		}
		Expect(jsonOf).To(Equal(statusOf), "proxies.json's egress addresses are the replicas'")
		seen := echoes(ctx, list)
		Expect(seen).To(Equal(statusOf), "the echo saw each replica's request come from its egress address")
		for _, a := range seen {
			staticFirst = append(staticFirst, a)
		}
		sort.Strings(staticFirst)
		Expect(slices.Compact(slices.Clone(staticFirst))).To(HaveLen(3), "distinct sources")
		Expect(inBlock(inet.Sources())).To(Equal(staticFirst), "the sources in %s the echo saw", block)
		cl, err := claims(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(cl).To(HaveLen(3), "one IPAddressClaim a replica")
		record("egress_static_available", took, fmt.Sprintf("(ProxyPool of 3 with addressesFromPools on a routed %s bridge, distinct Required → all Ready and published; the echo saw %v)", block, staticFirst))
	}, NodeTimeout(20*time.Minute))

	It("static: a ban report quarantines the replica's address, the pool holds its claim, and the replacement leaves from a new address", func(ctx SpecContext) {
		Expect(staticFirst).To(HaveLen(3))
		list, err := published(ctx, staticPool)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(HaveLen(3))
		banned, bannedAddr = list[0].Name, list[0].EgressAddress
		ban := &crawlv1.ProxyBan{ObjectMeta: metav1.ObjectMeta{GenerateName: staticPool.Name + "-ban-", Namespace: staticPool.Namespace},
			Spec: crawlv1.ProxyBanSpec{Pool: staticPool.Name, Proxy: banned, Reason: "e2e: HTTP 403 x5", Replace: true}}
		Expect(k8s.Create(ctx, ban)).To(Succeed())
		start := time.Now()
		// Three again, the banned replica gone, none at its address.
		_, after := serving(ctx, staticPool, 3, routedHost.Name, provider.AddressSourceAgent, cfg.ProxyReadyTimeout+2*time.Minute,
			func(pool *crawlv1.ProxyPool, reps []crawlv1.Proxy, _ []controllers.PublishedProxy) error {
				if !slices.ContainsFunc(pool.Status.Quarantine, func(q crawlv1.QuarantinedAddress) bool { return q.Address == bannedAddr }) {
					return fmt.Errorf("status.quarantine %v lacks %s", pool.Status.Quarantine, bannedAddr)
				}
				for _, p := range reps {
					if p.Name == banned {
						return fmt.Errorf("the banned replica %s is still there", banned)
					}
					if p.Status.EgressAddress == bannedAddr {
						return fmt.Errorf("replica %s has the quarantined address %s", p.Name, bannedAddr)
					}
				}
				return nil
			})
		took := time.Since(start)
		var replacement string
		for _, e := range after {
			if !slices.Contains(staticFirst, e.EgressAddress) {
				Expect(replacement).To(BeEmpty(), "one new address")
				replacement = e.EgressAddress
			}
		}
		Expect(replacement).NotTo(BeEmpty(), "the replacement's address is new: %v, before %v", after, staticFirst)
		seen := echoes(ctx, after)
		for _, e := range after {
			Expect(seen[e.Name]).To(Equal(e.EgressAddress), "the echo through %s", e.Name)
			Expect(seen[e.Name]).NotTo(Equal(bannedAddr))
		}
		want := append(slices.Clone(staticFirst), replacement)
		sort.Strings(want)
		Expect(inBlock(inet.Sources())).To(Equal(want), "sources in %s: the first three and the replacement's", block)
		// The pool holds the banned address's claim.
		cl, err := claims(ctx)
		Expect(err).NotTo(HaveOccurred())
		var held []string
		for _, x := range cl {
			if x.Labels[crawlv1.QuarantineHoldLabel] != "" {
				held = append(held, x.Annotations[crawlv1.QuarantinedAddressAnnotation])
				Expect(metav1.GetControllerOf(&x)).NotTo(BeNil())
				Expect(metav1.GetControllerOf(&x).Kind).To(Equal("ProxyPool"), "the held claim's controller")
			}
		}
		Expect(held).To(Equal([]string{bannedAddr}), "claims the pool holds")
		Expect(cl).To(HaveLen(4), "three replicas' claims and the held one")
		record("egress_static_ban", took, fmt.Sprintf("(ban report (replace) on %s at %s → quarantined, its claim held by the pool, a replacement Ready at %s; the echo saw %v)",
			banned, bannedAddr, replacement, inBlock(inet.Sources())))
	}, NodeTimeout(20*time.Minute))

	It("static: scaled to 0 and deleted, every claim is released, the held one too, and nothing is left on the host", func(ctx SpecContext) {
		start := time.Now()
		updatePool(ctx, c, staticPool, func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(0)) })
		Eventually(func(ctx context.Context) error {
			reps, err := e2eutil.PoolReplicas(ctx, c, staticPool)
			if err != nil {
				return err
			}
			if len(reps) > 0 {
				return fmt.Errorf("%d replicas left", len(reps))
			}
			cl, err := claims(ctx)
			if err != nil {
				return err
			}
			var left []string
			for _, x := range cl {
				left = append(left, x.Name)
			}
			if len(cl) != 1 || cl[0].Labels[crawlv1.QuarantineHoldLabel] == "" {
				return fmt.Errorf("claims %v, want only the one the pool holds", left)
			}
			return nil
		}).WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(time.Second).Should(Succeed())
		scaled := time.Since(start)
		Expect(c.Delete(ctx, staticPool.DeepCopy())).To(Succeed())
		Eventually(func(ctx context.Context) error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(staticPool), &crawlv1.ProxyPool{}); err == nil {
				return errors.New("the pool still exists")
			} else if !apierrors.IsNotFound(err) {
				return err
			}
			cl, err := claims(ctx)
			if err != nil {
				return err
			}
			addrs := &ipamv1.IPAddressList{}
			if err := c.List(ctx, addrs, client.InNamespace(objs.Namespace.Name)); err != nil {
				return err
			}
			if len(cl) > 0 || len(addrs.Items) > 0 {
				return fmt.Errorf("%d IPAddressClaims and %d IPAddresses left", len(cl), len(addrs.Items))
			}
			return nil
		}).WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(time.Second).Should(Succeed())
		took := time.Since(start)
		var seen []e2eutil.ProxyRef
		for _, w := range watches {
			seen = append(seen, w.Seen()...)
		}
		// 2 NAT replicas, 3 static ones and the replacement.
		Expect(len(seen)).To(BeNumerically(">=", 6), "replicas the watches saw")
		left, audit, err := e2eutil.PoolLeftovers(ctx, hv, k8s, cfg.Pool, seen)
		Expect(err).NotTo(HaveOccurred())
		Expect(left).To(BeEmpty(), "what is left on the host of the pools' replicas")
		Expect(audit.Leaks()).To(BeZero(), "host audit: %s", audit)
		record("egress_static_released", took, fmt.Sprintf("(static pool scaled 3 → 0 in %s, only the held claim left; deleted → every IPAddressClaim and IPAddress gone; host audit of %d replicas: %s)",
			e2eutil.Seconds(scaled), len(seen), audit))
	}, NodeTimeout(10*time.Minute))
})
