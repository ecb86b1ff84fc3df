package fleet

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

// policy is the defaults for replicas, changed by opts.
func policy(replicas int, opts ...func(*Policy)) Policy {
	p, err := PolicyFor(&crawlv1.ProxyPoolSpec{Replicas: ptrTo(int32(replicas))})
	if err != nil {
		panic(err)
	}
	p.MaxCreatesPerMinute = 100
	for _, o := range opts {
		o(&p)
	}
	return p
}

func ptrTo[T any](v T) *T { return &v }

// ready is a replica Ready since long before t0, made age before t0.
func ready(name string, age time.Duration) Replica {
	c := t0.Add(-age)
	return Replica{Name: name, UID: "uid-" + name, Created: c, Ready: true, ReadyChanged: c.Add(min(time.Minute, age)), UpToDate: true}
}

func with(r Replica, f func(*Replica)) Replica { f(&r); return r }

func outdated(r Replica) Replica { r.UpToDate = false; return r }

// booting is a replica made age ago whose Ready has been False since.
func booting(name string, age time.Duration) Replica {
	c := t0.Add(-age)
	return Replica{Name: name, UID: "uid-" + name, Created: c, ReadyChanged: c, UpToDate: true}
}

func TestDecide(t *testing.T) {
	type want struct {
		creates                      int
		drain, delete, rotate, publ  []string
		lineages                     []Lineage
		next                         time.Duration // from t0; 0: none
		available, unhealthy         int
		remediationOff               bool
		expiredWaiting, backingOff   int
		limitedUntil, nextRotation   time.Duration
		checkPublish, checkNext      bool
		checkLineage, checkRotations bool
	}
	cases := []struct {
		name   string
		policy Policy
		state  State
		want   want
	}{
		{
			name:   "scale up creates every missing replica at once",
			policy: policy(5),
			state:  State{Replicas: []Replica{ready("a", time.Hour)}},
			want:   want{creates: 4, available: 1},
		},
		{
			name:   "scale up stops at the per-minute create cap and says until when",
			policy: policy(5, func(p *Policy) { p.MaxCreatesPerMinute = 3 }),
			state:  State{RecentCreates: []time.Time{t0.Add(-50 * time.Second), t0.Add(-10 * time.Second), t0.Add(-2 * time.Minute)}},
			want:   want{creates: 1, limitedUntil: 10 * time.Second, next: 10 * time.Second, checkNext: true},
		},
		{
			name:   "the first creates at the cap hold the rest a minute",
			policy: policy(5, func(p *Policy) { p.MaxCreatesPerMinute = 2 }),
			want:   want{creates: 2, limitedUntil: time.Minute, next: time.Minute, checkNext: true},
		},
		{
			name:   "scale down drains marked first, then not Ready, then the oldest",
			policy: policy(2),
			state: State{Replicas: []Replica{
				ready("old", 5*time.Hour), ready("mid", 3*time.Hour), ready("young", time.Hour),
				with(ready("banned", time.Hour/2), func(r *Replica) { r.Marked = true }),
				booting("boot", time.Minute),
			}},
			// Marked replicas are replaced, not only removed: "banned" is
			// condemned, so it goes first; the rest by order. Withheld
			// from crawlers since its report, it is not available.
			want: want{drain: []string{"banned", "boot", "old"}, available: 3},
		},
		{
			name:   "scale down by Newest",
			policy: policy(1, func(p *Policy) { p.Order = crawlv1.ScaleDownNewest }),
			state:  State{Replicas: []Replica{ready("old", 5*time.Hour), ready("mid", 3*time.Hour), ready("young", time.Hour)}},
			want:   want{drain: []string{"mid", "young"}, available: 3},
		},
		{
			name:   "draining replicas are deleted once drained long enough, not before",
			policy: policy(2),
			state: State{Replicas: []Replica{
				ready("a", time.Hour), ready("b", time.Hour),
				with(ready("c", time.Hour), func(r *Replica) { r.DrainingSince = t0.Add(-30 * time.Second) }),
				with(ready("d", time.Hour), func(r *Replica) { r.DrainingSince = t0.Add(-29 * time.Second) }),
			}},
			want: want{delete: []string{"c"}, available: 2, next: time.Second, checkNext: true,
				publ: []string{"a", "b"}, checkPublish: true},
		},
		{
			name:   "drainSeconds 0 deletes without draining",
			policy: policy(1, func(p *Policy) { p.Drain = 0 }),
			state:  State{Replicas: []Replica{ready("a", 2*time.Hour), ready("b", time.Hour)}},
			want:   want{delete: []string{"a"}, available: 2},
		},
		{
			name:   "publishes the Ready replicas that are not draining and not drained now",
			policy: policy(2),
			state: State{Replicas: []Replica{
				ready("a", 3*time.Hour), ready("b", 2*time.Hour), ready("c", time.Hour), booting("d", time.Minute),
				with(ready("e", time.Hour), func(r *Replica) { r.DrainingSince = t0 }),
			}},
			want: want{drain: []string{"a", "d"}, publ: []string{"b", "c"}, checkPublish: true, available: 3},
		},
		{
			name:   "rollout surges one and keeps every old replica while the new one is not available",
			policy: policy(3),
			state:  State{Replicas: []Replica{outdated(ready("a", time.Hour)), outdated(ready("b", time.Hour)), outdated(ready("c", time.Hour))}},
			want:   want{creates: 1, available: 3},
		},
		{
			name:   "rollout waits for the surged replica",
			policy: policy(3),
			state: State{Replicas: []Replica{outdated(ready("a", time.Hour)), outdated(ready("b", time.Hour)), outdated(ready("c", time.Hour)),
				booting("n1", time.Minute)}},
			want: want{available: 3},
		},
		{
			name:   "rollout drains the oldest outdated replica once the new one is available",
			policy: policy(3),
			state: State{Replicas: []Replica{outdated(ready("a", 2*time.Hour)), outdated(ready("b", time.Hour)), outdated(ready("c", 3*time.Hour)),
				ready("n1", 10*time.Minute)}},
			want: want{drain: []string{"c"}, available: 4},
		},
		{
			name:   "a Ready replica is not available before minReadySeconds",
			policy: policy(3, func(p *Policy) { p.MinReady = 30 * time.Second }),
			state: State{Replicas: []Replica{outdated(ready("a", time.Hour)), outdated(ready("b", time.Hour)), outdated(ready("c", time.Hour)),
				with(booting("n1", time.Minute), func(r *Replica) { r.Ready = true; r.ReadyChanged = t0.Add(-20 * time.Second) })}},
			want: want{available: 3, next: 10 * time.Second, checkNext: true},
		},
		{
			name:   "maxSurge 0 drains first within maxUnavailable",
			policy: policy(3, func(p *Policy) { p.MaxSurge, p.MaxUnavailable = 0, 1 }),
			state:  State{Replicas: []Replica{outdated(ready("a", time.Hour)), outdated(ready("b", 2*time.Hour)), outdated(ready("c", time.Hour))}},
			want:   want{drain: []string{"b"}, available: 3},
		},
		{
			name:   "maxSurge 0 drains no more while one is on its way out",
			policy: policy(3, func(p *Policy) { p.MaxSurge, p.MaxUnavailable = 0, 1 }),
			state: State{Replicas: []Replica{outdated(ready("a", time.Hour)), outdated(ready("c", time.Hour)),
				with(outdated(ready("b", time.Hour)), func(r *Replica) { r.DeletingSince = t0.Add(-time.Second) })}},
			want: want{available: 2},
		},
		{
			name:   "placement refused: maxUnavailable lets a rollout drain first",
			policy: policy(2, func(p *Policy) { p.MaxUnavailable = 1 }),
			state:  State{PlacementBlocked: true, Replicas: []Replica{outdated(ready("a", 2*time.Hour)), outdated(ready("b", time.Hour))}},
			want:   want{creates: 1, drain: []string{"a"}, available: 2},
		},
		{
			name:   "placement refused without maxUnavailable: nothing drained",
			policy: policy(2),
			state:  State{PlacementBlocked: true, Replicas: []Replica{outdated(ready("a", 2*time.Hour)), outdated(ready("b", time.Hour))}},
			want:   want{creates: 1, available: 2},
		},
		{
			name:   "paused: the status still learns when a replica turns unhealthy",
			policy: policy(3, func(p *Policy) { p.Paused = true }),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour),
				with(ready("c", time.Hour), func(r *Replica) { r.Ready = false; r.ReadyChanged = t0.Add(-time.Minute) })}},
			want: want{available: 2, next: 4 * time.Minute, checkNext: true},
		},
		{
			name:   "OnDelete leaves outdated replicas",
			policy: policy(2, func(p *Policy) { p.OnDelete = true }),
			state:  State{Replicas: []Replica{outdated(ready("a", time.Hour)), outdated(ready("b", time.Hour))}},
			want:   want{available: 2},
		},
		{
			name:   "paused: no replacement, scaling goes on",
			policy: policy(3, func(p *Policy) { p.Paused = true }),
			state: State{Replicas: []Replica{outdated(ready("a", time.Hour)),
				with(ready("b", time.Hour), func(r *Replica) { r.Marked = true })}},
			want: want{creates: 1, available: 2},
		},
		{
			name:   "a marked replica is unpublished at once and replaced surge first",
			policy: policy(2),
			state:  State{Replicas: []Replica{ready("a", time.Hour), with(ready("b", time.Hour), func(r *Replica) { r.Marked = true })}},
			want:   want{creates: 1, available: 1, publ: []string{"a"}, checkPublish: true},
		},
		{
			name:   "a replica not Ready by startupTimeout is replaced, surge first, its slot's failure passed on",
			policy: policy(3),
			state:  State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), booting("x", 10*time.Minute)}},
			want: want{creates: 1, available: 2, unhealthy: 1,
				lineages: []Lineage{{Failures: 1, Replaces: "x"}}, checkLineage: true},
		},
		{
			name:   "a booting replica inside startupTimeout is left alone until then",
			policy: policy(3),
			state:  State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), booting("x", 9*time.Minute)}},
			want:   want{available: 2, next: time.Minute, checkNext: true},
		},
		{
			name:   "the failed replica stays until its replacement is available; nothing more is created",
			policy: policy(3),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), booting("x", 11*time.Minute),
				with(booting("y", time.Minute), func(r *Replica) { r.Replaces = "x"; r.StartupFailures = 1 })}},
			want: want{available: 2, unhealthy: 1, checkLineage: true},
		},
		{
			name:   "the failed replica is drained once its replacement is available",
			policy: policy(3),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), booting("x", 11*time.Minute),
				with(ready("y", time.Minute), func(r *Replica) { r.Replaces = "x"; r.StartupFailures = 1 })}},
			want: want{drain: []string{"x"}, available: 3, unhealthy: 1, checkLineage: true},
		},
		{
			name:   "maxUnhealthy 40% of one replica still heals it",
			policy: policy(1),
			state:  State{Replicas: []Replica{booting("x", 10*time.Minute)}},
			want:   want{creates: 1, unhealthy: 1, lineages: []Lineage{{Failures: 1, Replaces: "x"}}, checkLineage: true},
		},
		{
			name:   "maxUnhealthy 0 never remediates",
			policy: policy(3, func(p *Policy) { p.MaxUnhealthy = intstr.FromInt32(0) }),
			state:  State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), booting("x", 10*time.Minute)}},
			want:   want{available: 2, unhealthy: 1, remediationOff: true},
		},
		{
			name:   "a slot that failed before waits startupBackoff past the startup timeout",
			policy: policy(3),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour),
				with(booting("y", 10*time.Minute), func(r *Replica) { r.StartupFailures = 2 })}},
			// Two failures before: 30s, doubled once.
			want: want{available: 2, unhealthy: 1, backingOff: 1, next: time.Minute, checkNext: true},
		},
		{
			name:   "after its backoff the replica is replaced and its replacement inherits one more failure",
			policy: policy(3),
			state: State{Now: t0.Add(time.Minute), Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour),
				with(booting("y", 10*time.Minute), func(r *Replica) { r.StartupFailures = 2 })}},
			want: want{creates: 1, available: 2, unhealthy: 1, lineages: []Lineage{{Failures: 3, Replaces: "y"}}, checkLineage: true},
		},
		{
			name:   "a remembered slot of a replica already gone is inherited",
			policy: policy(2),
			state:  State{Replicas: []Replica{ready("a", time.Hour)}, Lineages: []Lineage{{Failures: 2, Replaces: "gone"}}},
			want:   want{creates: 1, available: 1, lineages: []Lineage{{Failures: 2, Replaces: "gone"}}, checkLineage: true},
		},
		{
			name:   "a replica that ran is replaced after unhealthyTimeout, not before",
			policy: policy(3),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour),
				with(ready("c", time.Hour), func(r *Replica) { r.Ready = false; r.ReadyChanged = t0.Add(-4 * time.Minute) })}},
			want: want{available: 2, next: time.Minute, checkNext: true},
		},
		{
			name:   "unhealthy past unhealthyTimeout: replaced, no lineage (it had started)",
			policy: policy(3),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour),
				with(ready("c", time.Hour), func(r *Replica) { r.Ready = false; r.ReadyChanged = t0.Add(-5 * time.Minute) })}},
			want: want{creates: 1, available: 2, unhealthy: 1, checkLineage: true},
		},
		{
			name:   "short-circuit: 3 of 5 unhealthy is more than 40%, nothing is replaced",
			policy: policy(5),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour),
				with(ready("c", time.Hour), func(r *Replica) { r.Ready = false; r.ReadyChanged = t0.Add(-time.Hour) }),
				with(ready("d", time.Hour), func(r *Replica) { r.Ready = false; r.ReadyChanged = t0.Add(-time.Hour) }),
				with(ready("e", time.Hour), func(r *Replica) { r.Ready = false; r.ReadyChanged = t0.Add(-time.Hour) })}},
			want: want{available: 2, unhealthy: 3, remediationOff: true},
		},
		{
			name:   "an expired replica rotates with a surged replacement",
			policy: policy(3, func(p *Policy) { p.MaxAge = time.Hour }),
			state:  State{Replicas: []Replica{ready("a", 2*time.Hour), ready("b", 10*time.Minute), ready("c", 10*time.Minute)}},
			want:   want{creates: 1, rotate: []string{"a"}, available: 3, checkRotations: true, nextRotation: 50 * time.Minute},
		},
		{
			name:   "rotation waits while a replica is unavailable",
			policy: policy(3, func(p *Policy) { p.MaxAge = time.Hour }),
			state:  State{Replicas: []Replica{ready("a", 2*time.Hour), ready("b", 10*time.Minute), booting("c", time.Minute)}},
			want:   want{available: 2, expiredWaiting: 1, checkRotations: true},
		},
		{
			name:   "rotation waits minInterval after the last start",
			policy: policy(3, func(p *Policy) { p.MaxAge, p.RotationInterval = time.Hour, 5*time.Minute }),
			state:  State{LastRotation: t0.Add(-time.Minute), Replicas: []Replica{ready("a", 2*time.Hour), ready("b", 2*time.Hour), ready("c", 10*time.Minute)}},
			want: want{available: 3, expiredWaiting: 2, checkRotations: true, nextRotation: 4 * time.Minute,
				next: 4 * time.Minute, checkNext: true},
		},
		{
			name: "rotation starts one per minInterval even with room for more",
			policy: policy(3, func(p *Policy) {
				p.MaxAge, p.RotationInterval, p.MaxConcurrentRotations, p.MaxSurge = time.Hour, time.Minute, 3, 3
			}),
			state: State{Replicas: []Replica{ready("a", 2*time.Hour), ready("b", 3*time.Hour), ready("c", 10*time.Minute)}},
			want:  want{creates: 1, rotate: []string{"b"}, available: 3, expiredWaiting: 1, checkRotations: true, nextRotation: time.Minute},
		},
		{
			name:   "rotation keeps to maxConcurrent",
			policy: policy(3, func(p *Policy) { p.MaxAge, p.MaxSurge = time.Hour, 2 }),
			state: State{Replicas: []Replica{with(ready("a", 2*time.Hour), func(r *Replica) { r.RotatingSince = t0.Add(-time.Second) }),
				ready("b", 2*time.Hour), ready("c", 10*time.Minute), ready("n", time.Second)}},
			want: want{available: 4, expiredWaiting: 1, drain: []string{"a"}, checkRotations: true},
		},
		{
			name:   "rotation never drains first, even with maxUnavailable",
			policy: policy(3, func(p *Policy) { p.MaxAge, p.MaxSurge, p.MaxUnavailable = time.Hour, 0, 1 }),
			state: State{Replicas: []Replica{with(ready("a", 2*time.Hour), func(r *Replica) { r.RotatingSince = t0.Add(-time.Second) }),
				ready("b", 10*time.Minute), ready("c", 10*time.Minute)}},
			want: want{available: 3, checkRotations: true},
		},
		{
			name:   "rotation waits when a rollout uses the surge room",
			policy: policy(2, func(p *Policy) { p.MaxAge = time.Hour }),
			state:  State{Replicas: []Replica{outdated(ready("a", 10*time.Minute)), ready("b", 2*time.Hour)}},
			want:   want{creates: 1, available: 2, expiredWaiting: 1, checkRotations: true},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.state
			if s.Now.IsZero() {
				s.Now = t0
			}
			plan := Decide(tc.policy, s)
			w := tc.want
			if len(plan.Create) != w.creates {
				t.Errorf("creates %d, want %d", len(plan.Create), w.creates)
			}
			for _, c := range []struct {
				what      string
				got, want []string
			}{{"drain", plan.Drain, w.drain}, {"delete", plan.Delete, w.delete}, {"rotate", plan.Rotate, w.rotate}} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s %v, want %v", c.what, c.got, c.want)
				}
			}
			if w.checkPublish && !slices.Equal(plan.Publish, w.publ) {
				t.Errorf("publish %v, want %v", plan.Publish, w.publ)
			}
			if plan.Status.Available != w.available {
				t.Errorf("available %d, want %d", plan.Status.Available, w.available)
			}
			if plan.Status.Unhealthy != w.unhealthy {
				t.Errorf("unhealthy %d, want %d", plan.Status.Unhealthy, w.unhealthy)
			}
			if plan.Status.RemediationAllowed == w.remediationOff {
				t.Errorf("remediation allowed %v, want %v", plan.Status.RemediationAllowed, !w.remediationOff)
			}
			if plan.Status.BackingOff != w.backingOff {
				t.Errorf("backing off %d, want %d", plan.Status.BackingOff, w.backingOff)
			}
			if w.checkNext && !plan.Next.Equal(at(s.Now, w.next)) {
				t.Errorf("next %s, want %s", plan.Next, at(s.Now, w.next))
			}
			if w.limitedUntil != 0 && !plan.Status.CreateLimitedUntil.Equal(t0.Add(w.limitedUntil)) {
				t.Errorf("create limited until %s, want %s", plan.Status.CreateLimitedUntil, t0.Add(w.limitedUntil))
			}
			if w.checkLineage {
				var got []Lineage
				for _, c := range plan.Create {
					if c.Replaces != "" {
						got = append(got, c.Lineage)
					}
				}
				if !slices.Equal(got, w.lineages) {
					t.Errorf("lineages %v, want %v", got, w.lineages)
				}
			}
			if w.checkRotations {
				if plan.Status.ExpiredWaiting != w.expiredWaiting {
					t.Errorf("expired waiting %d, want %d", plan.Status.ExpiredWaiting, w.expiredWaiting)
				}
				if w.nextRotation != 0 && !plan.Status.NextRotation.Equal(t0.Add(w.nextRotation)) {
					t.Errorf("next rotation %s, want %s", plan.Status.NextRotation, t0.Add(w.nextRotation))
				}
			}
		})
	}
}

func at(now time.Time, d time.Duration) time.Time {
	if d == 0 {
		return time.Time{}
	}
	return now.Add(d)
}

func TestDecideRandomScaleDownFollowsTheInjectedRandomness(t *testing.T) {
	p := policy(2, func(p *Policy) { p.Order = crawlv1.ScaleDownRandom })
	var rs []Replica
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		rs = append(rs, ready(n, time.Hour))
	}
	seen := map[string]bool{}
	for seed := range uint64(20) {
		s := State{Now: t0, Replicas: rs, Rand: rand.New(rand.NewPCG(seed, 1))}
		a, b := Decide(p, s), Decide(p, State{Now: t0, Replicas: rs, Rand: rand.New(rand.NewPCG(seed, 1))})
		if !slices.Equal(a.Drain, b.Drain) {
			t.Fatalf("seed %d: %v then %v", seed, a.Drain, b.Drain)
		}
		if len(a.Drain) != 4 {
			t.Fatalf("seed %d: drained %v, want 4", seed, a.Drain)
		}
		seen[strings.Join(a.Drain, ",")] = true
	}
	if len(seen) < 5 {
		t.Errorf("20 seeds gave only %d different victim sets: not random", len(seen))
	}
	// Marked and not-Ready replicas still go first.
	rs[3].Marked = true
	rs[5] = booting("f", time.Minute)
	for seed := range uint64(10) {
		plan := Decide(p, State{Now: t0, Replicas: rs, Rand: rand.New(rand.NewPCG(seed, 2))})
		if !slices.Contains(plan.Drain, "d") || !slices.Contains(plan.Drain, "f") {
			t.Fatalf("seed %d: drained %v, want d (marked) and f (not Ready) among them", seed, plan.Drain)
		}
	}
}

func TestPolicyFor(t *testing.T) {
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	num := func(n int) *intstr.IntOrString { v := intstr.FromInt32(int32(n)); return &v }
	cases := []struct {
		name                  string
		spec                  crawlv1.ProxyPoolSpec
		surge, unavail, drain int
		err                   bool
	}{
		{name: "defaults", spec: crawlv1.ProxyPoolSpec{Replicas: ptrTo(int32(10))}, surge: 1, unavail: 0, drain: 30},
		{name: "percent surge rounds up, unavailable down",
			spec:  crawlv1.ProxyPoolSpec{Replicas: ptrTo(int32(10)), Rollout: crawlv1.ProxyPoolRollout{MaxSurge: pct("25%"), MaxUnavailable: pct("25%")}},
			surge: 3, unavail: 2, drain: 30},
		{name: "both rounding to 0 surge one",
			spec:  crawlv1.ProxyPoolSpec{Replicas: ptrTo(int32(2)), Rollout: crawlv1.ProxyPoolRollout{MaxSurge: pct("0%"), MaxUnavailable: pct("10%")}},
			surge: 1, unavail: 0, drain: 30},
		{name: "maxUnavailable at most replicas",
			spec:  crawlv1.ProxyPoolSpec{Replicas: ptrTo(int32(2)), Rollout: crawlv1.ProxyPoolRollout{MaxUnavailable: num(5), DrainSeconds: ptrTo(int32(0))}},
			surge: 1, unavail: 2, drain: 0},
		{name: "malformed percent", spec: crawlv1.ProxyPoolSpec{Rollout: crawlv1.ProxyPoolRollout{MaxSurge: pct("x%")}}, err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := PolicyFor(&tc.spec)
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if tc.err {
				return
			}
			if p.MaxSurge != tc.surge || p.MaxUnavailable != tc.unavail || p.Drain != time.Duration(tc.drain)*time.Second {
				t.Errorf("surge %d unavailable %d drain %s, want %d %d %ds", p.MaxSurge, p.MaxUnavailable, p.Drain, tc.surge, tc.unavail, tc.drain)
			}
		})
	}
}

func TestStartupBackoffFor(t *testing.T) {
	p := policy(1)
	for failures, want := range map[int]time.Duration{
		0: 0, 1: 30 * time.Second, 2: time.Minute, 3: 2 * time.Minute, 7: 30 * time.Minute, 50: 30 * time.Minute,
	} {
		if got := p.StartupBackoffFor(failures); got != want {
			t.Errorf("after %d failures %s, want %s", failures, got, want)
		}
	}
	p.StartupBackoff = time.Hour
	if got := p.StartupBackoffFor(3); got != time.Hour {
		t.Errorf("a startupBackoff above the cap is the cap: %s", got)
	}
}
