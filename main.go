// Command manager runs the proxy operator: the Proxy, KVMHost and KVMImage
// controllers, their admission webhooks and the provider registry.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	webhookv1 "crawl.example.com/proxy-operator/internal/webhook/v1alpha1"
)

var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(crawlv1.AddToScheme(scheme))
}

// options are the manager's flags.
type options struct {
	metricsAddr          string
	probeAddr            string
	leaderElect          bool
	leaderElectNamespace string
	webhookPort          int
	webhookCertDir       string
	enableWebhooks       bool
	enableHTTP2          bool

	checkInterval durationFlag
	checkTimeout  durationFlag
}

func main() {
	var o options
	o.checkInterval.Duration = crawlv1.DefaultCheckInterval
	fs := flag.CommandLine
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "Address the metrics endpoint binds to; \"0\" disables it.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address the health probe endpoint binds to.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Enable leader election so only one manager is active.")
	fs.StringVar(&o.leaderElectNamespace, "leader-election-namespace", "", "Namespace of the leader election lease (in-cluster namespace when empty).")
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "Port the admission webhook server listens on.")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "", "Directory with tls.crt/tls.key for the webhook server (controller-runtime's default when empty).")
	fs.BoolVar(&o.enableWebhooks, "enable-webhooks", true, "Serve the admission webhooks.")
	fs.BoolVar(&o.enableHTTP2, "enable-http2", false, "Serve HTTP/2 on the webhook and metrics servers (off: CVE-2023-44487 rapid reset).")
	fs.Var(&o.checkInterval, "provider-check-interval", "Default interval between KVM host health checks (a KVMHost's spec.checkInterval overrides it).")
	fs.Var(&o.checkTimeout, "provider-check-timeout", "Default bound of one health check; 0 derives min(15s, interval). Must not exceed the interval.")
	zapOpts := zap.Options{Development: false}
	zapOpts.BindFlags(fs)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	// A bad flag is a clear message and exit 1, never a panic.
	if err := crawlv1.ValidateCheckTiming(o.checkInterval.Duration, o.checkTimeout.Duration); err != nil {
		fmt.Fprintf(os.Stderr, "invalid --provider-check-interval/--provider-check-timeout: %v\n", err)
		os.Exit(1)
	}

	var tlsOpts []func(*tls.Config)
	if !o.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: o.metricsAddr, TLSOpts: tlsOpts},
		HealthProbeBindAddress:  o.probeAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "proxy-operator.crawl.example.com",
		LeaderElectionNamespace: o.leaderElectNamespace,
		WebhookServer: webhook.NewServer(webhook.Options{
			Port:    o.webhookPort,
			CertDir: o.webhookCertDir,
			TLSOpts: tlsOpts,
		}),
	})
	if err != nil {
		log.Error(err, "unable to create manager")
		os.Exit(1)
	}

	if o.enableWebhooks {
		for name, setup := range map[string]func(ctrl.Manager) error{
			"KVMHost":  webhookv1.SetupKVMHostWebhookWithManager,
			"KVMImage": webhookv1.SetupKVMImageWebhookWithManager,
			"Proxy":    webhookv1.SetupProxyWebhookWithManager,
		} {
			if err := setup(mgr); err != nil {
				log.Error(err, "unable to create webhook", "kind", name)
				os.Exit(1)
			}
		}
	}

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "unable to set up health check")
		os.Exit(1)
	}
	readyCheck := healthz.Ping
	if o.enableWebhooks {
		readyCheck = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("readyz", readyCheck); err != nil {
		log.Error(err, "unable to set up ready check")
		os.Exit(1)
	}

	log.Info("starting manager", "checkInterval", o.checkInterval.Duration,
		"checkTimeout", crawlv1.EffectiveCheckTimeout(o.checkInterval.Duration, o.checkTimeout.Duration))
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "problem running manager")
		os.Exit(1)
	}
}
