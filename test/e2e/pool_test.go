//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
)

// The pool e2e (label pool, `make test-e2e-pool`): a ProxyPool on the real
// hypervisor, with a crawler-like client using what it publishes while it
// scales up, rolls a template change and scales down. Its own label, not
// e2e: under TCG on the shared machine it boots six guests, four of them
// one after another, which alone takes longer than the main e2e's whole
// run; and it needs the run's namespace, KVMHost and KVMImage to itself.
// ContinueOnFailure: each phase leaves the pool in a state the next can
// start from, and one run on the slow machine should yield every figure.
//
// What is asserted: the pool's disruption budget (whenever it takes a
// replica out of service, at least replicas-maxUnavailable stay available;
// never more than replicas+maxSurge exist) and no request refused by a
// published proxy (a replica listed while it does not serve, or removed
// before crawlers stopped using it). Requests that time out and replicas
// that lose Ready while in service (the manager's probe timing out) depend
// on the machine's load: they are recorded, with the lowest availability
// from any cause, and the goal of zero failed requests is reported.
var _ = Describe("a ProxyPool on a real KVM host", Ordered, ContinueOnFailure, Label("pool"), func() {
	const (
		poolName = "crawl"
		// The crawler re-reads proxies.txt and sends a request through the
		// next listed proxy every half second.
		crawlerInterval = 500 * time.Millisecond
		rolloutLabel    = "e2e-rollout"
	)
	var (
		pool    *crawlv1.ProxyPool
		watch   *e2eutil.PoolWatch
		crawler *e2eutil.Crawler
		// crawled: the crawler's figures at the end of the previous phase.
		crawled    e2eutil.CrawlerStats
		poolDumped bool
	)
	poolKey := func() client.ObjectKey { return client.ObjectKeyFromObject(pool) }

	// serving waits until the pool serves replicas replicas: all Ready,
	// up to date and published (e2eutil.PoolServing); extra checks more.
	serving := func(ctx context.Context, replicas int32, timeout time.Duration, extra func([]crawlv1.Proxy) error) ([]crawlv1.Proxy, []string) {
		var reps []crawlv1.Proxy
		var lines []string
		last := ""
		start := time.Now()
		Eventually(func(ctx context.Context) error {
			var got *crawlv1.ProxyPool
			var err error
			got, reps, lines, err = e2eutil.PoolServing(ctx, k8s, poolKey(), replicas, objs.Host.Name)
			if got != nil {
				st := got.Status
				if s := fmt.Sprintf("%d replicas, %d ready, %d available, %d up to date, %d draining; %s", st.Replicas, st.ReadyReplicas,
					st.AvailableReplicas, st.UpToDateReplicas, st.DrainingReplicas, e2eutil.CondString(got, crawlv1.PoolRollingOutCondition)); s != last {
					last = s
					GinkgoWriter.Printf("[+%s] pool: %s\n", e2eutil.Seconds(time.Since(start)), s)
				}
			}
			if err == nil && extra != nil {
				err = extra(reps)
			}
			return err
		}).WithContext(ctx).WithTimeout(timeout).WithPolling(time.Second).Should(Succeed())
		return reps, lines
	}

	// everyEntryServes sends one request through each published entry.
	everyEntryServes := func(ctx context.Context, lines []string) []time.Duration {
		var took []time.Duration
		for _, l := range lines {
			via, err := e2eutil.ViaURL(l)
			Expect(err).NotTo(HaveOccurred())
			d, err := e2eutil.Want204(ctx, via, cfg.ProbeURL)
			Expect(err).NotTo(HaveOccurred(), "a request through %s", e2eutil.MaskURL(l))
			took = append(took, d.Round(time.Millisecond))
		}
		return took
	}

	// scale sets replicas through the scale subresource, as `kubectl
	// scale` does, after checking what it reports.
	scale := func(ctx context.Context, from, to int32) {
		sc := &autoscalingv1.Scale{}
		Expect(k8s.SubResource("scale").Get(ctx, pool.DeepCopy(), sc)).To(Succeed())
		Expect(sc.Spec.Replicas).To(Equal(from))
		Expect(sc.Status.Selector).To(Equal(metav1.FormatLabelSelector(&pool.Spec.Selector)), "the scale subresource's selector (status.selector)")
		sc.Spec.Replicas = to
		Expect(k8s.SubResource("scale").Update(ctx, pool.DeepCopy(), client.WithSubResourceBody(sc))).To(Succeed())
	}

	// phase returns the crawler's figures since the previous phase.
	phase := func() (d e2eutil.CrawlerStats) {
		now := crawler.Stats()
		d = e2eutil.CrawlerStats{Sent: now.Sent - crawled.Sent, Failed: now.Failed - crawled.Failed,
			Refused: now.Refused - crawled.Refused, TimedOut: now.TimedOut - crawled.TimedOut}
		crawled = now
		return d
	}
	// figures describes a phase for its E2E-TIMING line.
	figures := func(c e2eutil.CrawlerStats, b e2eutil.PoolBudget) string {
		return fmt.Sprintf("crawler %d requests, %d failed (%d refused, %d timed out); %d replicas taken out by the pool, fewest available then %d; fewest available from any cause %d, %d lost Ready while in service; most replicas %d",
			c.Sent, c.Failed, c.Refused, c.TimedOut, b.Disruptions, b.MinAtDisruption, b.MinAvailable, len(b.ReadyLost), b.MostExisted)
	}
	// checkPhase asserts what the pool controls.
	checkPhase := func(c e2eutil.CrawlerStats, b e2eutil.PoolBudget) {
		if len(b.ReadyLost) > 0 {
			GinkgoWriter.Printf("replicas that lost Ready while in service:\n  %s\n", strings.Join(b.ReadyLost, "\n  "))
		}
		Expect(b.Err).NotTo(HaveOccurred(), "the watch must see the whole phase")
		Expect(b.Violations).To(BeEmpty(), "the disruption budget was broken")
		Expect(c.Sent).To(BeNumerically(">", 0))
		Expect(c.Refused).To(BeZero(), failures(crawler))
	}

	BeforeAll(func(ctx SpecContext) {
		createHostAndImage(ctx)
		pool = objs.NewPool(poolName, 2)
		var err error
		watch, err = e2eutil.WatchPool(context.Background(), op.Kubeconfig(), pool.Namespace, pool.Name)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(watch.Stop)
	}, NodeTimeout(15*time.Minute))

	AfterEach(func(ctx SpecContext) {
		if !CurrentSpecReport().Failed() || poolDumped || pool == nil {
			return
		}
		poolDumped = true
		path := filepath.Join(artifacts, "failure-pool.txt")
		if f, err := os.Create(path); err == nil {
			e2eutil.DumpPool(ctx, f, k8s, poolKey())
			_ = f.Close()
			GinkgoWriter.Printf("pool diagnostics in %s\n", path)
		}
	}, NodeTimeout(time.Minute))
	AfterEach(dumpOnFailure, NodeTimeout(2*time.Minute))

	AfterAll(func(ctx SpecContext) {
		if crawler != nil {
			crawler.Stop()
		}
		// The pool first (its replicas' finalizers make the manager delete
		// the VMs), then the rest. Bounded; the hypervisor's teardown
		// catches the rest.
		if pool != nil {
			if err := client.IgnoreNotFound(k8s.Delete(ctx, pool.DeepCopy())); err != nil {
				GinkgoWriter.Printf("cleanup: %v\n", err)
			}
			if err := e2eutil.Poll(ctx, cfg.DeleteTimeout, 2*time.Second, func(ctx context.Context) error {
				reps, err := e2eutil.PoolReplicas(ctx, k8s, pool)
				if err == nil && len(reps) > 0 {
					return fmt.Errorf("%d replicas left", len(reps))
				}
				return err
			}); err != nil {
				GinkgoWriter.Printf("cleanup: %v\n", err)
			}
		}
		for _, o := range []client.Object{objs.Image.DeepCopy(), objs.Host.DeepCopy(), objs.Secret.DeepCopy(), objs.Namespace.DeepCopy()} {
			_ = client.IgnoreNotFound(k8s.Delete(ctx, o))
		}
	}, NodeTimeout(6*time.Minute))

	It("makes a pool of 2 Available, every replica Ready and published for crawlers", func(ctx SpecContext) {
		Expect(k8s.Create(ctx, pool)).To(Succeed())
		created := time.Now()
		// Two TCG guests boot at once: each within ProxyReadyTimeout.
		reps, lines := serving(ctx, 2, cfg.ProxyReadyTimeout+time.Minute, nil)
		took := time.Since(created)
		Expect(lines).To(HaveLen(2))

		// The headless Service's EndpointSlices list the same addresses.
		var want []string
		for _, p := range reps {
			want = append(want, p.Status.Address)
		}
		Eventually(func(ctx context.Context) ([]string, error) {
			eps := &discoveryv1.EndpointSliceList{}
			if err := k8s.List(ctx, eps, client.InNamespace(pool.Namespace),
				client.MatchingLabels{discoveryv1.LabelServiceName: crawlv1.PublishedName(poolName)}); err != nil {
				return nil, err
			}
			var got []string
			for _, s := range eps.Items {
				for _, e := range s.Endpoints {
					if ptr.Deref(e.Conditions.Ready, false) {
						got = append(got, e.Addresses...)
					}
				}
			}
			return got, nil
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(ConsistOf(want))

		lat := everyEntryServes(ctx, lines)
		record("pool_time_to_available", took, fmt.Sprintf("(ProxyPool of 2 created → both replicas Ready and in proxies.txt; %s guests, %d vCPU, %s; a request through each entry: %v)",
			cfg.DomainType, e2eutil.PoolReplicaCPUs, e2eutil.PoolReplicaMemory, lat))

		// From here a crawler uses the pool for the rest of the specs.
		crawler = &e2eutil.Crawler{Client: k8s, Namespace: pool.Namespace, Pool: poolName, Target: cfg.ProbeURL,
			ReadInterval: crawlerInterval, RequestInterval: crawlerInterval, RequestTimeout: 10 * time.Second}
		crawler.Start(context.Background())
	}, NodeTimeout(20*time.Minute))

	It("scales to 3 through the scale subresource while the crawler uses the pool", func(ctx SpecContext) {
		Expect(crawler).NotTo(BeNil())
		phase()
		// Scaling up takes nothing out; at most 3+maxSurge exist.
		watch.Arm(3, 1, 0)
		scale(ctx, 2, 3)
		start := time.Now()
		_, lines := serving(ctx, 3, cfg.ProxyReadyTimeout+time.Minute, nil)
		took := time.Since(start)
		Expect(lines).To(HaveLen(3))
		everyEntryServes(ctx, lines)
		b, c := watch.Budget(), phase()
		record("pool_scale_up", took, "(scale 2 → 3 → the third replica Ready and published; "+figures(c, b)+")")
		checkPhase(c, b)
		Expect(b.MostExisted).To(BeNumerically("<=", 3))
	}, NodeTimeout(20*time.Minute))

	It("rolls a template change one replica at a time (maxSurge 1, maxUnavailable 0) within the budget, no request refused", func(ctx SpecContext) {
		Expect(crawler).NotTo(BeNil())
		before, err := e2eutil.PoolReplicas(ctx, k8s, pool)
		Expect(err).NotTo(HaveOccurred())
		Expect(before).To(HaveLen(3))
		old := map[string]bool{}
		for _, p := range before {
			old[string(p.UID)] = true
		}
		phase()
		watch.Arm(3, 1, 0)

		// A label of the template: every replica is out of date.
		Expect(k8s.Get(ctx, poolKey(), pool)).To(Succeed())
		pool.Spec.Template.Metadata.Labels[rolloutLabel] = "2"
		Expect(k8s.Update(ctx, pool)).To(Succeed())
		start := time.Now()
		// Three replacements one after another, each a TCG boot and a drain.
		reps, lines := serving(ctx, 3, 3*(cfg.ProxyReadyTimeout+time.Minute), func(reps []crawlv1.Proxy) error {
			for _, p := range reps {
				if old[string(p.UID)] {
					return fmt.Errorf("replica %s is one of those before the change", p.Name)
				}
				if p.Labels[rolloutLabel] != "2" {
					return fmt.Errorf("replica %s lacks the template's new label", p.Name)
				}
			}
			return nil
		})
		took := time.Since(start)
		Expect(reps).To(HaveLen(3))
		everyEntryServes(ctx, lines)
		b, c := watch.Budget(), phase()
		record("pool_rollout", took, "(template change → 3 new replicas Ready and published, the 3 old ones gone; budget: ≥ 3 available when one is taken out, ≤ 4 exist; "+figures(c, b)+")")
		checkPhase(c, b)
		Expect(b.Disruptions).To(BeNumerically(">=", 3), "every old replica was taken out")
		Expect(b.MinAtDisruption).To(BeNumerically(">=", 3))
		Expect(b.MostExisted).To(Equal(4), "a rollout with maxSurge 1 surges")
	}, NodeTimeout(45*time.Minute))

	It("scales down to 2 within the budget, no request refused, and reports the crawler's figures", func(ctx SpecContext) {
		Expect(crawler).NotTo(BeNil())
		phase()
		watch.Arm(2, 1, 0)
		scale(ctx, 3, 2)
		start := time.Now()
		var reps []crawlv1.Proxy
		Eventually(func(ctx context.Context) error {
			var err error
			_, reps, _, err = e2eutil.PoolServing(ctx, k8s, poolKey(), 2, objs.Host.Name)
			if err == nil {
				all, lerr := e2eutil.PoolReplicas(ctx, k8s, pool)
				if lerr != nil {
					return lerr
				}
				if len(all) != 2 {
					return fmt.Errorf("%d Proxies exist", len(all))
				}
			}
			return err
		}).WithContext(ctx).WithTimeout(cfg.DeleteTimeout + time.Minute).WithPolling(time.Second).Should(Succeed())
		took := time.Since(start)
		// A few more requests over the final list, then the crawler stops.
		time.Sleep(3 * time.Second)
		b, c := watch.Budget(), phase()
		st := crawler.Stop()
		record("pool_scale_down", took, fmt.Sprintf("(scale 3 → 2 → one replica drained (%ds) and deleted; %s)", e2eutil.PoolDrainSeconds, figures(c, b)))
		lat := "none"
		if n := len(st.Latencies); n > 0 {
			lat = fmt.Sprintf("min %s, median %s, max %s", st.Latencies[0].Round(time.Millisecond), st.Latencies[n/2].Round(time.Millisecond), st.Latencies[n-1].Round(time.Millisecond))
		}
		record("pool_crawler", time.Duration(st.Sent)*crawlerInterval, fmt.Sprintf("(scale-up, rollout, scale-down: %d requests through %d distinct published proxies, %d failed (%d refused, %d timed out; goal 0); %d reads of proxies.txt (%d failed), %d list changes, list length %d–%d; latency %s)",
			st.Sent, st.DistinctEntries, st.Failed, st.Refused, st.TimedOut, st.Reads, st.ReadErrors, st.ListChanges, st.ShortestList, st.LongestList, lat))
		if len(st.Failures) > 0 {
			GinkgoWriter.Printf("failed requests:\n  %s\n", strings.Join(st.Failures, "\n  "))
		}
		checkPhase(c, b)
		Expect(b.Disruptions).To(Equal(1), "scaling down by one takes one replica out")
		Expect(st.Refused).To(BeZero(), "refused requests: %v", st.Failures)
		Expect(st.ReadErrors).To(BeZero())
		Expect(st.ShortestList).To(BeNumerically(">=", 1), "the published list was never empty")
		Expect(st.DistinctEntries).To(BeNumerically(">=", 4), "the crawler used old and new replicas")
		Expect(reps).To(HaveLen(2))
	}, NodeTimeout(10*time.Minute))

	It("deletes every replica's VM, volumes and NVRAM file with the pool", func(ctx SpecContext) {
		Expect(k8s.Delete(ctx, pool.DeepCopy())).To(Succeed())
		start := time.Now()
		Eventually(func(ctx context.Context) error {
			err := k8s.Get(ctx, poolKey(), &crawlv1.ProxyPool{})
			if err == nil {
				return fmt.Errorf("ProxyPool %s still exists", poolKey())
			}
			return client.IgnoreNotFound(err)
		}).WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(time.Second).Should(Succeed())
		// The pool holds its finalizer until it has unpublished and its
		// replicas are gone; no garbage collector runs here.
		gc := "the pool unpublished and deleted its replicas before it went"
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: crawlv1.PublishedName(pool.Name)}, &corev1.Secret{})).
			To(Satisfy(apierrors.IsNotFound), "the published Secret after the pool went")
		Eventually(func(ctx context.Context) error {
			reps, err := e2eutil.PoolReplicas(ctx, k8s, pool)
			if err == nil && len(reps) > 0 {
				return fmt.Errorf("%d replicas still exist", len(reps))
			}
			return err
		}).WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(time.Second).Should(Succeed())
		took := time.Since(start)
		seen := watch.Seen()
		// Two, one more, three replacements.
		Expect(len(seen)).To(BeNumerically(">=", 6), "replicas the watch saw")
		left, audit, err := e2eutil.PoolLeftovers(ctx, hv, k8s, cfg.Pool, seen)
		Expect(err).NotTo(HaveOccurred())
		Expect(left).To(BeEmpty(), "what is left on the host of the pool's replicas")
		Expect(audit.Leaks()).To(BeZero(), "host audit: %s", audit)
		names := make([]string, 0, len(seen))
		for _, r := range seen {
			names = append(names, r.Domain)
		}
		sort.Strings(names)
		record("pool_deleted", took, fmt.Sprintf("(ProxyPool deleted → it and its replicas gone (%s); host audit: %s; %d replicas' domains checked: %s)",
			gc, audit, len(seen), strings.Join(slices.Compact(names), ", ")))
	}, NodeTimeout(10*time.Minute))
})

// failures describes the crawler's failed requests, when a check needs it.
func failures(cr *e2eutil.Crawler) func() string {
	return func() string {
		return "failed requests of the crawler (the first 20):\n  " + strings.Join(cr.Stats().Failures, "\n  ")
	}
}
