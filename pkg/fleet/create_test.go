package fleet

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func TestCreate(t *testing.T) {
	a := ready("a", time.Hour)
	cases := []struct {
		name    string
		p       Policy
		rs      []Replica
		b       budget
		creates int
		want    int
		// from t0; 0: no hold
		limitedUntil time.Duration
	}{
		{name: "as many as the desired count lacks", p: policy(5), rs: []Replica{a},
			b: budget{room: 5, rate: 10}, creates: 4, want: 4},
		{name: "a replaced replica counts as missing", p: policy(5), rs: []Replica{a, outdated(ready("b", time.Hour))},
			b: budget{room: 4, rate: 10}, creates: 4, want: 4},
		{name: "within the surge room", p: policy(5), rs: []Replica{a},
			b: budget{room: 2, rate: 10}, creates: 2, want: 4},
		{name: "none when over the room", p: policy(5), rs: []Replica{a},
			b: budget{room: -1, rate: 10}, want: 4},
		{name: "the per-minute cap holds the rest until the oldest create in the window leaves it", p: policy(5), rs: []Replica{a},
			b: budget{room: 5, rate: 1, oldestCreate: t0.Add(-50 * time.Second)}, creates: 1, want: 4, limitedUntil: 10 * time.Second},
		{name: "with no create in the window yet, the cap holds a window from now", p: policy(5), rs: []Replica{a},
			b: budget{room: 5, rate: 2}, creates: 2, want: 4, limitedUntil: time.Minute},
		{name: "the room limits before the cap: no hold", p: policy(5), rs: []Replica{a},
			b: budget{room: 1, rate: 1}, creates: 1, want: 4},
		{name: "none when enough are kept", p: policy(1), rs: []Replica{a, ready("b", time.Hour)},
			b: budget{room: 0, rate: 10}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs, sum := classified(tc.p, tc.rs...)
			next := nextTimer{now: t0}
			creates := create(tc.p, State{Now: t0, Replicas: tc.rs}, vs, tc.b, &sum, &next)
			if len(creates) != tc.creates || sum.Want != tc.want {
				t.Errorf("%d creates, want %d; status want %d, not %d", len(creates), tc.creates, sum.Want, tc.want)
			}
			if !sum.CreateLimitedUntil.Equal(at(t0, tc.limitedUntil)) || !next.t.Equal(at(t0, tc.limitedUntil)) {
				t.Errorf("limited until %s, next %s; want both %s", sum.CreateLimitedUntil, next.t, at(t0, tc.limitedUntil))
			}
		})
	}
}

func TestCreatePassesFailedSlotsOnLongestFailingFirst(t *testing.T) {
	p := policy(6, func(p *Policy) { p.MaxUnhealthy = intstr.FromString("100%") })
	rs := []Replica{
		ready("a", time.Hour),
		// Failed to start; its replacement n exists: covered.
		booting("x", 11*time.Minute),
		with(booting("n", time.Minute), func(r *Replica) { r.Replaces = "x"; r.StartupFailures = 1 }),
		// Failed after two failures before it, its one-minute backoff over.
		with(booting("y", 11*time.Minute), func(r *Replica) { r.StartupFailures = 2 }),
		// Failed and drained before its replacement was made.
		with(booting("d", 11*time.Minute), func(r *Replica) { r.DrainingSince = t0.Add(-10 * time.Second) }),
	}
	remembered := []Lineage{{Failures: 2, Replaces: "gone"}, {Failures: 5, Replaces: "y"}}
	vs, sum := classified(p, rs...)
	next := nextTimer{now: t0}
	creates := create(p, State{Now: t0, Replicas: rs, Lineages: remembered}, vs, budget{room: 10, rate: 10}, &sum, &next)
	var got []Lineage
	for _, c := range creates {
		got = append(got, c.Lineage)
	}
	want := []Lineage{{Failures: 3, Replaces: "y"}, {Failures: 2, Replaces: "gone"}, {Failures: 1, Replaces: "d"}, {}}
	if !slices.Equal(got, want) {
		t.Errorf("lineages %v, want %v", got, want)
	}
}

// How many creates the bounds allow: no pool-wide per-minute cap unless
// set, Policy.MaxCreating counting the live replicas being created, the
// room of maxSurge, the smallest of them.
func TestCreateBounds(t *testing.T) {
	creatingReplica := func(name string) Replica {
		return with(booting(name, 10*time.Second), func(r *Replica) { r.Creating = true })
	}
	defaults := func(replicas int, opts ...func(*Policy)) Policy {
		p, err := PolicyFor(&crawlv1.ProxyPoolSpec{Replicas: ptrTo(int32(replicas))})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range opts {
			o(&p)
		}
		return p
	}
	for _, tc := range []struct {
		name   string
		policy Policy
		state  State
		want   int
	}{
		{
			name:   "defaults: a pool of 20 creates all 20 at once (no per-minute cap)",
			policy: defaults(20),
			want:   20,
		},
		{
			name:   "defaults: creates made in the last minute do not hold the rest",
			policy: defaults(20),
			state:  State{RecentCreates: slices.Repeat([]time.Time{t0.Add(-time.Second)}, 50)},
			want:   20,
		},
		{
			name:   "a pool-wide per-minute cap, when set, still holds",
			policy: defaults(20, func(p *Policy) { p.MaxCreatesPerMinute = 3 }),
			want:   3,
		},
		{
			name:   "MaxCreating less those being created",
			policy: defaults(20, func(p *Policy) { p.MaxCreating = 4 }),
			state:  State{Replicas: []Replica{creatingReplica("c1"), ready("r1", time.Hour)}},
			want:   3,
		},
		{
			name:   "MaxCreating reached: nothing",
			policy: defaults(20, func(p *Policy) { p.MaxCreating = 2 }),
			state:  State{Replicas: []Replica{creatingReplica("c1"), creatingReplica("c2")}},
			want:   0,
		},
		{
			name:   "a replica being deleted no longer counts as being created",
			policy: defaults(20, func(p *Policy) { p.MaxCreating = 2 }),
			state: State{Replicas: []Replica{creatingReplica("c1"),
				with(creatingReplica("c2"), func(r *Replica) { r.DeletingSince = t0.Add(-time.Second) })}},
			want: 1,
		},
		{
			name:   "room is the tighter bound",
			policy: defaults(3, func(p *Policy) { p.MaxCreating = 10 }),
			state:  State{Replicas: []Replica{ready("r1", time.Hour)}},
			want:   2,
		},
		{
			name:   "the per-minute cap is the tighter bound",
			policy: defaults(20, func(p *Policy) { p.MaxCreating = 10; p.MaxCreatesPerMinute = 5 }),
			state:  State{RecentCreates: []time.Time{t0.Add(-time.Second)}},
			want:   4,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.state.Now = t0
			if got := len(Decide(tc.policy, tc.state).Create); got != tc.want {
				t.Fatalf("%d creates, want %d", got, tc.want)
			}
		})
	}
}

func TestPolicyForCreateLimits(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		spec                 crawlv1.ProxyPoolSpec
		perMinute, perDomain int
	}{
		{name: "defaults", perMinute: 0, perDomain: DefaultMaxConcurrentCreates},
		{name: "set", spec: crawlv1.ProxyPoolSpec{
			Placement:   crawlv1.ProxyPoolPlacement{MaxConcurrentCreates: 2},
			Remediation: crawlv1.ProxyPoolRemediation{MaxCreatesPerMinute: 30},
		}, perMinute: 30, perDomain: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := PolicyFor(&tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if p.MaxCreatesPerMinute != tc.perMinute || p.MaxConcurrentCreates != tc.perDomain {
				t.Fatalf("maxCreatesPerMinute %d, maxConcurrentCreates %d; want %d, %d", p.MaxCreatesPerMinute, p.MaxConcurrentCreates, tc.perMinute, tc.perDomain)
			}
		})
	}
}
