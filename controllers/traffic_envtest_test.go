package controllers

import (
	"os"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// trafficSeries returns the value of each series of c in namespace ns, by
// "pool/proxy" ("pool/proxy/class" for the upstream answers).
func trafficSeries(c *prometheus.CounterVec, ns string) map[string]float64 {
	ch := make(chan prometheus.Metric, 256)
	go func() { c.Collect(ch); close(ch) }()
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		Expect(m.Write(&d)).To(Succeed())
		labels := map[string]string{}
		for _, l := range d.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["namespace"] == ns {
			key := labels["pool"] + "/" + labels["proxy"]
			if class, ok := labels["class"]; ok {
				key += "/" + class
			}
			out[key] = d.GetCounter().GetValue()
		}
	}
	return out
}

// steadyTraffic: every squid counts perSecond requests and a tenth as many
// denials per second since start, read whenever the operator asks.
type steadyTraffic struct {
	mu        sync.Mutex
	start     time.Time
	perSecond float64
	base      float64
}

func (s *steadyTraffic) counters(string) squid.Counters {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.base + s.perSecond*time.Since(s.start).Seconds()
	return squid.Counters{Requests: uint64(n), Denied: uint64(n / 10), BytesOut: uint64(n) * 1024}
}

// upstream: half the requests get a 2xx from their target site, a
// quarter a 4xx, of which 403 for a fifth of all (the ban signals).
func (s *steadyTraffic) upstream(addr string) squid.UpstreamCounts {
	n := float64(s.counters(addr).Requests)
	return squid.UpstreamCounts{uint64(n / 2), 0, uint64(n / 4), 0, uint64(n / 5), 0}
}

// set changes the rate from now on, the counts going on from where they are.
func (s *steadyTraffic) set(perSecond float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.base += s.perSecond * time.Since(s.start).Seconds()
	s.start, s.perSecond = time.Now(), perSecond
}

// managedPool is a kvm pool of replicas with the operator's squid (Basic
// auth), drained for a second before deletion.
func managedPool(ns, name string, replicas int32, placement crawlv1.ProxyPlacement) *crawlv1.ProxyPool {
	labels := map[string]string{"app": name}
	return &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1.ProxyPoolSpec{
			Replicas: ptr.To(replicas),
			Selector: metav1.LabelSelector{MatchLabels: labels},
			Template: crawlv1.ProxyTemplate{
				Metadata: crawlv1.ProxyTemplateMeta{Labels: labels},
				Spec: crawlv1.ProxySpec{
					Provider:          crawlv1.ProviderKVM,
					Placement:         placement,
					CloudInit:         crawlv1.ProxyCloudInit{UserData: "#cloud-config\n"},
					InstallGuestAgent: ptr.To(true),
					Port:              3128,
					Access:            basicAccess(),
				},
			},
			Rollout: crawlv1.ProxyPoolRollout{DrainSeconds: ptr.To(int32(1))},
		},
	}
}

var _ = Describe("Traffic read from each replica's squid", Ordered, func() {
	It("exports per-Proxy counters, sums them into the pool's status when they move materially, and drops them with the Proxy", func() {
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		booter := startPoolBooter([]*testHost{h}, ns)
		DeferCleanup(booter.stop)
		traffic := &steadyTraffic{start: time.Now(), perSecond: 100}
		prober.SetStats(traffic.counters)
		prober.SetUpstream(traffic.upstream)
		DeferCleanup(func() { prober.SetStats(nil); prober.SetUpstream(nil) })

		pool := managedPool(ns, "busy", 2, crawlv1.ProxyPlacement{Host: h.name, Image: servedImage()})
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		names := waitPoolReady(pool, 2)

		By("each replica's squid carries about 100 requests per second: the pool about 200, and 20 denials per second")
		var first crawlv1.ProxyPoolTraffic
		Eventually(func(g Gomega) {
			t := getPool(pool).Status.Traffic
			g.Expect(t).NotTo(BeNil())
			g.Expect(t.ReplicasReporting).To(BeEquivalentTo(2))
			g.Expect(t.RequestsPerSecond.AsApproximateFloat64()).To(BeNumerically("~", 200, 30))
			g.Expect(t.DeniedPerMinute.AsApproximateFloat64()).To(BeNumerically("~", 1200, 200))
			g.Expect(t.BanSignalsPerMinute).NotTo(BeNil())
			g.Expect(t.BanSignalsPerMinute.AsApproximateFloat64()).To(BeNumerically("~", 2400, 400))
			first = *t
		}).WithTimeout(30 * time.Second).Should(Succeed())

		By("the operator read them with its own credential, kept apart from the crawlers'")
		for _, name := range names {
			p := getProxy(ns, name)
			stats, creds := &corev1.Secret{}, &corev1.Secret{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-proxy-stats"}, stats)).To(Succeed())
			Expect(metav1.IsControlledBy(stats, p)).To(BeTrue())
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: crawlv1.CredentialsSecretName(p)}, creds)).To(Succeed())
			password := string(stats.Data["password"])
			Expect(password).To(HaveLen(32))
			Expect(prober.StatsUser(p.Status.Address)).To(Equal("proxy-operator-stats:" + password))
			for key, v := range creds.Data {
				Expect(string(v)).NotTo(ContainSubstring(password), "the crawlers' Secret holds the counter password under %q", key)
			}
			status, err := yaml.Marshal(p.Status)
			Expect(err).NotTo(HaveOccurred())
			Expect(string(status)).NotTo(ContainSubstring(password))
		}
		published := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "busy-proxies"}, published)).To(Succeed())
		for _, name := range names {
			stats := &corev1.Secret{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-proxy-stats"}, stats)).To(Succeed())
			for key, v := range published.Data {
				Expect(string(v)).NotTo(ContainSubstring(string(stats.Data["password"])), "the published list holds a counter password under %q", key)
			}
		}

		By("Prometheus counters per Proxy, labelled namespace, pool and proxy")
		Eventually(func(g Gomega) {
			series := trafficSeries(proxyRequests, ns)
			g.Expect(series).To(HaveLen(2))
			for _, name := range names {
				g.Expect(series["busy/"+name]).To(BeNumerically(">", 100))
			}
			g.Expect(trafficSeries(proxyDenied, ns)).To(HaveLen(2))
			g.Expect(trafficSeries(proxyBytesOut, ns)).To(HaveLen(2))
			upstream := trafficSeries(proxyUpstream, ns)
			g.Expect(upstream).To(HaveLen(2 * len(squid.UpstreamClasses)))
			for _, name := range names {
				g.Expect(upstream["busy/"+name+"/403"]).To(BeNumerically(">", 20))
				g.Expect(upstream["busy/"+name+"/4xx"]).To(BeNumerically(">", upstream["busy/"+name+"/403"]))
			}
		}).WithTimeout(10 * time.Second).Should(Succeed())

		By("steady traffic rewrites nothing: readings every second, the status as first written")
		Consistently(func() crawlv1.ProxyPoolTraffic { return *getPool(pool).Status.Traffic }).
			WithTimeout(4 * time.Second).WithPolling(200 * time.Millisecond).Should(Equal(first))

		By("three times the traffic: the status follows")
		traffic.set(300)
		Eventually(func(g Gomega) {
			t := getPool(pool).Status.Traffic
			g.Expect(t.RequestsPerSecond.AsApproximateFloat64()).To(BeNumerically("~", 600, 80))
		}).WithTimeout(20 * time.Second).Should(Succeed())

		By("scaled to one: the gone replica's series go with it, and one replica reports")
		setScale(pool, 1)
		Eventually(func(g Gomega) {
			g.Expect(trafficSeries(proxyRequests, ns)).To(HaveLen(1))
			g.Expect(trafficSeries(proxyBytesIn, ns)).To(HaveLen(1))
			g.Expect(trafficSeries(proxyUpstream, ns)).To(HaveLen(len(squid.UpstreamClasses)))
			t := getPool(pool).Status.Traffic
			g.Expect(t.ReplicasReporting).To(BeEquivalentTo(1))
			g.Expect(t.RequestsPerSecond.AsApproximateFloat64()).To(BeNumerically("~", 300, 50))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		By("the pool deleted: once its replicas are gone, so are all their series")
		Expect(k8sClient.Delete(ctx, pool)).To(Succeed())
		// Not "until the series are empty": a replica still being deleted
		// may be read once more (a young one's second reading makes its
		// first series), so an empty moment proves nothing. What the
		// Proxy's finalizer promises is that none outlives the Proxy.
		Eventually(func() []crawlv1.Proxy { return poolReplicas(pool) }).WithTimeout(30 * time.Second).Should(BeEmpty())
		for _, c := range append(slices.Clone(trafficCounters), proxyUpstream) {
			Expect(trafficSeries(c, ns)).To(BeEmpty())
		}
	})

	It("accepts the documented HPA for a pool through its scale subresource, on the adapter rule's metric", func() {
		ns := newNamespace()
		raw, err := os.ReadFile("../docs/examples/autoscaling/hpa.yaml")
		Expect(err).NotTo(HaveOccurred())
		hpa := &autoscalingv2.HorizontalPodAutoscaler{}
		Expect(yaml.UnmarshalStrict(raw, hpa)).To(Succeed())

		var rules struct {
			Rules []struct {
				SeriesQuery string `json:"seriesQuery"`
				Resources   struct {
					Overrides map[string]struct {
						Group    string `json:"group"`
						Resource string `json:"resource"`
					} `json:"overrides"`
				} `json:"resources"`
				Name struct {
					Matches string `json:"matches"`
					As      string `json:"as"`
				} `json:"name"`
				MetricsQuery string `json:"metricsQuery"`
			} `json:"rules"`
		}
		raw, err = os.ReadFile("../docs/examples/autoscaling/prometheus-adapter-rules.yaml")
		Expect(err).NotTo(HaveOccurred())
		Expect(yaml.UnmarshalStrict(raw, &rules)).To(Succeed())
		Expect(rules.Rules).To(HaveLen(1))
		rule := rules.Rules[0]

		By("the rule reads the operator's request counter, by the labels it has")
		Expect(rule.SeriesQuery).To(HavePrefix("proxy_operator_proxy_requests_total{"))
		Expect(rule.Name.Matches).To(Equal("^proxy_operator_proxy_requests_total$"))
		Expect(trafficLabels).To(ConsistOf("namespace", "pool", "proxy"))
		Expect(rule.Resources.Overrides).To(HaveKeyWithValue("pool", HaveField("Resource", "proxypools")))
		Expect(rule.Resources.Overrides["pool"].Group).To(Equal(crawlv1.GroupVersion.Group))
		Expect(rule.Resources.Overrides).To(HaveKeyWithValue("namespace", HaveField("Resource", "namespace")))
		Expect(rule.MetricsQuery).To(ContainSubstring("rate(<<.Series>>"))

		By("the HPA asks for that metric of the pool it scales")
		Expect(hpa.Spec.ScaleTargetRef.APIVersion).To(Equal(crawlv1.GroupVersion.String()))
		Expect(hpa.Spec.ScaleTargetRef.Kind).To(Equal("ProxyPool"))
		Expect(hpa.Spec.Metrics).To(HaveLen(1))
		obj := hpa.Spec.Metrics[0].Object
		Expect(obj).NotTo(BeNil())
		Expect(obj.Metric.Name).To(Equal(rule.Name.As))
		Expect(obj.DescribedObject.Kind).To(Equal("ProxyPool"))
		Expect(obj.DescribedObject.Name).To(Equal(hpa.Spec.ScaleTargetRef.Name))
		// AverageValue divides by the scale's replicas; Value would count
		// Pods, which kvm and gcp pools have none of.
		Expect(obj.Target.Type).To(Equal(autoscalingv2.AverageValueMetricType))

		By("the API server validates it, and the pool it names has the scale subresource the HPA drives")
		hpa.Namespace = ns
		Expect(k8sClient.Create(ctx, hpa)).To(Succeed())
		pool := managedPool(ns, hpa.Spec.ScaleTargetRef.Name, 0, crawlv1.ProxyPlacement{Host: "none", Image: "none"})
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		sc := &autoscalingv1.Scale{}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.SubResource("scale").Get(ctx, pool, sc)).To(Succeed())
			g.Expect(sc.Status.Selector).To(ContainSubstring("app=" + pool.Name))
		}).Should(Succeed())
		Expect(sc.Spec.Replicas).To(BeEquivalentTo(0))
		Expect(k8sClient.Delete(ctx, pool)).To(Succeed())
	})
})
