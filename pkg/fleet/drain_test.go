package fleet

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

func drainedNow(vs []*view) []string {
	var out []string
	for _, v := range vs {
		if v.drainNow {
			out = append(out, v.Name)
		}
	}
	slices.Sort(out)
	return out
}

func TestDrainSurplus(t *testing.T) {
	cases := []struct {
		name      string
		p         Policy
		rs        []Replica
		drained   []string
		available int // left in the budget
	}{
		{name: "the surplus goes, replaced ones first, then the kept in scale-down order", p: policy(2),
			rs: []Replica{ready("a", 5*time.Hour), ready("b", 3*time.Hour), ready("c", time.Hour),
				with(ready("m", time.Hour/2), func(r *Replica) { r.Marked = true })},
			drained: []string{"a", "m"}, available: 2},
		{name: "a replaced replica waits until its replacement is available", p: policy(3),
			rs: []Replica{outdated(ready("a", 2*time.Hour)), outdated(ready("b", time.Hour)), outdated(ready("c", 3*time.Hour)),
				booting("n", time.Minute)},
			available: 3},
		{name: "then the oldest replaced one goes", p: policy(3),
			rs: []Replica{outdated(ready("a", 2*time.Hour)), outdated(ready("b", time.Hour)), outdated(ready("c", 3*time.Hour)),
				ready("n", 10*time.Minute)},
			drained: []string{"c"}, available: 3},
		{name: "a kept replica that serves nothing goes at no cost", p: policy(2),
			rs:      []Replica{ready("a", time.Hour), booting("b", time.Minute), booting("c", 2*time.Minute)},
			drained: []string{"c"}, available: 1},
		{name: "the victim is fixed: a protected one is not swapped for another", p: policy(2),
			rs:        []Replica{outdated(ready("a", 2*time.Hour)), ready("b", time.Hour), booting("c", time.Minute)},
			available: 2},
		{name: "no surplus, no drain", p: policy(3),
			rs:        []Replica{ready("a", time.Hour), ready("b", time.Hour), ready("c", time.Hour)},
			available: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs, sum := classified(tc.p, tc.rs...)
			left := drainSurplus(tc.p, nil, vs, budget{available: sum.Available})
			if got := drainedNow(vs); !slices.Equal(got, tc.drained) {
				t.Errorf("drained %v, want %v", got, tc.drained)
			}
			if left.available != tc.available {
				t.Errorf("%d available left, want %d", left.available, tc.available)
			}
		})
	}
}

func TestDrainFirst(t *testing.T) {
	noSurge := func(unavailable int) func(*Policy) {
		return func(p *Policy) { p.MaxSurge, p.MaxUnavailable = 0, unavailable }
	}
	abc := []Replica{outdated(ready("a", time.Hour)), outdated(ready("b", 2*time.Hour)), outdated(ready("c", time.Hour))}
	unhealthy := []Replica{outdated(ready("a", 3*time.Hour)),
		with(ready("s", 2*time.Hour), func(r *Replica) { r.Ready, r.ReadyChanged = false, t0.Add(-6*time.Minute) }),
		booting("f", 11*time.Minute)}
	healAll := func(p *Policy) { p.MaxUnhealthy = intstr.FromString("100%") }
	cases := []struct {
		name string
		p    Policy
		s    State
		room int
		// already drained by this plan (the surplus step)
		drainedBefore, drained []string
	}{
		{name: "no room: the oldest outdated replica drains within maxUnavailable", p: policy(3, noSurge(1)),
			s: State{Replicas: abc}, drained: []string{"b"}},
		{name: "maxUnavailable 0: no available replica drains first", p: policy(3, noSurge(0)),
			s: State{Replicas: abc}},
		{name: "room to surge: nothing drains first", p: policy(3, noSurge(1)),
			s: State{Replicas: abc}, room: 3},
		{name: "one already draining makes the room", p: policy(1, noSurge(1)),
			s: State{Replicas: []Replica{outdated(ready("a", time.Hour)), with(ready("d", time.Hour), func(r *Replica) { r.DrainingSince = t0 })}}},
		{name: "without it, the outdated one drains", p: policy(1, noSurge(1)),
			s: State{Replicas: []Replica{outdated(ready("a", time.Hour))}}, drained: []string{"a"}},
		{name: "placement refused: drains first even with room", p: policy(2, func(p *Policy) { p.MaxUnavailable = 1 }),
			s:    State{PlacementBlocked: true, Replicas: []Replica{outdated(ready("a", 2*time.Hour)), outdated(ready("b", time.Hour))}},
			room: 2, drained: []string{"a"}},
		{name: "a drain of this plan makes room too", p: policy(2, noSurge(2)),
			s: State{Replicas: abc}, drainedBefore: []string{"c"}, drained: []string{"b", "c"}},
		{name: "a failed start before a stopped one", p: policy(3, healAll),
			s: State{Replicas: unhealthy}, room: 2, drained: []string{"f"}},
		{name: "both serve nothing: both go; the available one only within maxUnavailable", p: policy(3, healAll),
			s: State{Replicas: unhealthy}, drained: []string{"f", "s"}},
		{name: "never a rotating replica", p: policy(3, noSurge(1), func(p *Policy) { p.MaxAge = time.Hour }),
			s: State{Replicas: []Replica{with(ready("a", 2*time.Hour), func(r *Replica) { r.RotatingSince = t0.Add(-time.Second) }),
				ready("b", 10*time.Minute), ready("c", 10*time.Minute)}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.s.Now = t0
			vs, sum := classified(tc.p, tc.s.Replicas...)
			b := budget{room: tc.room, available: sum.Available}
			for _, v := range vs {
				if slices.Contains(tc.drainedBefore, v.Name) {
					b = b.drain(v)
				}
			}
			drainFirst(tc.p, tc.s, vs, b)
			if got := drainedNow(vs); !slices.Equal(got, tc.drained) {
				t.Errorf("drained %v, want %v", got, tc.drained)
			}
		})
	}
}

func TestDrainsDeletionsAndPublished(t *testing.T) {
	rs := []Replica{
		ready("a", time.Hour), ready("b", time.Hour),
		with(ready("c", time.Hour), func(r *Replica) { r.DrainingSince = t0.Add(-30 * time.Second) }),
		with(ready("d", time.Hour), func(r *Replica) { r.DrainingSince = t0.Add(-29 * time.Second) }),
		with(ready("e", time.Hour), func(r *Replica) { r.DeletingSince = t0.Add(-time.Second) }),
		booting("f", time.Minute),
	}
	for _, tc := range []struct {
		drain                        time.Duration
		drains, deletions, published []string
	}{
		{drain: 30 * time.Second, drains: []string{"a"}, deletions: []string{"c"}, published: []string{"b"}},
		{drain: 0, deletions: []string{"a", "c", "d"}, published: []string{"b"}},
	} {
		p := policy(2, func(p *Policy) { p.Drain = tc.drain })
		vs, _ := classified(p, rs...)
		vs[0].drainNow = true
		if got := drains(p, vs); !slices.Equal(got, tc.drains) {
			t.Errorf("drain %s: drains %v, want %v", tc.drain, got, tc.drains)
		}
		if got := deletions(p, t0, vs); !slices.Equal(got, tc.deletions) {
			t.Errorf("drain %s: deletions %v, want %v", tc.drain, got, tc.deletions)
		}
		if got := published(vs); !slices.Equal(got, tc.published) {
			t.Errorf("drain %s: published %v, want %v", tc.drain, got, tc.published)
		}
	}
}

func TestBudgetOf(t *testing.T) {
	p := policy(3, func(p *Policy) { p.MaxCreatesPerMinute = 5 })
	s := State{Now: t0, Replicas: make([]Replica, 5), RecentCreates: []time.Time{
		t0.Add(-10 * time.Second), t0.Add(-59 * time.Second),
		t0.Add(-time.Minute), // left the window
		t0.Add(time.Second),  // a clock ahead of ours: not counted
	}}
	vs, _ := classified(p, s.Replicas...)
	b := budgetOf(p, s, vs, 4)
	want := budget{room: -1, rate: 3, oldestCreate: t0.Add(-59 * time.Second), available: 4}
	if b != want {
		t.Errorf("budget %+v, want %+v", b, want)
	}
	p.MaxCreatesPerMinute = 1
	if b := budgetOf(p, s, vs, 4); b.rate != 0 {
		t.Errorf("rate %d over the cap, want 0", b.rate)
	}
	// Two of the five are being deleted: one within deletionTimeout holds
	// its room, one past it (or stuck) does not.
	s.Replicas[3] = with(ready("d", time.Hour), func(r *Replica) { r.DeletingSince = t0.Add(-time.Minute) })
	s.Replicas[4] = with(ready("e", time.Hour), func(r *Replica) { r.DeletingSince = t0.Add(-p.DeletionTimeout) })
	vs, _ = classified(p, s.Replicas...)
	if b := budgetOf(p, s, vs, 4); b.room != 0 {
		t.Errorf("room %d with a deletion past deletionTimeout, want 0", b.room)
	}
	s.Replicas[4] = with(ready("e", time.Hour), func(r *Replica) { r.DeletingSince, r.DeletionStuck = t0.Add(-time.Second), true })
	vs, _ = classified(p, s.Replicas...)
	if b := budgetOf(p, s, vs, 4); b.room != 0 {
		t.Errorf("room %d with a stuck deletion, want 0", b.room)
	}
}
