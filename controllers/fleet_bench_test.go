package controllers

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/portwatch"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

// fleetShape is how many Proxies over how many hosts.
type fleetShape struct{ proxies, hosts int }

// BenchmarkProxyFleet's shape.
var fleetBenchShape = fleetShape{proxies: 200, hosts: 10}

// Steady state runs on production intervals divided by a scale factor so an
// hour's pattern fits in seconds. A resync costs the same RPCs whenever it
// runs, so RPCs per scaled hour are RPCs per real hour at the production
// intervals, as long as the manager keeps up with the scaled intervals
// (reported: achieved resync period against the nominal one).
var (
	// events: probe 30s → 1s, resync 10m → 20s (1/30).
	eventsTiming = benchTiming{scale: 30, probe: time.Second, provisionPoll: time.Second, resync: 20 * time.Second}
	// polling: probe = resync = 30s → 3s (1/10). At 1/30 (1s) 200 Proxies
	// are 200 resyncs and status writes a second, more than 2 cores running
	// the apiserver, etcd and the manager keep up with.
	pollingTiming = benchTiming{scale: 10, probe: 3 * time.Second, provisionPoll: 3 * time.Second, resync: 3 * time.Second}
)

// BenchmarkProxyFleet runs the real Proxy, KVMHost and KVMImage controllers
// against envtest (a real kube-apiserver and etcd, separate processes) and
// 10 in-memory libvirt hosts, wired as controllers/suite_test.go wires them
// except that kvmtest.Conns replaces the SSH pool (lifecycle events are still
// subscribed, by calling the provider's OnConnect as the pool does after a
// dial) and a fake prober answers for the proxies' ports.
//
// Per iteration (ns/op is step 2 only):
//
//  1. fresh hosts, KVMHosts and a KVMImage; a manager with main.go's
//     defaults (probe 30s, provision poll 5s, resync 10m, 16/64/4 workers,
//     no client-side rate limit); wait until the image is verified on every
//     host, then reset the counters;
//  2. apply 200 Proxies (10 hosts, round robin; one Create after another,
//     as kubectl apply does) and wait until all are Ready, polling a List
//     every 100ms from the first create on. A goroutine plays the booting
//     guests: every 10ms it gives each new domain an agent address;
//  3. steady state, twice, each with a freshly started manager on scaled
//     intervals: "events" (lifecycle events subscribed, resync 10m, probe
//     30s, both /30) and "polling" (resync = probe = 30s, /10); RPCs are
//     counted over a window and extrapolated to an hour at production
//     intervals.
//
// libvirt RPCs are counted with virt.RPCCounter on the provider the Proxy
// and KVMImage controllers use. The KVMHost controller gets its own
// kvm.Provider on the same hosts with its own counter, so host health checks
// (4 RPCs per host per check, whatever the number of Proxies) are kept out
// of the per-Proxy figures. Reconciles are controller-runtime's
// controller_runtime_reconcile_total{controller="proxy"}.
//
// Memory is this test process: the manager (controllers, informer caches,
// clients), the in-memory hosts and the benchmark itself. The kube-apiserver
// and etcd are separate processes and not included. peak-heapinuse-MiB is
// the Go heap in use (live objects and garbage not yet collected), sampled
// every 50ms during step 2; live-heap-after-gc-MiB is the heap left after a
// runtime.GC() once all are Ready, the manager still running; vmhwm-MiB is
// the process's peak RSS since it started, so run with -run='^$' (as make
// bench does) or it includes the Ginkgo suite run before it, and read the
// first -count only. With -count/-benchtime > 1 the memory figures are the
// maximum over iterations.
func BenchmarkProxyFleet(b *testing.B) {
	restCfg, sch, cl := startBenchEnv(b)

	var sum benchFleetResult
	iter := 0
	for b.Loop() {
		b.StopTimer()
		r := runFleetIteration(b, restCfg, sch, cl, iter, fleetBenchShape)
		sum.add(r)
		iter++
		b.StartTimer()
	}
	sum.report(b, float64(iter))
	b.ReportMetric(float64(benchShutdownHangs.Load()), "shutdown-hangs")
}

// startBenchEnv starts an envtest of the benchmark's own (stopped at
// cleanup) and returns its config, a scheme and a client.
func startBenchEnv(b *testing.B) (*rest.Config, *kruntime.Scheme, client.Client) {
	logf.SetLogger(logr.Discard())
	env, err := envtestutil.New(false)
	if err != nil {
		b.Fatal(err)
	}
	restCfg, err := env.Start()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := env.Stop(); err != nil {
			b.Errorf("stopping envtest: %v", err)
		}
	})
	// As ctrl.GetConfig in main.go: no client-side rate limiting (envtest's
	// config would allow 1000 QPS).
	restCfg = rest.CopyConfig(restCfg)
	restCfg.QPS, restCfg.Burst = -1, 0
	sch := kruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(sch); err != nil {
		b.Fatal(err)
	}
	if err := crawlv1.AddToScheme(sch); err != nil {
		b.Fatal(err)
	}
	cl, err := client.New(restCfg, client.Options{Scheme: sch})
	if err != nil {
		b.Fatal(err)
	}
	return restCfg, sch, cl
}

// benchFleetResult holds one iteration's figures (or their sums).
type benchFleetResult struct {
	applySubmit, applyToReady    time.Duration
	applyToDefined               time.Duration
	readyP50, readyP90, readyMax time.Duration
	reconciles, rpcs             float64 // per Proxy, apply→all Ready
	peakHeapInuse, vmHWM         float64 // bytes
	liveHeap                     float64 // bytes, after runtime.GC()
	events, polling              steadyStateResult
}

func (s *benchFleetResult) add(r benchFleetResult) {
	s.applySubmit += r.applySubmit
	s.applyToReady += r.applyToReady
	s.applyToDefined += r.applyToDefined
	s.readyP50 += r.readyP50
	s.readyP90 += r.readyP90
	s.readyMax += r.readyMax
	s.reconciles += r.reconciles
	s.rpcs += r.rpcs
	s.peakHeapInuse = max(s.peakHeapInuse, r.peakHeapInuse)
	s.vmHWM = max(s.vmHWM, r.vmHWM)
	s.liveHeap = max(s.liveHeap, r.liveHeap)
	for _, p := range []struct{ sum, r *steadyStateResult }{{&s.events, &r.events}, {&s.polling, &r.polling}} {
		p.sum.rpcsPerProxyHour += p.r.rpcsPerProxyHour
		p.sum.resyncPeriodRatio += p.r.resyncPeriodRatio
		p.sum.reconcilesPerProbe += p.r.reconcilesPerProbe
		p.sum.halvesPeriod += p.r.halvesPeriod
	}
}

func (s *benchFleetResult) report(b *testing.B, n float64) {
	b.ReportMetric(s.applySubmit.Seconds()/n, "apply-submit-s")
	b.ReportMetric(s.applyToReady.Seconds()/n, "apply-to-all-ready-s")
	b.ReportMetric(s.applyToDefined.Seconds()/n, "apply-to-all-defined-s")
	b.ReportMetric(float64(s.readyP50.Milliseconds())/n, "proxy-ready-p50-ms")
	b.ReportMetric(float64(s.readyP90.Milliseconds())/n, "proxy-ready-p90-ms")
	b.ReportMetric(float64(s.readyMax.Milliseconds())/n, "proxy-ready-max-ms")
	b.ReportMetric(s.reconciles/n, "reconciles/proxy")
	b.ReportMetric(s.rpcs/n, "rpcs/proxy")
	b.ReportMetric(s.peakHeapInuse/(1<<20), "peak-heapinuse-MiB")
	b.ReportMetric(s.vmHWM/(1<<20), "vmhwm-MiB")
	b.ReportMetric(s.liveHeap/(1<<20), "live-heap-after-gc-MiB")
	b.ReportMetric(s.events.rpcsPerProxyHour/n, "events-rpcs/proxy/h")
	b.ReportMetric(s.polling.rpcsPerProxyHour/n, "polling-rpcs/proxy/h")
	b.ReportMetric(s.polling.rpcsPerProxyHour/s.events.rpcsPerProxyHour, "polling/events")
	b.ReportMetric(s.polling.resyncPeriodRatio/n, "polling-resync-period/nominal")
	b.ReportMetric(s.events.halvesPeriod.Seconds()/n/eventsTiming.resync.Seconds(), "events-measured-period/nominal")
	b.ReportMetric(s.events.reconcilesPerProbe/n, "events-reconciles/probe-interval")
	b.ReportMetric(s.polling.reconcilesPerProbe/n, "polling-reconciles/probe-interval")
}

// benchShutdownGrace bounds a manager's shutdown (30s by default); the
// reconciles here finish in milliseconds.
const benchShutdownGrace = 5 * time.Second

// benchTiming is the ProxyReconciler's clock settings; scale is how much
// shorter they are than production's.
type benchTiming struct {
	scale                        float64
	probe, provisionPoll, resync time.Duration
}

// productionTiming is main.go's flag defaults.
var productionTiming = benchTiming{scale: 1, probe: 30 * time.Second, provisionPoll: 5 * time.Second, resync: 10 * time.Minute}

// benchKVM is one iteration's hypervisors: in-memory hosts in this process
// behind kvmtest.Conns, or (conns nil) hosts in a test/fakehv process that
// the manager dials with the production conn pool over SSH, with the
// KVMHosts' SSH Secret in secretNamespace.
type benchKVM struct {
	shape           fleetShape
	names           []string
	fakes           map[string]*fake.Fake
	conns           *kvmtest.Conns
	secretNamespace string
	proxyRPCs       *resyncObserver  // Proxy and KVMImage controllers (and, with fakehv, health checks: hostCheckRPCs)
	hostRPCs        *virt.RPCCounter // KVMHost health checks of in-process hosts
	probes          atomic.Int64     // proxy probes answered by benchProber
}

// resyncObserver counts RPCs and notes when each
// virDomainInterfaceAddresses ran: in steady state there is exactly one per
// resync (the Get of a running VM whose agent answers).
type resyncObserver struct {
	virt.RPCCounter
	mu    sync.Mutex
	times []time.Time
}

func (o *resyncObserver) ObserveRPC(rpc string, d time.Duration, err error) {
	o.RPCCounter.ObserveRPC(rpc, d, err)
	if rpc == virt.RPCDomainInterfaceAddresses {
		o.mu.Lock()
		o.times = append(o.times, time.Now())
		o.mu.Unlock()
	}
}

// Reset zeroes the counts and the resync times.
func (o *resyncObserver) Reset() {
	o.RPCCounter.Reset()
	o.mu.Lock()
	o.times = nil
	o.mu.Unlock()
}

// resyncTimes returns the times noted since the last Reset.
func (o *resyncObserver) resyncTimes() []time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.times)
}

// benchFleet is one iteration's objects: hosts, image and namespace.
type benchFleet struct {
	hv               *benchKVM
	image, namespace string
	imgSrv           *kvmtest.ImageServer
}

// newBenchFleet creates shape.hosts in-memory hosts (with opts) and their
// KVMHosts, a KVMImage served locally and a namespace for the Proxies.
func newBenchFleet(b *testing.B, cl client.Client, shape fleetShape, iter int, opts ...fake.Option) *benchFleet {
	ctx := context.Background()
	suffix := fmt.Sprintf("%d-%d", iter, time.Now().UnixNano()%1_000_000)
	hv := &benchKVM{shape: shape, fakes: map[string]*fake.Fake{}, conns: kvmtest.NewConns(), proxyRPCs: &resyncObserver{}, hostRPCs: &virt.RPCCounter{}}
	for i := range shape.hosts {
		name := fmt.Sprintf("bench-hv%02d-%s", i, suffix)
		f := kvmtest.NewHost(opts...)
		hv.names = append(hv.names, name)
		hv.fakes[name] = f
		hv.conns.Add(name, f)
		benchMust(b, cl.Create(ctx, &crawlv1.KVMHost{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: crawlv1.KVMHostSpec{Address: name + ".invalid:22", User: "root",
				StoragePool: kvmtest.PoolName, Network: kvmtest.NetworkName},
		}))
	}
	imageName := "bench-debian-" + suffix
	imgSrv := newBenchImage(b, cl, imageName)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-fleet-"}}
	benchMust(b, cl.Create(ctx, ns))
	return &benchFleet{hv: hv, image: imageName, namespace: ns.Name, imgSrv: imgSrv}
}

// newBenchImage serves a 256 KiB raw image and creates the KVMImage name
// for it. Close the server when done.
func newBenchImage(b *testing.B, cl client.Client, name string) *kvmtest.ImageServer {
	imgSrv := kvmtest.NewImageServer("debian", 256<<10)
	benchMust(b, cl.Create(context.Background(), &crawlv1.KVMImage{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: crawlv1.KVMImageSpec{URL: imgSrv.Image.URL, Checksum: imgSrv.Image.Checksum,
			Format: crawlv1.ImageFormatRaw, Firmware: crawlv1.FirmwareUEFI},
	}))
	return imgSrv
}

// waitImageCached waits until the fleet's KVMImage is verified on every host.
func (f *benchFleet) waitImageCached(b *testing.B, cl client.Client) {
	within := max(time.Minute, time.Duration(f.hv.shape.hosts)*time.Second)
	benchWait(b, within, "KVMImage verified on every host", func() bool {
		img := &crawlv1.KVMImage{}
		return cl.Get(context.Background(), client.ObjectKey{Name: f.image}, img) == nil &&
			int(img.Status.ReadyHosts) == f.hv.shape.hosts && conditions.IsTrue(img, crawlv1.ReadyCondition)
	})
}

// cleanup removes what newBenchFleet and the Proxies made.
func (f *benchFleet) cleanup(b *testing.B, cl client.Client) {
	cleanupFleet(b, cl, f.namespace, f.hv.names, f.image)
	f.imgSrv.Close()
}

func runFleetIteration(b *testing.B, restCfg *rest.Config, sch *kruntime.Scheme, cl client.Client, iter int, shape fleetShape) benchFleetResult {
	ctx := context.Background()
	var res benchFleetResult
	fleet := newBenchFleet(b, cl, shape, iter)
	hv, imageName := fleet.hv, fleet.image
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fleet.namespace}}
	benchProxies := shape.proxies

	// 1. A production-configured manager; the image cached everywhere.
	mgr := startBenchManager(b, restCfg, sch, hv, productionTiming)
	fleet.waitImageCached(b, cl)
	hv.proxyRPCs.Reset()
	reconcilesBefore := proxyReconciles(b)

	mem := startMemSampler()
	booted := startGuestBooter(hv, ns.Name)

	// 2. Apply and wait for Ready: the timed part. Readiness is polled
	// (a List every 100ms) from the first create on, so each Proxy's
	// create→Ready latency is known to ±100ms.
	b.StartTimer()
	start := time.Now()
	created := make(map[string]time.Time, benchProxies)
	readyAt := map[string]time.Time{}
	allReady, stopPoll := make(chan struct{}), make(chan struct{})
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			list := &crawlv1.ProxyList{}
			if err := cl.List(ctx, list, client.InNamespace(ns.Name)); err == nil {
				now := time.Now()
				for _, p := range list.Items {
					if _, seen := readyAt[p.Name]; !seen && p.Status.Phase == crawlv1.ProxyReady {
						readyAt[p.Name] = now
					}
				}
				if len(readyAt) == benchProxies {
					close(allReady)
					return
				}
			}
			select {
			case <-stopPoll:
				return
			case <-tick.C:
			}
		}
	}()
	for i := range benchProxies {
		name := fmt.Sprintf("p%03d", i)
		created[name] = time.Now()
		benchMust(b, cl.Create(ctx, benchProxy(ns.Name, name, hv.names[i%shape.hosts], imageName)))
	}
	res.applySubmit = time.Since(start)
	select {
	case <-allReady:
	case <-time.After(5 * time.Minute):
		close(stopPoll)
		b.Fatal("not all Proxies Ready within 5m")
	}
	res.applyToReady = time.Since(start)
	b.StopTimer()

	res.applyToDefined = booted.allDefinedAt().Sub(start)
	var lat []time.Duration
	for name, t := range readyAt {
		lat = append(lat, t.Sub(created[name]))
	}
	slices.Sort(lat)
	res.readyP50, res.readyP90, res.readyMax = lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1]
	res.reconciles = (proxyReconciles(b) - reconcilesBefore) / float64(benchProxies)
	res.rpcs = float64(hv.proxyRPCs.Total()) / float64(benchProxies)
	res.peakHeapInuse = mem.stop()
	res.vmHWM = vmHWM(b)
	// What stays: the live heap after a collection, the manager still
	// running with 200 Ready Proxies in its caches.
	res.liveHeap = liveHeapAfterGC(b, "")
	b.Logf("apply→Ready: libvirt RPCs by name over %d Proxies: %s", benchProxies, formatCounts(hv.proxyRPCs.Snapshot()))
	b.Logf("apply→Ready: host health-check RPCs (separate provider, not per Proxy): %d", hv.hostRPCs.Total())
	for _, h := range hv.names {
		if n := len(hv.fakes[h].DomainNames()); n != benchProxies/shape.hosts {
			b.Fatalf("host %s has %d domains, want %d", h, n, benchProxies/shape.hosts)
		}
	}
	mgr.stop(b)
	booted.stop()

	// 3. Steady state: lifecycle events + a long resync, against polling.
	res.events = steadyState(b, restCfg, sch, hv, "events", eventsTiming, eventsTiming.resync/4, 2*eventsTiming.resync)
	res.polling = steadyState(b, restCfg, sch, hv, "polling", pollingTiming, 2*pollingTiming.probe, 8*pollingTiming.probe)

	fleet.cleanup(b, cl)
	return res
}

// benchProxy is one fleet Proxy as the benchmarks create it.
func benchProxy(namespace, name, host, image string) *crawlv1.Proxy {
	return &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: crawlv1.ProxySpec{
			Provider:          crawlv1.ProviderKVM,
			Placement:         crawlv1.ProxyPlacement{Host: host, Image: image},
			CloudInit:         crawlv1.ProxyCloudInit{UserData: "#cloud-config\n"},
			InstallGuestAgent: ptr.To(true),
			Port:              3128,
		},
	}
}

// steadyStateResult is one steady-state window.
type steadyStateResult struct {
	rpcsPerProxyHour float64 // extrapolated to production intervals
	// resyncPeriodRatio is the achieved resync period (window / Gets per
	// Proxy) over the nominal one: ~1 when the manager kept up.
	resyncPeriodRatio float64
	// reconcilesPerProbe is Proxy reconciles per Proxy per probe interval.
	reconcilesPerProbe float64
	// halvesPeriod (events only) is the mean time of the window's second
	// half's resyncs minus that of its first half's: the resync period
	// actually achieved, independent of how the window is placed.
	halvesPeriod time.Duration
}

// steadyState starts a manager on timing over the Ready fleet, waits until
// every Proxy has been reconciled once by it (its first reconcile re-reads
// every instance) and then settle, and counts libvirt RPCs and Proxy
// reconciles over window. RPCs per Proxy per hour at production intervals
// are (RPCs / Proxies / window seconds) × 3600 / scale.
//
// The window is placed so that phase does not bias the count: in "events"
// mode every Proxy is resynced at start-up (within the start-up spread),
// then once per resync interval, so a window from start-up+¼ interval lasting
// 2 intervals holds exactly two resyncs of each Proxy if the manager keeps
// time. In "polling" mode every probe resyncs, and 8 periods keep the phase
// error within 1/8.
func steadyState(b *testing.B, restCfg *rest.Config, sch *kruntime.Scheme, hv *benchKVM, mode string,
	t benchTiming, settle, window time.Duration) steadyStateResult {
	benchProxies := float64(hv.shape.proxies)
	before := proxyReconciles(b)
	mgr := startBenchManager(b, restCfg, sch, hv, t)
	defer mgr.stop(b)
	benchWait(b, 60*time.Second, mode+": start-up reconciles", func() bool {
		return proxyReconciles(b)-before >= benchProxies
	})
	time.Sleep(settle)
	hv.proxyRPCs.Reset()
	r0 := proxyReconciles(b)
	time.Sleep(window)
	rpcs := hv.proxyRPCs.Total()
	snap := hv.proxyRPCs.Snapshot()
	times := hv.proxyRPCs.resyncTimes()
	reconciles := proxyReconciles(b) - r0
	windowStart := time.Now().Add(-window)

	// Every steady-state resync ends in one Get of a running VM whose
	// agent answers: exactly one virDomainInterfaceAddresses per resync.
	resyncs := float64(snap[virt.RPCDomainInterfaceAddresses]) / benchProxies
	var r steadyStateResult
	perProxySec := float64(rpcs) / benchProxies / window.Seconds()
	r.rpcsPerProxyHour = perProxySec * 3600 / t.scale
	if resyncs > 0 {
		r.resyncPeriodRatio = window.Seconds() / resyncs / t.resync.Seconds()
	}
	r.reconcilesPerProbe = reconciles / benchProxies / (window.Seconds() / t.probe.Seconds())
	if mode == "events" {
		var first, second []time.Duration
		for _, ts := range times {
			if off := ts.Sub(windowStart); off < window/2 {
				first = append(first, off)
			} else {
				second = append(second, off)
			}
		}
		if len(first) > 0 && len(second) > 0 {
			r.halvesPeriod = meanDuration(second) - meanDuration(first)
		}
		b.Logf("events: %d resyncs in the window's first half, %d in its second; mean time between them %s (nominal %s)",
			len(first), len(second), r.halvesPeriod.Round(time.Millisecond), t.resync)
	}
	b.Logf("%s: probe %s, resync %s (production/%g), window %s after %s settle: %d RPCs (%s), %.2f resyncs and %.1f reconciles per Proxy; %.3f RPCs/Proxy/s → %.1f RPCs/Proxy/h at production intervals",
		mode, t.probe, t.resync, t.scale, window, settle, rpcs, formatCounts(snap), resyncs, reconciles/benchProxies, perProxySec, r.rpcsPerProxyHour)
	return r
}

func meanDuration(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// benchManager is one running manager.
type benchManager struct {
	cancel  context.CancelFunc
	done    chan error
	conns   []*fake.Conn
	subs    sync.WaitGroup
	stopped atomic.Bool
}

// startBenchManager starts a manager wired by Setup over hv; tune, if
// given, changes its Deps (the pool benchmark's options).
func startBenchManager(b *testing.B, restCfg *rest.Config, sch *kruntime.Scheme, hv *benchKVM, t benchTiming, tune ...func(*Deps)) *benchManager {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts := ctrl.Options{Scheme: sch, Metrics: metricsserver.Options{BindAddress: "0"},
		GracefulShutdownTimeout: ptr.To(benchShutdownGrace), Controller: config.Controller{SkipNameValidation: ptr.To(true)}}
	if os.Getenv("BENCH_KEEP_MANAGED_FIELDS") != "" {
		// The baseline of ManagerOptions' managedFields strip: a transform
		// of the caller's own is kept.
		opts.Cache.DefaultTransform = func(in any) (any, error) { return in, nil }
	}
	m, err := ctrl.NewManager(restCfg, ManagerOptions(opts))
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	hostSource := &kvm.KubeHosts{Reader: m.GetClient(), SecretReader: m.GetAPIReader(), SecretNamespace: hv.secretNamespace}
	kvmDeps := &KVMDeps{Hosts: hostSource, Observer: hv.proxyRPCs}
	if hv.conns != nil {
		kvmDeps.Pool = hv.conns
		// Health checks on a provider of their own, counted apart.
		kvmDeps.HostProber = kvm.New(kvm.Options{Hosts: hostSource, Pool: hv.conns, Observer: hv.hostRPCs})
	}
	deps := Deps{
		Registry:  provider.NewRegistry(),
		Prober:    benchProber{count: &hv.probes},
		Tag:       "bench",
		InstallID: "bench-install",
		Proxy: ProxyOptions{
			ProbeInterval: t.probe, ProvisionPollInterval: t.provisionPoll,
			AddressTimeout: 10 * time.Minute, ResyncInterval: t.resync,
			// Never dials: every probe succeeds, so no Proxy is watched;
			// the fake addresses must not be dialed for real regardless.
			PortWatch: portwatch.Options{Dial: benchProber{}.dial},
		},
		Sweep: SweepOptions{Interval: time.Hour},
		KVM:   kvmDeps,
	}
	for _, f := range tune {
		f(&deps)
	}
	w, err := Setup(ctx, m, deps)
	benchMust(b, err)
	prov := w.KVM

	bm := &benchManager{cancel: cancel, done: make(chan error, 1)}
	// On a failure path, stop it before envtest (cleanups run last-in
	// first-out), or the apiserver waits on its watches.
	b.Cleanup(func() { bm.stop(b) })
	// What conn.Pool does after each dial: hand the new connection to
	// OnConnect, which subscribes to lifecycle events until it drops.
	for _, name := range hv.names {
		f, inProcess := hv.fakes[name]
		if !inProcess {
			continue // the real pool dials and subscribes
		}
		c := f.Connect()
		bm.conns = append(bm.conns, c)
		bm.subs.Go(func() { prov.OnConnect(name, c, c.Disconnected()) })
	}
	go func() { bm.done <- m.Start(ctx) }()
	return bm
}

// benchShutdownHangs counts managers whose shutdown ran out of its grace
// period (see stop).
var benchShutdownHangs atomic.Int64

// stop cancels the manager and waits for it. controller-runtime v0.24.1's
// priority queue can deadlock on shutdown when an item is handed to a worker
// that is leaving (kubernetes-sigs/controller-runtime#3538, fixed upstream by
// #3540): Start then returns after the grace period with "failed waiting for
// all runnables to end". The figures are taken before stop, so that is
// logged and counted, not a failure; the stuck goroutines are parked and use
// no CPU.
func (bm *benchManager) stop(b *testing.B) {
	b.Helper()
	if bm.stopped.Swap(true) {
		return
	}
	bm.cancel()
	select {
	case err := <-bm.done:
		if err != nil {
			benchShutdownHangs.Add(1)
			b.Logf("manager shutdown: %v (controller-runtime#3538 priority-queue deadlock)", err)
		}
	case <-time.After(benchShutdownGrace + 30*time.Second):
		b.Fatalf("manager did not stop within %s", benchShutdownGrace+30*time.Second)
	}
	for _, c := range bm.conns {
		_ = c.Disconnect()
	}
	bm.subs.Wait()
}

// benchProber: every proxy port answers; probes are counted.
type benchProber struct {
	requiresAuth
	count *atomic.Int64
}

func (p benchProber) Probe(context.Context, proxyprobe.Target) proxyprobe.Result {
	p.count.Add(1)
	return proxyprobe.Result{OK: true, Latency: time.Millisecond}
}

// dial agrees with Probe: every port accepts.
func (benchProber) dial(context.Context, string, string) (net.Conn, error) {
	c, other := net.Pipe()
	_ = other.Close()
	return c, nil
}

// guestBooter gives every new domain of namespace ns an agent address, as a
// guest does once booted, and notes when the last domain appeared.
type guestBooter struct {
	cancel  context.CancelFunc
	done    chan struct{}
	defined atomic.Int64 // unix nanos when all the fleet's domains existed
}

func startGuestBooter(hv *benchKVM, ns string) *guestBooter {
	ctx, cancel := context.WithCancel(context.Background())
	g := &guestBooter{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(g.done)
		seen := map[string]bool{}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, h := range hv.names {
				f := hv.fakes[h]
				for _, d := range f.DomainNames() {
					if seen[d] || !strings.HasPrefix(d, ns+".") {
						continue
					}
					n := len(seen)
					seen[d] = true
					f.SetAgentAddresses(d, []libvirt.DomainInterface{{Name: "eth0", Addrs: []libvirt.DomainIPAddr{{
						Type: int32(libvirt.IPAddrTypeIpv4), Addr: fmt.Sprintf("10.%d.%d.%d", n/62500, n/250%250, n%250+1), Prefix: 8}}}})
				}
			}
			if len(seen) == hv.shape.proxies && g.defined.Load() == 0 {
				g.defined.Store(time.Now().UnixNano())
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return g
}

func (g *guestBooter) allDefinedAt() time.Time { return time.Unix(0, g.defined.Load()) }

func (g *guestBooter) stop() { g.cancel(); <-g.done }

// memSampler records the peak runtime HeapInuse every 50ms. With a trace
// it also writes, every second, where the process's memory is (resident
// set, heap in use, heap free but not returned to the OS, stacks,
// goroutines) under the current phase's name; with a peakProfile it writes
// a heap profile to peakProfile+"-"+phase+".pprof" whenever HeapInuse
// passes that phase's peak by 5%, so the last one is taken at the peak.
type memSampler struct {
	cancel context.CancelFunc
	done   chan struct{}
	peak   uint64

	trace       io.Writer
	peakProfile string
	phase       atomic.Pointer[string]
}

func startMemSampler() *memSampler { return startMemTrace(nil, "") }

func startMemTrace(trace io.Writer, peakProfile string) *memSampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &memSampler{cancel: cancel, done: make(chan struct{}), trace: trace, peakProfile: peakProfile}
	s.setPhase("start")
	go func() {
		defer close(s.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		start, lastLine := time.Now(), time.Time{}
		phasePeak := map[string]uint64{}
		for {
			runtime.ReadMemStats(&ms)
			s.peak = max(s.peak, ms.HeapInuse)
			phase := *s.phase.Load()
			if s.peakProfile != "" && ms.HeapInuse > phasePeak[phase]*105/100 {
				phasePeak[phase] = ms.HeapInuse
				if f, err := os.Create(s.peakProfile + "-" + phase + ".pprof"); err == nil {
					_ = pprof.WriteHeapProfile(f)
					_ = f.Close()
				}
			}
			if s.trace != nil && time.Since(lastLine) >= time.Second {
				lastLine = time.Now()
				rss, _ := procStatusField("self", "VmRSS")
				_, _ = fmt.Fprintf(s.trace, "%.0f\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%d\n", time.Since(start).Seconds(), phase,
					rss/(1<<20), float64(ms.HeapInuse)/(1<<20), float64(ms.HeapIdle-ms.HeapReleased)/(1<<20),
					float64(ms.StackInuse)/(1<<20), runtime.NumGoroutine())
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// setPhase names what the process does from now on, in the trace and the
// peak profiles' names.
func (s *memSampler) setPhase(p string) { s.phase.Store(&p) }

func (s *memSampler) stop() float64 { s.cancel(); <-s.done; return float64(s.peak) }

// liveHeapAfterGC is the heap that survives a collection now, in bytes;
// with a profilePath it also writes the heap profile there (what that heap
// is made of: go tool pprof -top -inuse_space <path>).
func liveHeapAfterGC(b *testing.B, profilePath string) float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if profilePath != "" {
		f, err := os.Create(profilePath)
		benchMust(b, err)
		benchMust(b, pprof.WriteHeapProfile(f))
		benchMust(b, f.Close())
	}
	return float64(ms.HeapAlloc)
}

// vmHWM is the process's peak resident set (VmHWM), in bytes.
func vmHWM(b *testing.B) float64 { return procStatusBytes(b, "self", "VmHWM") }

// procStatusBytes reads a memory field (VmHWM, VmRSS) of /proc/<pid>/status
// in bytes; 0 when it cannot.
func procStatusBytes(b *testing.B, pid, field string) float64 {
	v, err := procStatusField(pid, field)
	if err != nil {
		b.Logf("no %s in /proc/%s/status: %v", field, pid, err)
	}
	return v
}

// procStatusField reads a memory field of /proc/<pid>/status in bytes.
func procStatusField(pid, field string) (float64, error) {
	data, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no field %s", field)
}

// proxyReconciles sums controller_runtime_reconcile_total{controller="proxy"}
// over every result. Gather returns what it could collect along with the
// errors of other collectors (e.g. one the Ginkgo suite registered, whose
// apiserver is gone when the benchmark runs in the same binary); only a
// Gather that returned nothing is fatal.
func proxyReconciles(b *testing.B) float64 {
	b.Helper()
	return reconcilesOf(b, "proxy")
}

// reconcilesOf sums controller_runtime_reconcile_total of one controller.
func reconcilesOf(b *testing.B, controller string) float64 {
	b.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil && len(mfs) == 0 {
		b.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// cleanupFleet removes what an iteration made, without a manager: finalizers
// are dropped by hand (the in-memory hosts go away with the iteration).
func cleanupFleet(b *testing.B, cl client.Client, ns string, hosts []string, image string) {
	ctx := context.Background()
	list := &crawlv1.ProxyList{}
	benchMust(b, cl.List(ctx, list, client.InNamespace(ns)))
	for i := range list.Items {
		p := &list.Items[i]
		_ = client.IgnoreNotFound(cl.Delete(ctx, p))
		benchDropFinalizers(ctx, cl, p)
	}
	for _, h := range hosts {
		kh := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: h}}
		_ = cl.Delete(ctx, kh)
		benchDropFinalizers(ctx, cl, kh)
	}
	_ = cl.Delete(ctx, &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: image}})
	_ = cl.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
}

func benchDropFinalizers(ctx context.Context, cl client.Client, obj client.Object) {
	for range 5 {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return
		}
		obj.SetFinalizers(nil)
		if err := cl.Update(ctx, obj); err == nil || client.IgnoreNotFound(err) == nil {
			return
		}
	}
}

func benchWait(b *testing.B, within time.Duration, what string, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("%s: not reached within %s", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func benchMust(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

func formatCounts[V int | float64](m map[string]V) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%v", k, m[k]))
	}
	return strings.Join(parts, " ")
}
