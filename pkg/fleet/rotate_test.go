package fleet

import (
	"slices"
	"testing"
	"time"
)

func TestRotate(t *testing.T) {
	maxAge := func(opts ...func(*Policy)) Policy {
		return policy(3, append([]func(*Policy){func(p *Policy) { p.MaxAge = time.Hour }}, opts...)...)
	}
	// a and b expired an hour and two ago; c expires in 50 minutes.
	abc := []Replica{ready("a", 2*time.Hour), ready("b", 3*time.Hour), ready("c", 10*time.Minute)}
	full := budget{room: 1, rate: 10, available: 3}
	cases := []rotateCase{
		{name: "the earliest expiry first, one at a time", p: maxAge(), s: State{Replicas: abc}, b: full,
			started: []string{"b"}, waiting: 1, inFlight: 1, next: 50 * time.Minute},
		{name: "room for two and maxConcurrent 2 start both", p: maxAge(func(p *Policy) { p.MaxConcurrentRotations = 2 }),
			s: State{Replicas: abc}, b: budget{room: 2, rate: 10, available: 3},
			started: []string{"b", "a"}, inFlight: 2, nextRotation: 50 * time.Minute, next: 50 * time.Minute},
		{name: "no room to surge: all wait", p: maxAge(), s: State{Replicas: abc}, b: budget{room: 0, rate: 10, available: 3},
			waiting: 2, next: 50 * time.Minute},
		{name: "the create cap leaves none: all wait", p: maxAge(), s: State{Replicas: abc}, b: budget{room: 2, rate: 0, available: 3},
			waiting: 2, next: 50 * time.Minute},
		{name: "a rollout's replacement takes the room first", p: maxAge(),
			s: State{Replicas: []Replica{ready("a", 2*time.Hour), ready("b", 3*time.Hour), outdated(ready("c", 10*time.Minute))}},
			b: budget{room: 1, rate: 10, available: 3}, waiting: 2},
		{name: "room for the rollout and one rotation", p: maxAge(),
			s: State{Replicas: []Replica{ready("a", 2*time.Hour), ready("b", 3*time.Hour), outdated(ready("c", 10*time.Minute))}},
			b: budget{room: 2, rate: 10, available: 3}, started: []string{"b"}, waiting: 1, inFlight: 1},
		{name: "a replica short of available holds every rotation", p: maxAge(), s: State{Replicas: abc},
			b: budget{room: 2, rate: 10, available: 2}, waiting: 2, next: 50 * time.Minute},
		{name: "placement refused holds every rotation", p: maxAge(), s: State{Replicas: abc, PlacementBlocked: true}, b: full,
			waiting: 2, next: 50 * time.Minute},
		{name: "one in flight at maxConcurrent 1: the other waits", p: maxAge(),
			s: State{Replicas: []Replica{with(ready("a", 2*time.Hour), func(r *Replica) { r.RotatingSince = t0.Add(-time.Minute) }), ready("b", 3*time.Hour), ready("c", 10*time.Minute)}},
			b: budget{room: 3, rate: 10, available: 3}, waiting: 1, inFlight: 1, next: 50 * time.Minute},
		{name: "minInterval after the last start holds them and says until when",
			p: maxAge(func(p *Policy) { p.RotationInterval = 5 * time.Minute }),
			s: State{Replicas: abc, LastRotation: t0.Add(-time.Minute)}, b: full,
			waiting: 2, nextRotation: 4 * time.Minute, next: 4 * time.Minute},
		{name: "minInterval starts one even with room for more; the next one after it",
			p: maxAge(func(p *Policy) { p.RotationInterval, p.MaxConcurrentRotations = time.Minute, 3 }),
			s: State{Replicas: abc}, b: budget{room: 3, rate: 10, available: 3},
			started: []string{"b"}, waiting: 1, inFlight: 1, nextRotation: time.Minute, next: time.Minute},
		{name: "paused starts none", p: maxAge(func(p *Policy) { p.Paused = true }), s: State{Replicas: abc}, b: full},
		{name: "without maxAge, no rotation", p: policy(3), s: State{Replicas: abc}, b: full},
		{name: "nothing expired: the next rotation is the earliest expiry", p: maxAge(),
			s: State{Replicas: []Replica{ready("c", 10*time.Minute), ready("d", 30*time.Minute)}}, b: full,
			nextRotation: 30 * time.Minute, next: 30 * time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.name, tc.check)
	}
}

type rotateCase struct {
	name     string
	p        Policy
	s        State
	b        budget
	started  []string
	waiting  int
	inFlight int
	// from t0; 0: none
	nextRotation, next time.Duration
}

// check runs rotate on the case's replicas, classified and marked for
// replacement as Decide does, with the case's budget.
func (tc rotateCase) check(t *testing.T) {
	tc.s.Now = t0
	vs, sum := classified(tc.p, tc.s.Replicas...)
	next := nextTimer{now: t0}
	started := rotate(tc.p, tc.s, vs, tc.b, &sum, &next)
	if !slices.Equal(started, tc.started) {
		t.Errorf("started %v, want %v", started, tc.started)
	}
	for _, v := range vs {
		if slices.Contains(started, v.Name) && v.cause != causeRotation {
			t.Errorf("%s started rotating but is not condemned for it", v.Name)
		}
	}
	if sum.ExpiredWaiting != tc.waiting || sum.RotationsInFlight != tc.inFlight {
		t.Errorf("waiting %d, in flight %d; want %d, %d", sum.ExpiredWaiting, sum.RotationsInFlight, tc.waiting, tc.inFlight)
	}
	wantNextRotation := at(t0, tc.nextRotation)
	if tc.waiting > 0 && tc.nextRotation == 0 {
		wantNextRotation = t0 // due now
	}
	if !sum.NextRotation.Equal(wantNextRotation) {
		t.Errorf("next rotation %s, want %s", sum.NextRotation, wantNextRotation)
	}
	if !next.t.Equal(at(t0, tc.next)) {
		t.Errorf("next %s, want %s", next.t, at(t0, tc.next))
	}
	if wantLast := len(tc.started) > 0; sum.LastRotation.Equal(t0) != wantLast {
		t.Errorf("last rotation %s after starting %v", sum.LastRotation, started)
	}
}
