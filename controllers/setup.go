package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/portwatch"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/gcp"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// specOrAnnotationChanged lets through what needs a reconcile: a new
// generation (spec changes and deletion) or annotations (skip-cleanup). Our
// own status writes do not: they would requeue every object at once after
// each reconcile, a hot loop of probes and provider calls. Periodic work is
// RequeueAfter's, provider changes come as events.
var specOrAnnotationChanged = predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{})

// Plugins is the registration list: the plug-in of every provider the
// operator knows (see package plugin), in the order messages name them.
// Generic code (the Proxy and ProxyPool controllers, the sweep, the
// webhooks) reaches a provider's own rules only through it; main.go gives
// the same list to the webhooks, and Setup uses it unless Deps.Plugins says
// otherwise. A new provider is one line here. Plugins is the list with
// every provider option at its default; main.go builds it from its flags.
func PluginsFor(o PluginOptions) plugin.List {
	return plugin.List{kvm.Plugin(), kubernetes.Plugin(), gcp.Plugin(o.GCPNoExternalIP)}
}

// Plugins is PluginsFor with every provider option at its default.
func Plugins() plugin.List { return PluginsFor(PluginOptions{}) }

// PluginOptions are the provider flags that change what a plug-in says.
type PluginOptions struct {
	// GCPNoExternalIP (--gcp-no-external-ip): gcp instances share the
	// region's Cloud NAT as their egress.
	GCPNoExternalIP bool
}

// ManagerOptions sets what every manager of this operator needs on opts (the
// classic work queue) and returns it. The priority queue, on by default in
// controller-runtime v0.24, can deadlock on shutdown
// (kubernetes-sigs/controller-runtime#3538, fixed after v0.24.1), so a
// rollout or leader hand-over would wait out the grace period; the classic
// rate-limited queue does not.
//
// It also restricts the cache of Secrets to the operator's own credential
// Secrets (CredentialsCacheOptions), unless the caller configured Secrets
// itself: the Proxy controller watches the Secrets it owns, and an
// unrestricted watch would hold every Secret of the cluster in memory.
//
// And, unless the caller set a default transform, cached objects are
// stripped of their managedFields: nothing here reads them, every write
// is a patch or an update that leaves them to the API server, and they
// are a large part of each cached Proxy (one entry per writer and
// subresource, each with its field set).
func ManagerOptions(opts ctrl.Options) ctrl.Options {
	opts.Controller = controllerConfig(opts.Controller)
	if opts.Cache.DefaultTransform == nil {
		opts.Cache.DefaultTransform = cache.TransformStripManagedFields()
	}
	for obj := range opts.Cache.ByObject {
		if _, ok := obj.(*corev1.Secret); ok {
			return opts
		}
	}
	byObject := maps.Clone(opts.Cache.ByObject)
	if byObject == nil {
		byObject = map[client.Object]cache.ByObject{}
	}
	byObject[&corev1.Secret{}] = CredentialsCacheOptions()
	opts.Cache.ByObject = byObject
	return opts
}

func controllerConfig(c config.Controller) config.Controller {
	c.UsePriorityQueue = ptr.To(false)
	return c
}

// Deps is everything Setup wires. main.go fills it from flags; the envtest
// harnesses and the benchmark fill it with fakes. Zero durations and worker
// counts take the defaults of main.go's flags.
type Deps struct {
	// Registry holds the providers the caller enabled besides kvm
	// (kubernetes, gcp); Setup adds kvm when KVM is set. Required.
	Registry *provider.Registry
	// Plugins are the providers' plug-ins; nil: Plugins(). Every provider
	// in Registry needs one; the webhooks must get the same list.
	Plugins plugin.List
	// Prober checks each proxy (TCP connect, or HTTP through it). Required.
	Prober proxyprobe.Prober
	// Tag is written on every instance and selects them for the sweep.
	// Required.
	Tag string
	// InstallID is this install's id (ResolveInstallID): the kvm provider
	// writes it on every domain, and the sweep deletes only instances
	// carrying it. The caller builds the other providers with the same id.
	// Required.
	InstallID string

	Proxy ProxyOptions
	Pool  PoolOptions
	Sweep SweepOptions
	// KVM enables the kvm provider, the KVMHost and KVMImage controllers
	// and the Proxy-by-host index; nil leaves them out.
	KVM *KVMDeps
}

// ProxyOptions are the Proxy controller's timings and workers.
type ProxyOptions struct {
	ProbeInterval time.Duration
	// ProbeHeartbeat: how old the written status.probe.lastProbeTime of a
	// steady Proxy gets before a probe writes it again
	// (DefaultProbeHeartbeat when zero).
	ProbeHeartbeat        time.Duration
	ProbeFailureThreshold int32
	ProvisionPollInterval time.Duration
	AddressTimeout        time.Duration
	ResyncInterval        time.Duration
	// ProviderCallTimeout bounds each whole provider call of a reconcile.
	// For kvm it is a backstop: every libvirt RPC in the call has its own
	// deadline (virt.Deadlines), so a wedged host pins a worker for one
	// RPC's deadline, not for this.
	ProviderCallTimeout time.Duration
	Workers             int
	// ProbeSourceCIDRs (--probe-source-cidrs): the manager's own source
	// ranges as the proxies see them, admitted by every managed squid with
	// Basic auth (still with the credential) so the probe gets through.
	ProbeSourceCIDRs []string
	// DestinationExceptionGrants (--allow-destination-exceptions): the
	// loopback, link-local and metadata ranges Proxies may list as
	// destination exceptions; none when empty. The webhooks get the same.
	DestinationExceptionGrants proxyaccess.Grants
	// RefuseUserData (--allow-proxy-user-data=false) refuses Proxies with
	// spec.cloudInit; the webhooks get the same.
	RefuseUserData bool
	// Egress: how egress addresses are measured (--egress-echo-url,
	// --egress-echo-interval, --egress-stale-after).
	Egress EgressOptions
	// Echoer measures them; proxyprobe.HTTPEcho when nil.
	Echoer proxyprobe.Echoer
	// PortWatch watches the port of each booting Proxy between probes
	// (zero: portwatch's defaults, dialing for real). A harness whose
	// proxy addresses are not real sets Dial.
	PortWatch portwatch.Options
}

// PoolOptions are the ProxyPool controller's workers and what tests
// inject.
type PoolOptions struct {
	Workers int
	// Clock and Rand: real time and a random seed when nil.
	Clock clock.PassiveClock
	Rand  *rand.Rand
	// OnPublished sees every list the pool controller publishes.
	OnPublished func(pool types.NamespacedName, replicas []crawlv1.Proxy)
}

// SweepOptions configure the orphan sweep.
type SweepOptions struct {
	// Interval between sweeps. Required: a ticker cannot run on 0.
	Interval time.Duration
	// CallTimeout bounds each provider call of a sweep; 0:
	// DefaultSweepCallTimeout.
	CallTimeout time.Duration
	// VolumeGrace is how long a kvm domain's leftover volumes must be
	// provably unused before they are swept; 0: DefaultVolumeGrace.
	VolumeGrace time.Duration
}

// KVMDeps wire the kvm provider.
type KVMDeps struct {
	// Hosts resolves KVMHosts (kvm.KubeHosts in production). Required.
	Hosts kvm.HostSource
	// Pool holds the connections. Nil: Setup dials with conn.New(PoolOptions)
	// and subscribes to each link's lifecycle events. A stand-in pool (the
	// benchmark's kvmtest.Conns) subscribes itself via the provider's
	// OnConnect.
	Pool        kvm.Connections
	PoolOptions conn.Options
	Observer    virt.Observer
	// MaxUploadsPerHost bounds concurrent image uploads to one host.
	MaxUploadsPerHost int
	// MaxUploads bounds concurrent image uploads over all hosts (their
	// buffers are the manager's memory); 0: kvm.DefaultMaxUploads,
	// negative: no bound.
	MaxUploads int
	// MaxInFlightPerHost bounds the provider calls in flight to one host,
	// so a wedged host holds at most that many Proxy workers; 0: a quarter
	// of the Proxy workers, at least 1.
	MaxInFlightPerHost int
	Logger             logr.Logger
	// HostProber checks host health; the provider when nil (the benchmark
	// counts health-check RPCs on a provider of its own).
	HostProber HostProber

	// CheckInterval and CheckTimeout are the defaults of KVMHosts without
	// spec.checkInterval/checkTimeout (0 timeout: derived).
	CheckInterval time.Duration
	CheckTimeout  time.Duration
	// ImageProgressInterval between KVMImage status updates while
	// downloading.
	ImageProgressInterval time.Duration
	HostWorkers           int
	ImageWorkers          int
}

// Wiring is what Setup built, for callers that need to reach into it (tests
// mark Proxies dirty or sweep by hand).
type Wiring struct {
	Proxy    *ProxyReconciler
	Pool     *ProxyPoolReconciler
	Sweep    *OrphanCollector
	Registry *provider.Registry
	// KVM is the kvm provider; nil when not enabled.
	KVM *kvm.Provider
}

// Validate reports the first missing or unusable setting, naming it.
func (d *Deps) Validate() error {
	var errs []error
	if d.Registry == nil {
		errs = append(errs, errors.New("Deps.Registry is required"))
	}
	if d.Plugins != nil {
		if err := d.Plugins.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("Deps.Plugins: %w", err))
		}
	}
	if d.Prober == nil {
		errs = append(errs, errors.New("Deps.Prober is required"))
	}
	if d.Tag == "" {
		errs = append(errs, errors.New("--instance-tag must not be empty"))
	}

	if d.Sweep.Interval <= 0 {
		errs = append(errs, fmt.Errorf("--gc-interval must be positive, got %s", d.Sweep.Interval))
	}
	for _, f := range []struct {
		flag string
		d    time.Duration
	}{
		{"--proxy-probe-interval", d.Proxy.ProbeInterval},
		{"--provision-poll-interval", d.Proxy.ProvisionPollInterval},
		{"--address-timeout", d.Proxy.AddressTimeout},
		{"--resync-interval", d.Proxy.ResyncInterval},
		{"--provider-call-timeout", d.Proxy.ProviderCallTimeout},
		{"--gc-volume-grace", d.Sweep.VolumeGrace},
		{"--egress-echo-interval", d.Proxy.Egress.Interval},
		{"--egress-stale-after", d.Proxy.Egress.StaleAfter},
		{"--provider-check-interval", kvmCheckInterval(d.KVM)},
	} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", f.flag, f.d))
		}
	}
	if err := ValidateProbeSourceCIDRs(d.Proxy.ProbeSourceCIDRs); err != nil {
		errs = append(errs, err)
	}
	if err := proxyprobe.ValidateEchoURL(d.Proxy.Egress.EchoURL); err != nil {
		errs = append(errs, fmt.Errorf("--egress-echo-url: %w", err))
	}
	if d.Proxy.ProbeFailureThreshold < 0 {
		errs = append(errs, fmt.Errorf("--proxy-probe-failure-threshold must not be negative, got %d", d.Proxy.ProbeFailureThreshold))
	}
	if k := d.KVM; k != nil {
		if k.Hosts == nil {
			errs = append(errs, errors.New("Deps.KVM.Hosts is required"))
		}
		// Zero means the default, as where the interval is used.
		if err := crawlv1.ValidateCheckTiming(orDefaultDuration(k.CheckInterval, crawlv1.DefaultCheckInterval), k.CheckTimeout); err != nil {
			errs = append(errs, fmt.Errorf("--provider-check-interval/--provider-check-timeout: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Setup wires the operator into mgr: the kvm provider and its connection
// pool, the lifecycle-event bridge, the Proxy, KVMHost and KVMImage
// controllers, the ProxyPool controller, the Proxy-by-host and by-pool
// indexes and the orphan sweep, the generic ones with the providers'
// plug-ins (Deps.Plugins, else Plugins()). main.go and
// every test harness call it, so tests run what production runs.
func Setup(ctx context.Context, mgr ctrl.Manager, d Deps) (*Wiring, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	// Checked here, not in Validate: main validates its flags before the
	// install id is read from the cluster.
	if err := provider.ValidateInstallID(d.InstallID); err != nil {
		return nil, fmt.Errorf("Deps.InstallID: %w", err)
	}
	plugins := d.Plugins
	if plugins == nil {
		plugins = Plugins()
	}
	w := &Wiring{Registry: d.Registry}
	w.Proxy = &ProxyReconciler{
		Client:                     mgr.GetClient(),
		APIReader:                  mgr.GetAPIReader(),
		ProbeSourceCIDRs:           d.Proxy.ProbeSourceCIDRs,
		DestinationExceptionGrants: d.Proxy.DestinationExceptionGrants,
		RefuseUserData:             d.Proxy.RefuseUserData,
		Registry:                   d.Registry,
		Plugins:                    plugins,
		Recorder:                   mgr.GetEventRecorderFor("proxy-controller"),
		Prober:                     d.Prober,
		Tag:                        d.Tag,
		ProbeInterval:              d.Proxy.ProbeInterval,
		ProbeHeartbeat:             d.Proxy.ProbeHeartbeat,
		ProbeFailureThreshold:      d.Proxy.ProbeFailureThreshold,
		ProvisionPollInterval:      d.Proxy.ProvisionPollInterval,
		AddressTimeout:             d.Proxy.AddressTimeout,
		ResyncInterval:             d.Proxy.ResyncInterval,
		ProviderCallTimeout:        d.Proxy.ProviderCallTimeout,
		Egress:                     d.Proxy.Egress,
		Echoer:                     d.Proxy.Echoer,
		WatchPods:                  slices.Contains(d.Registry.Enabled(), kubernetes.Name),
	}
	w.Proxy.PortWatch, w.Proxy.PortOpen = newPortWatch(ctx, d.Proxy.PortWatch, w.Proxy.notePortOpened)
	ipam, err := ServesIPAM(mgr)
	if err != nil {
		return nil, err
	}
	w.Proxy.IPAM = ipam

	proxyWorkers := orDefaultInt(d.Proxy.Workers, 16)
	if k := d.KVM; k != nil {
		prov, err := setupKVM(ctx, mgr, k, d.InstallID, proxyWorkers, w.Proxy)
		if err != nil {
			return nil, err
		}
		w.KVM = prov
		d.Registry.Add(prov)
	}
	for _, name := range d.Registry.Enabled() {
		if plugins.Get(name) == nil {
			return nil, fmt.Errorf("provider %q is enabled but has no plug-in (registered: %s)", name, strings.Join(plugins.Names(), ", "))
		}
	}
	if err := w.Proxy.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: proxyWorkers}); err != nil {
		return nil, fmt.Errorf("create Proxy controller: %w", err)
	}

	w.Pool = &ProxyPoolReconciler{
		Client:   mgr.GetClient(),
		Plugins:  plugins,
		Scheme:   mgr.GetScheme(),
		Recorder: mgr.GetEventRecorderFor("proxypool-controller"),
		// Credential Secrets are read one by one through the API reader: a
		// cached client would list and watch every Secret of the cluster.
		Publisher:         &Publisher{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()},
		HostCheckInterval: orDefaultDuration(kvmCheckInterval(d.KVM), crawlv1.DefaultCheckInterval),
		IPAM:              ipam,
		Clock:             d.Pool.Clock,
		Rand:              d.Pool.Rand,
		OnPublished:       d.Pool.OnPublished,
		Traffic:           w.Proxy.Traffic,
	}
	if err := IndexPoolOwner(ctx, mgr); err != nil {
		return nil, err
	}
	if err := IndexBanPool(ctx, mgr); err != nil {
		return nil, err
	}
	if err := w.Pool.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: orDefaultInt(d.Pool.Workers, 4)}); err != nil {
		return nil, fmt.Errorf("create ProxyPool controller: %w", err)
	}

	w.Sweep = &OrphanCollector{
		Reader: mgr.GetAPIReader(), Registry: d.Registry, Plugins: plugins, Tag: d.Tag, InstallID: d.InstallID,
		Interval: d.Sweep.Interval, CallTimeout: d.Sweep.CallTimeout, VolumeGrace: d.Sweep.VolumeGrace,
		Recorder: mgr.GetEventRecorderFor("orphan-collector"),
	}
	if err := mgr.Add(w.Sweep); err != nil {
		return nil, err
	}
	// Each provider's Check at start-up and periodically: its last result
	// explains a closed port in the Proxy's Ready message.
	if err := mgr.Add(&provider.Checker{Registry: d.Registry}); err != nil {
		return nil, err
	}
	return w, nil
}

func setupKVM(ctx context.Context, mgr ctrl.Manager, k *KVMDeps, installID string, proxyWorkers int, proxy *ProxyReconciler) (*kvm.Provider, error) {
	opts := kvm.Options{
		InstallID:          installID,
		Hosts:              k.Hosts,
		Pool:               k.Pool,
		Observer:           k.Observer,
		MaxUploadsPerHost:  k.MaxUploadsPerHost,
		MaxUploads:         k.MaxUploads,
		MaxInFlightPerHost: orDefaultInt(k.MaxInFlightPerHost, max(1, proxyWorkers/4)),
		CheckInterval:      k.CheckInterval,
		Logger:             k.Logger,
		OnImageUpload:      ObserveImageUpload,
	}
	var prov *kvm.Provider
	if k.Pool == nil {
		var pool *conn.Pool
		prov, pool = kvm.NewWithPool(opts, k.PoolOptions)
		// Closed when the manager stops, after the controllers.
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			<-ctx.Done()
			pool.Close()
			return nil
		})); err != nil {
			return nil, err
		}
	} else {
		prov = kvm.New(opts)
	}
	proxy.Events = BridgeKVMEvents(ctx, prov.Events(), proxy)

	var hostProber HostProber = prov
	if k.HostProber != nil {
		hostProber = k.HostProber
	}
	if err := IndexProxyHost(ctx, mgr); err != nil {
		return nil, err
	}
	if err := (&KVMHostReconciler{
		Client: mgr.GetClient(), Prober: hostProber, Recorder: mgr.GetEventRecorderFor("kvmhost-controller"),
		DefaultInterval: orDefaultDuration(k.CheckInterval, crawlv1.DefaultCheckInterval), DefaultTimeout: k.CheckTimeout,
	}).SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: orDefaultInt(k.HostWorkers, 64)}); err != nil {
		return nil, fmt.Errorf("create KVMHost controller: %w", err)
	}
	if err := (&KVMImageReconciler{
		Client: mgr.GetClient(), Cacher: prov, Recorder: mgr.GetEventRecorderFor("kvmimage-controller"),
		JobContext: ctx, ProgressInterval: k.ImageProgressInterval,
	}).SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: orDefaultInt(k.ImageWorkers, 4)}); err != nil {
		return nil, fmt.Errorf("create KVMImage controller: %w", err)
	}
	return prov, nil
}

// BridgeKVMEvents turns libvirt lifecycle events into Proxy reconcile
// requests: the Proxy is marked dirty (its instance is re-read at once), a
// probe of it under way is interrupted (the reconcile would otherwise wait
// for it), and it is requeued. It runs until ctx ends.
func BridgeKVMEvents(ctx context.Context, src <-chan kvm.DomainEvent, r *ProxyReconciler) <-chan event.GenericEvent {
	out := make(chan event.GenericEvent, 256)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-src:
				key := types.NamespacedName{Namespace: ev.Namespace, Name: ev.Name}
				r.MarkDirty(key)
				r.InterruptProbe(key)
				obj := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ev.Namespace, Name: ev.Name}}
				select {
				case out <- event.GenericEvent{Object: obj}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// ValidateProbeSourceCIDRs checks --probe-source-cidrs by the renderer's
// rules for allowed sources (a CIDR without host bits, no IPv4-mapped
// IPv6 range), since every managed squid will list them.
func ValidateProbeSourceCIDRs(cidrs []string) error {
	if len(cidrs) == 0 {
		return nil
	}
	var msgs []string
	errs := squid.Config{AllowedSourceCIDRs: cidrs, Auth: squid.Auth{Type: squid.AuthBasic}}.ValidateFields(nil)
	for _, e := range errs {
		if strings.HasPrefix(e.Field, "allowedSourceCIDRs[") {
			msgs = append(msgs, fmt.Sprintf("%q %s", e.BadValue, e.Detail))
		}
	}
	if len(msgs) > 0 {
		return fmt.Errorf("--probe-source-cidrs: %s", strings.Join(msgs, "; "))
	}
	return nil
}

func kvmCheckInterval(k *KVMDeps) time.Duration {
	if k == nil {
		return 0
	}
	return k.CheckInterval
}

// requireDeps names, sorted, the dependencies of owner that are missing
// (false in present), so a harness that forgot one fails at set-up, not in
// some later Reconcile.
func requireDeps(owner string, present map[string]bool) error {
	var missing []string
	for name, ok := range present {
		if !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return fmt.Errorf("%s: missing %s", owner, strings.Join(missing, ", "))
}

func orDefaultInt(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

func orDefaultDuration(v, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return v
}
