//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
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
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

// The pool e2e (label pool, `make test-e2e-pool`): a ProxyPool on the real
// hypervisor, used by two crawlers while it scales up and rotates a replica
// by age, rolls a template change while a ban report replaces a replica,
// and scales down: the test's own client and a real Scrapy crawl with the
// shipped recipe, both fetching an origin that checks every request came
// through a published replica. Its own label, not
// e2e: under TCG on the shared machine it boots six guests, four of them
// one after another, which alone takes longer than the main e2e's whole
// run; and it needs the run's namespace, KVMHost and KVMImage to itself.
// ContinueOnFailure: each phase leaves the pool in a state the next can
// start from, and one run on the slow machine should yield every figure.
//
// What is asserted: the pool's disruption budget (whenever it takes a
// replica out of service, at least replicas-maxUnavailable stay available;
// never more than replicas+maxSurge exist); no failed request (an error, a
// timeout, a 407 or any answer that is not 2xx) of either crawler; no
// request that reached the origin other than through a published replica;
// at least 5,000 requests of the Scrapy crawl; and no request through the
// banned replica later than 2 s plus the recipe's reload interval after the
// report. Replicas that lose Ready while in service (the manager's probe
// timing out on a loaded machine) are recorded, with the lowest
// availability from any cause.
var _ = Describe("a ProxyPool on a real KVM host", Ordered, ContinueOnFailure, Label("pool"), func() {
	const (
		poolName     = "crawl"
		rolloutLabel = "e2e-rollout"
		// The test stands in for the kubelet: it copies the pool's Secret
		// into a mounted-Secret layout this often (the kubelet takes up to
		// a minute, which the pool's 5 s drain would not cover).
		mirrorInterval = 250 * time.Millisecond
		// The Scrapy recipe's PROXYLIST_RELOAD_INTERVAL.
		recipeReload = time.Second
		// The Go client: 8 requests in flight, each worker pausing this
		// long between two (at most 16 requests a second in all), each
		// given what Scrapy's recipe run gives one (DOWNLOAD_TIMEOUT).
		crawlerWorkers = 8
		crawlerPause   = 500 * time.Millisecond
		requestTimeout = 20 * time.Second
		// Scrapy: 8 in flight, DOWNLOAD_DELAY 50 ms (about 20 a second);
		// the crawl must make at least scrapyRequests.
		scrapyConcurrency = 8
		scrapyDelay       = 50 * time.Millisecond
		scrapyRequests    = 5000
		// A ban report unpublishes at once (the pool's promise: within
		// 2 s); a crawler stops using the replica after its next reload.
		banBound = 2*time.Second + recipeReload
	)
	var (
		pool    *crawlv1.ProxyPool
		watch   *e2eutil.PoolWatch
		origin  *e2eutil.Origin
		mirror  *e2eutil.ListMirror
		crawler *e2eutil.Crawler
		scrapy  *e2eutil.ScrapyCrawl
		// crawled: the crawler's figures at the end of the previous phase.
		crawled    e2eutil.CrawlerStats
		crawlStart time.Time
		// The ban report: when, on which replica and its address, how long
		// until the published Secret no longer listed it, and when the
		// replica was seen gone (its address may be reused after that).
		banAt, banGone       time.Time
		bannedName, bannedIP string
		banUnpublished       time.Duration
		poolDumped           bool
		scrapyStopped        bool
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
	// The operator writes the pool's status while the suite changes its
	// spec: each change is read, made and written again on a conflict, as
	// kubectl edit and scale do.
	scale := func(ctx context.Context, from, to int32) {
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			sc := &autoscalingv1.Scale{}
			Expect(k8s.SubResource("scale").Get(ctx, pool.DeepCopy(), sc)).To(Succeed())
			Expect(sc.Spec.Replicas).To(Equal(from))
			Expect(sc.Status.Selector).To(Equal(metav1.FormatLabelSelector(&pool.Spec.Selector)), "the scale subresource's selector (status.selector)")
			sc.Spec.Replicas = to
			return k8s.SubResource("scale").Update(ctx, pool.DeepCopy(), client.WithSubResourceBody(sc))
		})).To(Succeed())
	}
	update := func(ctx context.Context, change func(*crawlv1.ProxyPool)) { updatePool(ctx, k8s, pool, change) }

	// phase returns the crawler's figures since the previous phase.
	phase := func() e2eutil.CrawlerStats {
		now := crawler.Stats()
		d := now.Minus(crawled)
		crawled = now
		return d
	}
	// figures describes a phase for its E2E-TIMING line.
	figures := func(c e2eutil.CrawlerStats, b e2eutil.PoolBudget) string {
		return fmt.Sprintf("crawler %s; %d replicas taken out by the pool, fewest available then %d; fewest available from any cause %d, %d lost Ready while in service; most replicas %d",
			c, b.Disruptions, b.MinAtDisruption, b.MinAvailable, len(b.ReadyLost), b.MostExisted)
	}
	// checkPhase asserts what the pool controls, and that both crawlers
	// went on without a failure.
	checkPhase := func(c e2eutil.CrawlerStats, b e2eutil.PoolBudget) {
		if len(b.ReadyLost) > 0 {
			GinkgoWriter.Printf("replicas that lost Ready while in service:\n  %s\n", strings.Join(b.ReadyLost, "\n  "))
		}
		Expect(b.Err).NotTo(HaveOccurred(), "the watch must see the whole phase")
		Expect(b.Violations).To(BeEmpty(), "the disruption budget was broken")
		Expect(c.Sent).To(BeNumerically(">", 0))
		Expect(c.Failed).To(BeZero(), failures(crawler))
		if !scrapyStopped {
			Expect(scrapy.Running()).To(Succeed(), "the Scrapy crawl")
		}
		Expect(mirror.Stats().WriteError).NotTo(HaveOccurred(), "laying out the mounted list")
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
		if scrapy != nil {
			scrapy.Kill()
		}
		if mirror != nil {
			mirror.Stop()
		}
		if origin != nil {
			_ = origin.Close()
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

		// From here two crawlers use the pool for the rest of the specs,
		// fetching an origin on the probe server's address (one the
		// replicas' Access admits) that checks where each request came from.
		probe, err := url.Parse(cfg.ProbeURL)
		Expect(err).NotTo(HaveOccurred())
		origin, err = e2eutil.StartOrigin(probe.Hostname())
		Expect(err).NotTo(HaveOccurred())
		mirror = &e2eutil.ListMirror{Client: k8s, Namespace: pool.Namespace, Pool: poolName, Dir: filepath.Join(artifacts, "proxies-mount"),
			Interval: mirrorInterval, Origin: origin}
		Expect(mirror.Start(context.Background())).To(Succeed())
		crawlStart = time.Now()
		crawler = &e2eutil.Crawler{List: mirror.Lines, Targets: []string{origin.HTTPURL + "/go/", origin.HTTPSURL + "/go/"},
			RootCAs: origin.RootCAs, Workers: crawlerWorkers, Pause: crawlerPause, RequestTimeout: requestTimeout}
		crawler.Start(context.Background())
		scrapy = &e2eutil.ScrapyCrawl{Root: envtestutil.Root(), ListPath: filepath.Join(mirror.Dir, crawlv1.ProxiesJSONKey),
			URLs: []string{origin.HTTPURL + "/scrapy/", origin.HTTPSURL + "/scrapy/"}, Dir: artifacts,
			Reload: recipeReload, Delay: scrapyDelay, Concurrency: scrapyConcurrency, Timeout: requestTimeout}
		Expect(scrapy.Start()).To(Succeed())
	}, NodeTimeout(20*time.Minute))

	It("scales to 3 through the scale subresource and rotates a replica by age while the crawlers use the pool", func(ctx SpecContext) {
		Expect(crawler).NotTo(BeNil())
		before, err := e2eutil.PoolReplicas(ctx, k8s, pool)
		Expect(err).NotTo(HaveOccurred())
		Expect(before).To(HaveLen(2))
		phase()
		// At most 3+maxSurge exist: the rotation surges beside the scale-up.
		watch.Arm(3, 1, 0)
		// Both replicas are older than maxAge: one rotation starts now, and
		// minInterval keeps it to one in this run (its boot runs beside the
		// scale-up's, adding little wall time). Rotation is switched off
		// again once it is done.
		update(ctx, func(pool *crawlv1.ProxyPool) {
			pool.Spec.Rotation = crawlv1.ProxyPoolRotation{MaxAge: &metav1.Duration{Duration: time.Minute}, MaxConcurrent: 1,
				MinInterval: &metav1.Duration{Duration: time.Hour}}
		})
		scale(ctx, 2, 3)
		start := time.Now()
		_, lines := serving(ctx, 3, 2*(cfg.ProxyReadyTimeout+time.Minute), func(reps []crawlv1.Proxy) error {
			left := 0
			for _, p := range reps {
				for _, o := range before {
					if p.UID == o.UID {
						left++
					}
				}
			}
			if left != 1 {
				return fmt.Errorf("%d of the 2 replicas older than maxAge remain, want 1 (one rotation)", left)
			}
			return nil
		})
		took := time.Since(start)
		Expect(lines).To(HaveLen(3))
		everyEntryServes(ctx, lines)
		update(ctx, func(pool *crawlv1.ProxyPool) { pool.Spec.Rotation = crawlv1.ProxyPoolRotation{} })
		b, c := watch.Budget(), phase()
		record("pool_scale_up_rotation", took, "(scale 2 → 3 and maxAge 1m with minInterval 1h → the third replica and one replacing the older of the first two Ready and published, that one gone; "+figures(c, b)+")")
		checkPhase(c, b)
		Expect(b.Disruptions).To(Equal(1), "the rotation took one replica out")
		Expect(b.MostExisted).To(BeNumerically("<=", 4))
	}, NodeTimeout(30*time.Minute))

	It("rolls a template change one replica at a time (maxSurge 1, maxUnavailable 0) within the budget while a ban report replaces a replica, no request failed", func(ctx SpecContext) {
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
		update(ctx, func(pool *crawlv1.ProxyPool) { pool.Spec.Template.Metadata.Labels[rolloutLabel] = "2" })
		start := time.Now()

		// A crawler reports a ban on a replica still published, asking for
		// its replacement (what the recipes' report_ban does): it must
		// leave the published list at once, and no crawler may use it
		// after the list it reads no longer names it.
		var published []struct {
			Name string `json:"name"`
			URL  string `json:"url"`
		}
		sec := &corev1.Secret{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: crawlv1.PublishedName(poolName)}, sec)).To(Succeed())
		Expect(json.Unmarshal(sec.Data[crawlv1.ProxiesJSONKey], &published)).To(Succeed())
		Expect(published).NotTo(BeEmpty())
		bannedName = published[0].Name
		bannedURL, err := url.Parse(published[0].URL)
		Expect(err).NotTo(HaveOccurred())
		bannedIP = bannedURL.Hostname()
		ban := &crawlv1.ProxyBan{ObjectMeta: metav1.ObjectMeta{GenerateName: poolName + "-ban-", Namespace: pool.Namespace},
			Spec: crawlv1.ProxyBanSpec{Pool: poolName, Proxy: bannedName, Reason: "e2e: HTTP 403 x5", Replace: true}}
		// The pool takes it out of service at once, by design: no
		// disruption of the budget.
		watch.Reported(bannedName)
		banAt = time.Now()
		Expect(k8s.Create(ctx, ban)).To(Succeed())
		Eventually(func(ctx context.Context) (string, error) {
			s := &corev1.Secret{}
			err := k8s.Get(ctx, client.ObjectKeyFromObject(sec), s)
			return string(s.Data[crawlv1.ProxiesTextKey]), err
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(50*time.Millisecond).ShouldNot(ContainSubstring("@"+bannedURL.Host),
			"the banned replica leaves proxies.txt")
		banUnpublished = time.Since(banAt)
		GinkgoWriter.Printf("ban report on %s (%s): unpublished after %s\n", bannedName, bannedIP, banUnpublished.Round(time.Millisecond))

		// Three replacements one after another, each a TCG boot and a drain.
		reps, lines := serving(ctx, 3, 3*(cfg.ProxyReadyTimeout+time.Minute), func(reps []crawlv1.Proxy) error {
			if banGone.IsZero() {
				if err := k8s.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: bannedName}, &crawlv1.Proxy{}); apierrors.IsNotFound(err) {
					banGone = time.Now()
				}
			}
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
		if banGone.IsZero() {
			banGone = time.Now()
		}
		// Between report+bound and the replica's end (after it, a new
		// replica may lease the same address), nothing came from it.
		late := origin.From(bannedIP, banAt.Add(banBound), banGone)
		var lateDesc []string
		for _, h := range late[:min(len(late), 10)] {
			lateDesc = append(lateDesc, fmt.Sprintf("%s %s after the report", h.Path, h.At.Sub(banAt).Round(time.Millisecond)))
		}
		record("pool_rollout", took, fmt.Sprintf("(template change → 3 new replicas Ready and published, the 3 old ones gone; budget: ≥ 3 available when one is taken out, ≤ 4 exist; a ban report (replace) on %s: out of proxies.txt %s after it, %d requests through it later than %s after it, taken out of service outside the budget %d; %s)",
			bannedName, banUnpublished.Round(time.Millisecond), len(late), banBound, b.ReportedOut, figures(c, b)))
		checkPhase(c, b)
		Expect(late).To(BeEmpty(), "requests through the banned replica %s more than %s after the report: %v", bannedName, banBound, lateDesc)
		Expect(b.ReportedOut).To(Equal(1), "the reported replica was taken out")
		Expect(b.Disruptions).To(BeNumerically(">=", 2), "every other old replica was taken out")
		Expect(b.MinAtDisruption).To(BeNumerically(">=", 3))
		Expect(b.MostExisted).To(Equal(4), "a rollout with maxSurge 1 surges")
	}, NodeTimeout(45*time.Minute))

	It("scales down to 2 within the budget, no request failed, and reports the crawlers' figures", func(ctx SpecContext) {
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
		// The Scrapy crawl makes its count first if it has not yet (only a
		// fast run ends before), then a few more requests over the final
		// list, and the crawlers stop.
		Eventually(func() int { return origin.Counts("/scrapy/").Requests }).WithContext(ctx).WithTimeout(6*time.Minute).WithPolling(time.Second).
			Should(BeNumerically(">=", scrapyRequests), "requests of the Scrapy crawl")
		time.Sleep(3 * time.Second)
		b, c := watch.Budget(), phase()
		st := crawler.Stop()
		sum, serr := scrapy.Stop(time.Minute)
		scrapyStopped = true
		ms := mirror.Stop()
		crawlTook := time.Since(crawlStart)
		goSeen, scrapySeen := origin.Counts("/go/"), origin.Counts("/scrapy/")
		record("pool_scale_down", took, fmt.Sprintf("(scale 3 → 2 → one replica drained (%ds) and deleted; %s)", e2eutil.PoolDrainSeconds, figures(c, b)))
		lat := "none"
		if n := len(st.Latencies); n > 0 {
			lat = fmt.Sprintf("min %s, median %s, max %s", st.Latencies[0].Round(time.Millisecond), st.Latencies[n/2].Round(time.Millisecond), st.Latencies[n-1].Round(time.Millisecond))
		}
		record("pool_crawler", crawlTook, fmt.Sprintf("(the Go client, %d in flight, keep-alive, through scale-up and rotation, rollout and ban, scale-down: %s through %d distinct published proxies; the origin saw %d (%d HTTPS), %d not from a published replica; latency %s)",
			crawlerWorkers, st, st.DistinctEntries, goSeen.Requests, goSeen.HTTPS, goSeen.Direct, lat))
		record("pool_scrapy", crawlTook, fmt.Sprintf("(Scrapy %d in flight with the shipped recipe, the list from a kubelet-like directory refreshed every %s, reload %s: %d responses, %d failed, %d retried by the recipe through another proxy, %d held waits, closed %q; the origin saw %d (%d HTTPS), %d not from a published replica (%v); list: %d reads of the Secret (%d failed), %d changes, length %d–%d; ban report → out of proxies.txt %s)",
			scrapyConcurrency, mirrorInterval, recipeReload, sum.Responses, sum.Failed, sum.Stat("proxylist/retries"), sum.Stat("proxylist/held_waits"), sum.Reason,
			scrapySeen.Requests, scrapySeen.HTTPS, scrapySeen.Direct, scrapySeen.DirectSources, ms.Reads, ms.ReadErrors, ms.ListChanges, ms.ShortestList, ms.LongestList,
			banUnpublished.Round(time.Millisecond)))
		if len(st.Failures) > 0 {
			GinkgoWriter.Printf("failed requests of the Go client:\n  %s\n", strings.Join(st.Failures, "\n  "))
		}
		if len(sum.Failures) > 0 {
			GinkgoWriter.Printf("failed requests of the Scrapy crawl:\n  %s\n", strings.Join(sum.Failures, "\n  "))
		}
		checkPhase(c, b)
		Expect(b.Disruptions).To(Equal(1), "scaling down by one takes one replica out")
		Expect(st.Failed).To(BeZero(), "failed requests of the Go client: %v", st.Failures)
		Expect(st.HTTPS).To(BeNumerically(">", 0))
		Expect(st.DistinctEntries).To(BeNumerically(">=", 4), "the crawler used old and new replicas")
		Expect(goSeen.Direct).To(BeZero(), "requests of the Go client not through a published replica, from %v", goSeen.DirectSources)
		Expect(serr).NotTo(HaveOccurred())
		Expect(sum.Failed).To(BeZero(), "failed requests of the Scrapy crawl: %v", sum.Failures)
		Expect(sum.Responses).To(BeNumerically(">=", scrapyRequests))
		Expect(scrapySeen.Requests).To(BeNumerically(">=", sum.Responses))
		Expect(scrapySeen.HTTPS).To(BeNumerically(">", 0))
		Expect(scrapySeen.Direct).To(BeZero(), "requests of the Scrapy crawl not through a published replica, from %v", scrapySeen.DirectSources)
		Expect(ms.ReadErrors).To(BeZero(), "the first failed read of the Secret: %v", ms.FirstReadError)
		Expect(ms.ShortestList).To(BeNumerically(">=", 1), "the published list was never empty")
		Expect(reps).To(HaveLen(2))
	}, NodeTimeout(15*time.Minute))

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
