package controllers

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// firstProbeBackoff is the first requeue of a new Proxy whose port is not
// open yet; it doubles up to ProvisionPollInterval. A guest's squid comes up
// seconds after its address, so a fixed poll would add most of a poll
// interval to time-to-Ready. A Proxy that was healthy keeps the poll
// interval (and the failure threshold): it is not booting.
const firstProbeBackoff = 500 * time.Millisecond

// reconcileHealth probes the proxy (with its credential, if it has one)
// and sets ProxyHealthy; beside the probe it sends a request without
// credentials, which sets Secure when the probe succeeds, and after a
// successful probe it measures the egress address (measureEgress) and
// reads the traffic counters once status is written. All ride on the
// probe's own schedule: at most one probe and one check per probe
// interval.
func (r *ProxyReconciler) reconcileHealth(ctx context.Context, s *proxyScope) (ctrl.Result, error) {
	after := r.probe(ctx, s)
	if s.providerUnreachable {
		after = min(after, r.ProvisionPollInterval)
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

// probe runs one probe and returns when to probe again.
func (r *ProxyReconciler) probe(ctx context.Context, s *proxyScope) time.Duration {
	p := s.proxy
	// Read before this probe's verdict changes the conditions.
	startsBackoff := booting(p)
	target := proxyprobe.Target{Address: p.Status.Address, Port: p.Spec.Port}
	if s.creds != nil {
		target.Username, target.Password = s.creds.Username, s.creds.Password
	}
	probeCtx, probed := r.mem.startProbe(ctx, s.key)
	defer probed()
	// The check without credentials goes out beside the probe, not after
	// it: Ready waits for both, and the first answers of a squid that has
	// just started are the slow ones (seconds in a TCG guest).
	secure := r.startSecureCheck(probeCtx, s, target)
	res := r.Prober.Probe(probeCtx, target)
	r.sentThrough(s.key, p, res)
	checked := secure()
	if probeCtx.Err() != nil && ctx.Err() == nil {
		// A provider event about the instance came during the probe
		// (stopped, gone, started): whatever the probe got is about the
		// instance as it was, and a probe of a guest being destroyed can
		// take its whole timeout while the event's reconcile waits behind
		// it. That reconcile re-reads the instance and probes afresh; the
		// verdict stays as it was until then.
		s.log.V(1).Info("probe interrupted by a provider event; the instance is read again")
		return time.Millisecond
	}
	s.log.V(1).Info("probed", "ok", res.OK, "latency", res.Latency, "status", res.StatusCode, "err", res.Err)
	now := metav1.NewTime(r.Clock.Now())
	recordProbe(s.key, now.Time, res.Latency, res.OK)
	if p.Status.Probe == nil {
		p.Status.Probe = &crawlv1.ProxyProbeStatus{}
	}
	// Written only with another change or as a heartbeat (holdHeartbeat).
	p.Status.Probe.LastProbeTime = &now
	if p.Status.EgressSource == "" {
		p.Status.EgressSource = crawlv1.EgressSourceUnknown
	}
	if res.OK {
		r.probeSucceeded(probeCtx, s, target, res, checked)
		return r.ProbeInterval
	}
	return r.probeFailed(ctx, s, target, res, startsBackoff)
}

// DefaultProbeHeartbeat is how old the written status.probe.lastProbeTime
// of a Proxy whose probes find nothing new may get before a probe writes
// it again. An hour keeps a steady Proxy at most one status write an hour
// (issue 30's goal; the probe metrics have every probe's time), while
// `kubectl get` still shows that the probe is alive.
const DefaultProbeHeartbeat = time.Hour

// holdHeartbeat puts before's lastProbeTime and egressMeasuredAt back into
// after when they are all that changed in status and are younger than
// heartbeat, so that a probe or a measurement that found nothing new
// writes nothing. With any other change, or one of them a heartbeat old,
// the fresh times are written along.
func holdHeartbeat(before, after *crawlv1.Proxy, heartbeat time.Duration) {
	type heartbeatTime struct {
		written *metav1.Time
		fresh   **metav1.Time
	}
	times := []heartbeatTime{{before.Status.EgressMeasuredAt, &after.Status.EgressMeasuredAt}}
	if bp, ap := before.Status.Probe, after.Status.Probe; bp != nil && ap != nil {
		times = append(times, heartbeatTime{bp.LastProbeTime, &ap.LastProbeTime})
	}
	for _, t := range times {
		if t.written != nil && *t.fresh != nil && !(*t.fresh).Time.Before(t.written.Add(heartbeat)) {
			return
		}
	}
	fresh := make([]*metav1.Time, len(times))
	for i, t := range times {
		fresh[i] = *t.fresh
		if t.written != nil && fresh[i] != nil { // set or cleared is a change anyway
			*t.fresh = t.written
		}
	}
	// The patcher's own comparison, so "changed" means "would be written".
	if _, changed, err := changes(before, after); err != nil || changed {
		for i, t := range times {
			*t.fresh = fresh[i]
		}
	}
}

// probeSucceeded makes the proxy healthy, records its egress address,
// sets Secure from checked (the check without credentials sent beside the
// probe) and has the traffic counters read once status is written.
func (r *ProxyReconciler) probeSucceeded(ctx context.Context, s *proxyScope, target proxyprobe.Target, res proxyprobe.Result, checked secureCheck) {
	p := s.proxy
	r.endProbeBackoff(s.key)
	p.Status.Probe.ConsecutiveFailures, p.Status.Probe.LastError = 0, ""
	// No latency in the message: it would change it, and so write status,
	// on every probe (the latency is a metric, recordProbe).
	reason, msg := crawlv1.ProxyProbeSucceededReason, "a request through the proxy succeeded"
	if !res.Through {
		reason, msg = crawlv1.ProxyNotProbedReason, fmt.Sprintf("port %d accepts connections; the proxy itself was not probed: set --proxy-probe-url", p.Spec.Port)
	}
	conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionTrue, Reason: reason, Message: msg})
	r.measureEgress(ctx, s, target, res.EgressAddress)
	r.setSecure(ctx, s, checked)
	// After the write: the counters' three requests through the proxy are
	// nothing Ready waits for.
	s.afterWrite(func(ctx context.Context) { r.readTraffic(ctx, s, target) })
}

// probeFailed counts the failure and returns when to probe again: a
// healthy proxy turns unhealthy only at the failure threshold (and is
// re-read from its provider), a booting one backs off from
// firstProbeBackoff with its port watched.
func (r *ProxyReconciler) probeFailed(ctx context.Context, s *proxyScope, target proxyprobe.Target, res proxyprobe.Result, startsBackoff bool) time.Duration {
	p, ps := s.proxy, s.proxy.Status.Probe
	wasHealthy := conditions.IsTrue(p, crawlv1.ProxyHealthyCondition)
	ps.ConsecutiveFailures++
	ps.LastError = res.Err.Error()
	if wasHealthy && ps.ConsecutiveFailures < r.ProbeFailureThreshold {
		// One lost probe does not flap a healthy proxy.
		s.log.V(1).Info("probe failed, below threshold", "failures", ps.ConsecutiveFailures, "err", res.Err)
		return r.ProvisionPollInterval
	}
	reason := crawlv1.ProxyProbeFailedReason
	if !res.Through {
		reason = crawlv1.ProxyPortClosedReason
	}
	if res.StatusCode == http.StatusProxyAuthRequired {
		reason = crawlv1.ProxyProbeAuthFailedReason
	}
	msg := fmt.Sprintf("%d consecutive probe failures, last after %s: %v", ps.ConsecutiveFailures, res.Latency.Round(time.Millisecond), res.Err)
	if hint := probeStatusHint(p, res.StatusCode); hint != "" {
		msg += "; " + hint
	}
	if why := r.Registry.CheckError(string(p.Spec.Provider)); why != nil {
		// e.g. no firewall rule admits the port: say so, not just "closed".
		msg += "; provider check fails: " + why.Error()
	}
	conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	if wasHealthy {
		// It served before: a failing proxy is re-read from the provider.
		r.MarkDirty(s.key)
	} else if after, ok := r.mem.nextProbeBackoff(s.key, startsBackoff, r.ProvisionPollInterval); ok {
		// The backoff soon reaches the poll interval, long before a
		// guest's squid starts; the watch notices the port opening
		// without a probe or a status write per look.
		r.watchPort(ctx, s.key, target)
		return after
	}
	return r.ProvisionPollInterval
}

// booting: the Proxy has not served since its instance was (re)started, so
// a closed port means it is still coming up, not broken.
func booting(p *crawlv1.Proxy) bool {
	return p.Status.Probe == nil || notReadySinceProvisioned(p) || startedAgain(p)
}

// notReadySinceProvisioned: the Proxy has not been Ready since its
// instance was last provisioned, so a closed port means it is still
// booting, not broken. Unlike the probe backoff's memory this survives a
// manager restart: Ready has been False since before InstanceProvisioned
// turned True (both times are whole seconds; a tie counts as booting).
func notReadySinceProvisioned(p *crawlv1.Proxy) bool {
	prov, ready := conditions.Get(p, crawlv1.InstanceProvisionedCondition), conditions.Get(p, crawlv1.ReadyCondition)
	if prov == nil || prov.Status != metav1.ConditionTrue {
		return false
	}
	if ready == nil {
		return true
	}
	return ready.Status != metav1.ConditionTrue && !ready.LastTransitionTime.After(prov.LastTransitionTime.Time)
}

// startedAgain: the instance was found not running and has been started
// again since (instanceDown's verdict stands until a probe replaces it), so
// it boots like a new one.
func startedAgain(p *crawlv1.Proxy) bool {
	c := conditions.Get(p, crawlv1.ProxyHealthyCondition)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == crawlv1.ProxyInstanceNotRunningReason
}

// probeStatusHint says what a refusal of the probe means for p.
func probeStatusHint(p *crawlv1.Proxy, status int) string {
	switch status {
	case http.StatusProxyAuthRequired:
		switch {
		case !p.IsManaged():
			return "the proxy asks for credentials, and the operator has none for a squid it does not manage (spec.access.managed false)"
		case p.Spec.Access.Auth != nil && p.Spec.Access.Auth.SecretRef != nil:
			return fmt.Sprintf("squid refused the credential of Secret %s (spec.access.auth.secretRef); a credential changed after the instance was created reaches squid only with a new instance", p.Spec.Access.Auth.SecretRef.Name)
		default:
			return fmt.Sprintf("squid refused the credential of Secret %s", crawlv1.CredentialsSecretName(p))
		}
	case http.StatusForbidden:
		return "the proxy refused the request: the manager's source address must be admitted (spec.access.allowedSourceCIDRs, or the manager's --probe-source-cidrs), " +
			"and the probe URL's destination must be allowed (spec.access.allowedDestinationExceptions for an internal one)"
	}
	return ""
}

// secureCheck is the outcome of the request sent without credentials
// beside a probe: asked false when none was sent (a managed squid with
// auth None is not asked: it serves whoever its source list admits, by
// design).
type secureCheck struct {
	asked bool
	res   proxyprobe.Result
}

// startSecureCheck sends the request without credentials that decides
// Secure and returns the wait for its outcome; the caller waits whatever
// the probe says, so nothing outlives the reconcile.
func (r *ProxyReconciler) startSecureCheck(ctx context.Context, s *proxyScope, target proxyprobe.Target) func() secureCheck {
	p := s.proxy
	if p.IsManaged() && proxyaccess.AuthType(p.Spec.Access) == squid.AuthNone {
		return func() secureCheck { return secureCheck{} }
	}
	target.Username, target.Password = "", ""
	done := make(chan proxyprobe.Result, 1)
	go func() { done <- r.Prober.ProbeWithoutCredentials(ctx, target) }()
	return func() secureCheck {
		res := <-done
		r.sentThrough(s.key, p, res)
		return secureCheck{asked: true, res: res}
	}
}

// setSecure sets Secure from the check sent beside a successful probe. A
// check that got no answer keeps the last verdict.
func (r *ProxyReconciler) setSecure(ctx context.Context, s *proxyScope, checked secureCheck) {
	p := s.proxy
	set := func(status metav1.ConditionStatus, reason, msg string) {
		if status == metav1.ConditionFalse && reason == crawlv1.ProxyOpenProxyReason && !conditions.IsFalse(p, crawlv1.SecureCondition) {
			r.Recorder.Eventf(p, corev1.EventTypeWarning, crawlv1.ProxyOpenProxyReason, "%s", msg)
		}
		conditions.Set(p, metav1.Condition{Type: crawlv1.SecureCondition, Status: status, Reason: reason, Message: msg})
	}
	if !checked.asked {
		set(metav1.ConditionFalse, crawlv1.ProxySourceListOnlyReason, fmt.Sprintf(
			"auth type None: only spec.access.allowedSourceCIDRs (%s) guards this proxy", strings.Join(p.Spec.Access.AllowedSourceCIDRs, ", ")))
		return
	}
	res := checked.res
	switch res.StatusCode {
	case http.StatusProxyAuthRequired:
		set(metav1.ConditionTrue, crawlv1.ProxyAuthRequiredReason, "a request without credentials was refused with 407")
	case 0:
		logf.FromContext(ctx).V(1).Info("request without credentials got no answer; Secure unchanged", "err", res.Err)
		if r := conditions.GetReason(p, crawlv1.SecureCondition); r == "" || r == crawlv1.ProxySecureUnknownReason {
			set(metav1.ConditionUnknown, crawlv1.ProxySecureUnknownReason, fmt.Sprintf("a request without credentials got no answer: %v", res.Err))
		}
	case http.StatusForbidden:
		// squid judges the source before credentials: a 403 says the
		// manager was refused, not whether others must authenticate.
		set(metav1.ConditionUnknown, crawlv1.ProxySecureUnknownReason,
			"a request without credentials was refused with 403 before any credential was asked for; admit the manager's source address to check (spec.access.allowedSourceCIDRs or --probe-source-cidrs)")
	default:
		msg := fmt.Sprintf("a request without credentials was answered with status %d instead of 407: the proxy serves whoever reaches it without authentication", res.StatusCode)
		if !p.IsManaged() {
			msg += "; its squid is the user's (spec.access.managed false or absent), whose configuration alone decides who that is"
		}
		set(metav1.ConditionFalse, crawlv1.ProxyOpenProxyReason, msg)
	}
}

// endProbeBackoff: the Proxy served; its port needs no more watching.
func (r *ProxyReconciler) endProbeBackoff(key types.NamespacedName) {
	r.mem.endProbeBackoff(key)
	r.forgetPort(key)
}

// watchPort watches target's port for key (one watch per Proxy; see
// portwatch.Watcher.Watch).
func (r *ProxyReconciler) watchPort(ctx context.Context, key types.NamespacedName, target proxyprobe.Target) {
	if r.PortWatch == nil {
		return
	}
	if r.PortWatch.Watch(key, net.JoinHostPort(target.Address, strconv.Itoa(int(target.Port)))) {
		logf.FromContext(ctx).V(1).Info("watching the proxy port until it opens", "address", target.Address, "port", target.Port)
	}
}

func (r *ProxyReconciler) forgetPort(key types.NamespacedName) {
	if r.PortWatch != nil {
		r.PortWatch.Forget(key)
	}
}
