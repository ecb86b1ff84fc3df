package controllers

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt/socket"
	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/zap/zapcore"
	"golang.org/x/crypto/ssh"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/logkeys"
	"crawl.example.com/proxy-operator/pkg/portwatch"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn/sshtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

const (
	secretNamespace = "kvm-system"
	testTag         = "envtest"
	testInstallID   = "envtest-install"
)

var (
	suiteT    *testing.T
	testEnv   *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
	scheme    = envtestutil.Scheme()
	hosts     *fleet
	prober    = &fakeProber{down: map[string]bool{}}
	// published records every list the pool controller publishes.
	published  = &publishRecorder{}
	rpcMetrics *virt.PrometheusObserver
	mgr        *harness
)

func TestControllers(t *testing.T) {
	suiteT = t
	RegisterFailHandler(Fail)
	// Gomega's 1 s default is a race with a loaded CI machine; a spec that
	// means "at once" says its own bound.
	SetDefaultEventuallyTimeout(10 * time.Second)
	RunSpecs(t, "Controllers Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(logkeys.Wrap(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true), zap.Level(zapcore.InfoLevel))))
	var err error
	testEnv, err = envtestutil.New(false)
	Expect(err).NotTo(HaveOccurred())
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	Expect(k8sClient.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretNamespace}})).To(Succeed())

	hosts = newFleet()
	rpcMetrics, err = virt.NewPrometheusObserver(metrics.Registry)
	Expect(err).NotTo(HaveOccurred())
	Expect(metrics.Registry.Register(NewProxyPhaseCollector(k8sClient))).To(Succeed())
	mgr = startManager()
})

var _ = AfterSuite(func() {
	if mgr != nil {
		mgr.stop()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// fleet is the test's hypervisors: an in-process SSH server (real handshake,
// strict host keys, keys from Secrets) in front of an in-memory libvirt.
type fleet struct {
	mu        sync.Mutex
	hosts     map[string]*testHost
	signer    ssh.Signer
	clientKey []byte
}

type testHost struct {
	name string
	ssh  *sshtest.Server
	fake *fake.Fake
}

func newFleet() *fleet {
	signer, pem := sshtest.NewKey(suiteT)
	return &fleet{hosts: map[string]*testHost{}, signer: signer, clientKey: pem}
}

// add starts a host (opts size it) and returns it; createKVMHost registers
// it in the API.
func (f *fleet) add(name string, opts ...fake.Option) *testHost {
	h := &testHost{name: name, fake: kvmtest.NewHost(opts...)}
	// The SSH server forwards the libvirt socket to a pipe: the pool's
	// libvirt client for this host is the fake (see newLibvirt).
	h.ssh = sshtest.NewServer(suiteT, sshtest.Config{
		AuthorizedKeys: []ssh.PublicKey{f.signer.PublicKey()},
		Forward: func(string) (net.Conn, error) {
			a, b := net.Pipe()
			go func() { _, _ = b.Read(make([]byte, 1)); _ = b.Close() }()
			return a, nil
		},
	})
	f.mu.Lock()
	f.hosts[name] = h
	f.mu.Unlock()
	return h
}

func (f *fleet) get(name string) *testHost {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hosts[name]
}

func (f *fleet) newLibvirt(host string, _ socket.Dialer) conn.Libvirt {
	h := f.get(host)
	if h == nil {
		return fake.New().Connect() // unknown: a daemon with nothing in it
	}
	return h.fake.Connect()
}

// secretData is the SSH Secret for host h.
func (f *fleet) secretData(h *testHost) map[string][]byte {
	return map[string][]byte{crawlv1.SSHPrivateKeyKey: f.clientKey, crawlv1.KnownHostsKey: h.ssh.KnownHosts()}
}

// fakeProber stands in for the TCP/HTTP probe of the proxy port, and its
// dial for the port watch's: the fake guests' addresses are never dialed
// for real.
type fakeProber struct {
	requiresAuth
	mu   sync.Mutex
	down map[string]bool
	// listener: an address whose port is a real loopback address (a spec's
	// "squid"): probe and port watch both dial it and see what it does.
	listener map[string]string
	// egress: what an address-echo URL answers through the proxy at an
	// address, or at any other ("*"); none: no egress address.
	egress map[string]string
}

func (p *fakeProber) Probe(ctx context.Context, t proxyprobe.Target) proxyprobe.Result {
	p.mu.Lock()
	to, listening := p.listener[t.Address]
	down := p.down[t.Address]
	p.mu.Unlock()
	if listening {
		return proxyprobe.TCP{Timeout: time.Second}.Probe(ctx, proxyprobe.Target{Address: "127.0.0.1", Port: int32(portOf(to))})
	}
	if down {
		return proxyprobe.Result{Err: errors.New("connection refused"), Latency: time.Millisecond}
	}
	p.mu.Lock()
	egress, ok := p.egress[t.Address]
	if !ok {
		egress = p.egress["*"]
	}
	p.mu.Unlock()
	return proxyprobe.Result{OK: true, Latency: time.Millisecond, EgressAddress: egress}
}

// setEgress makes the probe through addr see egress (empty: nothing).
func (p *fakeProber) setEgress(addr, egress string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.egress == nil {
		p.egress = map[string]string{}
	}
	p.egress[addr] = egress
}

func (p *fakeProber) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	to, listening := p.listener[host]
	down := p.down[host]
	p.mu.Unlock()
	if listening {
		return (&net.Dialer{}).DialContext(ctx, network, to)
	}
	if down {
		return nil, errors.New("connection refused")
	}
	c, other := net.Pipe()
	_ = other.Close()
	return c, nil
}

// listenAt makes addr's proxy port the loopback address to; the cleanup
// undoes it.
func (p *fakeProber) listenAt(addr, to string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listener == nil {
		p.listener = map[string]string{}
	}
	p.listener[addr] = to
	DeferCleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.listener, addr)
	})
}

func portOf(hostPort string) int {
	_, port, err := net.SplitHostPort(hostPort)
	Expect(err).NotTo(HaveOccurred())
	n, err := strconv.Atoi(port)
	Expect(err).NotTo(HaveOccurred())
	return n
}

func (p *fakeProber) setDown(addr string, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down[addr] = down
}

// harness is one running manager with its own provider and connections,
// so a test can stop it and start another (a manager restart).
type harness struct {
	cancel   context.CancelFunc
	done     chan struct{}
	provider *kvm.Provider
	proxy    *ProxyReconciler
	gc       *OrphanCollector
	registry *provider.Registry
	// client reads through the manager's cache, as reconcilers do.
	client client.Client
	// metricsAddr serves the manager's Prometheus metrics.
	metricsAddr string
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().String()
}

// startManager starts the suite's manager; tune, if given, changes its Proxy
// options (e.g. a slower provision poll).
func startManager(tune ...func(*ProxyOptions)) *harness {
	return startManagerLogging(logr.Logger{}, tune...)
}

// startManagerLogging is startManager with log as the logger of the
// manager, its controllers and the kvm provider and pool; the zero
// Logger keeps the suite's.
func startManagerLogging(log logr.Logger, tune ...func(*ProxyOptions)) *harness {
	ctx, cancel := context.WithCancel(context.Background())
	metricsAddr := freeAddr()
	m, err := ctrl.NewManager(cfg, ManagerOptions(ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: metricsAddr},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}, Logger: log}))
	Expect(err).NotTo(HaveOccurred())

	proxyOpts := ProxyOptions{
		ProbeInterval: time.Second, ProvisionPollInterval: 200 * time.Millisecond,
		AddressTimeout: time.Minute, ResyncInterval: 10 * time.Minute, // only events re-read a Ready proxy
		Workers:   8,
		PortWatch: portwatch.Options{Dial: prober.dial},
	}
	for _, t := range tune {
		t(&proxyOpts)
	}
	w, err := Setup(ctx, m, Deps{
		Registry:  provider.NewRegistry(),
		Prober:    prober,
		Tag:       testTag,
		InstallID: testInstallID,
		Proxy:     proxyOpts,
		Pool:      PoolOptions{Workers: 4, OnPublished: published.record},
		// The sweep never ticks during the suite; specs call Sweep directly.
		Sweep: SweepOptions{Interval: time.Hour},
		KVM: &KVMDeps{
			Hosts: &kvm.KubeHosts{Reader: m.GetClient(), SecretReader: m.GetAPIReader(), SecretNamespace: secretNamespace},
			PoolOptions: conn.Options{
				// Above the blackholed-host spec's 700 ms check timeout, and
				// room for a loaded CI machine.
				HandshakeTimeout:  5 * time.Second,
				KeepaliveInterval: 200 * time.Millisecond,
				NewLibvirt:        hosts.newLibvirt,
				Logger:            log,
			},
			Logger:                log,
			Observer:              rpcMetrics,
			CheckInterval:         time.Second,
			ImageProgressInterval: 100 * time.Millisecond,
			HostWorkers:           8,
			ImageWorkers:          8,
		},
	})
	Expect(err).NotTo(HaveOccurred())
	h := &harness{cancel: cancel, done: make(chan struct{}), provider: w.KVM, proxy: w.Proxy, gc: w.Sweep, registry: w.Registry, client: m.GetClient(), metricsAddr: metricsAddr}
	go func() {
		defer GinkgoRecover()
		defer close(h.done)
		Expect(m.Start(ctx)).To(Succeed())
	}()
	return h
}

func (h *harness) stop() {
	h.cancel()
	Eventually(h.done).WithTimeout(30 * time.Second).Should(BeClosed())
}
