package providers

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/zap/zapcore"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"crawl.example.com/proxy-operator/controllers"
	"crawl.example.com/proxy-operator/internal/logkeys"
	"crawl.example.com/proxy-operator/pkg/portwatch"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/gcp"
	"crawl.example.com/proxy-operator/pkg/provider/gcp/gcptest"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

const (
	// testTag is this install's instance tag; instances carrying another
	// tag belong to someone else and are never swept.
	testTag = "envtest"
	// testInstallID is this install's id; instances of another install (or
	// of none) are never swept.
	testInstallID = "envtest-install"

	gcpProject = "envtest-project"
	gcpZone    = "us-central1-a"

	// resyncInterval is long next to the specs' observation windows, so a
	// Failed Proxy's RequeueAfter is told apart from a hot loop.
	resyncInterval = 5 * time.Second
)

var (
	testEnv   *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
	scheme    = envtestutil.Scheme()
	// computeFake is the Compute Engine API behind the gcp provider.
	computeFake *gcptest.Server
	prober      = &fakeProber{probes: map[string]int{}}
	// mgr is the running manager; a spec that swaps it restores it.
	mgr *harness
)

func TestProviders(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Providers Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(logkeys.Wrap(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true), zap.Level(zapcore.InfoLevel))))
	var err error
	// Fails (never skips) without KUBEBUILDER_ASSETS, saying how to get them.
	testEnv, err = envtestutil.New(false)
	Expect(err).NotTo(HaveOccurred())
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	computeFake = gcptest.NewServer()
	mgr = startManager(managerConfig{gcp: fakeGCP})
})

var _ = AfterSuite(func() {
	if mgr != nil {
		mgr.stop()
	}
	if computeFake != nil {
		computeFake.Close()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// fakeGCP builds the gcp provider against the Compute fake, as main.go's
// registry.Register does against the real API.
func fakeGCP(ctx context.Context) (provider.Provider, error) {
	return gcp.New(ctx, gcp.Options{
		InstallID:        testInstallID,
		Project:          gcpProject,
		Zone:             gcpZone,
		Endpoint:         computeFake.Endpoint(),
		HTTPClient:       computeFake.Client(),
		PollInterval:     20 * time.Millisecond,
		OperationTimeout: 10 * time.Second,
	})
}

// fakeProber stands in for the TCP/HTTP probe of the proxy port: envtest
// pods and fake instances have addresses nobody listens on.
type fakeProber struct {
	mu     sync.Mutex
	probes map[string]int
	closed map[string]bool // addresses whose port refuses connections
}

func (p *fakeProber) Probe(_ context.Context, t proxyprobe.Target) proxyprobe.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probes[t.Address]++
	if p.closed[t.Address] {
		return proxyprobe.Result{Latency: time.Millisecond, Err: errors.New("connection refused")}
	}
	return proxyprobe.Result{OK: true, Latency: time.Millisecond}
}

// dial is the port watch's dialer, agreeing with Probe: the fake
// addresses are never dialed for real.
func (p *fakeProber) dial(_ context.Context, _, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed[host] {
		return nil, errors.New("connection refused")
	}
	c, other := net.Pipe()
	_ = other.Close()
	return c, nil
}

// ProbeWithoutCredentials answers as squid with Basic auth does.
func (p *fakeProber) ProbeWithoutCredentials(context.Context, proxyprobe.Target) proxyprobe.Result {
	return proxyprobe.Result{OK: true, Through: true, StatusCode: http.StatusProxyAuthRequired, Latency: time.Millisecond}
}

// closePort makes probes of addr fail as a closed (or firewalled) port does.
func (p *fakeProber) closePort(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed == nil {
		p.closed = map[string]bool{}
	}
	p.closed[addr] = true
}

func (p *fakeProber) count(addr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.probes[addr]
}

// managerConfig varies what a harness enables.
type managerConfig struct {
	// gcp constructs the gcp provider on first use.
	gcp provider.Constructor
	// registryBackoff, when set, replaces the registry's retry backoff
	// after a failed construction.
	registryBackoff time.Duration
}

// harness is one running manager wired like main.go with providers
// kubernetes and gcp enabled.
type harness struct {
	cancel   context.CancelFunc
	done     chan struct{}
	registry *provider.Registry
	proxy    *controllers.ProxyReconciler
	gc       *controllers.OrphanCollector
}

func startManager(mc managerConfig) *harness {
	mctx, cancel := context.WithCancel(context.Background())
	m, err := ctrl.NewManager(cfg, controllers.ManagerOptions(ctrl.Options{
		Scheme: scheme,
		// As main.go does with the kubernetes provider enabled: only our
		// pods and ConfigMaps are cached; foreign ones are read through
		// the API reader.
		Cache:                  cache.Options{ByObject: kubernetes.CacheByObject()},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	}))
	Expect(err).NotTo(HaveOccurred())

	registry := provider.NewRegistry()
	if mc.registryBackoff > 0 {
		registry.Backoff = func(int) time.Duration { return mc.registryBackoff }
	}
	// As main.go builds it: with the watch of the cluster's own ranges.
	kp, err := kubernetes.NewForManager(m, kubernetes.Options{InstallID: testInstallID})
	Expect(err).NotTo(HaveOccurred())
	registry.Add(kp)
	registry.Register(gcp.Name, mc.gcp)

	w, err := controllers.Setup(mctx, m, controllers.Deps{
		Registry:  registry,
		Prober:    prober,
		Tag:       testTag,
		InstallID: testInstallID,
		Proxy: controllers.ProxyOptions{
			ProbeInterval:         time.Second,
			ProvisionPollInterval: 200 * time.Millisecond,
			AddressTimeout:        time.Minute,
			ResyncInterval:        resyncInterval,
			Workers:               4,
			PortWatch:             portwatch.Options{Dial: prober.dial},
		},
		// The sweep never ticks during the suite; specs call Sweep directly.
		Sweep: controllers.SweepOptions{Interval: time.Hour},
	})
	Expect(err).NotTo(HaveOccurred())
	h := &harness{cancel: cancel, done: make(chan struct{}), registry: registry, proxy: w.Proxy, gc: w.Sweep}

	go func() {
		defer GinkgoRecover()
		defer close(h.done)
		Expect(m.Start(mctx)).To(Succeed())
	}()
	return h
}

func (h *harness) stop() {
	h.cancel()
	Eventually(h.done).WithTimeout(30 * time.Second).Should(BeClosed())
}
