package controllers

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	poolfleet "crawl.example.com/proxy-operator/pkg/fleet"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn/sshtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

// scaleShape is issue 30's: a pool of 5,000 replicas on 250 hosts, a
// rotation of 1,000 of them with maxSurge 5%, then a steady-state window.
// SCALE_BENCH_REPLICAS, _HOSTS, _ROTATE, _SURGE (a count or a percent) and
// _STEADY (a duration) change it, e.g. 1000/50/200 for issue 15's size;
// SCALE_BENCH_MAX_CONCURRENT_CREATES sets spec.placement.maxConcurrentCreates
// (unset: its default), e.g. the replicas for a baseline without the bound;
// SCALE_BENCH_HEAPPROFILE=FILE writes the heap profile once all are Ready;
// SCALE_BENCH_MAX_UPLOADS sets the manager's --max-uploads (-1: no bound);
// SCALE_BENCH_MEMTRACE=FILE writes the manager's memory every second, by
// phase, and SCALE_BENCH_PEAKPROFILE=PREFIX a heap profile at each phase's
// peak (memSampler); SCALE_BENCH_STEADYPROFILE=FILE a CPU profile of the
// steady window (the manager's side only: fakehv and kube-apiserver are
// other processes). BENCH_KEEP_MANAGED_FIELDS=1 (any benchmark starting a
// manager) caches objects with their managedFields, as before
// ManagerOptions stripped them.
type scaleShape struct {
	replicas, hosts, rotate int
	maxConcurrentCreates    int
	maxUploads              int
	surge                   string
	steady                  time.Duration
}

func scaleShapeFromEnv(b *testing.B) scaleShape {
	s := scaleShape{replicas: 5000, hosts: 250, rotate: 1000, surge: "5%", steady: 10 * time.Minute}
	for _, v := range []struct {
		env string
		to  *int
	}{{"SCALE_BENCH_REPLICAS", &s.replicas}, {"SCALE_BENCH_HOSTS", &s.hosts}, {"SCALE_BENCH_ROTATE", &s.rotate},
		{"SCALE_BENCH_MAX_CONCURRENT_CREATES", &s.maxConcurrentCreates}} {
		if e := os.Getenv(v.env); e != "" {
			n, err := strconv.Atoi(e)
			if err != nil || n <= 0 {
				b.Fatalf("%s=%q: want a positive number", v.env, e)
			}
			*v.to = n
		}
	}
	if e := os.Getenv("SCALE_BENCH_MAX_UPLOADS"); e != "" {
		n, err := strconv.Atoi(e)
		if err != nil || n == 0 {
			b.Fatalf("SCALE_BENCH_MAX_UPLOADS=%q: want a positive number, or -1 for no bound", e)
		}
		s.maxUploads = n
	}
	if e := os.Getenv("SCALE_BENCH_SURGE"); e != "" {
		s.surge = e
	}
	if e := os.Getenv("SCALE_BENCH_STEADY"); e != "" {
		d, err := time.ParseDuration(e)
		if err != nil || d <= 0 {
			b.Fatalf("SCALE_BENCH_STEADY=%q: want a positive duration", e)
		}
		s.steady = d
	}
	if s.rotate > s.replicas {
		b.Fatalf("SCALE_BENCH_ROTATE %d is more than SCALE_BENCH_REPLICAS %d", s.rotate, s.replicas)
	}
	return s
}

// surgeCount resolves maxSurge as the pool does.
func (s scaleShape) surgeCount(b *testing.B) int {
	v := intstr.Parse(s.surge)
	p, err := poolfleet.PolicyFor(&crawlv1.ProxyPoolSpec{Replicas: ptr.To(int32(s.replicas)), Rollout: crawlv1.ProxyPoolRollout{MaxSurge: &v}})
	if err != nil {
		b.Fatalf("SCALE_BENCH_SURGE=%q: %v", s.surge, err)
	}
	return p.MaxSurge
}

// BenchmarkProxyPoolScale measures the manager alone at issue 30's size:
// the real controllers (Setup, main.go's flag defaults: probe 30s,
// provision poll 5s, resync 10m, 16 Proxy / 4 pool / 64 KVMHost workers,
// a quarter of the Proxy workers per host, sweep every 5m) against
// envtest's kube-apiserver and etcd, with the hypervisors in a process of
// their own (test/fakehv, built by the benchmark; FAKEHV_BINARY names a
// prebuilt one). So this process is the manager, plus the benchmark's
// watch, image server and counters, and its peak RSS and CPU are the
// manager's own.
//
// The manager reaches each host as in production: the KVMHost's Secret
// read through the API, TCP to the host's SSH port (loopback), an SSH
// handshake with strict known_hosts, libvirt's socket forwarded over
// direct-streamlocal, go-libvirt, lifecycle and guest agent events
// subscribed on every link, SSH keepalives. What is not production: the
// proxy probe and the port watch answer without dialing (benchProber:
// the guests' addresses are not real), and the guests boot the moment
// their domain starts (fakehv gives each an agent address).
//
// One iteration (ns/op is the apply; -benchtime=1x):
//
//  1. KVMHosts, their SSH Secret and a KVMImage; wait until every host is
//     Ready with the image cached;
//  2. apply a ProxyPool of `replicas` spread over the hosts by
//     spec.placement.hostSelector, everything at its default (creates:
//     maxConcurrentCreates per host, no pool-wide cap); until
//     every replica is Ready, as an independent watch of the namespace sees
//     it. Figures: apply → all created, → all Ready; Proxy and pool
//     reconciles, libvirt RPCs (the Proxy path; host health checks apart)
//     and kube-apiserver writes per replica; CPU seconds of this process,
//     of fakehv and of the kube-apiserver and etcd;
//  3. rotate `rotate` replicas: maxSurge `surge`, rotation.maxAge 1s
//     with maxConcurrent equal to the surge and minInterval 0 (the
//     defaults, one at a time, would not finish in a benchmark), drain at
//     its default (30s); rotation is switched off once `rotate` replicas
//     have started rotating. Figures: wall time until those are gone and
//     `replicas` are Ready, the fewest available and the most replicas any
//     event of the watch showed (the budget: at least `replicas`, at most
//     `replicas` + surge);
//  4. steady state for `steady` at production intervals, the watch
//     stopped: CPU of this process (cores), kube-apiserver writes and
//     libvirt RPCs per Proxy per hour, probes achieved against nominal.
//
// Memory: manager-vmhwm-MiB is this process's peak RSS (VmHWM, from
// /proc/self/status) from the apply to the end; setup-vmhwm-MiB the peak
// before, while the image went to every host; fakehv-vmhwm-MiB the
// hypervisors'. The kube-apiserver
// writes come from its own apiserver_request_total (by verb, group,
// resource, subresource), scraped from /metrics before and after each
// phase, so they count what the server handled, not what a client meant
// to send; the benchmark's own writes (the pool, its updates) are among
// them and negligible.
func BenchmarkProxyPoolScale(b *testing.B) {
	shape := scaleShapeFromEnv(b)
	// SCALE_BENCH_MANAGER_MEMLIMIT sets the soft memory limit of this
	// process (the manager) only: GOMEMLIMIT would reach kube-apiserver
	// and etcd too, which the benchmark starts as children.
	if e := os.Getenv("SCALE_BENCH_MANAGER_MEMLIMIT"); e != "" {
		mib, err := strconv.Atoi(e)
		if err != nil || mib <= 0 {
			b.Fatalf("SCALE_BENCH_MANAGER_MEMLIMIT=%q: want MiB, a positive integer", e)
		}
		debug.SetMemoryLimit(int64(mib) << 20)
	}
	if os.Getenv("SCALE_BENCH_PEAKPROFILE") != "" || os.Getenv("SCALE_BENCH_HEAPPROFILE") != "" {
		// Finer than the default 512 KiB, so that a peak's buffers and
		// the live heap's per-replica parts show.
		runtime.MemProfileRate = 64 << 10
	}
	bin := buildFakeHV(b)
	restCfg, sch, cl := startBenchEnv(b)
	var previous func()
	for iter := 0; b.Loop(); iter++ {
		b.StopTimer()
		if previous != nil {
			previous()
		}
		var r scaleResult
		r, previous = runScaleIteration(b, restCfg, sch, cl, bin, iter, shape)
		r.report(b)
		b.StartTimer()
	}
}

// buildFakeHV builds test/fakehv (or takes FAKEHV_BINARY).
func buildFakeHV(b *testing.B) string {
	if p := os.Getenv("FAKEHV_BINARY"); p != "" {
		return p
	}
	out := filepath.Join(b.TempDir(), "fakehv")
	cmd := exec.Command("go", "build", "-o", out, "./test/fakehv")
	cmd.Dir = envtestutil.Root()
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building test/fakehv (or set FAKEHV_BINARY): %v\n%s", err, msg)
	}
	return out
}

// fakeHV is a running test/fakehv.
type fakeHV struct {
	cmd       *exec.Cmd
	stdin     io.Closer
	dir       string
	hosts     []fakeHVHost
	knownHost []byte
	clientKey []byte // PEM
	ctl       *http.Client
}

type fakeHVHost struct {
	Name    string `json:"name"`
	Address string `json:"address"`
}

type fakeHVStats struct {
	Hosts      int            `json:"hosts"`
	Domains    int            `json:"domains"`
	Calls      map[string]int `json:"calls"`
	TotalCalls int            `json:"totalCalls"`
	Booted     int64          `json:"booted"`
}

func startFakeHV(b *testing.B, bin string, hosts int, prefix string) *fakeHV {
	dir, err := os.MkdirTemp("", "fhv") // unix socket paths are short
	benchMust(b, err)
	signer, keyPEM := sshtest.NewKey(b)
	pub := filepath.Join(dir, "client.pub")
	benchMust(b, os.WriteFile(pub, ssh.MarshalAuthorizedKey(signer.PublicKey()), 0o600))
	logFile, err := os.Create(filepath.Join(dir, "fakehv.log"))
	benchMust(b, err)
	cmd := exec.Command(bin, "-hosts", strconv.Itoa(hosts), "-name-prefix", prefix, "-dir", dir, "-authorized-key", pub)
	cmd.Stderr = logFile
	// It dies with the benchmark, whatever way the benchmark ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	benchMust(b, err)
	stdout, err := cmd.StdoutPipe()
	benchMust(b, err)
	benchMust(b, cmd.Start())
	h := &fakeHV{cmd: cmd, stdin: stdin, dir: dir, clientKey: keyPEM}
	b.Cleanup(func() {
		h.stop()
		_ = logFile.Close()
		_ = os.RemoveAll(dir)
	})
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case line := <-ready:
		if line != "ready" {
			msg, _ := os.ReadFile(logFile.Name())
			b.Fatalf("fakehv: %q\n%s", line, msg)
		}
	case <-time.After(5 * time.Minute):
		b.Fatal("fakehv not ready within 5m")
	}
	data, err := os.ReadFile(filepath.Join(dir, "hosts.json"))
	benchMust(b, err)
	benchMust(b, json.Unmarshal(data, &h.hosts))
	h.knownHost, err = os.ReadFile(filepath.Join(dir, "known_hosts"))
	benchMust(b, err)
	h.ctl = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(dir, "control.sock"))
	}}}
	return h
}

func (h *fakeHV) pid() int { return h.cmd.Process.Pid }

func (h *fakeHV) stats(b *testing.B) fakeHVStats {
	resp, err := h.ctl.Get("http://fakehv/stats")
	benchMust(b, err)
	defer resp.Body.Close()
	var s fakeHVStats
	benchMust(b, json.NewDecoder(resp.Body).Decode(&s))
	return s
}

// stop ends fakehv (its stdin closing is its signal) and waits for it.
func (h *fakeHV) stop() {
	if h.cmd.ProcessState != nil {
		return
	}
	_ = h.stdin.Close()
	done := make(chan struct{})
	go func() { _ = h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = h.cmd.Process.Kill()
		<-done
	}
}

// scaleResult is one iteration's figures.
type scaleResult struct {
	shape                           scaleShape
	applyToCreated, applyToReady    time.Duration
	readyP50, readyP99              time.Duration
	proxyReconciles, poolReconciles float64 // per replica
	rpcs, hostCheckRPCs             float64 // per replica; health checks in total
	apiWrites, proxyWrites          float64 // per replica
	managerCPU, fakeHVCPU, apiCPU   time.Duration
	peakHeap, liveHeap              float64

	rotation                  time.Duration
	rotationMinAv, rotationMx int
	rotationSurge             int
	rotationStarted           int
	rotationCreates           int
	rotationRPCs              float64 // per replica created

	steadyWindow                     time.Duration
	steadyManagerCores               float64
	steadyFakeHVCores, steadyAPICore float64
	steadyWrites, steadyProxyWrites  float64 // per Proxy per hour
	steadyRPCs, steadyProxyRPCs      float64 // per Proxy per hour
	steadyProbesRatio                float64

	setupHWM, managerHWM, fakeHVHWM float64
}

func (r scaleResult) report(b *testing.B) {
	n := float64(r.shape.replicas)
	b.ReportMetric(r.applyToCreated.Seconds(), "apply-to-all-created-s")
	b.ReportMetric(r.applyToReady.Seconds(), "apply-to-all-ready-s")
	b.ReportMetric(float64(r.readyP50.Milliseconds()), "replica-ready-p50-ms")
	b.ReportMetric(float64(r.readyP99.Milliseconds()), "replica-ready-p99-ms")
	b.ReportMetric(r.proxyReconciles, "proxy-reconciles/replica")
	b.ReportMetric(r.poolReconciles, "pool-reconciles/replica")
	b.ReportMetric(r.rpcs, "rpcs/replica")
	b.ReportMetric(r.hostCheckRPCs, "apply-hostcheck-rpcs")
	b.ReportMetric(r.apiWrites, "api-writes/replica")
	b.ReportMetric(r.proxyWrites, "proxy-writes/replica")
	b.ReportMetric(r.managerCPU.Seconds(), "apply-manager-cpu-s")
	b.ReportMetric(r.managerCPU.Seconds()*1000/n, "apply-manager-cpu-ms/replica")
	b.ReportMetric(r.fakeHVCPU.Seconds(), "apply-fakehv-cpu-s")
	b.ReportMetric(r.apiCPU.Seconds(), "apply-apiserver+etcd-cpu-s")
	b.ReportMetric(r.peakHeap/(1<<20), "peak-heapinuse-MiB")
	b.ReportMetric(r.liveHeap/(1<<20), "live-heap-after-gc-MiB")
	b.ReportMetric(r.rotation.Seconds(), "rotation-s")
	b.ReportMetric(float64(r.rotationMinAv), "rotation-min-available")
	b.ReportMetric(float64(r.rotationMx), "rotation-max-existing")
	b.ReportMetric(float64(r.rotationSurge), "rotation-max-surge")
	b.ReportMetric(float64(r.rotationStarted), "rotation-started")
	b.ReportMetric(float64(r.rotationCreates), "rotation-creates")
	b.ReportMetric(r.rotationRPCs, "rotation-rpcs/create")
	b.ReportMetric(r.steadyManagerCores, "steady-manager-cores")
	b.ReportMetric(r.steadyFakeHVCores, "steady-fakehv-cores")
	b.ReportMetric(r.steadyAPICore, "steady-apiserver+etcd-cores")
	b.ReportMetric(r.steadyWrites, "steady-api-writes/proxy/h")
	b.ReportMetric(r.steadyProxyWrites, "steady-proxy-writes/proxy/h")
	b.ReportMetric(r.steadyRPCs, "steady-rpcs/proxy/h")
	b.ReportMetric(r.steadyProxyRPCs, "steady-proxy-path-rpcs/proxy/h")
	b.ReportMetric(r.steadyProbesRatio, "steady-probes-achieved/nominal")
	b.ReportMetric(r.setupHWM/(1<<20), "setup-vmhwm-MiB")
	b.ReportMetric(r.managerHWM/(1<<20), "manager-vmhwm-MiB")
	b.ReportMetric(r.fakeHVHWM/(1<<20), "fakehv-vmhwm-MiB")
}

// hostCheckOnlyRPCs are the RPCs only the KVMHost health check makes
// (kvm.Provider.Probe); it also makes one virStoragePoolLookupByName per
// check, i.e. one per virConnectGetLibVersion.
var hostCheckOnlyRPCs = []string{virt.RPCConnectGetLibVersion, virt.RPCConnectGetHostname, virt.RPCStoragePoolGetInfo,
	virt.RPCNodeGetInfo, virt.RPCNodeGetMemoryStats, virt.RPCConnectGetAllDomainStats}

// hostCheckRPCs is the health checks' share of a count by RPC name.
func hostCheckRPCs(byName map[string]int) int {
	n := byName[virt.RPCConnectGetLibVersion] // their pool lookups
	for _, rpc := range hostCheckOnlyRPCs {
		n += byName[rpc]
	}
	return n
}

// cpuSample is CPU time so far of this process, fakehv, and this
// process's other children (the kube-apiserver and etcd).
type cpuSample struct{ self, fakeHV, servers time.Duration }

func sampleCPU(b *testing.B, hv *fakeHV) cpuSample {
	s := cpuSample{self: selfCPU(b), fakeHV: procCPU(b, hv.pid())}
	s.servers = childrenCPU(b) - s.fakeHV
	return s
}

func (s cpuSample) sub(o cpuSample) cpuSample {
	return cpuSample{self: s.self - o.self, fakeHV: s.fakeHV - o.fakeHV, servers: s.servers - o.servers}
}

func runScaleIteration(b *testing.B, restCfg *rest.Config, sch *kruntime.Scheme, cl client.Client, bin string, iter int, shape scaleShape) (scaleResult, func()) {
	ctx := context.Background()
	res := scaleResult{shape: shape, rotationSurge: shape.surgeCount(b)}
	b.Logf("load average at start: %s; VmRSS %.1f MiB (envtest and its clients started)", loadAverage(), procStatusBytes(b, "self", "VmRSS")/(1<<20))
	cs, err := kubernetes.NewForConfig(restCfg)
	benchMust(b, err)
	var trace io.Writer
	if path := os.Getenv("SCALE_BENCH_MEMTRACE"); path != "" {
		f, err := os.Create(path)
		benchMust(b, err)
		defer f.Close()
		_, _ = fmt.Fprintln(f, "s\tphase\trss-MiB\theap-inuse-MiB\theap-idle-unreleased-MiB\tstacks-MiB\tgoroutines")
		trace = f
	}
	memTrace := startMemTrace(trace, os.Getenv("SCALE_BENCH_PEAKPROFILE"))
	defer memTrace.stop()
	memTrace.setPhase("setup")

	// 1. Hosts in fakehv, KVMHosts with their Secret, an image.
	suffix := fmt.Sprintf("%d-%d", iter, time.Now().UnixNano()%1_000_000)
	hvProc := startFakeHV(b, bin, shape.hosts, "scale-hv-"+suffix)
	secretNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "scale-system-"}}
	benchMust(b, cl.Create(ctx, secretNS))
	benchMust(b, cl.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: secretNS.Name, Name: "kvm-ssh"},
		Data:       map[string][]byte{crawlv1.SSHPrivateKeyKey: hvProc.clientKey, crawlv1.KnownHostsKey: hvProc.knownHost},
	}))
	label := map[string]string{"scale-pool": suffix}
	hv := &benchKVM{shape: fleetShape{proxies: shape.replicas, hosts: shape.hosts}, proxyRPCs: &resyncObserver{}, hostRPCs: &virt.RPCCounter{},
		secretNamespace: secretNS.Name}
	for _, h := range hvProc.hosts {
		hv.names = append(hv.names, h.Name)
		benchMust(b, cl.Create(ctx, &crawlv1.KVMHost{
			ObjectMeta: metav1.ObjectMeta{Name: h.Name, Labels: label},
			Spec: crawlv1.KVMHostSpec{Address: h.Address, User: "root",
				SSHKeySecretRef: &crawlv1.SecretReference{Namespace: secretNS.Name, Name: "kvm-ssh"},
				StoragePool:     kvmtest.PoolName, Network: kvmtest.NetworkName},
		}))
	}
	imageName := "scale-debian-" + suffix
	imgSrv := newBenchImage(b, cl, imageName)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "scale-pool-"}}
	benchMust(b, cl.Create(ctx, ns))
	bf := &benchFleet{hv: hv, image: imageName, namespace: ns.Name, imgSrv: imgSrv}

	mgr := startBenchManager(b, restCfg, sch, hv, productionTiming, func(d *Deps) {
		d.Sweep.Interval = 5 * time.Minute // main.go's --gc-interval
		d.KVM.MaxUploads = shape.maxUploads
	})
	bf.waitImageCached(b, cl)
	waitHostsReady(b, cl, label, shape.hosts, 5*time.Minute)

	// 2. Apply → all Ready. The peak so far is the image's distribution to
	// every host (each upload holds go-libvirt's 4 MiB stream buffer), which
	// depends on the hosts, not the replicas: it is reported apart and the
	// peak restarts here.
	res.setupHWM = vmHWM(b)
	resetHWM(b)
	b.Logf("before the apply (envtest started, %d hosts connected, image cached): VmHWM %.1f MiB, VmRSS %.1f MiB",
		shape.hosts, res.setupHWM/(1<<20), procStatusBytes(b, "self", "VmRSS")/(1<<20))
	hv.proxyRPCs.Reset()
	proxy0, pool0 := reconcilesOf(b, "proxy"), reconcilesOf(b, "proxypool")
	writes0, cpu0 := apiWrites(b, cs), sampleCPU(b, hvProc)
	mem := startMemSampler()
	memTrace.setPhase("apply")
	w := startPoolBenchWatch(b, restCfg, sch, ns.Name, "scale")
	pool := &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "scale"},
		Spec: crawlv1.ProxyPoolSpec{
			Replicas: ptr.To(int32(shape.replicas)),
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "scale"}},
			Template: crawlv1.ProxyTemplate{
				Metadata: crawlv1.ProxyTemplateMeta{Labels: map[string]string{"app": "scale"}},
				Spec: crawlv1.ProxySpec{
					Provider:          crawlv1.ProviderKVM,
					Placement:         crawlv1.ProxyPlacement{Image: imageName},
					CloudInit:         crawlv1.ProxyCloudInit{UserData: "#cloud-config\n"},
					InstallGuestAgent: ptr.To(true),
					Port:              3128,
				},
			},
			// Creates at their defaults: maxConcurrentCreates per host,
			// no pool-wide per-minute cap.
			Placement: crawlv1.ProxyPoolPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: label},
				MaxConcurrentCreates: int32(shape.maxConcurrentCreates)},
		},
	}
	var lat []time.Duration
	res.applyToReady, res.applyToCreated, lat = applyBenchPool(b, cl, w, pool, 2*time.Hour)
	res.readyP50, res.readyP99 = lat[len(lat)/2], lat[len(lat)*99/100]
	n := float64(shape.replicas)
	res.proxyReconciles = (reconcilesOf(b, "proxy") - proxy0) / n
	res.poolReconciles = (reconcilesOf(b, "proxypool") - pool0) / n
	snap := hv.proxyRPCs.Snapshot()
	hc := hostCheckRPCs(snap)
	res.hostCheckRPCs = float64(hc)
	res.rpcs = float64(hv.proxyRPCs.Total()-hc) / n
	writes := diffCounts(apiWrites(b, cs), writes0)
	res.apiWrites, res.proxyWrites = sumCounts(writes, "")/n, sumCounts(writes, crawlv1.GroupVersion.Group+"/proxies")/n
	cpu := sampleCPU(b, hvProc).sub(cpu0)
	res.managerCPU, res.fakeHVCPU, res.apiCPU = cpu.self, cpu.fakeHV, cpu.servers
	res.peakHeap = mem.stop()
	// SCALE_BENCH_HEAPPROFILE: what the manager's live heap is made of
	// with every replica Ready.
	res.liveHeap = liveHeapAfterGC(b, os.Getenv("SCALE_BENCH_HEAPPROFILE"))
	st := hvProc.stats(b)
	b.Logf("apply: %d replicas Ready in %s, last created at %s; fakehv holds %d domains (%d booted)",
		shape.replicas, res.applyToReady.Round(time.Millisecond), res.applyToCreated.Round(time.Millisecond), st.Domains, st.Booted)
	b.Logf("apply: libvirt RPCs by name (manager side, health checks included): %s", formatCounts(snap))
	b.Logf("apply: kube-apiserver writes by resource: %s", formatCounts(writes))
	b.Logf("apply: CPU manager %s, fakehv %s, kube-apiserver+etcd %s; manager VmHWM %.1f MiB, fakehv VmHWM %.1f MiB",
		cpu.self.Round(time.Millisecond), cpu.fakeHV.Round(time.Millisecond), cpu.servers.Round(time.Millisecond),
		vmHWM(b)/(1<<20), procStatusBytes(b, strconv.Itoa(hvProc.pid()), "VmHWM")/(1<<20))

	// 3. A rotation of `rotate` within the budget.
	originals := w.names()
	memTrace.setPhase("rotation")
	hv.proxyRPCs.Reset()
	w.arm(shape.replicas)
	t0 := time.Now()
	updateBenchPool(b, cl, pool, func(p *crawlv1.ProxyPool) {
		p.Spec.Rollout.MaxSurge = ptr.To(intstr.Parse(shape.surge))
		p.Spec.Rotation = crawlv1.ProxyPoolRotation{MaxAge: &metav1.Duration{Duration: time.Second}, MaxConcurrent: int32(res.rotationSurge)}
	})
	benchWait(b, 2*time.Hour, fmt.Sprintf("%d rotations started", shape.rotate), func() bool {
		return w.rotatingOf(originals) >= shape.rotate
	})
	updateBenchPool(b, cl, pool, func(p *crawlv1.ProxyPool) { p.Spec.Rotation = crawlv1.ProxyPoolRotation{} })
	res.rotationStarted = w.rotatingOf(originals)
	benchWait(b, 2*time.Hour, "rotated replicas gone and every replica Ready", func() bool {
		return w.goneOf(originals) >= res.rotationStarted && w.readyCount() == shape.replicas && w.count() == shape.replicas
	})
	res.rotation = time.Since(t0)
	res.rotationMinAv, res.rotationMx, res.rotationCreates = w.disarm()
	rsnap := hv.proxyRPCs.Snapshot()
	res.rotationRPCs = float64(hv.proxyRPCs.Total()-hostCheckRPCs(rsnap)) / float64(max(1, res.rotationCreates))
	b.Logf("rotation: %d started, %d created, in %s; fewest available %d (budget %d), most replicas %d (budget %d), %d of them being deleted",
		res.rotationStarted, res.rotationCreates, res.rotation.Round(time.Millisecond), res.rotationMinAv, shape.replicas,
		res.rotationMx, shape.replicas+res.rotationSurge, w.peakDeleting())
	w.stop()

	// 4. Steady state: nothing changes; production intervals.
	memTrace.setPhase("steady")
	time.Sleep(time.Minute) // the last replacements' first probes and status writes
	hv.proxyRPCs.Reset()
	probes0 := hv.probes.Load()
	writes0, cpu0 = apiWrites(b, cs), sampleCPU(b, hvProc)
	stopProfile := startCPUProfile(b, os.Getenv("SCALE_BENCH_STEADYPROFILE"))
	time.Sleep(shape.steady)
	stopProfile()
	res.steadyWindow = shape.steady
	cpu = sampleCPU(b, hvProc).sub(cpu0)
	writes = diffCounts(apiWrites(b, cs), writes0)
	ssnap := hv.proxyRPCs.Snapshot()
	perProxyHour := 3600 / shape.steady.Seconds() / n
	res.steadyManagerCores = cpu.self.Seconds() / shape.steady.Seconds()
	res.steadyFakeHVCores = cpu.fakeHV.Seconds() / shape.steady.Seconds()
	res.steadyAPICore = cpu.servers.Seconds() / shape.steady.Seconds()
	res.steadyWrites = sumCounts(writes, "") * perProxyHour
	res.steadyProxyWrites = sumCounts(writes, crawlv1.GroupVersion.Group+"/proxies") * perProxyHour
	res.steadyRPCs = float64(hv.proxyRPCs.Total()) * perProxyHour
	res.steadyProxyRPCs = float64(hv.proxyRPCs.Total()-hostCheckRPCs(ssnap)) * perProxyHour
	res.steadyProbesRatio = float64(hv.probes.Load()-probes0) / (n * shape.steady.Seconds() / productionTiming.probe.Seconds())
	b.Logf("steady %s: CPU manager %s, fakehv %s, kube-apiserver+etcd %s; writes by resource %s; RPCs by name %s",
		shape.steady, cpu.self.Round(time.Millisecond), cpu.fakeHV.Round(time.Millisecond), cpu.servers.Round(time.Millisecond),
		formatCounts(writes), formatCounts(ssnap))
	res.managerHWM = vmHWM(b)
	res.fakeHVHWM = procStatusBytes(b, strconv.Itoa(hvProc.pid()), "VmHWM")
	b.Logf("load average at end: %s", loadAverage())

	mgr.stop(b)
	hvProc.stop()
	// Cleaned up before the next iteration, if any: the last one's go with
	// envtest.
	return res, func() {
		bf.cleanup(b, cl)
		_ = cl.Delete(ctx, secretNS)
	}
}

// resetHWM restarts this process's VmHWM from its current resident set
// (Linux: "5" to /proc/self/clear_refs).
func resetHWM(b *testing.B) {
	benchMust(b, os.WriteFile("/proc/self/clear_refs", []byte("5"), 0))
}

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// apiWriteVerbs are the verbs of apiserver_request_total that write.
var apiWriteVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true, "APPLY": true}

var metricLabelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// apiWrites reads the kube-apiserver's apiserver_request_total and sums its
// writes by group/resource[/subresource].
func apiWrites(b *testing.B, cs kubernetes.Interface) map[string]float64 {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	benchMust(b, err)
	out := map[string]float64{}
	for line := range strings.Lines(string(raw)) {
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		end := strings.LastIndexByte(rest, '}')
		if end < 0 {
			continue
		}
		labels := map[string]string{}
		for _, m := range metricLabelRE.FindAllStringSubmatch(rest[:end], -1) {
			labels[m[1]] = m[2]
		}
		if !apiWriteVerbs[labels["verb"]] {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest[end+1:]), 64)
		if err != nil {
			continue
		}
		key := labels["group"] + "/" + labels["resource"]
		if sub := labels["subresource"]; sub != "" {
			key += "/" + sub
		}
		out[key] += v
	}
	if len(out) == 0 {
		b.Fatal("kube-apiserver /metrics has no apiserver_request_total writes")
	}
	return out
}

func diffCounts(after, before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// sumCounts sums the counts whose key starts with prefix.
func sumCounts(m map[string]float64, prefix string) float64 {
	total := 0.0
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			total += v
		}
	}
	return total
}

// startCPUProfile profiles this process's CPU into file until the returned
// func is called; with no file it does nothing.
func startCPUProfile(b *testing.B, file string) (stop func()) {
	if file == "" {
		return func() {}
	}
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
