package controllers

import (
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// Operator metrics, served beside controller-runtime's on the manager's
// metrics endpoint. libvirt RPC metrics live in pkg/provider/kvm/virt.
var (
	hostReady = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "proxy_operator_kvmhost_ready",
		Help: "1 for the KVMHost's current Ready reason (Ready when healthy), by host.",
	}, []string{"host", "reason"})
	hostUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "proxy_operator_kvmhost_up",
		Help: "1 when the KVMHost's last health check passed, else 0.",
	}, []string{"host"})
	hostCheckDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "proxy_operator_kvmhost_check_duration_seconds",
		Help:    "Duration of KVMHost health checks.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15},
	}, []string{"result"})
	imageUploadBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_image_upload_bytes_total",
		Help: "Image bytes uploaded into KVM host pools.",
	}, []string{"host"})
	imageUploadDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "proxy_operator_image_upload_duration_seconds",
		Help:    "Duration of image downloads+uploads that transferred bytes.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 12),
	}, []string{"result"})
)

// Per-Proxy probe metrics: what status.probe no longer carries on every
// probe (its time and latency), so that a steady Proxy's status is not
// written each probe interval. One series per Proxy (two for probes_total),
// labels namespace and proxy, removed when the Proxy goes
// (forgetProbeMetrics).
var (
	probeLabels      = []string{"namespace", "proxy"}
	proxyProbeLatest = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "proxy_operator_proxy_last_probe_timestamp_seconds",
		Help: "Unix time when the Proxy's last probe finished.",
	}, probeLabels)
	proxyProbeLatency = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "proxy_operator_proxy_probe_latency_seconds",
		Help: "Latency of the Proxy's last probe.",
	}, probeLabels)
	proxyProbes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_proxy_probes_total",
		Help: "Probes of the Proxy by outcome (ok or failed); a probe cut short by a provider event is not counted.",
	}, append(slices.Clone(probeLabels), "outcome"))
)

func init() {
	metrics.Registry.MustRegister(hostReady, hostUp, hostCheckDuration, imageUploadBytes, imageUploadDuration,
		proxyProbeLatest, proxyProbeLatency, proxyProbes)
}

// recordProbe updates key's probe metrics after one probe that finished at
// at.
func recordProbe(key types.NamespacedName, at time.Time, latency time.Duration, ok bool) {
	outcome := "failed"
	if ok {
		outcome = "ok"
	}
	proxyProbeLatest.WithLabelValues(key.Namespace, key.Name).Set(float64(at.UnixNano()) / 1e9)
	proxyProbeLatency.WithLabelValues(key.Namespace, key.Name).Set(latency.Seconds())
	proxyProbes.WithLabelValues(key.Namespace, key.Name, outcome).Inc()
}

// forgetProbeMetrics drops a deleted Proxy's probe series.
func forgetProbeMetrics(key types.NamespacedName) {
	proxyProbeLatest.DeleteLabelValues(key.Namespace, key.Name)
	proxyProbeLatency.DeleteLabelValues(key.Namespace, key.Name)
	proxyProbes.DeletePartialMatch(prometheus.Labels{"namespace": key.Namespace, "proxy": key.Name})
}

// recordHostCheck updates the host metrics after one health check.
func recordHostCheck(host, reason string, took time.Duration, err error) {
	result := "ok"
	up := 1.0
	if err != nil {
		result, up = "error", 0
	}
	hostCheckDuration.WithLabelValues(result).Observe(took.Seconds())
	hostUp.WithLabelValues(host).Set(up)
	hostReady.DeletePartialMatch(prometheus.Labels{"host": host})
	hostReady.WithLabelValues(host, reason).Set(1)
}

// forgetHostMetrics drops a deleted host's series.
func forgetHostMetrics(host string) {
	hostReady.DeletePartialMatch(prometheus.Labels{"host": host})
	hostUp.DeleteLabelValues(host)
}

// ObserveImageUpload records one image upload (wire it as the kvm
// provider's OnImageUpload).
func ObserveImageUpload(host string, bytes int64, took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	imageUploadBytes.WithLabelValues(host).Add(float64(bytes))
	imageUploadDuration.WithLabelValues(result).Observe(took.Seconds())
}

// ProxyPhaseCollector reports Proxies by provider and phase at scrape time,
// from the manager's cache, so the numbers can never drift from the API.
type ProxyPhaseCollector struct {
	Reader client.Reader
	desc   *prometheus.Desc
}

// NewProxyPhaseCollector returns a collector reading Proxies through r.
func NewProxyPhaseCollector(r client.Reader) *ProxyPhaseCollector {
	return &ProxyPhaseCollector{Reader: r, desc: prometheus.NewDesc("proxy_operator_proxies",
		"Proxies by provider and phase.", []string{"provider", "phase"}, nil)}
}

func (c *ProxyPhaseCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *ProxyPhaseCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list := &crawlv1.ProxyList{}
	if err := c.Reader.List(ctx, list); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	type key struct{ provider, phase string }
	counts := map[key]int{}
	for _, p := range list.Items {
		phase := string(p.Status.Phase)
		if phase == "" {
			phase = string(crawlv1.ProxyPending)
		}
		counts[key{string(p.Spec.Provider), phase}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k.provider, k.phase)
	}
}
