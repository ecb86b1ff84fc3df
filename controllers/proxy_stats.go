package controllers

import (
	"context"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// The operator's credential for a managed squid's traffic counters
// (squid.Config.Stats) lives in a Secret of its own, <proxy>-proxy-stats:
// crawlers mount <proxy>-proxy-credentials, and must never hold it.
const (
	statsUsername       = "proxy-operator-stats"
	statsSecretSuffix   = "-proxy-stats"
	statsPasswordKey    = "password"
	labelStatsSecretFor = "crawl.example.com/proxy-stats"
)

func statsSecretName(p *crawlv1.Proxy) string { return p.Name + statsSecretSuffix }

// statsCredential returns the operator's counter credential of a managed
// Proxy, generated once into its Secret and reused; nil for a squid the
// operator does not manage, or whose clients' user name is the one the
// counters use (squid could not tell them apart). A Secret lost while an
// instance runs is generated again: that instance's counters are then
// unreadable (407) until it is replaced, and nothing else changes.
func (r *ProxyReconciler) statsCredential(ctx context.Context, p *crawlv1.Proxy, creds *credentials) (*squid.Auth, error) {
	if !p.IsManaged() || (creds != nil && creds.Username == statsUsername) {
		return nil, nil
	}
	key := client.ObjectKey{Namespace: p.Namespace, Name: statsSecretName(p)}
	s := &corev1.Secret{}
	err := r.Client.Get(ctx, key, s)
	if apierrors.IsNotFound(err) {
		// The cache may not have seen a Secret just created: never two.
		err = r.APIReader.Get(ctx, key, s)
	}
	switch {
	case err == nil:
		if !metav1.IsControlledBy(s, p) {
			logf.FromContext(ctx).Info("Secret for the traffic counters exists and is not this Proxy's; counters not read", "secret", key.Name)
			return nil, nil
		}
		if pw := string(s.Data[statsPasswordKey]); len(pw) >= squid.MinPasswordLength {
			return &squid.Auth{Type: squid.AuthBasic, Username: statsUsername, Password: pw}, nil
		}
		orig := s.DeepCopy()
		s.Data = map[string][]byte{statsPasswordKey: []byte(squid.GeneratePassword())}
		if err := r.Client.Patch(ctx, s, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return nil, provider.Transientf("update Secret %s: %w", key, err)
		}
	case apierrors.IsNotFound(err):
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
				Labels: map[string]string{labelManagedBy: managedBy, labelStatsSecretFor: p.Name}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{statsPasswordKey: []byte(squid.GeneratePassword())},
		}
		if err := controllerutil.SetControllerReference(p, s, r.Client.Scheme()); err != nil {
			return nil, provider.Permanent(err)
		}
		if err := r.Client.Create(ctx, s); err != nil {
			return nil, provider.Transientf("create Secret %s: %w", key, err)
		}
	default:
		return nil, provider.Transientf("read Secret %s: %w", key, err)
	}
	return &squid.Auth{Type: squid.AuthBasic, Username: statsUsername, Password: string(s.Data[statsPasswordKey])}, nil
}

// poolOf is the ProxyPool that controls p, "" for none.
func poolOf(p *crawlv1.Proxy) string {
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "ProxyPool" && ref.APIVersion == crawlv1.GroupVersion.String() {
		return ref.Name
	}
	return ""
}

// statsReads is how many requests one reading of squid's counters takes,
// upstreamReads one of the upstream counter.
const (
	statsReads    = 2
	upstreamReads = 1
)

// readTraffic reads the counters of a healthy managed squid, on the
// probe's schedule (one reading per probe interval at most), after the
// status write: nothing in status waits for it. Every request the
// operator sent through the proxy in this reconcile has its answer by
// then, so the reading's own-request count is exact.
func (r *ProxyReconciler) readTraffic(ctx context.Context, s *proxyScope, target proxyprobe.Target) {
	if s.stats == nil || r.Stats == nil {
		return
	}
	target.Username, target.Password = s.stats.Username, s.stats.Password
	c, err := r.Stats.ReadStats(ctx, target)
	if err != nil {
		// An instance made before its Stats credential (or before the
		// operator read counters at all) refuses it until it is replaced.
		s.log.V(1).Info("traffic counters not read", "err", err.Error())
		return
	}
	// Instances made before the counter have none: a failed read leaves
	// the classes unknown, never the rest.
	u, err := r.Stats.ReadUpstream(ctx, target)
	if err != nil {
		s.log.V(1).Info("upstream counts not read", "err", err.Error())
	} else {
		c.Upstream = &u
	}
	r.Traffic.Observe(s.key, poolOf(s.proxy), c, statsReads+upstreamReads, r.Clock.Now())
}

// sentThrough records a request the operator sent through p's proxy (a
// probe, a check, an echo) and what came back (StatusCode 0: no answer),
// so that the counters leave it out.
func (r *ProxyReconciler) sentThrough(key types.NamespacedName, p *crawlv1.Proxy, res proxyprobe.Result) {
	if res.StatusCode == 0 {
		return
	}
	upstream := 0
	if res.Upstream {
		upstream = res.StatusCode
	}
	r.Traffic.Sent(key, poolOf(p), res.StatusCode == http.StatusProxyAuthRequired || res.StatusCode == http.StatusForbidden, upstream)
}
