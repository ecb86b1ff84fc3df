package controllers

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	poolfleet "crawl.example.com/proxy-operator/pkg/fleet"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
)

// The pool specs run the real ProxyPool and Proxy controllers over the
// suite's in-memory libvirt hosts: replicas become Ready when their guest
// agent reports an address (poolBooter plays the guests) and the fake
// prober answers for it. An independent watch (poolWatch) sees every
// version of every replica the API server stores and checks the budget on
// each one.
var _ = Describe("ProxyPool", Ordered, func() {
	var (
		image     string
		hostLabel map[string]string
		testHosts []*testHost
	)
	BeforeAll(func() { image, hostLabel, testHosts = poolHosts("pool", 3) })

	newPool := func(ns, name string, replicas int32, tune ...func(*crawlv1.ProxyPool)) *crawlv1.ProxyPool {
		pool := poolOnHosts(ns, name, replicas, hostLabel, image, append([]func(*crawlv1.ProxyPool){func(p *crawlv1.ProxyPool) {
			// A replica boots in about a second here.
			p.Spec.Remediation.StartupTimeout = &metav1.Duration{Duration: 20 * time.Second}
		}}, tune...)...)
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		return pool
	}

	It("scales up and down through the scale subresource, in deletion order, and publishes exactly the Ready replicas", func() {
		ns := newNamespace()
		booter := startPoolBooter(testHosts, ns)
		w := watchPool(ns, "scale")
		pool := newPool(ns, "scale", 3)

		names := waitPoolReady(pool, 3)
		for _, n := range names {
			Expect(n).To(MatchRegexp(`^scale-[bcdfghjklmnpqrstvwxz2456789]{5}$`))
			p := getProxy(ns, n)
			Expect(metav1.IsControlledBy(p, pool)).To(BeTrue(), "%s has no controller reference to the pool", n)
			Expect(p.Labels).To(HaveKeyWithValue(crawlv1.PoolNameLabel, "scale"))
			Expect(p.Labels).To(HaveKeyWithValue("app", "scale"))
			Expect(p.Labels).To(HaveKeyWithValue(crawlv1.TemplateHashLabel, poolfleet.TemplateHash(&pool.Spec.Template)))
		}
		got := getPool(pool)
		Expect(got.Status.Selector).To(Equal("app=scale"))
		Expect(got.Status.ReadyReplicas).To(BeEquivalentTo(3))
		Expect(got.Status.UpToDateReplicas).To(BeEquivalentTo(3))
		hostsUsed := map[string]bool{}
		for _, n := range names {
			hostsUsed[getProxy(ns, n).Status.Host] = true
		}
		Expect(got.Status.DistinctHosts).To(BeEquivalentTo(len(hostsUsed)))
		Expect(conditions.IsTrue(got, crawlv1.PoolAvailableCondition)).To(BeTrue())
		Expect(conditions.GetReason(got, crawlv1.PoolRollingOutCondition)).To(Equal(crawlv1.PoolUpToDateReason))
		expectPublishedIsReady(pool)

		By("kubectl scale: the scale subresource sets spec.replicas")
		setScale(pool, 5)
		waitPoolReady(pool, 5)
		expectPublishedIsReady(pool)
		w.arm(5, 1, 1) // one replica is taken down by hand below

		By("a replica that stops serving leaves the published list at once")
		sick := waitPoolReady(pool, 5)[2]
		prober.SetDown(getProxy(ns, sick).Status.Address, true)
		DeferCleanup(prober.SetDown, getProxy(ns, sick).Status.Address, false)
		waitProxyReady(ns, sick, false)
		notReadyAt := time.Now()
		Eventually(func() []string { return published.last(pool) }).WithTimeout(2 * time.Second).WithPolling(20 * time.Millisecond).
			ShouldNot(ContainElement(sick))
		GinkgoWriter.Printf("unpublished %s after %s\n", sick, time.Since(notReadyAt))

		By("scale down, paused so nothing is replaced: the marked replica first, then the not-Ready one, then the oldest")
		updatePool(pool, func(p *crawlv1.ProxyPool) { p.Spec.Paused = true })
		Eventually(func() bool { return conditions.IsTrue(getPool(pool), crawlv1.PoolPausedCondition) }).Should(BeTrue())
		ready := readyPoolReplicas(pool)
		// The pool's Oldest: by creation time (whole seconds), then name.
		byAge := func(a, b crawlv1.Proxy) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		}
		oldest := slices.MinFunc(ready, byAge).Name
		marked := slices.MaxFunc(ready, byAge).Name
		Expect(marked).NotTo(Equal(oldest))
		annotateProxy(ns, marked, crawlv1.DeleteProxyAnnotation, "banned")
		w.expectBudgetKept()
		// Scaling down lowers the budget's own measure; what counts here is
		// the order.
		w.disarm()
		setScale(pool, 2)
		Eventually(func() int { return len(poolReplicas(pool)) }).WithTimeout(20 * time.Second).Should(Equal(2))
		// The not-Ready one left the list when it lost Ready, long enough
		// ago to need no drain now: removed, drained or not.
		Expect(w.removedNames()).To(ConsistOf(marked, sick, oldest))
		Expect(w.drainedNames()).To(ContainElements(marked, oldest))
		Eventually(func() []string { return published.last(pool) }).Should(HaveLen(2))
		expectPublishedIsReady(pool)
		w.expectPublishedNeverDraining(pool)
		w.expectBudgetKept()
		booter.stop()
	})

	for _, b := range []struct{ surge, unavailable int }{{1, 0}, {0, 1}} {
		It(fmt.Sprintf("rolls a template change with maxSurge %d, maxUnavailable %d, within the budget at every event", b.surge, b.unavailable), func() {
			ns := newNamespace()
			booter := startPoolBooter(testHosts, ns)
			defer booter.stop()
			w := watchPool(ns, "roll")
			pool := newPool(ns, "roll", 4, func(p *crawlv1.ProxyPool) {
				p.Spec.Rollout.MaxSurge = ptr.To(intstr.FromInt32(int32(b.surge)))
				p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(int32(b.unavailable)))
			})
			before := waitPoolReady(pool, 4)
			w.arm(4, b.surge, b.unavailable)

			updatePool(pool, func(p *crawlv1.ProxyPool) {
				p.Spec.Template.Spec.CloudInit.UserData = "#cloud-config\nlocale: C.UTF-8\n"
			})
			newHash := poolfleet.TemplateHash(&getPool(pool).Spec.Template)
			Eventually(func(g Gomega) {
				rs := poolReplicas(pool)
				g.Expect(rs).To(HaveLen(4))
				for _, p := range rs {
					g.Expect(p.Labels[crawlv1.TemplateHashLabel]).To(Equal(newHash))
					g.Expect(conditions.IsTrue(&p, crawlv1.ReadyCondition)).To(BeTrue())
				}
			}).WithTimeout(60 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
			for _, n := range before {
				waitProxyGone(ns, n, 10*time.Second)
			}
			Eventually(func() string { return conditions.GetReason(getPool(pool), crawlv1.PoolRollingOutCondition) }).Should(Equal(crawlv1.PoolUpToDateReason))

			w.expectBudgetKept()
			lowest, most := w.extremes()
			GinkgoWriter.Printf("rollout maxSurge %d maxUnavailable %d: lowest availability %d, most replicas %d, %d events\n", b.surge, b.unavailable, lowest, most, w.events())
			Expect(most).To(Equal(4+b.surge), "the rollout never used its surge")
			Expect(lowest).To(Equal(4-b.unavailable), "the rollout never used maxUnavailable")
			w.expectPublishedNeverDraining(pool)
			expectPublishedIsReady(pool)
		})
	}

	It("rotates replicas by age, one per minInterval, each no sooner than maxAge minus its own jitter, never below replicas", func() {
		ns := newNamespace()
		booter := startPoolBooter(testHosts, ns)
		defer booter.stop()
		w := watchPool(ns, "rot")
		const maxAge, jitter, interval = 8 * time.Second, 4 * time.Second, 3 * time.Second
		pool := newPool(ns, "rot", 3, func(p *crawlv1.ProxyPool) {
			p.Spec.Rotation = crawlv1.ProxyPoolRotation{MaxAge: &metav1.Duration{Duration: maxAge}, Jitter: &metav1.Duration{Duration: jitter},
				MinInterval: &metav1.Duration{Duration: interval}}
			// A budget that would allow a drain first: rotation must not use it.
			p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(1))
		})
		waitPoolReady(pool, 3)
		w.arm(3, 1, 0)

		Eventually(func() int { return len(w.rotations()) }).WithTimeout(45 * time.Second).Should(BeNumerically(">=", 5))
		rots := w.rotations()
		for i := 1; i < len(rots); i++ {
			Expect(rots[i].at.Sub(rots[i-1].at)).To(BeNumerically(">=", interval), "rotations %s and %s started %s apart", rots[i-1].name, rots[i].name, rots[i].at.Sub(rots[i-1].at))
		}
		for _, r := range rots {
			earliest := r.created.Add(maxAge - poolfleet.JitterOf(string(r.uid), jitter))
			// creationTimestamp is whole seconds.
			Expect(r.at).To(BeTemporally(">=", earliest.Add(-time.Second)), "%s rotated at age %s, its expiry is at %s", r.name, r.at.Sub(r.created), earliest.Sub(r.created))
		}
		Expect(w.maxRotating()).To(Equal(1), "maxConcurrent 1")
		w.expectBudgetKept()
		Expect(getPool(pool).Status.Rotation).NotTo(BeNil())
		Expect(getPool(pool).Status.Rotation.LastTime).NotTo(BeNil())
		w.expectPublishedNeverDraining(pool)
	})

	It("says when its rotation limits cannot replace it within maxAge (RotationBehind), and clears once they are raised", func() {
		ns := newNamespace()
		booter := startPoolBooter(testHosts, ns)
		defer booter.stop()
		// One start per 30 minutes replaces two replicas an hour: short
		// of three, long before any of them is old.
		pool := newPool(ns, "behind", 3, func(p *crawlv1.ProxyPool) {
			p.Spec.Rotation = crawlv1.ProxyPoolRotation{MaxAge: &metav1.Duration{Duration: time.Hour}, MinInterval: &metav1.Duration{Duration: 30 * time.Minute}}
		})
		waitPoolReady(pool, 3)
		behind := func() metav1.Condition {
			c := conditions.Get(getPool(pool), crawlv1.PoolRotationBehindCondition)
			if c == nil {
				return metav1.Condition{}
			}
			return *c
		}
		Eventually(behind).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", crawlv1.PoolRotationTooSlowReason),
			HaveField("Message", ContainSubstring("at most 2 of 3 replicas per maxAge 1h0m0s")), HaveField("Message", ContainSubstring("rotation.minInterval 30m0s"))))
		Expect(getPool(pool).Status.Rotation.OverdueReplicas).To(BeZero())

		updatePool(pool, func(p *crawlv1.ProxyPool) { p.Spec.Rotation.MinInterval = &metav1.Duration{Duration: 5 * time.Minute} })
		Eventually(behind).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", crawlv1.PoolRotationCaughtUpReason)))
	})

	It("replaces a replica that stops serving, and leaves 60% unhealthy alone (TooManyUnhealthy)", func() {
		ns := newNamespace()
		booter := startPoolBooter(testHosts, ns)
		defer booter.stop()
		w := watchPool(ns, "heal")
		pool := newPool(ns, "heal", 5, func(p *crawlv1.ProxyPool) {
			p.Spec.Remediation.StartupTimeout = &metav1.Duration{Duration: 5 * time.Second}
			p.Spec.Remediation.UnhealthyTimeout = &metav1.Duration{Duration: 2 * time.Second}
		})
		names := waitPoolReady(pool, 5)
		// Older than the startup window, so a failure counts as unhealthy.
		time.Sleep(6 * time.Second)
		w.arm(5, 1, 1) // one replica down by the test's hand

		victim := getProxy(ns, names[0])
		prober.SetDown(victim.Status.Address, true)
		DeferCleanup(prober.SetDown, victim.Status.Address, false)
		waitProxyGone(ns, victim.Name, 30*time.Second)
		waitPoolReady(pool, 5)
		Expect(w.createdNames()).To(HaveLen(6))
		// Unpublished when it lost Ready, more than drainSeconds before
		// its replacement was available: deleted without a drain.
		Expect(w.removedNames()).To(ConsistOf(victim.Name))
		w.expectBudgetKept()

		By("three of five unhealthy at once (an outage): the short-circuit")
		w.arm(5, 1, 3)
		// Paused while the three go down: probes fail at slightly different
		// moments, and the outage is three at once, not one after another.
		updatePool(pool, func(p *crawlv1.ProxyPool) { p.Spec.Paused = true })
		Eventually(func() bool { return conditions.IsTrue(getPool(pool), crawlv1.PoolPausedCondition) }).Should(BeTrue())
		now := readyPoolReplicas(pool)
		Expect(now).To(HaveLen(5))
		for _, p := range now[:3] {
			prober.SetDown(p.Status.Address, true)
			DeferCleanup(prober.SetDown, p.Status.Address, false)
		}
		Eventually(func() string { return conditions.GetReason(getPool(pool), crawlv1.PoolRemediationAllowedCondition) }).
			WithTimeout(20 * time.Second).Should(Equal(crawlv1.PoolTooManyUnhealthyReason))
		created, drained := len(w.createdNames()), len(w.drainedNames())
		updatePool(pool, func(p *crawlv1.ProxyPool) { p.Spec.Paused = false })
		// Well past unhealthyTimeout: nothing is created, drained or deleted.
		Consistently(func() []int { return []int{len(w.createdNames()), len(w.drainedNames()), len(poolReplicas(pool))} }).
			WithTimeout(6 * time.Second).WithPolling(200 * time.Millisecond).Should(Equal([]int{created, drained, 5}))
		got := getPool(pool)
		Expect(got.Status.UnhealthyReplicas).To(BeEquivalentTo(3))
		Expect(conditions.IsFalse(got, crawlv1.PoolAvailableCondition)).To(BeTrue())
		Expect(published.last(pool)).To(HaveLen(2))
		// The outage ends (at once: paused again while the probes recover,
		// which they do a moment apart).
		updatePool(pool, func(p *crawlv1.ProxyPool) { p.Spec.Paused = true })
		for _, p := range now[:3] {
			prober.SetDown(p.Status.Address, false)
		}
		waitPoolReady(pool, 5)
		updatePool(pool, func(p *crawlv1.ProxyPool) { p.Spec.Paused = false })
		Eventually(func() bool { return conditions.IsTrue(getPool(pool), crawlv1.PoolRemediationAllowedCondition) }).WithTimeout(20 * time.Second).Should(BeTrue())
		Expect(proxyNames(readyPoolReplicas(pool))).To(ConsistOf(proxyNames(now)), "the replicas that were unhealthy serve again; none was replaced")
		Expect(len(w.createdNames())).To(Equal(created))
	})

	It("leaves its replicas and published objects when deleted with propagationPolicy Orphan", func() {
		ns := newNamespace()
		booter := startPoolBooter(testHosts, ns)
		defer booter.stop()
		pool := newPool(ns, "orphan", 1)
		names := waitPoolReady(pool, 1)

		// kubectl delete --cascade=orphan: the API server puts the orphan
		// finalizer on the pool; the garbage collector (none runs here)
		// would remove the owner references and then that finalizer.
		Expect(k8sClient.Delete(ctx, getPool(pool), client.PropagationPolicy(metav1.DeletePropagationOrphan))).To(Succeed())
		Eventually(func() []string { return getPool(pool).Finalizers }).Should(Equal([]string{metav1.FinalizerOrphanDependents}))
		Consistently(func(g Gomega) {
			p := getProxy(ns, names[0])
			g.Expect(p.DeletionTimestamp.IsZero()).To(BeTrue(), "replica %s deleted", p.Name)
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: crawlv1.PublishedName("orphan")}, &corev1.Secret{})).To(Succeed())
		}).WithTimeout(3 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

		// What the garbage collector would do, so the namespace can go.
		updatePool(pool, func(p *crawlv1.ProxyPool) { p.Finalizers = nil })
		Expect(k8sClient.Delete(ctx, getProxy(ns, names[0]))).To(Succeed())
		waitProxyGone(ns, names[0], 20*time.Second)
	})

	It("reaches its replica count while a replica's deletion never finishes, and says which", func() {
		ns := newNamespace()
		booter := startPoolBooter(testHosts, ns)
		defer booter.stop()
		const deletionTimeout = 3 * time.Second
		// maxSurge 1, maxUnavailable 0: the one room a replacement has is
		// the one the stuck deletion holds.
		pool := newPool(ns, "hold", 2, func(p *crawlv1.ProxyPool) {
			p.Spec.Rollout.DrainSeconds = ptr.To(int32(0))
			p.Spec.Remediation.DeletionTimeout = &metav1.Duration{Duration: deletionTimeout}
		})
		names := waitPoolReady(pool, 2)
		stuck, next := names[0], names[1]

		By("a replica whose deletion never finishes (a finalizer that never goes)")
		const hold = "test.crawl.example.com/hold"
		// Read and written again on a conflict: the controllers write the
		// replica's status meanwhile.
		Eventually(func() error {
			p := getProxy(ns, stuck)
			if controllerutil.ContainsFinalizer(p, hold) {
				return nil
			}
			controllerutil.AddFinalizer(p, hold)
			return k8sClient.Update(ctx, p)
		}).Should(Succeed())
		release := func() {
			Eventually(func() error {
				p := &crawlv1.Proxy{}
				if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: stuck}, p); err != nil {
					return client.IgnoreNotFound(err)
				}
				p.Finalizers = slices.DeleteFunc(p.Finalizers, func(f string) bool { return f == hold })
				return k8sClient.Update(ctx, p)
			}).Should(Succeed())
		}
		DeferCleanup(release)
		annotateProxy(ns, stuck, crawlv1.DeleteProxyAnnotation, "banned")
		Eventually(func(g Gomega) {
			g.Expect(getProxy(ns, stuck).DeletionTimestamp.IsZero()).To(BeFalse(), "the banned replica is not being deleted")
			g.Expect(proxyNames(readyPoolReplicas(pool))).To(HaveLen(2))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		By("another replica to replace: its room is the one the stuck deletion holds, until deletionTimeout")
		annotateProxy(ns, next, crawlv1.DeleteProxyAnnotation, "banned")
		waitProxyGone(ns, next, 40*time.Second)
		Eventually(func(g Gomega) {
			ready := proxyNames(readyPoolReplicas(pool))
			g.Expect(ready).To(HaveLen(2))
			g.Expect(ready).NotTo(ContainElements(stuck, next))
			got := getPool(pool)
			g.Expect(got.Status.AvailableReplicas).To(BeEquivalentTo(2))
			g.Expect(conditions.IsTrue(got, crawlv1.PoolAvailableCondition)).To(BeTrue())
			c := conditions.Get(got, crawlv1.PoolDeletionStuckCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(crawlv1.PoolDeletionStuckReason))
			g.Expect(c.Message).To(ContainSubstring(stuck))
		}).WithTimeout(40 * time.Second).Should(Succeed())
		Expect(getProxy(ns, stuck).DeletionTimestamp.IsZero()).To(BeFalse(), "the stuck replica is still there, being deleted")
		Eventually(func(g Gomega) {
			events := &corev1.EventList{}
			g.Expect(k8sClient.List(ctx, events, client.InNamespace(ns))).To(Succeed())
			var warned []string
			for _, e := range events.Items {
				if e.InvolvedObject.Kind == "ProxyPool" && e.Type == corev1.EventTypeWarning && e.Reason == crawlv1.PoolDeletionStuckReason {
					warned = append(warned, e.Message)
				}
			}
			g.Expect(warned).To(ContainElement(ContainSubstring(stuck)))
		}).WithTimeout(10 * time.Second).Should(Succeed())

		By("the deletion finishes at last: nothing is stuck")
		release()
		waitProxyGone(ns, stuck, 20*time.Second)
		Eventually(func() string { return conditions.GetReason(getPool(pool), crawlv1.PoolDeletionStuckCondition) }).
			Should(Equal(crawlv1.PoolNoDeletionStuckReason))
		waitPoolReady(pool, 2)
	})

	It("backs off a slot whose replicas never start, and says so", func() {
		ns := newNamespace()
		booter := startPoolBooter(testHosts, ns)
		defer booter.stop()
		booter.neverBoot("stuck-")
		w := watchPool(ns, "stuck")
		const startup, backoff = 2 * time.Second, 3 * time.Second
		newPool(ns, "stuck", 1, func(p *crawlv1.ProxyPool) {
			p.Spec.Rollout.DrainSeconds = ptr.To(int32(0))
			p.Spec.Remediation.StartupTimeout = &metav1.Duration{Duration: startup}
			p.Spec.Remediation.StartupBackoff = &metav1.Duration{Duration: backoff}
		})
		Eventually(func() int { return len(w.createdNames()) }).WithTimeout(40 * time.Second).Should(BeNumerically(">=", 4))
		cs := w.creations()
		fail := poolfleet.Policy{StartupBackoff: backoff}
		for i := 1; i < 4; i++ {
			gap := cs[i].at.Sub(cs[i-1].at)
			// The replica made at i-1 inherited i-1 failures of its slot:
			// it is replaced startupTimeout plus their backoff after it was
			// made (creationTimestamp is whole seconds: a second of slack).
			want := startup + fail.StartupBackoffFor(i-1)
			GinkgoWriter.Printf("replica %d (%s) after %s, at least %s\n", i, cs[i].name, gap, want)
			Expect(gap).To(BeNumerically(">=", want-time.Second-100*time.Millisecond), "replica %d came %s after the one it replaces", i, gap)
			Expect(gap).To(BeNumerically("<", want+3*time.Second), "replica %d came late: %s", i, gap)
			p := w.object(cs[i].name)
			Expect(p.Annotations).To(HaveKeyWithValue(crawlv1.StartupFailuresAnnotation, fmt.Sprint(i)))
			Expect(p.Annotations).To(HaveKeyWithValue(crawlv1.ReplacesAnnotation, cs[i-1].name))
		}
		Eventually(func() string {
			return conditions.GetReason(getPool(&crawlv1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "stuck"}}), crawlv1.PoolRemediatingCondition)
		}).WithTimeout(20 * time.Second).Should(Equal(crawlv1.PoolRemediationBackoffReason))
		Expect(w.maxExisting()).To(BeNumerically("<=", 2), "a pool of 1 with maxSurge 1")
	})
})

// readyLabelledHost is readyHost with labels on the KVMHost.
// poolHosts serves an image and makes n Ready hosts sharing a label, for
// the pool specs (prefix tells their objects apart); call it in BeforeAll.
func poolHosts(prefix string, n int) (image string, hostLabel map[string]string, hosts []*testHost) {
	img := kvmtest.NewImageServer("debian", 256<<10)
	DeferCleanup(img.Close)
	image = uniqueName(prefix + "-image")
	createImage(image, img)
	hostLabel = map[string]string{prefix + "-hosts": uniqueName("hv")}
	for i := range n {
		hosts = append(hosts, readyLabelledHost(uniqueName(fmt.Sprintf("%shv%d", prefix, i)), hostLabel))
	}
	return image, hostLabel, hosts
}

// poolOnHosts is a pool of replicas on the kvm hosts labelled hostLabel,
// booting image, drained in a second; tune changes it before it is
// created (the caller creates it).
func poolOnHosts(ns, name string, replicas int32, hostLabel map[string]string, image string, tune ...func(*crawlv1.ProxyPool)) *crawlv1.ProxyPool {
	pool := &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1.ProxyPoolSpec{
			Replicas: ptr.To(replicas),
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: crawlv1.ProxyTemplate{
				Metadata: crawlv1.ProxyTemplateMeta{Labels: map[string]string{"app": name}},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Port: 3128,
					Placement: crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: hostLabel}, Image: image},
					CloudInit: crawlv1.ProxyCloudInit{UserData: "#cloud-config\n"}, InstallGuestAgent: ptr.To(true)},
			},
			Rollout: crawlv1.ProxyPoolRollout{DrainSeconds: ptr.To(int32(1))},
		},
	}
	for _, t := range tune {
		t(pool)
	}
	return pool
}

func readyLabelledHost(name string, labels map[string]string) *testHost {
	h := hosts.add(name)
	createSecret(h)
	createKVMHost(name, h.ssh.Addr(), labels)
	waitHostReason(name, crawlv1.HostReadyReason, 20*time.Second)
	return h
}

func getPool(pool *crawlv1.ProxyPool) *crawlv1.ProxyPool {
	p := &crawlv1.ProxyPool{}
	Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pool), p)).To(Succeed())
	return p
}

func updatePool(pool *crawlv1.ProxyPool, change func(*crawlv1.ProxyPool)) {
	Eventually(func() error {
		p := getPool(pool)
		orig := p.DeepCopy()
		change(p)
		return k8sClient.Patch(ctx, p, client.MergeFrom(orig))
	}).Should(Succeed())
}

// setScale writes spec.replicas through the scale subresource, as kubectl
// scale and an autoscaler do.
func setScale(pool *crawlv1.ProxyPool, n int32) {
	Eventually(func() error {
		sc := &autoscalingv1.Scale{}
		if err := k8sClient.SubResource("scale").Get(ctx, pool, sc); err != nil {
			return err
		}
		sc.Spec.Replicas = n
		return k8sClient.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(sc))
	}).Should(Succeed())
	Expect(*getPool(pool).Spec.Replicas).To(Equal(n))
}

func annotateProxy(ns, name, key, value string) {
	Eventually(func() error {
		p := getProxy(ns, name)
		orig := p.DeepCopy()
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[key] = value
		return k8sClient.Patch(ctx, p, client.MergeFrom(orig))
	}).Should(Succeed())
}

// poolReplicas lists the Proxies the pool controls.
func poolReplicas(pool *crawlv1.ProxyPool) []crawlv1.Proxy {
	list := &crawlv1.ProxyList{}
	Expect(k8sClient.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingLabels{crawlv1.PoolNameLabel: pool.Name})).To(Succeed())
	var out []crawlv1.Proxy
	for _, p := range list.Items {
		if metav1.IsControlledBy(&p, pool) {
			out = append(out, p)
		}
	}
	return out
}

// readyPoolReplicas are the Ready replicas neither draining nor deleting,
// sorted by name: what the pool must publish.
func readyPoolReplicas(pool *crawlv1.ProxyPool) []crawlv1.Proxy {
	var out []crawlv1.Proxy
	for _, p := range poolReplicas(pool) {
		if _, draining := p.Annotations[crawlv1.DrainingAnnotation]; !draining && p.DeletionTimestamp.IsZero() && conditions.IsTrue(&p, crawlv1.ReadyCondition) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b crawlv1.Proxy) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func proxyNames(ps []crawlv1.Proxy) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// waitPoolReady waits until the pool has exactly n replicas, all Ready and
// published, and returns their names.
func waitPoolReady(pool *crawlv1.ProxyPool, n int) []string {
	var got []string
	Eventually(func(g Gomega) {
		all := poolReplicas(pool)
		g.Expect(all).To(HaveLen(n))
		ready := readyPoolReplicas(pool)
		g.Expect(ready).To(HaveLen(n))
		p := getPool(pool)
		g.Expect(p.Status.AvailableReplicas).To(BeEquivalentTo(n))
		g.Expect(p.Status.Replicas).To(BeEquivalentTo(n))
		got = proxyNames(ready)
	}).WithTimeout(60*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(), "pool %s never had %d Ready replicas", pool.Name, n)
	return got
}

func waitProxyReady(ns, name string, ready bool) {
	Eventually(func() bool { return conditions.IsTrue(getProxy(ns, name), crawlv1.ReadyCondition) }).
		WithTimeout(20*time.Second).WithPolling(50*time.Millisecond).Should(Equal(ready), "%s Ready never became %v", name, ready)
}

// expectPublishedIsReady: the last published list is exactly the pool's
// Ready replicas that are not draining.
func expectPublishedIsReady(pool *crawlv1.ProxyPool) {
	Eventually(func(g Gomega) {
		g.Expect(published.last(pool)).To(Equal(proxyNames(readyPoolReplicas(pool))))
	}).WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
}

// publishRecorder keeps every list passed to the Publisher.
type publishRecorder struct {
	mu    sync.Mutex
	calls map[types.NamespacedName][]publishCall
}

type publishCall struct {
	at    time.Time
	names []string
}

func (r *publishRecorder) record(pool types.NamespacedName, replicas []crawlv1.Proxy) {
	ns := make([]string, 0, len(replicas))
	for _, p := range replicas {
		ns = append(ns, p.Name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls == nil {
		r.calls = map[types.NamespacedName][]publishCall{}
	}
	r.calls[pool] = append(r.calls[pool], publishCall{at: time.Now(), names: ns})
}

func (r *publishRecorder) all(pool *crawlv1.ProxyPool) []publishCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls[client.ObjectKeyFromObject(pool)])
}

func (r *publishRecorder) last(pool *crawlv1.ProxyPool) []string {
	c := r.all(pool)
	if len(c) == 0 {
		return nil
	}
	return c[len(c)-1].names
}

// poolBooter plays the guests of a namespace's pool replicas: every new
// domain gets an agent address, except those of replicas named with a
// prefix passed to neverBoot.
type poolBooter struct {
	stopCh chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	never  []string
}

var bootedAddresses sync.Mutex
var nextBootAddress int

func startPoolBooter(hs []*testHost, ns string) *poolBooter {
	b := &poolBooter{stopCh: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(b.done)
		seen := map[string]bool{}
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, h := range hs {
				for _, d := range h.fake.DomainNames() {
					name, ok := strings.CutPrefix(d, ns+".")
					if !ok || seen[d] || b.isNever(name) {
						continue
					}
					seen[d] = true
					bootedAddresses.Lock()
					nextBootAddress++
					n := nextBootAddress
					bootedAddresses.Unlock()
					h.fake.SetAgentAddresses(d, []libvirt.DomainInterface{{Name: "eth0", Addrs: []libvirt.DomainIPAddr{{
						Type: int32(libvirt.IPAddrTypeIpv4), Addr: fmt.Sprintf("198.51.%d.%d", 100+n/250, n%250+1), Prefix: 24}}}})
				}
			}
			select {
			case <-b.stopCh:
				return
			case <-tick.C:
			}
		}
	}()
	DeferCleanup(b.stop)
	return b
}

func (b *poolBooter) neverBoot(prefix string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.never = append(b.never, prefix)
}

func (b *poolBooter) isNever(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.ContainsFunc(b.never, func(p string) bool { return strings.HasPrefix(name, p) })
}

func (b *poolBooter) stop() {
	select {
	case <-b.stopCh:
	default:
		close(b.stopCh)
	}
	<-b.done
}

// poolWatch is the independent observer: a watch of the namespace's
// Proxies of one pool, straight from the API server (not the manager's
// cache), that checks after every event, once armed, that at least
// replicas-maxUnavailable replicas are Ready and not draining and at most
// replicas+maxSurge exist.
type poolWatch struct {
	pool string
	mu   sync.Mutex
	objs map[string]*crawlv1.Proxy

	// lastSeen keeps deleted replicas' last version too.
	lastSeen map[string]*crawlv1.Proxy

	armed                       bool
	replicas, surge, unavail    int
	minAvailable, mostExisting  int
	violations                  []string
	n                           int
	created                     []creation
	createdAt                   map[string]bool
	drained                     map[string]time.Time
	removed                     map[string]bool
	rotated                     []rotation
	rotatedSeen                 map[string]bool
	mostRotating, mostExistEver int
	// mostCreatingOnHost: the most replicas not yet Ready (nor being
	// deleted) any one host had at any event.
	mostCreatingOnHost int
}

type creation struct {
	name string
	at   time.Time
}

type rotation struct {
	name    string
	uid     types.UID
	created time.Time
	at      time.Time
}

func watchPool(ns, pool string) *poolWatch {
	w := &poolWatch{pool: pool, objs: map[string]*crawlv1.Proxy{}, lastSeen: map[string]*crawlv1.Proxy{}, createdAt: map[string]bool{}, drained: map[string]time.Time{}, removed: map[string]bool{},
		rotatedSeen: map[string]bool{}, minAvailable: 1 << 30}
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	list := &crawlv1.ProxyList{}
	Expect(wc.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	rv := list.ResourceVersion
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		for {
			wi, err := wc.Watch(ctx, &crawlv1.ProxyList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
			if err != nil {
				Fail(fmt.Sprintf("watch Proxies: %v", err))
			}
			for {
				select {
				case <-stop:
					wi.Stop()
					return
				case ev, ok := <-wi.ResultChan():
					if !ok {
						goto rewatch
					}
					p, isProxy := ev.Object.(*crawlv1.Proxy)
					if !isProxy {
						continue
					}
					rv = p.ResourceVersion
					w.observe(ev.Type, p)
				}
			}
		rewatch:
		}
	}()
	DeferCleanup(func() { close(stop); <-done })
	return w
}

func (w *poolWatch) observe(t watch.EventType, p *crawlv1.Proxy) {
	if p.Labels[crawlv1.PoolNameLabel] != w.pool {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n++
	now := time.Now()
	w.lastSeen[p.Name] = p
	if t == watch.Deleted {
		delete(w.objs, p.Name)
	} else {
		w.objs[p.Name] = p
	}
	if !w.createdAt[p.Name] && t == watch.Added {
		w.createdAt[p.Name] = true
		w.created = append(w.created, creation{name: p.Name, at: now})
	}
	if t == watch.Deleted || !p.DeletionTimestamp.IsZero() {
		w.removed[p.Name] = true
	}
	if v, ok := p.Annotations[crawlv1.DrainingAnnotation]; ok {
		w.removed[p.Name] = true
		if _, seen := w.drained[p.Name]; !seen {
			at, err := time.Parse(time.RFC3339Nano, v)
			Expect(err).NotTo(HaveOccurred(), "draining annotation of %s", p.Name)
			w.drained[p.Name] = at
		}
	}
	if v, ok := p.Annotations[crawlv1.RotationAnnotation]; ok && !w.rotatedSeen[p.Name] {
		at, err := time.Parse(time.RFC3339Nano, v)
		Expect(err).NotTo(HaveOccurred(), "rotation annotation of %s", p.Name)
		w.rotatedSeen[p.Name] = true
		w.rotated = append(w.rotated, rotation{name: p.Name, uid: p.UID, created: p.CreationTimestamp.Time, at: at})
	}
	existing, available, rotating := len(w.objs), 0, 0
	creatingOn := map[string]int{}
	for _, o := range w.objs {
		_, draining := o.Annotations[crawlv1.DrainingAnnotation]
		if !draining && o.DeletionTimestamp.IsZero() && conditions.IsTrue(o, crawlv1.ReadyCondition) {
			available++
		}
		if o.DeletionTimestamp.IsZero() && !conditions.IsTrue(o, crawlv1.ReadyCondition) {
			creatingOn[o.Spec.Placement.Host]++
			w.mostCreatingOnHost = max(w.mostCreatingOnHost, creatingOn[o.Spec.Placement.Host])
		}
		if _, ok := o.Annotations[crawlv1.RotationAnnotation]; ok {
			rotating++
		}
	}
	w.mostRotating = max(w.mostRotating, rotating)
	w.mostExistEver = max(w.mostExistEver, existing)
	if !w.armed {
		return
	}
	w.minAvailable = min(w.minAvailable, available)
	w.mostExisting = max(w.mostExisting, existing)
	if available < w.replicas-w.unavail {
		w.violations = append(w.violations, fmt.Sprintf("%s %s %s: %d available, fewer than %d", now.Format("15:04:05.000"), t, p.Name, available, w.replicas-w.unavail))
	}
	if existing > w.replicas+w.surge {
		w.violations = append(w.violations, fmt.Sprintf("%s %s %s: %d exist, more than %d", now.Format("15:04:05.000"), t, p.Name, existing, w.replicas+w.surge))
	}
}

func (w *poolWatch) disarm() { w.mu.Lock(); defer w.mu.Unlock(); w.armed = false }

// arm starts checking the budget from now on.
func (w *poolWatch) arm(replicas, surge, unavailable int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed, w.replicas, w.surge, w.unavail = true, replicas, surge, unavailable
	w.minAvailable, w.mostExisting = 1<<30, 0
}

func (w *poolWatch) expectBudgetKept() {
	w.mu.Lock()
	defer w.mu.Unlock()
	Expect(w.violations).To(BeEmpty(), "the budget was broken (%d events seen)", w.n)
	Expect(w.n).To(BeNumerically(">", 0))
}

func (w *poolWatch) extremes() (minAvailable, mostExisting int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.minAvailable, w.mostExisting
}

func (w *poolWatch) events() int { w.mu.Lock(); defer w.mu.Unlock(); return w.n }

func (w *poolWatch) maxExisting() int { w.mu.Lock(); defer w.mu.Unlock(); return w.mostExistEver }

func (w *poolWatch) maxRotating() int { w.mu.Lock(); defer w.mu.Unlock(); return w.mostRotating }

func (w *poolWatch) maxCreatingOnHost() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mostCreatingOnHost
}

func (w *poolWatch) creations() []creation {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.created)
}

func (w *poolWatch) createdNames() []string {
	var out []string
	for _, c := range w.creations() {
		out = append(out, c.name)
	}
	return out
}

func (w *poolWatch) drainedNames() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for n := range w.drained {
		out = append(out, n)
	}
	return out
}

// removedNames are the replicas taken out of service: drained or deleted.
func (w *poolWatch) removedNames() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Collect(maps.Keys(w.removed))
}

func (w *poolWatch) rotations() []rotation {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := slices.Clone(w.rotated)
	slices.SortFunc(out, func(a, b rotation) int { return a.at.Compare(b.at) })
	return out
}

// object is the last version of a replica the watch saw (its deletion's,
// if it is gone).
func (w *poolWatch) object(name string) *crawlv1.Proxy {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.lastSeen[name]
	Expect(ok).To(BeTrue(), "no object %s in the watch", name)
	return p.DeepCopy()
}

// expectPublishedNeverDraining: no list published after a replica's drain
// began names it (the pool unpublishes before it writes the annotation).
func (w *poolWatch) expectPublishedNeverDraining(pool *crawlv1.ProxyPool) {
	w.mu.Lock()
	drained := maps.Clone(w.drained)
	w.mu.Unlock()
	Expect(drained).NotTo(BeEmpty(), "nothing was drained: the check would prove nothing")
	for _, c := range published.all(pool) {
		for _, n := range c.names {
			if since, ok := drained[n]; ok && c.at.After(since) {
				Fail(fmt.Sprintf("%s published at %s, draining since %s", n, c.at.Format("15:04:05.000"), since.Format("15:04:05.000")))
			}
		}
	}
}
