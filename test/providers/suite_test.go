package providers

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/controllers"
	"crawl.example.com/proxy-operator/pkg/portwatch"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/gcp"
	"crawl.example.com/proxy-operator/pkg/provider/gcp/gcptest"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
	"crawl.example.com/proxy-operator/test/harness"
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
	env       *harness.Env
	k8sClient client.Client
	// computeFake is the Compute Engine API behind the gcp provider.
	computeFake *gcptest.Server
	prober      = harness.NewProber()
	// mgr is the running manager; a spec that needs another replaces it
	// (harness.Replace).
	mgr *harness.Manager[*controllers.Wiring]
)

// operator is the operator as main.go wires it.
var operator = harness.Operator[controllers.Deps, *controllers.Wiring]{ManagerOptions: controllers.ManagerOptions, Setup: controllers.Setup}

func TestProviders(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Providers Suite")
}

var _ = BeforeSuite(func() {
	harness.LogToGinkgo()
	env = harness.StartEnv(harness.EnvOptions{})
	DeferCleanup(env.Stop)
	k8sClient = env.Client

	computeFake = gcptest.NewServer()
	DeferCleanup(computeFake.Close)
	mgr = startManager(managerConfig{})
	// Cleanups run last-in first-out: the manager stops first.
	DeferCleanup(func() { mgr.Stop() })
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

// managerConfig is how a spec's manager differs from the suite's (the zero
// value).
type managerConfig struct {
	// gcp constructs the gcp provider on first use; nil: fakeGCP.
	gcp provider.Constructor
	// registryBackoff, when set, replaces the registry's retry backoff
	// after a failed construction.
	registryBackoff time.Duration
	// slowRequeues, when set, gives a Ready Proxy its next probe and
	// resync only after an hour: nothing but a watch wakes it sooner.
	slowRequeues bool
}

// startManager starts a manager wired like main.go with providers
// kubernetes and gcp enabled.
func startManager(mc managerConfig) *harness.Manager[*controllers.Wiring] {
	// As main.go does with the kubernetes provider enabled: only our pods
	// and ConfigMaps are cached; foreign ones are read through the API
	// reader.
	cached := harness.ManagerConfig{Cache: cache.Options{ByObject: kubernetes.CacheByObject()}}
	return operator.Start(env, cached, func(m ctrl.Manager) controllers.Deps {
		registry := provider.NewRegistry()
		if mc.registryBackoff > 0 {
			registry.Backoff = func(int) time.Duration { return mc.registryBackoff }
		}
		// As main.go builds it: with the watch of the cluster's own ranges.
		kp, err := kubernetes.NewForManager(m, kubernetes.Options{InstallID: testInstallID})
		Expect(err).NotTo(HaveOccurred())
		registry.Add(kp)
		if mc.gcp == nil {
			mc.gcp = fakeGCP
		}
		registry.Register(gcp.Name, mc.gcp)
		d := suiteDeps(registry)
		if mc.slowRequeues {
			d.Proxy.ProbeInterval, d.Proxy.ResyncInterval = time.Hour, time.Hour
		}
		return d
	})
}

// suiteDeps is what every manager of the suite is given besides its
// providers.
func suiteDeps(registry *provider.Registry) controllers.Deps {
	return controllers.Deps{
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
			PortWatch:             portwatch.Options{Dial: prober.Dial},
		},
		// The sweep never ticks during the suite; specs call Sweep directly.
		Sweep: controllers.SweepOptions{Interval: time.Hour},
	}
}
