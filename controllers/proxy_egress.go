package controllers

import (
	"context"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

// Defaults of the egress flags (main.go binds the same).
const (
	DefaultEgressEchoInterval = 10 * time.Minute
	DefaultEgressStaleAfter   = 30 * time.Minute
)

// EgressOptions configure how the Proxy controller measures egress
// addresses (docs/egress.md).
type EgressOptions struct {
	// EchoURL (--egress-echo-url) is requested through each proxy whose
	// pool names none (spec.egress.echoURL); empty: only a probe URL that
	// echoes measures.
	EchoURL string
	// Interval (--egress-echo-interval) between measurements of one
	// instance; an instance new to this manager, or whose address or
	// provider id changed, is measured at its first healthy probe.
	Interval time.Duration
	// StaleAfter (--egress-stale-after): a measurement older than this
	// that no echo could renew is dropped (egress unknown), as the
	// address may have moved.
	StaleAfter time.Duration
}

func (o EgressOptions) withDefaults() EgressOptions {
	if o.Interval <= 0 {
		o.Interval = DefaultEgressEchoInterval
	}
	if o.StaleAfter <= 0 {
		o.StaleAfter = DefaultEgressStaleAfter
	}
	return o
}

// retry is how soon a failed echo is tried again: one a tenth of the
// interval, so a measurement goes stale only after several failures.
func (o EgressOptions) retry() time.Duration { return max(o.Interval/10, time.Second) }

// measureEgress runs after a successful probe: the probe's own answer, when
// it echoed an address, is a measurement; otherwise the echo URL is asked
// when due. Without a measurement the last one stands until StaleAfter,
// then the egress is unknown. An address the operator assigned (static)
// is left alone unless an echo sees another.
//
// Memory has the time of the last measurement; status may have an older
// one, as holdHeartbeat holds a measurement that found the same address
// out of status for up to a heartbeat. So the measurement is recorded
// from memory (which also rewrites one whose status write was lost), and
// staleness counts from it.
func (r *ProxyReconciler) measureEgress(ctx context.Context, s *proxyScope, target proxyprobe.Target, probed string) {
	p := s.proxy
	now := r.Clock.Now()
	instance := p.Status.Address + " " + p.Status.ProviderID
	if probed != "" {
		r.mem.echoed(s.key, instance, now, probed)
	} else if url := r.echoURL(ctx, p); url != "" && r.mem.echoDue(s.key, instance, now, r.Egress.Interval, r.Egress.retry()) {
		addr, err := r.Echoer.Echo(ctx, url, target)
		// A request squid counts (the probe just passed, so not one it
		// refuses); a read echo is the origin's 200, which the upstream
		// counter sees unless it went through a tunnel.
		upstream := 0
		if err == nil && strings.HasPrefix(url, "http://") {
			upstream = http.StatusOK
		}
		r.Traffic.Sent(s.key, poolOf(p), false, upstream)
		if err != nil {
			r.mem.echoed(s.key, instance, now, "")
			s.log.Info("egress echo failed; the last measurement stands until it is stale", "err", err.Error())
		} else {
			r.mem.echoed(s.key, instance, now, addr.String())
		}
	}
	// A stale one is not brought back: it would be dropped again below,
	// with an address-changed Event at every probe.
	if addr, at := r.mem.lastEcho(s.key, instance); addr != "" && now.Before(at.Add(r.Egress.StaleAfter)) &&
		(p.Status.EgressMeasuredAt == nil || p.Status.EgressMeasuredAt.Time.Before(at)) {
		r.recordEgress(p, addr, at)
	}
	if p.Status.EgressSource == crawlv1.EgressSourceStatic {
		return
	}
	if m := p.Status.EgressMeasuredAt; m == nil || !now.Before(m.Add(r.Egress.StaleAfter)) {
		p.Status.EgressAddress, p.Status.EgressSource, p.Status.EgressMeasuredAt = "", crawlv1.EgressSourceUnknown, nil
	}
}

// echoURL is what measures p's egress: its pool's spec.egress.echoURL,
// else the manager's --egress-echo-url. The pool is read when needed
// (from the cache), not copied onto its replicas, so a changed URL
// reaches every replica at its next measurement and changes no template
// hash.
func (r *ProxyReconciler) echoURL(ctx context.Context, p *crawlv1.Proxy) string {
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "ProxyPool" && ref.APIVersion == crawlv1.GroupVersion.String() {
		pool := &crawlv1.ProxyPool{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: ref.Name}, pool); err == nil && pool.Spec.Egress.EchoURL != "" {
			return pool.Spec.Egress.EchoURL
		}
	}
	return r.Egress.EchoURL
}

// recordEgress records a measured egress address (source echo, measured
// now), with an Event when the address changes.
func (r *ProxyReconciler) recordEgress(p *crawlv1.Proxy, addr string, now time.Time) {
	old := p.Status.EgressAddress
	if p.Status.EgressSource == crawlv1.EgressSourceStatic && addr == old {
		// The echo confirms the assigned address; it stays static.
		return
	}
	t := metav1.NewTime(now)
	p.Status.EgressAddress, p.Status.EgressSource, p.Status.EgressMeasuredAt = addr, crawlv1.EgressSourceEcho, &t
	if addr == old {
		return
	}
	if old == "" {
		old = "none"
	}
	r.Recorder.Eventf(p, corev1.EventTypeNormal, "EgressAddressChanged", "egress address %s -> %s", old, addr)
}
