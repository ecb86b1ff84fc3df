package fleet

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
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
