package controllers

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// poolBenchShape is issue 15's: a pool of 1000 replicas over 50 hosts,
// then a full rotation of 200 with maxSurge 10. POOL_BENCH_REPLICAS,
// POOL_BENCH_HOSTS, POOL_BENCH_ROTATE and POOL_BENCH_SURGE make it smaller
// for a quick run.
type poolBenchShape struct{ replicas, hosts, rotate, surge int }

func poolBenchShapeFromEnv(b *testing.B) poolBenchShape {
	s := poolBenchShape{replicas: 1000, hosts: 50, rotate: 200, surge: 10}
	for _, v := range []struct {
		env string
		to  *int
	}{{"POOL_BENCH_REPLICAS", &s.replicas}, {"POOL_BENCH_HOSTS", &s.hosts}, {"POOL_BENCH_ROTATE", &s.rotate}, {"POOL_BENCH_SURGE", &s.surge}} {
		if e := os.Getenv(v.env); e != "" {
			n, err := strconv.Atoi(e)
			if err != nil || n <= 0 {
				b.Fatalf("%s=%q: want a positive number", v.env, e)
			}
			*v.to = n
		}
	}
	if s.rotate > s.replicas {
		b.Fatalf("POOL_BENCH_ROTATE %d is more than POOL_BENCH_REPLICAS %d", s.rotate, s.replicas)
	}
	return s
}

// BenchmarkProxyPool runs the real ProxyPool, Proxy, KVMHost and KVMImage
// controllers (Setup, main.go's production intervals) against envtest and
// in-memory libvirt hosts, as BenchmarkProxyFleet does, with a ProxyPool
// making the Proxies. Per iteration (ns/op is step 1 only):
//
//  1. apply one ProxyPool of `replicas` (template hostSelector over every
//     host, creates at their defaults) and wait until every
//     replica is Ready; a guest booter gives each new domain an address
//     within 10ms. An independent watch of the namespace's Proxies notes
//     when each replica first shows Ready: apply→Ready per replica
//     (p50, p99), all Ready, and all created (the last replica's first
//     event); reconciles of the proxy and proxypool
//     controllers and libvirt RPCs per replica; memory as in
//     BenchmarkProxyFleet (peak heap, VmHWM, live heap after GC; the
//     in-memory hosts keep no volume content, see runPoolIteration);
//  2. scale to `rotate` (drainSeconds 0): wall time until the others are gone;
//  3. a full rotation of those `rotate` replicas with maxSurge `surge`,
//     maxConcurrent `surge`, minInterval 0: rotation.maxAge is set to 1s,
//     which expires every replica at once (the originals first: rotation
//     takes the earliest expiry first); wall time until the last original
//     is gone and `rotate` replicas are Ready, and the lowest number of
//     Ready, non-draining replicas any event of the watch showed from the
//     moment maxAge was set (the goal: never below `rotate`), and the most
//     replicas in existence (at most rotate+surge).
func BenchmarkProxyPool(b *testing.B) {
	shape := poolBenchShapeFromEnv(b)
	restCfg, sch, cl := startBenchEnv(b)
	var sum poolBenchResult
	iter := 0
	for b.Loop() {
		b.StopTimer()
		r := runPoolIteration(b, restCfg, sch, cl, iter, shape)
		sum.add(r)
		iter++
		b.StartTimer()
	}
	sum.report(b, float64(iter))
}

type poolBenchResult struct {
	applyToReady, readyP50, readyP99, readyMax time.Duration
	applyToCreated                             time.Duration
	proxyReconciles, poolReconciles, rpcs      float64 // per replica
	peakHeap, vmHWM, liveHeap                  float64
	scaleDown, rotation                        time.Duration
	rotationMinAvailable, rotationMaxExisting  int
	rotationCreates                            int
	rotationRPCs                               float64 // per replica created in the window
	rotationPoolReconciles                     float64
}

func (s *poolBenchResult) add(r poolBenchResult) {
	s.applyToReady += r.applyToReady
	s.applyToCreated += r.applyToCreated
	s.readyP50 += r.readyP50
	s.readyP99 += r.readyP99
	s.readyMax += r.readyMax
	s.proxyReconciles += r.proxyReconciles
	s.poolReconciles += r.poolReconciles
	s.rpcs += r.rpcs
	s.peakHeap = max(s.peakHeap, r.peakHeap)
	s.vmHWM = max(s.vmHWM, r.vmHWM)
	s.liveHeap = max(s.liveHeap, r.liveHeap)
	s.scaleDown += r.scaleDown
	s.rotation += r.rotation
	if s.rotationMinAvailable == 0 || r.rotationMinAvailable < s.rotationMinAvailable {
		s.rotationMinAvailable = r.rotationMinAvailable
	}
	s.rotationMaxExisting = max(s.rotationMaxExisting, r.rotationMaxExisting)
	s.rotationRPCs += r.rotationRPCs
	s.rotationCreates += r.rotationCreates
	s.rotationPoolReconciles += r.rotationPoolReconciles
}

func (s *poolBenchResult) report(b *testing.B, n float64) {
	b.ReportMetric(s.applyToReady.Seconds()/n, "apply-to-all-ready-s")
	b.ReportMetric(s.applyToCreated.Seconds()/n, "apply-to-all-created-s")
	b.ReportMetric(float64(s.readyP50.Milliseconds())/n, "replica-ready-p50-ms")
	b.ReportMetric(float64(s.readyP99.Milliseconds())/n, "replica-ready-p99-ms")
	b.ReportMetric(float64(s.readyMax.Milliseconds())/n, "replica-ready-max-ms")
	b.ReportMetric(s.proxyReconciles/n, "proxy-reconciles/replica")
	b.ReportMetric(s.poolReconciles/n, "pool-reconciles/replica")
	b.ReportMetric(s.rpcs/n, "rpcs/replica")
	b.ReportMetric(s.peakHeap/(1<<20), "peak-heapinuse-MiB")
	b.ReportMetric(s.vmHWM/(1<<20), "vmhwm-MiB")
	b.ReportMetric(s.liveHeap/(1<<20), "live-heap-after-gc-MiB")
	b.ReportMetric(s.scaleDown.Seconds()/n, "scale-down-s")
	b.ReportMetric(s.rotation.Seconds()/n, "rotation-s")
	b.ReportMetric(float64(s.rotationMinAvailable), "rotation-min-available")
	b.ReportMetric(float64(s.rotationMaxExisting), "rotation-max-existing")
	b.ReportMetric(float64(s.rotationCreates)/n, "rotation-creates")
	b.ReportMetric(s.rotationRPCs/n, "rotation-rpcs/create")
	b.ReportMetric(s.rotationPoolReconciles/n, "rotation-pool-reconciles/create")
}

func runPoolIteration(b *testing.B, restCfg *rest.Config, sch *kruntime.Scheme, cl client.Client, iter int, shape poolBenchShape) poolBenchResult {
	ctx := context.Background()
	var res poolBenchResult
	// The in-memory hosts keep no volume content (a seed ISO per replica
	// and the image per host): it would be most of this process's heap, and
	// it lives in libvirt, not in the manager.
	fleet := newBenchFleet(b, cl, fleetShape{proxies: shape.replicas, hosts: shape.hosts}, iter, fake.WithMaxStoredBytes(0))
	hv, ns := fleet.hv, fleet.namespace
	label := map[string]string{"bench-pool": fmt.Sprintf("i%d", iter)}
	for _, h := range hv.names {
		kh := &crawlv1.KVMHost{}
		benchMust(b, cl.Get(ctx, client.ObjectKey{Name: h}, kh))
		kh.Labels = label
		benchMust(b, cl.Update(ctx, kh))
	}
	mgr := startBenchManager(b, restCfg, sch, hv, productionTiming)
	fleet.waitImageCached(b, cl)
	waitHostsReady(b, cl, label, shape.hosts, time.Minute)
	hv.proxyRPCs.Reset()
	proxy0, pool0 := reconcilesOf(b, "proxy"), reconcilesOf(b, "proxypool")
	mem := startMemSampler()
	booted := startGuestBooter(hv, ns)
	w := startPoolBenchWatch(b, restCfg, sch, ns, "bench")

	// 1. Apply → all Ready.
	pool := &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench"},
		Spec: crawlv1.ProxyPoolSpec{
			Replicas: ptr.To(int32(shape.replicas)),
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "bench"}},
			Template: crawlv1.ProxyTemplate{
				Metadata: crawlv1.ProxyTemplateMeta{Labels: map[string]string{"app": "bench"}},
				Spec: crawlv1.ProxySpec{
					Provider:          crawlv1.ProviderKVM,
					Placement:         crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: label}, Image: fleet.image},
					CloudInit:         crawlv1.ProxyCloudInit{UserData: "#cloud-config\n"},
					InstallGuestAgent: ptr.To(true),
					Port:              3128,
				},
			},
			Rollout: crawlv1.ProxyPoolRollout{DrainSeconds: ptr.To(int32(0))},
		},
	}
	var lat []time.Duration
	res.applyToReady, res.applyToCreated, lat = applyBenchPool(b, cl, w, pool, 10*time.Minute)
	res.readyP50, res.readyP99, res.readyMax = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	res.proxyReconciles = (reconcilesOf(b, "proxy") - proxy0) / float64(shape.replicas)
	res.poolReconciles = (reconcilesOf(b, "proxypool") - pool0) / float64(shape.replicas)
	res.rpcs = float64(hv.proxyRPCs.Total()) / float64(shape.replicas)
	res.peakHeap = mem.stop()
	res.vmHWM = vmHWM(b)
	// POOL_BENCH_HEAPPROFILE: what the live heap is made of (the in-memory
	// libvirt hosts and the benchmark's own watch live in this process too).
	res.liveHeap = liveHeapAfterGC(b, os.Getenv("POOL_BENCH_HEAPPROFILE"))
	perHost := make([]int, 0, len(hv.names))
	for _, h := range hv.names {
		perHost = append(perHost, len(hv.fakes[h].DomainNames()))
	}
	slices.Sort(perHost)
	b.Logf("apply: %d replicas Ready in %s; domains per host min %d max %d (spread is the placement's)", shape.replicas, res.applyToReady.Round(time.Millisecond), perHost[0], perHost[len(perHost)-1])
	b.Logf("apply: libvirt RPCs by name over %d replicas: %s", shape.replicas, formatCounts(hv.proxyRPCs.Snapshot()))

	// 2. Scale down to the rotation's size.
	t0 := time.Now()
	setBenchReplicas(b, cl, pool, shape.rotate)
	w.waitCount(b, shape.rotate, 10*time.Minute)
	res.scaleDown = time.Since(t0)

	// 3. A full rotation.
	originals := w.names()
	hv.proxyRPCs.Reset()
	pool1 := reconcilesOf(b, "proxypool")
	w.arm(shape.rotate)
	t0 = time.Now()
	updateBenchPool(b, cl, pool, func(p *crawlv1.ProxyPool) {
		p.Spec.Rollout.MaxSurge = ptr.To(intstr.FromInt32(int32(shape.surge)))
		p.Spec.Rotation = crawlv1.ProxyPoolRotation{MaxAge: &metav1.Duration{Duration: time.Second}, MaxConcurrent: int32(shape.surge)}
	})
	benchWait(b, 20*time.Minute, "every original replica rotated out", func() bool {
		return w.noneOf(originals) && w.readyCount() == shape.rotate
	})
	res.rotation = time.Since(t0)
	rpcs, snap := hv.proxyRPCs.Total(), hv.proxyRPCs.Snapshot()
	res.rotationMinAvailable, res.rotationMaxExisting, res.rotationCreates = w.disarm()
	updateBenchPool(b, cl, pool, func(p *crawlv1.ProxyPool) { p.Spec.Rotation = crawlv1.ProxyPoolRotation{} })
	// Replacements go on past the originals (maxAge 1s expires the new
	// ones too) until the check sees them gone: per replica created.
	res.rotationRPCs = float64(rpcs) / float64(res.rotationCreates)
	res.rotationPoolReconciles = (reconcilesOf(b, "proxypool") - pool1) / float64(res.rotationCreates)
	b.Logf("rotation: %d replicas in %s (%d created by then), lowest availability %d, most replicas %d; RPCs by name: %s", shape.rotate,
		res.rotation.Round(time.Millisecond), res.rotationCreates, res.rotationMinAvailable, res.rotationMaxExisting, formatCounts(snap))

	w.stop()
	mgr.stop(b)
	booted.stop()
	fleet.cleanup(b, cl)
	return res
}

// applyBenchPool creates pool and waits until its replicas are Ready as w
// sees them, timed as the benchmark's op: apply → all Ready, → the last
// replica's first event, and each replica's apply → Ready, sorted.
func applyBenchPool(b *testing.B, cl client.Client, w *poolBenchWatch, pool *crawlv1.ProxyPool, within time.Duration) (toReady, toCreated time.Duration, latencies []time.Duration) {
	b.StartTimer()
	start := time.Now()
	benchMust(b, cl.Create(context.Background(), pool))
	w.waitReady(b, int(*pool.Spec.Replicas), within)
	toReady = time.Since(start)
	b.StopTimer()
	return toReady, w.lastSeen().Sub(start), w.readyLatencies(start)
}

// waitHostsReady waits until n KVMHosts with label are Ready.
func waitHostsReady(b *testing.B, cl client.Client, label map[string]string, n int, within time.Duration) {
	benchWait(b, within, "every KVMHost Ready", func() bool {
		list := &crawlv1.KVMHostList{}
		if cl.List(context.Background(), list, client.MatchingLabels(label)) != nil {
			return false
		}
		ready := 0
		for i := range list.Items {
			if conditions.IsTrue(&list.Items[i], crawlv1.ReadyCondition) {
				ready++
			}
		}
		return ready == n
	})
}

func setBenchReplicas(b *testing.B, cl client.Client, pool *crawlv1.ProxyPool, n int) {
	updateBenchPool(b, cl, pool, func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(n)) })
}

func updateBenchPool(b *testing.B, cl client.Client, pool *crawlv1.ProxyPool, change func(*crawlv1.ProxyPool)) {
	b.Helper()
	for range 10 {
		p := &crawlv1.ProxyPool{}
		benchMust(b, cl.Get(context.Background(), client.ObjectKeyFromObject(pool), p))
		change(p)
		if err := cl.Update(context.Background(), p); err == nil {
			return
		}
	}
	b.Fatal("could not update the pool")
}

// poolBenchWatch follows a pool's Proxies through a watch of their
// namespace (not the manager's cache): when each first showed Ready, and,
// while armed, the fewest Ready non-draining replicas and the most
// replicas any event showed. It keeps only what it reads of each replica,
// not the object, since it shares the manager's process and its memory
// figures.
type poolBenchWatch struct {
	pool   string
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	objs    map[string]replicaSeen
	seenAt  map[string]time.Time
	readyAt map[string]time.Time
	rotated map[string]bool // seen with the rotating-since annotation
	armed   bool
	minAv   int
	maxEx   int
	// maxExDeleting: of maxEx, those being deleted. A pool exceeds
	// replicas+maxSurge only by deletions it released (docs/pools.md, "A
	// deletion that does not finish"); more than those would be a bug.
	maxExDeleting int
	made          int // replicas that appeared while armed
}

func startPoolBenchWatch(b *testing.B, restCfg *rest.Config, sch *kruntime.Scheme, ns, pool string) *poolBenchWatch {
	wc, err := client.NewWithWatch(restCfg, client.Options{Scheme: sch})
	benchMust(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	w := &poolBenchWatch{pool: pool, cancel: cancel, done: make(chan struct{}), objs: map[string]replicaSeen{}, seenAt: map[string]time.Time{}, readyAt: map[string]time.Time{}, rotated: map[string]bool{}}
	list := &crawlv1.ProxyList{}
	benchMust(b, wc.List(ctx, list, client.InNamespace(ns)))
	rv := list.ResourceVersion
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			wi, err := wc.Watch(ctx, &crawlv1.ProxyList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range wi.ResultChan() {
				if p, ok := ev.Object.(*crawlv1.Proxy); ok {
					rv = p.ResourceVersion
					w.observe(ev.Type, p)
				}
			}
		}
	}()
	b.Cleanup(w.stop)
	return w
}

func (w *poolBenchWatch) stop() {
	w.cancel()
	<-w.done
}

func (w *poolBenchWatch) observe(t watch.EventType, p *crawlv1.Proxy) {
	if p.Labels[crawlv1.PoolNameLabel] != w.pool {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.armed && t == watch.Added {
		w.made++
	}
	_, draining := p.Annotations[crawlv1.DrainingAnnotation]
	_, rotating := p.Annotations[crawlv1.RotationAnnotation]
	seen := replicaSeen{ready: conditions.IsTrue(p, crawlv1.ReadyCondition), draining: draining, rotating: rotating, deleting: !p.DeletionTimestamp.IsZero()}
	if t == watch.Deleted {
		delete(w.objs, p.Name)
	} else {
		w.objs[p.Name] = seen
	}
	if _, seen := w.seenAt[p.Name]; !seen {
		w.seenAt[p.Name] = time.Now()
	}
	if rotating {
		w.rotated[p.Name] = true
	}
	if _, ok := w.readyAt[p.Name]; !ok && seen.ready {
		w.readyAt[p.Name] = time.Now()
	}
	if !w.armed {
		return
	}
	av, deleting := 0, 0
	for _, o := range w.objs {
		if o.available() {
			av++
		}
		if o.deleting {
			deleting++
		}
	}
	w.minAv = min(w.minAv, av)
	if len(w.objs) > w.maxEx {
		w.maxEx, w.maxExDeleting = len(w.objs), deleting
	}
}

// replicaSeen is what the watch last saw of a replica.
type replicaSeen struct{ ready, draining, rotating, deleting bool }

// available: Ready, not draining, not being deleted.
func (r replicaSeen) available() bool { return r.ready && !r.draining && !r.deleting }

func (w *poolBenchWatch) arm(replicas int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed, w.minAv, w.maxEx, w.maxExDeleting, w.made = true, replicas, len(w.objs), 0, 0
}

func (w *poolBenchWatch) disarm() (minAvailable, maxExisting, made int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	return w.minAv, w.maxEx, w.made
}

// peakDeleting is how many of the most replicas seen while armed were
// being deleted.
func (w *poolBenchWatch) peakDeleting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxExDeleting
}

func (w *poolBenchWatch) readyCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, o := range w.objs {
		if o.available() {
			n++
		}
	}
	return n
}

func (w *poolBenchWatch) names() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for n := range w.objs {
		out = append(out, n)
	}
	return out
}

// count is how many replicas exist.
func (w *poolBenchWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.objs)
}

// rotatingOf counts names seen rotating at some point.
func (w *poolBenchWatch) rotatingOf(names []string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, name := range names {
		if w.rotated[name] {
			n++
		}
	}
	return n
}

// goneOf counts names that no longer exist.
func (w *poolBenchWatch) goneOf(names []string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, name := range names {
		if _, ok := w.objs[name]; !ok {
			n++
		}
	}
	return n
}

func (w *poolBenchWatch) noneOf(names []string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range names {
		if _, ok := w.objs[n]; ok {
			return false
		}
	}
	return true
}

func (w *poolBenchWatch) waitReady(b *testing.B, n int, within time.Duration) {
	b.Helper()
	benchWait(b, within, fmt.Sprintf("%d replicas Ready", n), func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.readyAt) >= n
	})
}

// waitCount waits until exactly n replicas exist, all Ready.
func (w *poolBenchWatch) waitCount(b *testing.B, n int, within time.Duration) {
	b.Helper()
	benchWait(b, within, fmt.Sprintf("%d replicas left", n), func() bool {
		w.mu.Lock()
		count := len(w.objs)
		w.mu.Unlock()
		return count == n && w.readyCount() == n
	})
}

// lastSeen is when the watch first saw the replica it saw last.
func (w *poolBenchWatch) lastSeen() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var last time.Time
	for _, t := range w.seenAt {
		if t.After(last) {
			last = t
		}
	}
	return last
}

// readyLatencies are each replica's time from start to its first Ready,
// sorted.
func (w *poolBenchWatch) readyLatencies(start time.Time) []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]time.Duration, 0, len(w.readyAt))
	for _, t := range w.readyAt {
		out = append(out, t.Sub(start))
	}
	slices.Sort(out)
	return out
}
