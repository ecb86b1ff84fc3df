package controllers

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// answerProber answers from functions and records every target it was
// given, so a test sees which credential each request carried.
type answerProber struct {
	probe func(proxyprobe.Target) proxyprobe.Result
	// unauth answers the request without credentials; 407 when nil.
	unauth func(proxyprobe.Target) proxyprobe.Result

	mu      sync.Mutex
	probed  []proxyprobe.Target
	checked []proxyprobe.Target
}

func (a *answerProber) Probe(_ context.Context, t proxyprobe.Target) proxyprobe.Result {
	a.mu.Lock()
	a.probed = append(a.probed, t)
	a.mu.Unlock()
	if a.probe == nil {
		return proxyprobe.Result{OK: true, Through: true, StatusCode: http.StatusNoContent, Latency: time.Millisecond}
	}
	return a.probe(t)
}

func (a *answerProber) ProbeWithoutCredentials(ctx context.Context, t proxyprobe.Target) proxyprobe.Result {
	a.mu.Lock()
	a.checked = append(a.checked, t)
	a.mu.Unlock()
	if a.unauth == nil {
		return requiresAuth{}.ProbeWithoutCredentials(ctx, t)
	}
	return a.unauth(t)
}

func answer(status int) func(proxyprobe.Target) proxyprobe.Result {
	return func(proxyprobe.Target) proxyprobe.Result {
		return proxyprobe.Result{OK: true, Through: true, StatusCode: status, Latency: time.Millisecond}
	}
}

// machineRecorder is a provider whose instance runs at stateAddress; it
// keeps every Machine handed to Create.
type machineRecorder struct {
	scriptedProvider
	created []*provider.Machine
}

func newMachineRecorder() *machineRecorder {
	m := &machineRecorder{}
	m.name = string(crawlv1.ProviderKubernetes)
	m.get = func(mm *provider.Machine) (*provider.Instance, error) {
		if len(m.created) == 0 {
			return nil, provider.NotFoundf("no instance")
		}
		return running(stateAddress)(mm)
	}
	m.create = func(mm *provider.Machine) (*provider.Instance, error) {
		m.created = append(m.created, mm)
		return running(stateAddress)(mm)
	}
	return m
}

func managedAccess() *crawlv1.ProxyAccess {
	return &crawlv1.ProxyAccess{Managed: ptr.To(true), AllowedSourceCIDRs: []string{"10.244.0.0/16"},
		Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthBasic}, AllowedPorts: []int32{80, 443}, MaxConnectionsPerClient: 256}
}

func secureProxy(access *crawlv1.ProxyAccess) *crawlv1.Proxy {
	return &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1", Finalizers: []string{crawlv1.ProxyFinalizer}},
		Spec:       crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Port: 3128, Access: access},
	}
}

// secureEnv is a reconciler on a fake client with a recording provider.
type secureEnv struct {
	t      *testing.T
	r      *ProxyReconciler
	prov   *machineRecorder
	prober *answerProber
	events *record.FakeRecorder
	key    client.ObjectKey
}

func newSecureEnv(t *testing.T, p *crawlv1.Proxy, prober *answerProber, objs ...client.Object) *secureEnv {
	t.Helper()
	if prober == nil {
		prober = &answerProber{}
	}
	r := testReconciler(t, prober, clocktesting.NewFakePassiveClock(time.Unix(1000, 0)), append(objs, p)...)
	r.ProbeInterval, r.ProvisionPollInterval, r.ResyncInterval = time.Second, 200*time.Millisecond, 7*time.Minute
	events := record.NewFakeRecorder(100)
	r.Recorder = events
	prov := newMachineRecorder()
	r.Registry.Add(prov)
	return &secureEnv{t: t, r: r, prov: prov, prober: prober, events: events, key: client.ObjectKeyFromObject(p)}
}

// reconcile runs one full reconcile (the instance re-read) and returns the
// stored Proxy.
func (e *secureEnv) reconcile() (*crawlv1.Proxy, ctrl.Result) {
	e.t.Helper()
	e.r.MarkDirty(e.key)
	res, err := e.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: e.key})
	if err != nil {
		e.t.Fatalf("Reconcile: %v", err)
	}
	return e.proxy(), res
}

// reconcileFast runs one reconcile without marking the Proxy dirty: a
// Ready one is only probed.
func (e *secureEnv) reconcileFast() *crawlv1.Proxy {
	e.t.Helper()
	if _, err := e.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: e.key}); err != nil {
		e.t.Fatalf("Reconcile: %v", err)
	}
	return e.proxy()
}

func (e *secureEnv) proxy() *crawlv1.Proxy {
	e.t.Helper()
	p := &crawlv1.Proxy{}
	if err := e.r.Client.Get(context.Background(), e.key, p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *secureEnv) secret(name string) *corev1.Secret {
	e.t.Helper()
	s := &corev1.Secret{}
	err := e.r.Client.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, s)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *secureEnv) drainEvents() []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

func wantCond(t *testing.T, p *crawlv1.Proxy, typ string, status metav1.ConditionStatus, reason, msgPart string) {
	t.Helper()
	c := conditions.Get(p, typ)
	if c == nil || c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msgPart) {
		t.Fatalf("%s = %+v, want %s %s with %q", typ, c, status, reason, msgPart)
	}
}

// TestGeneratedCredentialIsMadeOnceAndReused: the first reconcile of a
// managed Proxy makes a Secret owned by it with a random password, hands
// the credential to the provider (Machine.Squid) and to the probe, and
// publishes the url; later reconciles reuse it, write nothing, and never
// regenerate it.
func TestGeneratedCredentialIsMadeOnceAndReused(t *testing.T) {
	e := newSecureEnv(t, secureProxy(managedAccess()), nil)
	e.r.ProbeSourceCIDRs = []string{"10.0.0.7/32"}
	p, _ := e.reconcile()

	if p.Status.Phase != crawlv1.ProxyReady || p.Status.CredentialsSecretRef == nil || p.Status.CredentialsSecretRef.Name != "p-proxy-credentials" {
		t.Fatalf("phase %s, credentialsSecretRef %+v; want Ready with p-proxy-credentials", p.Status.Phase, p.Status.CredentialsSecretRef)
	}
	s := e.secret("p-proxy-credentials")
	if s == nil {
		t.Fatal("no credential Secret")
	}
	if !metav1.IsControlledBy(s, p) || s.Labels[labelManagedBy] != managedBy {
		t.Fatalf("Secret owners %+v labels %v: want controlled by the Proxy and labelled managed-by", s.OwnerReferences, s.Labels)
	}
	user, pass := string(s.Data["username"]), string(s.Data["password"])
	if user != "p" || len(pass) < 32 {
		t.Fatalf("credential %q with a %d-character password, want user p and 32 or more", user, len(pass))
	}
	wantURL := (&url.URL{Scheme: "http", User: url.UserPassword(user, pass), Host: stateAddress + ":3128"}).String()
	if got := string(s.Data["url"]); got != wantURL {
		t.Fatalf("url %q, want %q", got, wantURL)
	}

	if len(e.prov.created) != 1 {
		t.Fatalf("%d Creates, want 1", len(e.prov.created))
	}
	sq := e.prov.created[0].Squid
	if sq == nil || sq.Auth != (squid.Auth{Type: squid.AuthBasic, Username: user, Password: pass}) || sq.Port != 3128 ||
		!slices.Equal(sq.AllowedSourceCIDRs, []string{"10.244.0.0/16", "10.0.0.7/32"}) || !slices.Equal(sq.AllowedPorts, []int{80, 443}) ||
		sq.MaxConnectionsPerClient != 256 {
		t.Fatalf("Machine.Squid = %+v, want spec.access with the generated credential and the probe source", sq)
	}
	if err := sq.Validate(); err != nil {
		t.Fatalf("Machine.Squid does not render: %v", err)
	}
	if got := e.prober.probed[0]; got.Username != user || got.Password != pass {
		t.Fatalf("probe target %s/%d user %q: the probe did not carry the credential", got.Address, got.Port, got.Username)
	}
	if got := e.prober.checked[0]; got.Username != "" || got.Password != "" {
		t.Fatal("the check without credentials carried a credential")
	}
	wantCond(t, p, crawlv1.SecureCondition, metav1.ConditionTrue, crawlv1.ProxyAuthRequiredReason, "407")
	if evs := e.drainEvents(); !slices.ContainsFunc(evs, func(s string) bool { return strings.Contains(s, "CredentialsGenerated") }) {
		t.Fatalf("events %q, want CredentialsGenerated", evs)
	}

	// Later reconciles, full and fast: same credential, no write.
	rv := s.ResourceVersion
	for i := range 3 {
		if i == 1 {
			e.reconcileFast()
		} else {
			e.reconcile()
		}
	}
	again := e.secret("p-proxy-credentials")
	if string(again.Data["password"]) != pass || again.ResourceVersion != rv {
		t.Fatalf("Secret rewritten (resourceVersion %s -> %s) or password changed", rv, again.ResourceVersion)
	}
	for _, tgt := range e.prober.probed {
		if tgt.Password != pass {
			t.Fatal("a later probe used another password")
		}
	}
}

// TestLostGeneratedCredentialIsReportedNotRegenerated: the instance's squid
// keeps the old password, so a new one would lock everyone out.
func TestLostGeneratedCredentialIsReportedNotRegenerated(t *testing.T) {
	e := newSecureEnv(t, secureProxy(managedAccess()), nil)
	e.reconcile()
	if err := e.r.Client.Delete(context.Background(), e.secret("p-proxy-credentials")); err != nil {
		t.Fatal(err)
	}
	calls := len(e.prov.Calls())
	p, res := e.reconcile()
	wantCond(t, p, crawlv1.InstanceProvisionedCondition, metav1.ConditionFalse, crawlv1.ProxyCredentialsMissingReason, "Secret ns/p-proxy-credentials")
	wantCond(t, p, crawlv1.ReadyCondition, metav1.ConditionFalse, crawlv1.ProxyCredentialsMissingReason, "was deleted while instance "+stateProviderID)
	if e.secret("p-proxy-credentials") != nil {
		t.Fatal("a new credential was generated while the instance keeps the old one")
	}
	if got := e.prov.Calls()[calls:]; len(got) != 0 || res.RequeueAfter != dependencyPoll {
		t.Fatalf("provider calls %v, requeue %v: want none and a %s poll", got, res.RequeueAfter, dependencyPoll)
	}
}

// TestUserCredentialSecret: a missing Secret or key is a reason naming
// both, with no instance created; once complete, the credential reaches
// the provider and the probe, copied into the operator's Secret.
func TestUserCredentialSecret(t *testing.T) {
	access := managedAccess()
	access.Auth.SecretRef = &crawlv1.LocalObjectReference{Name: "mine"}
	e := newSecureEnv(t, secureProxy(access), nil)

	p, res := e.reconcile()
	wantCond(t, p, crawlv1.InstanceProvisionedCondition, metav1.ConditionFalse, crawlv1.ProxyCredentialsMissingReason,
		"Secret ns/mine (spec.access.auth.secretRef) not found: create it with keys username and password")
	if p.Status.Phase != crawlv1.ProxyPending || len(e.prov.Calls()) != 0 || res.RequeueAfter != dependencyPoll {
		t.Fatalf("phase %s, provider calls %v, requeue %v; want Pending, none, %s", p.Status.Phase, e.prov.Calls(), res.RequeueAfter, dependencyPoll)
	}

	mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mine"}, Type: crawlv1.CredentialsSecretType, Data: map[string][]byte{"username": []byte("crawler")}}
	if err := e.r.Client.Create(context.Background(), mine); err != nil {
		t.Fatal(err)
	}
	p, _ = e.reconcile()
	wantCond(t, p, crawlv1.InstanceProvisionedCondition, metav1.ConditionFalse, crawlv1.ProxyCredentialsMissingReason,
		`Secret ns/mine (spec.access.auth.secretRef) has no key "password"`)

	const short = "tooshort"
	mine.Data["password"] = []byte(short)
	if err := e.r.Client.Update(context.Background(), mine); err != nil {
		t.Fatal(err)
	}
	p, _ = e.reconcile()
	wantCond(t, p, crawlv1.InstanceProvisionedCondition, metav1.ConditionFalse, crawlv1.ProxyCredentialsInvalidReason, `key "password" must be at least 16 characters`)
	if p.Status.Phase != crawlv1.ProxyFailed || strings.Contains(conditions.GetMessage(p, crawlv1.ReadyCondition), short) {
		t.Fatalf("phase %s, message %q: want Failed, without the password", p.Status.Phase, conditions.GetMessage(p, crawlv1.ReadyCondition))
	}

	const pass = "a long enough p@ss/word"
	mine.Data["password"] = []byte(pass)
	if err := e.r.Client.Update(context.Background(), mine); err != nil {
		t.Fatal(err)
	}
	p, _ = e.reconcile()
	if p.Status.Phase != crawlv1.ProxyReady || len(e.prov.created) != 1 {
		t.Fatalf("phase %s, %d Creates; want Ready after one", p.Status.Phase, len(e.prov.created))
	}
	if a := e.prov.created[0].Squid.Auth; a.Username != "crawler" || a.Password != pass {
		t.Fatalf("Machine.Squid.Auth user %q: not the user's credential", a.Username)
	}
	copyOf := e.secret("p-proxy-credentials")
	wantURL := "http://crawler:a%20long%20enough%20p%40ss%2Fword@" + stateAddress + ":3128"
	if string(copyOf.Data["password"]) != pass || string(copyOf.Data["url"]) != wantURL {
		t.Fatalf("operator Secret url %q, want %q (user and password escaped)", copyOf.Data["url"], wantURL)
	}
	if e.prober.probed[len(e.prober.probed)-1].Password != pass {
		t.Fatal("the probe did not carry the user's credential")
	}
}

// TestCredentialSecretNameTakenIsAConflict: the operator never writes into
// a Secret that is not its Proxy's.
func TestCredentialSecretNameTakenIsAConflict(t *testing.T) {
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p-proxy-credentials"}, Data: map[string][]byte{"password": []byte("someone else's")}}
	e := newSecureEnv(t, secureProxy(managedAccess()), nil, foreign)
	p, _ := e.reconcile()
	wantCond(t, p, crawlv1.InstanceProvisionedCondition, metav1.ConditionFalse, crawlv1.ProxyCredentialsConflictReason, "is not this Proxy's")
	if got := e.secret("p-proxy-credentials"); string(got.Data["password"]) != "someone else's" || len(e.prov.Calls()) != 0 {
		t.Fatalf("foreign Secret changed or provider called (%v)", e.prov.Calls())
	}
}

// TestProbeAndSecureOutcomes: how the probe's answers and the answer to
// the request without credentials set ProxyHealthy, Secure, Ready and
// the phase.
func TestProbeAndSecureOutcomes(t *testing.T) {
	none := managedAccess()
	none.Auth.Type = crawlv1.ProxyAuthNone
	none.AllowedSourceCIDRs = []string{"10.244.1.0/24"}
	cases := []struct {
		name      string
		access    *crawlv1.ProxyAccess
		probe     func(proxyprobe.Target) proxyprobe.Result
		unauth    func(proxyprobe.Target) proxyprobe.Result
		wantPhase crawlv1.ProxyPhase
		// condition type → status, reason, message part
		want      map[string][3]string
		wantCheck bool // a request without credentials was sent (beside every probe)
	}{{
		name:   "407 to the probe: ProbeAuthFailed, Secure not judged",
		access: managedAccess(), wantCheck: true,
		probe: func(proxyprobe.Target) proxyprobe.Result {
			return proxyprobe.Result{Through: true, StatusCode: http.StatusProxyAuthRequired, Err: errString("GET http://probe/ through 10.0.0.5:3128: status 407, want 2xx")}
		},
		wantPhase: crawlv1.ProxyProvisioning,
		want: map[string][3]string{
			crawlv1.ProxyHealthyCondition: {"False", crawlv1.ProxyProbeAuthFailedReason, "squid refused the credential of Secret p-proxy-credentials"},
			crawlv1.ReadyCondition:        {"False", crawlv1.ProxyProbeAuthFailedReason, "status 407"},
		},
	}, {
		name:   "403 to the probe: the manager's source must be admitted, Secure not judged",
		access: managedAccess(), wantCheck: true,
		probe: func(proxyprobe.Target) proxyprobe.Result {
			return proxyprobe.Result{Through: true, StatusCode: http.StatusForbidden, Err: errString("status 403, want 2xx")}
		},
		wantPhase: crawlv1.ProxyProvisioning,
		want: map[string][3]string{
			crawlv1.ProxyHealthyCondition: {"False", crawlv1.ProxyProbeFailedReason, "the manager's source address must be admitted"},
		},
	}, {
		name:   "managed proxy serving without credentials: Secure False, never Ready",
		access: managedAccess(), unauth: answer(http.StatusNoContent), wantCheck: true,
		wantPhase: crawlv1.ProxyFailed,
		want: map[string][3]string{
			crawlv1.ProxyHealthyCondition: {"True", crawlv1.ProxyProbeSucceededReason, ""},
			crawlv1.SecureCondition:       {"False", crawlv1.ProxyOpenProxyReason, "answered with status 204 instead of 407"},
			crawlv1.ReadyCondition:        {"False", crawlv1.ProxyOpenProxyReason, "without authentication"},
		},
	}, {
		name:   "unmanaged proxy serving without credentials: Secure False, its user's call",
		access: nil, unauth: answer(http.StatusOK), wantCheck: true,
		wantPhase: crawlv1.ProxyReady,
		want: map[string][3]string{
			crawlv1.SecureCondition: {"False", crawlv1.ProxyOpenProxyReason, "its squid is the user's"},
			crawlv1.ReadyCondition:  {"True", crawlv1.ProxyReadyReason, "serving at"},
		},
	}, {
		name:   "unmanaged proxy that authenticates: Secure True",
		access: nil, wantCheck: true, wantPhase: crawlv1.ProxyReady,
		want: map[string][3]string{crawlv1.SecureCondition: {"True", crawlv1.ProxyAuthRequiredReason, "407"}},
	}, {
		name:   "403 without credentials: not known",
		access: managedAccess(), unauth: answer(http.StatusForbidden), wantCheck: true, wantPhase: crawlv1.ProxyReady,
		want: map[string][3]string{crawlv1.SecureCondition: {"Unknown", crawlv1.ProxySecureUnknownReason, "admit the manager's source address"}},
	}, {
		name:   "no answer without credentials: not known yet",
		access: managedAccess(), wantCheck: true, wantPhase: crawlv1.ProxyReady,
		unauth: func(proxyprobe.Target) proxyprobe.Result {
			return proxyprobe.Result{Through: true, Err: errString("connection reset by peer")}
		},
		want: map[string][3]string{crawlv1.SecureCondition: {"Unknown", crawlv1.ProxySecureUnknownReason, "connection reset"}},
	}, {
		name:   "auth None: only the source list guards it, Ready, not asked",
		access: none, wantPhase: crawlv1.ProxyReady,
		want: map[string][3]string{crawlv1.SecureCondition: {"False", crawlv1.ProxySourceListOnlyReason, "10.244.1.0/24"}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newSecureEnv(t, secureProxy(tc.access), &answerProber{probe: tc.probe, unauth: tc.unauth})
			p, _ := e.reconcile()
			if p.Status.Phase != tc.wantPhase {
				t.Fatalf("phase %s, want %s (Ready: %s %s)", p.Status.Phase, tc.wantPhase,
					conditions.GetReason(p, crawlv1.ReadyCondition), conditions.GetMessage(p, crawlv1.ReadyCondition))
			}
			for typ, w := range tc.want {
				wantCond(t, p, typ, metav1.ConditionStatus(w[0]), w[1], w[2])
			}
			if checked := len(e.prober.checked) > 0; checked != tc.wantCheck {
				t.Fatalf("request without credentials sent: %v, want %v", checked, tc.wantCheck)
			}
			if _, judged := tc.want[crawlv1.SecureCondition]; !judged && tc.wantPhase != crawlv1.ProxyReady {
				if c := conditions.Get(p, crawlv1.SecureCondition); c == nil || c.Message != "checked once the proxy serves" {
					t.Fatalf("Secure %+v after a failed probe: the check beside it must not be judged", c)
				}
			}
			if tc.access != nil && tc.access.Auth.Type == crawlv1.ProxyAuthNone {
				if sq := e.prov.created[0].Squid; sq.Auth.Type != squid.AuthNone || p.Status.CredentialsSecretRef != nil || e.secret("p-proxy-credentials") != nil {
					t.Fatalf("auth None: Squid.Auth %+v, credentialsSecretRef %+v; want None and no credential", sq.Auth, p.Status.CredentialsSecretRef)
				}
			}
		})
	}
}

// TestOpenProxyEventOnceAndRecovery: the Warning comes with the change to
// an open proxy, not with every probe, and a proxy that authenticates
// again is Ready again.
func TestOpenProxyEventOnceAndRecovery(t *testing.T) {
	open := true
	prober := &answerProber{unauth: func(t proxyprobe.Target) proxyprobe.Result {
		if open {
			return answer(http.StatusOK)(t)
		}
		return answer(http.StatusProxyAuthRequired)(t)
	}}
	e := newSecureEnv(t, secureProxy(managedAccess()), prober)
	e.reconcile()
	e.reconcile()
	var warnings int
	for _, ev := range e.drainEvents() {
		if strings.HasPrefix(ev, "Warning OpenProxy") {
			warnings++
		}
	}
	if warnings != 1 {
		t.Fatalf("%d OpenProxy warnings over two probes, want 1", warnings)
	}
	open = false
	if p, _ := e.reconcile(); p.Status.Phase != crawlv1.ProxyReady || !conditions.IsTrue(p, crawlv1.SecureCondition) {
		t.Fatalf("phase %s, Secure %+v after squid authenticates again", p.Status.Phase, conditions.Get(p, crawlv1.SecureCondition))
	}
}

// TestEgressAddressFollowsTheProbe: recorded from the probe URL's answer
// (source echo, measured at the probe that finds it), an Event on each change
// (old -> new); a probe that no longer echoes leaves the last measurement
// until it is stale, then the egress is unknown.
func TestEgressAddressFollowsTheProbe(t *testing.T) {
	egress := "203.0.113.5"
	prober := &answerProber{probe: func(proxyprobe.Target) proxyprobe.Result {
		return proxyprobe.Result{OK: true, Through: true, StatusCode: http.StatusOK, EgressAddress: egress, Latency: time.Millisecond}
	}}
	e := newSecureEnv(t, secureProxy(managedAccess()), prober)
	clk := e.r.Clock.(*clocktesting.FakePassiveClock)
	var changedAt time.Time
	steps := []struct {
		egress    string
		advance   time.Duration
		want      string
		source    crawlv1.EgressSource
		wantEvent string // "" = no EgressAddressChanged event
	}{
		{"203.0.113.5", 0, "203.0.113.5", crawlv1.EgressSourceEcho, "egress address none -> 203.0.113.5"},
		{"203.0.113.5", time.Second, "203.0.113.5", crawlv1.EgressSourceEcho, ""},
		{"198.51.100.9", time.Second, "198.51.100.9", crawlv1.EgressSourceEcho, "egress address 203.0.113.5 -> 198.51.100.9"},
		{"", time.Second, "198.51.100.9", crawlv1.EgressSourceEcho, ""},
		{"", e.r.Egress.StaleAfter - 2*time.Second, "198.51.100.9", crawlv1.EgressSourceEcho, ""},
		{"", 2 * time.Second, "", crawlv1.EgressSourceUnknown, ""},
	}
	for i, st := range steps {
		egress = st.egress
		clk.SetTime(clk.Now().Add(st.advance))
		p := e.reconcileFast() // the first is a full reconcile: not Ready yet
		if p.Status.EgressAddress != st.want || p.Status.EgressSource != st.source {
			t.Fatalf("step %d: egress %q (%s), want %q (%s)", i, p.Status.EgressAddress, p.Status.EgressSource, st.want, st.source)
		}
		if st.wantEvent != "" {
			changedAt = clk.Now()
		}
		// The same address measured again is held like lastProbeTime.
		if st.source == crawlv1.EgressSourceEcho && (p.Status.EgressMeasuredAt == nil || !p.Status.EgressMeasuredAt.Time.Equal(changedAt.Truncate(time.Second))) {
			t.Fatalf("step %d: egressMeasuredAt %v, want %v (the measurement that found the address)", i, p.Status.EgressMeasuredAt, changedAt)
		}
		var got []string
		for _, ev := range e.drainEvents() {
			if strings.Contains(ev, "EgressAddressChanged") {
				got = append(got, ev)
			}
		}
		switch {
		case st.wantEvent == "" && len(got) != 0:
			t.Fatalf("step %d: events %q, want none", i, got)
		case st.wantEvent != "" && (len(got) != 1 || !strings.HasSuffix(got[0], st.wantEvent)):
			t.Fatalf("step %d: events %q, want one ending %q", i, got, st.wantEvent)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestReadyWaitsOnlyForTheProbeAndTheCheck: Ready waits for one round of
// requests through the proxy, the probe and the check without credentials
// sent together, and the traffic counters are read after the write that
// makes the Proxy Ready. A squid that has just started answers its first
// requests slowly (a second each in a TCG guest), and its first Ready
// used to wait for five in a row.
func TestReadyWaitsOnlyForTheProbeAndTheCheck(t *testing.T) {
	checkSent := make(chan struct{})
	var once sync.Once
	prober := &answerProber{
		probe: func(proxyprobe.Target) proxyprobe.Result {
			select {
			case <-checkSent:
				return proxyprobe.Result{OK: true, Through: true, StatusCode: http.StatusNoContent, Latency: time.Millisecond}
			case <-time.After(2 * time.Second):
				return proxyprobe.Result{Through: true, Err: errString("the check without credentials was not sent while the probe waited for its answer")}
			}
		},
		unauth: func(tg proxyprobe.Target) proxyprobe.Result {
			once.Do(func() { close(checkSent) })
			return requiresAuth{}.ProbeWithoutCredentials(context.Background(), tg)
		},
	}
	e := newSecureEnv(t, secureProxy(managedAccess()), prober)
	stats := &readyAtRead{t: t, c: e.r.Client, key: e.key}
	e.r.Stats = stats

	p, _ := e.reconcile()
	if p.Status.Phase != crawlv1.ProxyReady {
		t.Fatalf("phase %s, want Ready (ProxyHealthy: %s)", p.Status.Phase, conditions.GetMessage(p, crawlv1.ProxyHealthyCondition))
	}
	wantCond(t, p, crawlv1.SecureCondition, metav1.ConditionTrue, crawlv1.ProxyAuthRequiredReason, "407")
	if len(stats.readyAtRead) != 1 {
		t.Fatalf("counters read %d times in one reconcile, want 1", len(stats.readyAtRead))
	}
	if !stats.readyAtRead[0] {
		t.Fatal("the traffic counters were read before the write that makes the Proxy Ready")
	}
}

// readyAtRead is a StatsReader that notes, at each reading, whether the
// stored Proxy is Ready.
type readyAtRead struct {
	t           *testing.T
	c           client.Client
	key         client.ObjectKey
	readyAtRead []bool
}

func (r *readyAtRead) ReadStats(ctx context.Context, _ proxyprobe.Target) (squid.Counters, error) {
	p := &crawlv1.Proxy{}
	if err := r.c.Get(ctx, r.key, p); err != nil {
		r.t.Errorf("get the Proxy at the reading: %v", err)
	}
	r.readyAtRead = append(r.readyAtRead, conditions.IsTrue(p, crawlv1.ReadyCondition))
	return squid.Counters{}, nil
}

func (r *readyAtRead) ReadUpstream(context.Context, proxyprobe.Target) (squid.UpstreamCounts, error) {
	return squid.UpstreamCounts{}, nil
}
