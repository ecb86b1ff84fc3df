// Command manager runs the proxy operator: the Proxy, ProxyPool, KVMHost and
// KVMImage controllers, their admission webhooks, the orphan sweep and the
// provider registry.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/controllers"
	"crawl.example.com/proxy-operator/internal/logkeys"
	"crawl.example.com/proxy-operator/internal/memlimit"
	"crawl.example.com/proxy-operator/internal/metricsauth"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	webhookv1 "crawl.example.com/proxy-operator/internal/webhook/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/gcp"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(crawlv1.AddToScheme(scheme))
	// Proxies with a static address claim it through Cluster API IPAM.
	utilruntime.Must(ipamv1.AddToScheme(scheme))
}

// options are the manager's flags.
type options struct {
	metricsAddr          string
	metricsSecure        bool
	probeAddr            string
	leaderElect          bool
	leaderElectNamespace string
	webhookPort          int
	webhookCertDir       string
	enableWebhooks       bool
	enableHTTP2          bool
	allowProxyImageURLs  bool
	allowProxyUserData   bool
	// destinationGrants is --allow-destination-exceptions as given;
	// validate parses it into grants.
	destinationGrants string
	grants            proxyaccess.Grants
	managerNamespace  string
	// namespaces is --namespaces as given; validate parses it into
	// served.
	namespaces string
	served     []string

	providers       string
	tag             string
	installID       string
	checkInterval   time.Duration
	checkTimeout    time.Duration
	sshKeyDir       string
	maxUploads      int
	maxUploadsTotal int
	maxCalls        int
	memLimitRatio   float64

	proxyProbeURL         string
	egress                controllers.EgressOptions
	probeSourceCIDRs      string
	proxyProbeInterval    time.Duration
	proxyProbeThreshold   int
	provisionPollInterval time.Duration
	addressTimeout        time.Duration
	resyncInterval        time.Duration
	gcInterval            time.Duration
	gcVolumeGrace         time.Duration
	providerCallTimeout   time.Duration
	proxyConcurrency      int
	hostConcurrency       int

	kubernetes kubernetes.Options
	gcp        gcp.Options
}

func (o *options) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "Address the metrics endpoint binds to; \"0\" disables it.")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS to authenticated and authorized clients only (get on /metrics); false serves plain HTTP to anyone (not recommended).")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address the health probe endpoint binds to.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Enable leader election so only one manager is active.")
	fs.StringVar(&o.leaderElectNamespace, "leader-election-namespace", "", "Namespace of the leader election lease (in-cluster namespace when empty).")
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "Port the admission webhook server listens on.")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "", "Directory with tls.crt/tls.key for the webhook server (controller-runtime's default when empty).")
	fs.BoolVar(&o.enableWebhooks, "enable-webhooks", true, "Serve the admission webhooks.")
	fs.BoolVar(&o.enableHTTP2, "enable-http2", false, "Serve HTTP/2 on the webhook and metrics servers (off: CVE-2023-44487 rapid reset).")
	managerNamespace := os.Getenv("POD_NAMESPACE") // the downward API in config/manager
	if managerNamespace == "" {
		managerNamespace = "proxy-operator-system" // config/default's, for local runs
	}
	fs.StringVar(&o.namespaces, strings.TrimPrefix(controllers.NamespacesFlag, "--"), "", "Comma-separated namespaces whose Proxies, ProxyPools and their Secrets, Pods, ConfigMaps, Services and NetworkPolicies the manager serves; others it does not see. Empty: every namespace. KVMHosts, KVMImages, Nodes and ServiceCIDRs are cluster-scoped and always served. config/namespaced grants RBAC for such a manager through Roles only.")
	fs.StringVar(&o.managerNamespace, "manager-namespace", managerNamespace, "The manager's namespace, the only one KVMHosts' SSH Secrets are read from (default: $POD_NAMESPACE, else proxy-operator-system).")
	fs.BoolVar(&o.allowProxyImageURLs, "allow-proxy-image-urls", false, "Admit Proxies whose spec.placement.image is a URL, which the manager downloads from inside the cluster (SSRF); otherwise only KVMImage names, which cluster admins create.")
	fs.BoolVar(&o.allowProxyUserData, "allow-proxy-user-data", true, "Admit Proxies with spec.cloudInit (userData, userDataBase64, vendorData). On kvm and gcp it runs as root on the instance, on the hypervisor's network or in the VPC, and can listen where squid should; false refuses it (admission and controller), leaving the operator's managed squid.")
	fs.StringVar(&o.destinationGrants, "allow-destination-exceptions", "", "Comma-separated CIDRs inside loopback, link-local (cloud metadata at 169.254.169.254) or a metadata address that Proxies may list in spec.access.allowedDestinationExceptions; without them such exceptions are refused (admission and controller). Exceptions in private ranges need no grant.")

	fs.StringVar(&o.providers, "providers", "kvm,kubernetes", "Comma-separated providers to enable: kvm, kubernetes, gcp.")
	fs.StringVar(&o.tag, "instance-tag", "proxy-operator", "Tag written on every instance; the orphan sweep only considers instances with it (and with this install's id).")
	fs.StringVar(&o.installID, "install-id", "", "Id of this operator install, written on every instance; the orphan sweep only deletes instances carrying it. Empty: the UID of the kube-system namespace. Set it only for a second install in the same cluster.")
	fs.DurationVar(&o.checkInterval, "provider-check-interval", crawlv1.DefaultCheckInterval, "Default interval between KVM host health checks (a KVMHost's spec.checkInterval overrides it).")
	fs.DurationVar(&o.checkTimeout, "provider-check-timeout", 0, "Default bound of one health check; 0 derives min(15s, interval). Must not exceed the interval.")
	fs.StringVar(&o.sshKeyDir, "ssh-key-dir", "/etc/kvm-ssh", "Directory with ssh-privatekey and known_hosts (the mounted kvm-ssh Secret) for KVMHosts without sshKeySecretRef.")
	fs.IntVar(&o.maxUploads, "max-uploads-per-host", 2, "Concurrent image uploads allowed per KVM host.")
	fs.Float64Var(&o.memLimitRatio, "memory-limit-ratio", 0.8, "Soft memory limit (the Go runtime's GOMEMLIMIT) as this share of the container's memory limit (its cgroup's); the rest is for memory-backed /tmp and what the runtime does not count. 0: none. A GOMEMLIMIT in the environment takes precedence.")
	fs.IntVar(&o.maxUploadsTotal, "max-uploads", kvm.DefaultMaxUploads, "Concurrent image uploads over all KVM hosts (each holds some MiB of buffers in the manager). Negative: no bound.")
	fs.IntVar(&o.maxCalls, "max-calls-per-host", 0, "Provider calls (create, get, delete, list) in flight per KVM host; more fail at once as host busy. 0: a quarter of --proxy-concurrency, at least 1.")

	fs.StringVar(&o.proxyProbeURL, "proxy-probe-url", "", "URL requested through each proxy, with its credential (expects a 2xx answer); Ready then means a request went through. An answer that echoes an address (one IP, or JSON with an \"ip\" field) is recorded as status.egressAddress (egressSource echo). Empty: a TCP connect to the port.")
	fs.StringVar(&o.egress.EchoURL, "egress-echo-url", "", "Address-echo URL requested through each proxy, with its credential, to measure its egress address (status.egressAddress, egressSource echo); the answer is one IP address or JSON with an \"ip\" field. A pool's spec.egress.echoURL overrides it for its replicas. May equal --proxy-probe-url. Empty: only a probe URL that echoes measures (docs/egress.md).")
	fs.DurationVar(&o.egress.Interval, "egress-echo-interval", controllers.DefaultEgressEchoInterval, "Interval between egress measurements of one instance; a new instance, or one whose address changed, is measured at its first healthy probe.")
	fs.DurationVar(&o.egress.StaleAfter, "egress-stale-after", controllers.DefaultEgressStaleAfter, "How long a measured egress address stands while echoes fail; then it is unknown (cleared).")
	fs.StringVar(&o.probeSourceCIDRs, "probe-source-cidrs", "", "Comma-separated source ranges of the manager's probes as the proxies see them (e.g. the pod CIDR of the manager's node, or its egress NAT address); every managed squid with Basic auth admits them, still requiring the credential. Empty: Proxies must list the manager's source in spec.access.allowedSourceCIDRs themselves.")
	fs.DurationVar(&o.proxyProbeInterval, "proxy-probe-interval", 30*time.Second, "Interval between probes of a Ready proxy.")
	fs.IntVar(&o.proxyProbeThreshold, "proxy-probe-failure-threshold", 3, "Consecutive probe failures before a healthy proxy is marked unhealthy.")
	fs.DurationVar(&o.provisionPollInterval, "provision-poll-interval", 5*time.Second, "Poll interval while an instance boots and has no address.")
	fs.DurationVar(&o.addressTimeout, "address-timeout", 10*time.Minute, "How long a running instance may go without an address before the Proxy is Failed.")
	fs.DurationVar(&o.resyncInterval, "resync-interval", 10*time.Minute, "Re-read a Ready proxy's instance this often even without provider events.")
	fs.DurationVar(&o.gcInterval, "gc-interval", 5*time.Minute, "Interval of the orphan-instance sweep (must be positive).")
	fs.DurationVar(&o.gcVolumeGrace, "gc-volume-grace", controllers.DefaultVolumeGrace, "How long the volumes a kvm domain of this install left behind (domain undefined outside the operator, Proxy gone) must stay unused before the sweep deletes them.")
	fs.DurationVar(&o.providerCallTimeout, "provider-call-timeout", controllers.DefaultProviderCallTimeout, "Backstop bound of each whole provider call (Create, Get, Delete) of a Proxy reconcile; each libvirt RPC in it also has its own deadline of seconds to minutes.")
	fs.IntVar(&o.proxyConcurrency, "proxy-concurrency", 16, "Concurrent Proxy reconciles.")
	fs.IntVar(&o.hostConcurrency, "kvmhost-concurrency", 64, "Concurrent KVMHost health checks (hosts beyond this wait for a worker).")

	o.kubernetes.BindFlags(fs)
	fs.StringVar(&o.gcp.Project, "gcp-project", "", "GCP project for Proxies with provider gcp.")
	fs.StringVar(&o.gcp.Zone, "gcp-zone", "", "Default GCP zone.")
	fs.StringVar(&o.gcp.MachineType, "gcp-machine-type", gcp.DefaultMachineType, "Default GCE machine type.")
	fs.StringVar(&o.gcp.Image, "gcp-image", gcp.DefaultImage, "Default GCE source image.")
	fs.StringVar(&o.gcp.Network, "gcp-network", "", "GCE network (default network when empty).")
	fs.StringVar(&o.gcp.CredentialsFile, "gcp-credentials-file", "", "GCP credentials file (a mounted Secret); Application Default Credentials when empty.")
	fs.BoolVar(&o.gcp.NoExternalIP, "gcp-no-external-ip", false, "GCE instances get no external IP (egress through Cloud NAT; the internal IP is the endpoint).")
}

// validate rejects flags the manager could only fail on later (or panic
// on, like a zero ticker interval), before anything starts.
func (o *options) validate() error {
	d := o.deps(provider.NewRegistry())
	if err := d.Validate(); err != nil {
		return err
	}
	if err := crawlv1.ValidateCheckTiming(o.checkInterval, o.checkTimeout); err != nil {
		return fmt.Errorf("invalid --provider-check-interval/--provider-check-timeout: %w", err)
	}
	if o.installID != "" {
		if err := provider.ValidateInstallID(o.installID); err != nil {
			return fmt.Errorf("--install-id: %w", err)
		}
	}
	if err := o.kubernetes.Validate(); err != nil {
		return err
	}
	if o.memLimitRatio < 0 || o.memLimitRatio > 1 {
		return fmt.Errorf("--memory-limit-ratio %v: want 0 (none) up to 1", o.memLimitRatio)
	}
	grants, err := proxyaccess.ParseGrants(o.destinationGrants)
	if err != nil {
		return err
	}
	o.grants = grants
	if o.served, err = controllers.ParseNamespaces(o.namespaces); err != nil {
		return err
	}
	return nil
}

func main() {
	var o options
	o.bind(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(logkeys.Wrap(zap.New(zap.UseFlagOptions(&zapOpts))))
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}

// deps turns the flags into the controllers' dependencies (registry aside).
func (o *options) deps(registry *provider.Registry) controllers.Deps {
	d := controllers.Deps{
		Registry: registry,
		Plugins:  o.plugins(),
		Prober:   proxyprobe.TCP{},
		Tag:      o.tag,
		Proxy: controllers.ProxyOptions{
			ProbeInterval:              o.proxyProbeInterval,
			ProbeFailureThreshold:      int32(o.proxyProbeThreshold),
			ProvisionPollInterval:      o.provisionPollInterval,
			AddressTimeout:             o.addressTimeout,
			ResyncInterval:             o.resyncInterval,
			ProviderCallTimeout:        o.providerCallTimeout,
			Workers:                    o.proxyConcurrency,
			ProbeSourceCIDRs:           splitList(o.probeSourceCIDRs),
			DestinationExceptionGrants: o.grants,
			RefuseUserData:             !o.allowProxyUserData,
			Egress:                     o.egress,
		},
		Sweep: controllers.SweepOptions{Interval: o.gcInterval, VolumeGrace: o.gcVolumeGrace},
	}
	if o.proxyProbeURL != "" {
		d.Prober = proxyprobe.HTTP{URL: o.proxyProbeURL}
	}
	return d
}

// proxyWebhook is the Proxy webhook under the manager's policy; the
// controllers apply the same rules to stored Proxies (deps).
func (o *options) proxyWebhook() webhookv1.ProxyWebhook {
	return webhookv1.ProxyWebhook{AllowImageURLs: o.allowProxyImageURLs, DestinationExceptionGrants: o.grants,
		RefuseUserData: !o.allowProxyUserData, Plugins: o.plugins()}
}

// plugins are the providers' plug-ins under the manager's flags; the
// controllers and the webhooks get the same.
func (o *options) plugins() plugin.List {
	return controllers.PluginsFor(controllers.PluginOptions{GCPNoExternalIP: o.gcp.NoExternalIP})
}

// splitList splits a comma-separated flag value, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// setSoftMemoryLimit follows the container's memory limit with the
// runtime's soft limit, so that the collector works harder near it rather
// than the heap's garbage getting the manager OOM-killed (internal/memlimit). An
// operator's own GOMEMLIMIT wins; the runtime has applied it already.
func setSoftMemoryLimit(log logr.Logger, ratio float64) {
	if v := os.Getenv("GOMEMLIMIT"); v != "" || ratio == 0 {
		log.Info("Soft memory limit not derived from the container's", "GOMEMLIMIT", v, "ratio", ratio)
		return
	}
	limit, ok, err := memlimit.Limit(os.DirFS("/"), ratio)
	switch {
	case err != nil:
		log.Error(err, "Reading the container's memory limit; no soft memory limit set")
	case !ok:
		log.Info("No container memory limit; no soft memory limit set")
	default:
		debug.SetMemoryLimit(limit)
		log.Info("Soft memory limit set from the container's", "bytes", limit, "ratio", ratio)
	}
}

func run(o options) error {
	log := ctrl.Log.WithName("setup")
	// A bad flag is a clear message and exit 1, never a panic.
	if err := o.validate(); err != nil {
		return err
	}
	setSoftMemoryLimit(log, o.memLimitRatio)
	enabled, err := enabledProviders(o.providers)
	if err != nil {
		return err
	}
	mgr, err := o.newManager(enabled)
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	installID, err := controllers.ResolveInstallID(ctx, mgr.GetAPIReader(), o.installID)
	if err != nil {
		return err
	}
	if o.enableWebhooks {
		if err := o.setupWebhooks(mgr); err != nil {
			return err
		}
	}

	registry := provider.NewRegistry()
	deps := o.deps(registry)
	deps.InstallID = installID
	if enabled[kvm.Name] {
		if deps.KVM, err = o.kvmDeps(ctx, log, mgr); err != nil {
			return err
		}
	}
	if enabled[kubernetes.Name] {
		ko := o.kubernetes
		ko.InstallID = installID
		ko.ManagerNamespace = o.managerNamespace // its NetworkPolicies admit the manager's probes
		// Also watches the cluster's own ranges, which every squid refuses.
		kp, err := kubernetes.NewForManager(mgr, ko)
		if err != nil {
			return err
		}
		registry.Add(kp)
	}
	if enabled[gcp.Name] {
		gopts := o.gcp
		gopts.InstallID = installID
		// Built lazily and retried: missing credentials never stop the
		// manager or the other providers.
		registry.Register(gcp.Name, func(ctx context.Context) (provider.Provider, error) { return gcp.New(ctx, gopts) })
	}
	if _, err := controllers.Setup(ctx, mgr, deps); err != nil {
		return err
	}
	if err := metrics.Registry.Register(controllers.NewProxyPhaseCollector(mgr.GetClient())); err != nil {
		return err
	}

	if err := o.addHealthChecks(mgr); err != nil {
		return err
	}

	log.Info("starting manager", "providers", registry.Enabled(), "installID", installID, "checkInterval", o.checkInterval,
		"checkTimeout", crawlv1.EffectiveCheckTimeout(o.checkInterval, o.checkTimeout))
	return mgr.Start(ctx)
}

// enabledProviders parses --providers.
func enabledProviders(list string) (map[string]bool, error) {
	enabled := map[string]bool{}
	for _, p := range strings.Split(list, ",") {
		switch p = strings.TrimSpace(p); p {
		case "":
		case kvm.Name, kubernetes.Name, gcp.Name:
			enabled[p] = true
		default:
			return nil, fmt.Errorf("--providers: unknown provider %q (want kvm, kubernetes, gcp)", p)
		}
	}
	return enabled, nil
}

// newManager creates the manager: metrics, probes, leader election and the
// webhook server as the flags say, and the cache the enabled providers need.
func (o *options) newManager(enabled map[string]bool) (ctrl.Manager, error) {
	var tlsOpts []func(*tls.Config)
	if !o.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	return ctrl.NewManager(ctrl.GetConfigOrDie(), controllers.ManagerOptions(ctrl.Options{
		Scheme:                  scheme,
		Cache:                   o.cacheOptions(enabled),
		Metrics:                 metricsauth.ServerOptions(o.metricsAddr, o.metricsSecure, tlsOpts),
		HealthProbeBindAddress:  o.probeAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "proxy-operator.crawl.example.com",
		LeaderElectionNamespace: o.leaderElectNamespace,
		WebhookServer:           webhook.NewServer(webhook.Options{Port: o.webhookPort, CertDir: o.webhookCertDir, TLSOpts: tlsOpts}),
	}))
}

// cacheOptions are the cache the enabled providers need, over the
// namespaces --namespaces serves.
func (o *options) cacheOptions(enabled map[string]bool) cache.Options {
	cacheOpts := cache.Options{}
	if enabled[kubernetes.Name] {
		cacheOpts.ByObject = kubernetes.CacheByObject()
	}
	return controllers.ServeNamespaces(cacheOpts, o.served)
}

// setupWebhooks registers the admission webhooks of every kind.
func (o *options) setupWebhooks(mgr ctrl.Manager) error {
	// Admission knows the providers the controllers know.
	proxyWebhook := o.proxyWebhook()
	for name, setup := range map[string]func(ctrl.Manager) error{
		"KVMHost":  (&webhookv1.KVMHostWebhook{ManagerNamespace: o.managerNamespace}).SetupWithManager,
		"KVMImage": (&webhookv1.KVMImageWebhook{}).SetupWithManager,
		"Proxy":    proxyWebhook.SetupWithManager,
		// A pool's template is validated as its replicas will be.
		"ProxyPool": (&webhookv1.ProxyPoolWebhook{Proxy: proxyWebhook}).SetupWithManager,
	} {
		if err := setup(mgr); err != nil {
			return fmt.Errorf("create %s webhook: %w", name, err)
		}
	}
	return nil
}

// kvmDeps is what the kvm provider needs from the flags and the manager.
func (o *options) kvmDeps(ctx context.Context, log logr.Logger, mgr ctrl.Manager) (*controllers.KVMDeps, error) {
	rpcObserver, err := virt.NewPrometheusObserver(metrics.Registry)
	if err != nil {
		return nil, err
	}
	defaultMaterial := conn.FileMaterial(o.sshKeyDir)
	// Unreadable material is a warning, never a reason to stop: KVMHosts
	// with their own Secret, and the other providers, work without it.
	if _, err := defaultMaterial(ctx); err != nil {
		log.Info(fmt.Sprintf("WARNING: default SSH material in %s not usable yet (KVMHosts without sshKeySecretRef will report SSHMaterialMissing until it is): %v", o.sshKeyDir, err))
	}
	return &controllers.KVMDeps{
		Hosts:              &kvm.KubeHosts{Reader: mgr.GetClient(), SecretReader: mgr.GetAPIReader(), DefaultMaterial: defaultMaterial, SecretNamespace: o.managerNamespace},
		PoolOptions:        conn.Options{Logger: ctrl.Log.WithName("kvm-conn")},
		Observer:           rpcObserver,
		MaxUploadsPerHost:  o.maxUploads,
		MaxUploads:         o.maxUploadsTotal,
		MaxInFlightPerHost: o.maxCalls,
		Logger:             ctrl.Log.WithName("kvm"),
		CheckInterval:      o.checkInterval,
		CheckTimeout:       o.checkTimeout,
		HostWorkers:        o.hostConcurrency,
	}, nil
}

// addHealthChecks adds /healthz and /readyz; with webhooks, ready means
// the webhook server serves.
func (o *options) addHealthChecks(mgr ctrl.Manager) error {
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	readyCheck := healthz.Ping
	if o.enableWebhooks {
		readyCheck = mgr.GetWebhookServer().StartedChecker()
	}
	return mgr.AddReadyzCheck("readyz", readyCheck)
}
