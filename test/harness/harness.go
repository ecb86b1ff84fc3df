// Package harness is the one envtest harness of the Ginkgo suites that run
// the operator against a real kube-apiserver (controllers, test/providers):
// an API server with the project's CRDs and, optionally, its webhooks
// (StartEnv), a manager wired through controllers.Setup as main.go wires it
// (Operator.Start), a spec's own manager in place of the suite's (Replace),
// the fake prober, and the suites' logging. Each suite keeps only its own
// fakes (the kvm hosts; the gcp fake and the kubernetes provider) and the
// Deps it builds from them.
//
// It does not import package controllers: controllers' own suite is an
// internal test of that package, and could not import a package that
// imports it. A suite hands controllers.ManagerOptions and controllers.Setup
// in as an Operator. Only tests import this package.
package harness

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/go-logr/logr"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"go.uber.org/zap/zapcore"

	kruntime "k8s.io/apimachinery/pkg/runtime"
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
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"crawl.example.com/proxy-operator/internal/logkeys"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

// Logger writes to w in zap's development format up to verbosity v (0:
// Info; 2: the V(2) payloads), with repeated keys merged as main.go's
// logger merges them.
func Logger(w io.Writer, v int) logr.Logger {
	return logkeys.Wrap(zap.New(zap.WriteTo(w), zap.UseDevMode(true), zap.Level(zapcore.Level(-v))))
}

// LogToGinkgo makes controller-runtime log at Info into the spec's output
// (shown for a failed spec, or with -v).
func LogToGinkgo() {
	logf.SetLogger(Logger(ginkgo.GinkgoWriter, 0))
}

// EnvOptions say what the API server serves besides the project's API.
type EnvOptions struct {
	// Webhooks installs the project's webhook configurations (config/webhook)
	// pointing at a local port with generated serving certificates; a
	// manager serves them (ManagerConfig.Webhooks).
	Webhooks bool
	// CRDDirs, when set, replace config/crd/bases (e.g. a copy whose
	// enums admit a provider that exists only in a test).
	CRDDirs []string
}

// Env is a running kube-apiserver and etcd (envtest).
type Env struct {
	Config *rest.Config
	// Client talks to the API server directly, without a cache.
	Client client.Client
	Scheme *kruntime.Scheme
	env    *envtest.Environment
}

// StartEnv starts an API server. Without KUBEBUILDER_ASSETS it fails,
// saying how to get the binaries; it never skips.
func StartEnv(o EnvOptions) *Env {
	env, err := envtestutil.New(o.Webhooks)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	if o.CRDDirs != nil {
		env.CRDDirectoryPaths = o.CRDDirs
	}
	e := &Env{Scheme: envtestutil.Scheme(), env: env}
	e.Config, err = env.Start()
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	e.Client, err = client.New(e.Config, client.Options{Scheme: e.Scheme})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return e
}

// Stop stops the API server; stop its managers first, or it waits on
// their watches.
func (e *Env) Stop() {
	gomega.Expect(e.env.Stop()).To(gomega.Succeed())
}

// FreeAddr returns a loopback address nobody listens on (yet).
func FreeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	defer l.Close()
	return l.Addr().String()
}

// Operator is the operator's wiring as main.go calls it: a suite sets
// controllers.ManagerOptions and controllers.Setup (D is controllers.Deps,
// W *controllers.Wiring).
type Operator[D, W any] struct {
	ManagerOptions func(ctrl.Options) ctrl.Options
	Setup          func(context.Context, ctrl.Manager, D) (W, error)
}

// ManagerConfig is how a suite's manager differs from the default one: no
// metrics server, no webhooks, the global logger, the operator's cache.
type ManagerConfig struct {
	// Logger is the manager's and its controllers'; zero: the global one.
	Logger logr.Logger
	// Cache is the cache configuration before the operator's own
	// (main.go's with the kubernetes provider enabled, say).
	Cache cache.Options
	// Metrics serves the manager's Prometheus metrics on a free loopback
	// address (Manager.MetricsAddr).
	Metrics bool
	// Webhooks registers admission webhooks on the manager, served where
	// the Env (started with Webhooks) sends them; Start waits until they
	// listen.
	Webhooks func(ctrl.Manager) error
	// Neighbours registers controllers that are not the operator's but
	// that a cluster would run beside it (an IPAM provider, say).
	Neighbours func(ctrl.Manager) error
}

// Manager is one running manager, so a spec can stop it and start another
// (a manager restart).
type Manager[W any] struct {
	// Wiring is what Setup returned (the reconcilers, the sweep, the
	// registry).
	Wiring W
	// Client reads through the manager's cache, as reconcilers do.
	Client client.Client
	// MetricsAddr serves the Prometheus metrics (ManagerConfig.Metrics).
	MetricsAddr string
	cancel      context.CancelFunc
	done        chan struct{}
}

// Start starts a manager on env wired by Setup with the Deps that deps
// builds for it (most fakes need the manager's client).
func (o Operator[D, W]) Start(env *Env, mc ManagerConfig, deps func(ctrl.Manager) D) *Manager[W] {
	opts := ctrl.Options{
		Scheme:                 env.Scheme,
		Cache:                  mc.Cache,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Every spec's manager registers the same controller names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		Logger:     mc.Logger,
	}
	if mc.Metrics {
		opts.Metrics.BindAddress = FreeAddr()
	}
	if mc.Webhooks != nil {
		install := &env.env.WebhookInstallOptions
		opts.WebhookServer = webhook.NewServer(webhook.Options{
			Host: install.LocalServingHost, Port: install.LocalServingPort, CertDir: install.LocalServingCertDir,
		})
	}
	m, err := ctrl.NewManager(env.Config, o.ManagerOptions(opts))
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	if mc.Webhooks != nil {
		gomega.Expect(mc.Webhooks(m)).To(gomega.Succeed())
	}
	if mc.Neighbours != nil {
		gomega.Expect(mc.Neighbours(m)).To(gomega.Succeed())
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := o.Setup(ctx, m, deps(m))
	if err != nil {
		cancel()
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	h := &Manager[W]{Wiring: w, Client: m.GetClient(), cancel: cancel, done: make(chan struct{})}
	if mc.Metrics {
		h.MetricsAddr = opts.Metrics.BindAddress
	}
	go func() {
		defer ginkgo.GinkgoRecover()
		defer close(h.done)
		gomega.Expect(m.Start(ctx)).To(gomega.Succeed())
	}()
	if mc.Webhooks != nil {
		// The API server calls the webhooks over TLS; wait until they listen.
		gomega.Eventually(func() error { return m.GetWebhookServer().StartedChecker()(nil) }).WithTimeout(30 * time.Second).Should(gomega.Succeed())
	}
	return h
}

// Stop stops the manager and waits until it has; stopping it again does
// nothing.
func (m *Manager[W]) Stop() {
	m.cancel()
	gomega.Eventually(m.done).WithTimeout(30 * time.Second).Should(gomega.BeClosed())
}

// Replace stops the suite's manager (*current) and runs the rest of the
// spec on start(c) instead, which it returns; after the spec that one
// stops and start's default (the zero C) takes its place. Only one manager
// runs at a time: two would reconcile the same objects.
func Replace[C any, W any](current **Manager[W], start func(C) *Manager[W], c C) *Manager[W] {
	(*current).Stop()
	*current = start(c)
	ginkgo.DeferCleanup(func() {
		(*current).Stop()
		var suites C
		*current = start(suites)
	})
	return *current
}
