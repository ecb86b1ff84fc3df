package fleet

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
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
			b: budget{room: 1, rate: 10, available: 3}, waiting: 2, next: 50 * time.Minute},
		{name: "room for the rollout and one rotation", p: maxAge(),
			s: State{Replicas: []Replica{ready("a", 2*time.Hour), ready("b", 3*time.Hour), outdated(ready("c", 10*time.Minute))}},
			b: budget{room: 2, rate: 10, available: 3}, started: []string{"b"}, waiting: 1, inFlight: 1, next: 50 * time.Minute},
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
		// Paused still looks again when c passes maxAge: RotationBehind
		// counts it.
		{name: "paused starts none", p: maxAge(func(p *Policy) { p.Paused = true }), s: State{Replicas: abc}, b: full, next: 50 * time.Minute},
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

// TestRotationLimitsScaleWithThePool: rotation.maxConcurrent left empty
// comes to what replaces every replica within 80% of maxAge, within
// maxSurge; a limit the user sets wins, and RotationsPerMaxAge says when
// the limits cannot keep up. Default rotation time: 2m boot + 30s drain.
func TestRotationLimitsScaleWithThePool(t *testing.T) {
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	count := func(n int) *intstr.IntOrString { v := intstr.FromInt32(int32(n)); return &v }
	sixHours := &metav1.Duration{Duration: 6 * time.Hour}
	cases := []struct {
		name           string
		replicas       int32
		surge, unavail *intstr.IntOrString
		rotation       crawlv1.ProxyPoolRotation
		minReady       int32
		concurrent     int
		perMaxAge      int
	}{
		{name: "10 replicas: one at a time is plenty", replicas: 10,
			rotation: crawlv1.ProxyPoolRotation{MaxAge: sixHours}, concurrent: 1, perMaxAge: 144},
		{name: "1,000 with maxSurge 5%: nine in flight", replicas: 1000, surge: pct("5%"),
			rotation: crawlv1.ProxyPoolRotation{MaxAge: sixHours}, concurrent: 9, perMaxAge: 1296},
		{name: "1,000 with the default maxSurge 1: the budget bounds it, too few", replicas: 1000,
			rotation: crawlv1.ProxyPoolRotation{MaxAge: sixHours}, concurrent: 1, perMaxAge: 144},
		{name: "5,000 with maxSurge 5%: 44 in flight", replicas: 5000, surge: pct("5%"),
			rotation: crawlv1.ProxyPoolRotation{MaxAge: sixHours}, concurrent: 44, perMaxAge: 6336},
		{name: "5,000 with maxSurge 20: the budget bounds it", replicas: 5000, surge: count(20),
			rotation: crawlv1.ProxyPoolRotation{MaxAge: sixHours}, concurrent: 20, perMaxAge: 2880},
		{name: "minReadySeconds lengthens each rotation: more in flight", replicas: 1000, surge: pct("5%"), minReady: 150,
			rotation: crawlv1.ProxyPoolRotation{MaxAge: sixHours}, concurrent: 18, perMaxAge: 1296},
		{name: "a user's maxConcurrent wins, even when too low", replicas: 1000, surge: pct("5%"),
			rotation: crawlv1.ProxyPoolRotation{MaxAge: sixHours, MaxConcurrent: 2}, concurrent: 2, perMaxAge: 288},
		{name: "the shipped sample's limits: 72 per 6h", replicas: 1000, surge: pct("5%"),
			rotation:   crawlv1.ProxyPoolRotation{MaxAge: sixHours, MaxConcurrent: 1, MinInterval: &metav1.Duration{Duration: 5 * time.Minute}},
			concurrent: 1, perMaxAge: 72},
		{name: "minInterval caps the derived rate", replicas: 1000, surge: pct("5%"),
			rotation:   crawlv1.ProxyPoolRotation{MaxAge: sixHours, MinInterval: &metav1.Duration{Duration: time.Minute}},
			concurrent: 9, perMaxAge: 360},
		{name: "maxSurge 0: rotation never spends maxUnavailable, so it cannot rotate", replicas: 10, surge: count(0), unavail: count(1),
			rotation: crawlv1.ProxyPoolRotation{MaxAge: sixHours}, concurrent: 1, perMaxAge: 0},
		{name: "no maxAge: no rotation", replicas: 1000, concurrent: DefaultMaxConcurrentRotations, perMaxAge: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := crawlv1.ProxyPoolSpec{Replicas: ptrTo(tc.replicas), Rotation: tc.rotation}
			spec.Rollout.MaxSurge, spec.Rollout.MaxUnavailable, spec.Rollout.MinReadySeconds = tc.surge, tc.unavail, tc.minReady
			p, err := PolicyFor(&spec)
			if err != nil {
				t.Fatal(err)
			}
			if p.MaxConcurrentRotations != tc.concurrent || p.RotationsPerMaxAge() != tc.perMaxAge {
				t.Errorf("maxConcurrent %d, %d per maxAge; want %d, %d", p.MaxConcurrentRotations, p.RotationsPerMaxAge(), tc.concurrent, tc.perMaxAge)
			}
		})
	}
}

// TestRotationsPerMaxAgeFollowsThePoolWideCreateLimits: a create cap or a
// bound on replicas being created lowers what rotation can replace.
func TestRotationsPerMaxAgeFollowsThePoolWideCreateLimits(t *testing.T) {
	base := policy(1000, func(p *Policy) {
		p.MaxAge, p.MaxSurge, p.MaxConcurrentRotations, p.MaxCreatesPerMinute = 6*time.Hour, 50, 50, 0
	})
	for _, tc := range []struct {
		name string
		opt  func(*Policy)
		want int
	}{
		{name: "no pool-wide limit", opt: func(*Policy) {}, want: 7200},
		{name: "2 creates a minute", opt: func(p *Policy) { p.MaxCreatesPerMinute = 2 }, want: 720},
		{name: "8 replicas being created at once", opt: func(p *Policy) { p.MaxCreating = 8 }, want: 1440},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := base
			tc.opt(&p)
			if got := p.RotationsPerMaxAge(); got != tc.want {
				t.Errorf("%d per maxAge, want %d", got, tc.want)
			}
		})
	}
}

// TestRotationOverdue counts the live replicas past maxAge and those past
// it by more than the grace (the longer of jitter and one rotation), and
// wakes the pool when the next crosses a line, paused or not.
func TestRotationOverdue(t *testing.T) {
	p := policy(4, func(p *Policy) { p.MaxAge, p.Jitter = time.Hour, 20*time.Minute })
	draining := with(ready("d", 3*time.Hour), func(r *Replica) { r.DrainingSince = t0.Add(-time.Second) })
	for _, tc := range []struct {
		name          string
		p             Policy
		reps          []Replica
		overdue, late int
		next          time.Duration
	}{
		{name: "none past maxAge: wakes when the first gets there", p: policy(4, func(p *Policy) { p.MaxAge = time.Hour }),
			reps: []Replica{ready("a", 10*time.Minute), ready("b", 50*time.Minute)}, next: 10 * time.Minute},
		{name: "past maxAge within the jitter: overdue, not late; wakes when it would be", p: p,
			reps: []Replica{ready("a", 70*time.Minute)}, overdue: 1, next: 10 * time.Minute},
		{name: "past maxAge by more than the jitter: late", p: p,
			reps: []Replica{ready("a", 81*time.Minute), ready("b", 75*time.Minute)}, overdue: 2, late: 1, next: 5 * time.Minute},
		{name: "a short jitter: one rotation's time is the grace", p: policy(4, func(p *Policy) { p.MaxAge = time.Hour }),
			reps: []Replica{ready("a", 61*time.Minute)}, overdue: 1, next: 90 * time.Second},
		{name: "a draining replica is on its way out", p: p, reps: []Replica{draining}},
		{name: "paused still counts", p: policy(4, func(p *Policy) { p.MaxAge, p.Paused = time.Hour, true }),
			reps: []Replica{ready("a", 3*time.Hour)}, overdue: 1, late: 1},
		{name: "no maxAge: nothing", p: policy(4), reps: []Replica{ready("a", 30*time.Hour)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs, sum := classified(tc.p, tc.reps...)
			next := nextTimer{now: t0}
			// A budget with no room: only the counting is under test.
			rotate(tc.p, State{Now: t0, Replicas: tc.reps}, vs, budget{available: len(tc.reps)}, &sum, &next)
			if sum.RotationOverdue != tc.overdue || sum.RotationLate != tc.late {
				t.Errorf("overdue %d, late %d; want %d, %d", sum.RotationOverdue, sum.RotationLate, tc.overdue, tc.late)
			}
			if !next.t.Equal(at(t0, tc.next)) {
				t.Errorf("next %s, want %s", next.t, at(t0, tc.next))
			}
			if sum.RotationCapacity != tc.p.RotationsPerMaxAge() {
				t.Errorf("capacity %d, policy says %d", sum.RotationCapacity, tc.p.RotationsPerMaxAge())
			}
		})
	}
}
