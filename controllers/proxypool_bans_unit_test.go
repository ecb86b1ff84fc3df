package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// publishedEntries reads proxies.json from the pool's Secret.
func (u *poolUnit) publishedEntries() map[string]PublishedProxy {
	u.t.Helper()
	sec := &corev1.Secret{}
	if err := u.c.Client.Get(context.Background(), client.ObjectKey{Namespace: u.pool.Namespace, Name: crawlv1.PublishedName(u.pool.Name)}, sec); err != nil {
		u.t.Fatalf("published Secret: %v", err)
	}
	var entries []PublishedProxy
	if err := json.Unmarshal(sec.Data[crawlv1.ProxiesJSONKey], &entries); err != nil {
		u.t.Fatalf("proxies.json: %v", err)
	}
	out := map[string]PublishedProxy{}
	for _, e := range entries {
		out[e.Name] = e
	}
	return out
}

// report creates a ProxyBan made at the fake clock's now (the fake client
// does not stamp creation times).
func (u *poolUnit) report(name, proxy, domain string, replace bool) {
	u.t.Helper()
	b := &crawlv1.ProxyBan{ObjectMeta: metav1.ObjectMeta{Namespace: u.pool.Namespace, Name: name, CreationTimestamp: metav1.NewTime(u.clock.Now())},
		Spec: crawlv1.ProxyBanSpec{Pool: u.pool.Name, Proxy: proxy, Domain: domain, Replace: replace, Reason: "HTTP 403 x12"}}
	if err := u.c.Client.Create(context.Background(), b); err != nil {
		u.t.Fatal(err)
	}
}

// setEgress gives a replica a measured egress address.
func (u *poolUnit) setEgress(name, addr string, source crawlv1.EgressSource) {
	u.t.Helper()
	p := &crawlv1.Proxy{}
	if err := u.c.Client.Get(context.Background(), client.ObjectKey{Namespace: u.pool.Namespace, Name: name}, p); err != nil {
		u.t.Fatal(err)
	}
	p.Status.EgressAddress, p.Status.EgressSource = addr, source
	if err := u.c.Client.Status().Update(context.Background(), p); err != nil {
		u.t.Fatal(err)
	}
}

func (u *poolUnit) annotateReplica(name, key, value string) {
	u.t.Helper()
	p := &crawlv1.Proxy{}
	if err := u.c.Client.Get(context.Background(), client.ObjectKey{Namespace: u.pool.Namespace, Name: name}, p); err != nil {
		u.t.Fatal(err)
	}
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[key] = value
	if err := u.c.Client.Update(context.Background(), p); err != nil {
		u.t.Fatal(err)
	}
}

func (u *poolUnit) readyPool(n int) []string {
	u.t.Helper()
	u.reconcile()
	u.readyAll(time.Hour)
	u.reconcile()
	names := proxyNames(u.replicas())
	if len(names) != n || len(u.publishedEntries()) != n {
		u.t.Fatalf("replicas %v, published %d; want %d of each", names, len(u.publishedEntries()), n)
	}
	return names
}

func (u *poolUnit) events() []string {
	var out []string
	for {
		select {
		case e := <-u.r.Recorder.(*record.FakeRecorder).Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestPoolDomainBanIsPublishedWithItsExpiryAndEnds(t *testing.T) {
	u := newPoolUnit(t, 2, func(p *crawlv1.ProxyPool) {
		p.Spec.Bans.DomainBanDuration = &metav1.Duration{Duration: 2 * time.Hour}
	})
	names := u.readyPool(2)
	banned := names[0]
	made := u.clock.Now()
	u.report("b1", banned, "example.com", false)
	u.clock.Step(10 * time.Minute)
	// A later report on the same domain extends the ban; another domain adds one.
	u.report("b2", banned, "example.com", false)
	u.report("b3", banned, "shop.test", false)
	u.reconcile()

	got := u.publishedEntries()
	want := []BannedDomain{{Domain: "example.com", ExpiresAt: made.Add(10*time.Minute + 2*time.Hour).UTC().Format(time.RFC3339)},
		{Domain: "shop.test", ExpiresAt: made.Add(10*time.Minute + 2*time.Hour).UTC().Format(time.RFC3339)}}
	if !slices.Equal(got[banned].BannedDomains, want) {
		t.Errorf("bannedDomains %+v, want %+v", got[banned].BannedDomains, want)
	}
	// The shape the recipes read (test/recipes, docs/examples/python).
	sec := &corev1.Secret{}
	if err := u.c.Client.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: crawlv1.PublishedName(u.pool.Name)}, sec); err != nil {
		t.Fatal(err)
	}
	var raw []map[string]any
	if err := json.Unmarshal(sec.Data[crawlv1.ProxiesJSONKey], &raw); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(raw, func(e map[string]any) bool { return e["name"] == banned })
	if first := fmt.Sprint(raw[max(i, 0)]["bannedDomains"]); i < 0 || !strings.HasPrefix(first, "[map[domain:example.com expiresAt:"+want[0].ExpiresAt+"]") {
		t.Errorf("proxies.json entry %v: want bannedDomains as [{domain, expiresAt}]", raw[max(i, 0)])
	}
	if len(got) != 2 || got[names[1]].BannedDomains != nil {
		t.Errorf("published %+v: want both replicas, the other without bans", got)
	}
	if n := len(u.replicas()); n != 2 {
		t.Errorf("%d replicas: a domain ban replaced nothing, want 2", n)
	}

	u.clock.Step(2*time.Hour + time.Second)
	u.reconcile()
	if bd := u.publishedEntries()[banned].BannedDomains; bd != nil {
		t.Errorf("bannedDomains %+v after they expired, want none", bd)
	}
	left := &crawlv1.ProxyBanList{}
	if err := u.c.Client.List(context.Background(), left); err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 0 {
		t.Errorf("%d expired domain reports left, want them deleted", len(left.Items))
	}
}

func TestPoolReplacesAfterBansOnReplaceAfterDomains(t *testing.T) {
	u := newPoolUnit(t, 2, func(p *crawlv1.ProxyPool) { p.Spec.Bans.ReplaceAfterDomains = 2 })
	names := u.readyPool(2)
	u.report("b1", names[0], "a.test", false)
	u.reconcile()
	if _, ok := u.publishedEntries()[names[0]]; !ok || len(u.replicas()) != 2 {
		t.Fatalf("one domain ban of two: want it published and nothing created")
	}
	u.report("b2", names[0], "b.test", false)
	u.reconcile()
	if _, ok := u.publishedEntries()[names[0]]; ok {
		t.Errorf("banned on 2 domains with replaceAfterDomains 2: still published")
	}
	if n := len(u.replicas()); n != 3 {
		t.Errorf("%d replicas, want a replacement made first (3)", n)
	}
	if st := u.getPool().Status.BanReplacements; len(st) != 1 || st[0].Replica != names[0] {
		t.Errorf("banReplacements %+v, want %s", st, names[0])
	}
}

func TestPoolQuarantinesTheReportedEgressUntilItExpires(t *testing.T) {
	u := newPoolUnit(t, 2, func(p *crawlv1.ProxyPool) {
		p.Spec.Egress.Quarantine = &metav1.Duration{Duration: 3 * time.Hour}
		// One replacement an hour: the second replica on the address waits.
		p.Spec.Bans.MaxReplacementsPerHour = ptr.To(int32(1))
		p.Spec.Bans.MaxBanned = ptr.To(intstr.FromString("100%"))
	})
	names := u.readyPool(2)
	banned, sharing := names[0], names[1]
	u.setEgress(banned, "203.0.113.9", crawlv1.EgressSourceEcho)
	u.annotateReplica(banned, crawlv1.DeleteProxyAnnotation, "")
	u.reconcile()
	pool := u.getPool()
	q := pool.Status.Quarantine
	if len(q) != 1 || q[0].Address != "203.0.113.9" || q[0].Replica != banned || !q[0].ExpiresAt.Time.Equal(u.clock.Now().Add(3*time.Hour).Truncate(time.Second)) {
		t.Fatalf("quarantine %+v, want 203.0.113.9 of %s until now+3h", q, banned)
	}
	if _, ok := u.publishedEntries()[banned]; ok {
		t.Errorf("the reported replica is still published")
	}

	// The other replica turns out to leave from the same address (NAT): it
	// is withheld at once; its replacement waits for the budget.
	u.setEgress(sharing, "203.0.113.9", crawlv1.EgressSourceEcho)
	u.reconcile()
	if _, ok := u.publishedEntries()[sharing]; ok {
		t.Errorf("a replica leaving from a quarantined address is published")
	}
	pool = u.getPool()
	if pool.Status.AvailableReplicas != 0 {
		t.Errorf("available %d, want 0: neither replica may serve", pool.Status.AvailableReplicas)
	}
	c := conditions.Get(pool, crawlv1.PoolBanReplacementPausedCondition)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != crawlv1.PoolBanBudgetExhaustedReason || !strings.Contains(c.Message, sharing) {
		t.Errorf("BanReplacementPaused %+v, want True/%s naming %s", c, crawlv1.PoolBanBudgetExhaustedReason, sharing)
	}

	// A restarted manager keeps the quarantine (status) ... (and no more
	// ban replacements, so the sharing replica waits it out)
	u.update(func(p *crawlv1.ProxyPool) { p.Spec.Bans.MaxReplacementsPerHour = ptr.To(int32(0)) })
	u.restart()
	u.clock.Step(3*time.Hour - time.Minute)
	u.reconcile()
	if _, ok := u.publishedEntries()[sharing]; ok || len(u.getPool().Status.Quarantine) != 1 {
		t.Errorf("after a restart, within the quarantine: %s published or the quarantine lost", sharing)
	}
	// ... until it expires: the entry goes and the replica's replacement
	// is no longer needed.
	u.clock.Step(time.Minute)
	u.reconcile()
	if q := u.getPool().Status.Quarantine; len(q) != 0 {
		t.Errorf("quarantine %+v after it expired, want none", q)
	}
	if _, ok := u.publishedEntries()[sharing]; !ok {
		t.Errorf("%s not published once the quarantine ended", sharing)
	}
}

func TestPoolQuarantinesOnlyMeasuredEgress(t *testing.T) {
	for _, src := range []crawlv1.EgressSource{"", crawlv1.EgressSourceUnknown} {
		u := newPoolUnit(t, 1)
		names := u.readyPool(1)
		u.setEgress(names[0], "10.0.0.5", src)
		u.report("b", names[0], "", true)
		u.reconcile()
		if q := u.getPool().Status.Quarantine; len(q) != 0 {
			t.Errorf("source %q: quarantine %+v, want nothing from an unmeasured egress", src, q)
		}
		if st := u.getPool().Status.BanReplacements; len(st) != 1 {
			t.Errorf("source %q: banReplacements %+v, want the replacement started all the same", src, st)
		}
	}
}

func TestPoolBanBudgetSurvivesARestart(t *testing.T) {
	u := newPoolUnit(t, 3, func(p *crawlv1.ProxyPool) {
		p.Spec.Bans.MaxReplacementsPerHour = ptr.To(int32(1))
		p.Spec.Bans.MaxBanned = ptr.To(intstr.FromString("100%"))
	})
	names := u.readyPool(3)
	u.report("first", names[0], "", true)
	u.reconcile()
	if _, ok := u.publishedEntries()[names[0]]; ok {
		t.Fatalf("the first report within the budget did not unpublish %s", names[0])
	}
	u.restart()
	u.report("second", names[1], "a.test", true)
	u.reconcile()
	got := u.publishedEntries()
	if _, ok := got[names[1]]; !ok {
		t.Errorf("the second report, past the budget, unpublished %s", names[1])
	}
	pool := u.getPool()
	c := conditions.Get(pool, crawlv1.PoolBanReplacementPausedCondition)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != crawlv1.PoolBanBudgetExhaustedReason {
		t.Fatalf("BanReplacementPaused %+v, want True/%s", c, crawlv1.PoolBanBudgetExhaustedReason)
	}
	if !slices.ContainsFunc(u.events(), func(e string) bool { return strings.Contains(e, "Warning "+crawlv1.PoolBanBudgetExhaustedReason) }) {
		t.Errorf("no Warning event when replacement paused")
	}
	u.clock.Step(time.Hour + time.Second)
	u.reconcile()
	if _, ok := u.publishedEntries()[names[1]]; ok {
		t.Errorf("an hour later the budget did not let the waiting report go")
	}
	if c := conditions.Get(u.getPool(), crawlv1.PoolBanReplacementPausedCondition); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("BanReplacementPaused %+v, want False", c)
	}
}

func TestPoolIgnoresAReportOnNoReplicaOfIt(t *testing.T) {
	u := newPoolUnit(t, 2)
	u.readyPool(2)
	u.events()
	before := u.getPool()
	pubs := len(u.pubs)
	u.report("stray", "not-a-replica", "", true)
	u.reconcile()
	u.reconcile()
	ev := u.events()
	warned := slices.DeleteFunc(slices.Clone(ev), func(e string) bool { return !strings.HasPrefix(e, "Warning BanIgnored") })
	if len(warned) != 1 || !strings.Contains(warned[0], "stray") || !strings.Contains(warned[0], "not-a-replica") {
		t.Errorf("events %q, want one Warning BanIgnored naming the report and its proxy", ev)
	}
	after := u.getPool()
	if !slices.Equal(proxyNames(u.replicas()), proxyNames(u.replicas())) || len(u.replicas()) != 2 || len(u.pubs) != pubs ||
		after.Status.AvailableReplicas != before.Status.AvailableReplicas || len(after.Status.BanReplacements) != 0 {
		t.Errorf("the pool changed for a report on no replica of it: %d replicas, %d publishes (was %d), status %+v",
			len(u.replicas()), len(u.pubs), pubs, after.Status)
	}
	if err := u.c.Client.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "stray"}, &crawlv1.ProxyBan{}); err != nil {
		t.Errorf("the ignored report: %v, want it kept for whoever reads the event", err)
	}
	// Once as old as a domain ban lasts, it is deleted.
	u.clock.Step(24 * time.Hour)
	u.reconcile()
	if err := u.c.Client.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "stray"}, &crawlv1.ProxyBan{}); !apierrors.IsNotFound(err) {
		t.Errorf("a day later the ignored report: %v, want it deleted", err)
	}
}

func TestBanMemoryBoundsDropTheSoonestToEnd(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	bm := &banMemory{records: map[string]time.Time{}, quarantine: map[string]crawlv1.QuarantinedAddress{}}
	for i := range maxQuarantine + 5 {
		a := fmt.Sprintf("203.0.%d.%d", i/250, i%250)
		// The first five end soonest.
		bm.quarantine[a] = crawlv1.QuarantinedAddress{Address: a, ExpiresAt: metav1.NewTime(now.Add(time.Duration(i+1) * time.Minute))}
		bm.records[fmt.Sprintf("r%d", i)] = now.Add(time.Duration(i) * time.Second)
	}
	bm.bound()
	if len(bm.quarantine) != maxQuarantine || len(bm.records) != maxBanRecords {
		t.Fatalf("%d quarantined, %d records; want %d, %d", len(bm.quarantine), len(bm.records), maxQuarantine, maxBanRecords)
	}
	for i := range 5 {
		if _, ok := bm.quarantine[fmt.Sprintf("203.0.0.%d", i)]; ok {
			t.Errorf("203.0.0.%d, among the soonest to end, kept", i)
		}
		if _, ok := bm.records[fmt.Sprintf("r%d", i)]; ok {
			t.Errorf("record r%d, among the oldest, kept", i)
		}
	}
	bm.prune(map[string]*crawlv1.Proxy{"r10": {}}, now.Add(2*time.Hour))
	for a, q := range bm.quarantine {
		if !q.ExpiresAt.After(now.Add(2 * time.Hour)) {
			t.Errorf("%s expired at %s, kept", a, q.ExpiresAt)
		}
	}
	if _, ok := bm.records["r10"]; !ok || len(bm.records) != 1 {
		t.Errorf("records %d, want only r10 (its replica is still there)", len(bm.records))
	}
}
