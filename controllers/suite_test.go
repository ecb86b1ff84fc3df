package controllers

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt/socket"
	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/crypto/ssh"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/portwatch"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn/sshtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
	"crawl.example.com/proxy-operator/test/envtestutil"
	"crawl.example.com/proxy-operator/test/harness"
	"crawl.example.com/proxy-operator/test/ipamtest"
)

const (
	secretNamespace = "kvm-system"
	testTag         = "envtest"
	testInstallID   = "envtest-install"
)

var (
	suiteT    *testing.T
	env       *harness.Env
	cfg       *rest.Config
	k8sClient client.Client
	scheme    = envtestutil.Scheme()
	hosts     *fleet
	prober    = harness.NewProber()
	// published records every list the pool controller publishes.
	published  = &publishRecorder{}
	rpcMetrics *virt.PrometheusObserver
	// mgr is the running manager; a spec that needs another replaces it
	// (harness.Replace) or restarts it.
	mgr *harness.Manager[*Wiring]
)

// operator is the operator as main.go wires it.
var operator = harness.Operator[Deps, *Wiring]{ManagerOptions: ManagerOptions, Setup: Setup}

func TestControllers(t *testing.T) {
	suiteT = t
	RegisterFailHandler(Fail)
	// Gomega's 1 s default is a race with a loaded CI machine; a spec that
	// means "at once" says its own bound.
	SetDefaultEventuallyTimeout(10 * time.Second)
	RunSpecs(t, "Controllers Suite")
}

var _ = BeforeSuite(func() {
	harness.LogToGinkgo()
	env = harness.StartEnv(harness.EnvOptions{})
	DeferCleanup(env.Stop)
	cfg, k8sClient = env.Config, env.Client
	Expect(k8sClient.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretNamespace}})).To(Succeed())

	hosts = newFleet()
	var err error
	rpcMetrics, err = virt.NewPrometheusObserver(metrics.Registry)
	Expect(err).NotTo(HaveOccurred())
	Expect(metrics.Registry.Register(NewProxyPhaseCollector(k8sClient))).To(Succeed())
	mgr = startManager(managerConfig{})
	// Cleanups run last-in first-out: the manager stops before the API
	// server, which would otherwise wait on its watches.
	DeferCleanup(func() { mgr.Stop() })
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

// managerConfig is how a spec's manager differs from the suite's (the zero
// value).
type managerConfig struct {
	// log is the logger of the manager, its controllers and the kvm
	// provider and pool; zero: the suite's.
	log logr.Logger
	// proxy changes the Proxy options (e.g. a slower provision poll).
	proxy func(*ProxyOptions)
	// namespaces, when set, are the only ones the manager serves
	// (--namespaces).
	namespaces []string
}

// startManager starts a manager wired as the suite's, changed by mc.
func startManager(mc managerConfig) *harness.Manager[*Wiring] {
	served := harness.ManagerConfig{Logger: mc.log, Metrics: true, Cache: ServeNamespaces(cache.Options{}, mc.namespaces),
		// An IPAM provider serving the suite's pools, as a cluster with one
		// installed would.
		Neighbours: (&ipamtest.Provider{Pools: ipamPools()}).SetupWithManager}
	return operator.Start(env, served, func(m ctrl.Manager) Deps {
		proxyOpts := ProxyOptions{
			ProbeInterval: time.Second, ProvisionPollInterval: 200 * time.Millisecond,
			AddressTimeout: time.Minute, ResyncInterval: 10 * time.Minute, // only events re-read a Ready proxy
			Workers:   8,
			PortWatch: portwatch.Options{Dial: prober.Dial},
		}
		if mc.proxy != nil {
			mc.proxy(&proxyOpts)
		}
		return Deps{
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
					Logger:            mc.log,
				},
				Logger:                mc.log,
				Observer:              rpcMetrics,
				CheckInterval:         time.Second,
				ImageProgressInterval: 100 * time.Millisecond,
				HostWorkers:           8,
				ImageWorkers:          8,
			},
		}
	})
}
