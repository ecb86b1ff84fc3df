package fleet

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// sim plays a pool against Decide, step by step, as the controller would:
// replicas boot after a delay (or never), drained ones are deleted and take
// a while to go, and every plan is carried out at once. After each step it
// checks the budget: Decide's own actions never take availability below
// replicas-maxUnavailable (or below where it already was), nor existence
// above replicas+maxSurge (or above where it already was).
type sim struct {
	t    *testing.T
	p    Policy
	now  time.Time
	step time.Duration
	reps []*simReplica
	boot func(s *sim, r *Replica) (time.Duration, bool)
	hook func(s *sim)
	rng  *rand.Rand
	seq  int
	gone time.Duration // deletion of a drained replica takes this long
	// hung: replicas whose deletion never finishes (a dead host).
	hung  map[string]bool
	hash  string // current template: replicas made from it are up to date
	memo  []Lineage
	last  time.Time
	rec   []time.Time
	stats simStats
	// rotationFloor: availability never below replicas (rotation only).
	rotationFloor bool
}

type simReplica struct {
	Replica
	hash   string
	bootAt time.Time
	never  bool
	goneAt time.Time
}

type simStats struct {
	creates, drains, deletes int
	createdAt                []time.Time
	rotations                []time.Time
	minAvailable, maxExist   int
	maxRotating              int
}

func newSim(t *testing.T, p Policy, initial int) *sim {
	s := &sim{t: t, p: p, now: t0, step: time.Second, gone: 5 * time.Second, hash: "v1", rng: rand.New(rand.NewPCG(1, 2))}
	s.boot = func(*sim, *Replica) (time.Duration, bool) { return 20 * time.Second, true }
	for range initial {
		r := s.newReplica()
		r.Created = t0.Add(-time.Hour)
		r.Ready, r.ReadyChanged = true, r.Created.Add(time.Minute)
		s.reps = append(s.reps, r)
	}
	s.stats.minAvailable = 1 << 30
	return s
}

func (s *sim) newReplica() *simReplica {
	s.seq++
	name := fmt.Sprintf("r%03d", s.seq)
	r := &simReplica{Replica: Replica{Name: name, UID: fmt.Sprintf("%08x-%d", s.rng.Uint32(), s.seq), Created: s.now, ReadyChanged: s.now, UpToDate: true}, hash: s.hash}
	return r
}

// available counts the available replicas and those that exist for the
// budget: a deletion released by deletionTimeout holds nothing.
func (s *sim) available() (avail, exist int) {
	for _, r := range s.reps {
		if !r.deleting() || s.now.Before(r.DeletingSince.Add(s.p.DeletionTimeout)) {
			exist++
		}
		if !r.deleting() && r.DrainingSince.IsZero() && r.Ready && !s.now.Before(r.ReadyChanged.Add(s.p.MinReady)) {
			avail++
		}
	}
	return avail, exist
}

func (s *sim) replica(name string) *simReplica {
	for _, r := range s.reps {
		if r.Name == name {
			return r
		}
	}
	s.t.Fatalf("%s: plan names %s, which does not exist", s.now.Sub(t0), name)
	return nil
}

// run steps until d has passed.
func (s *sim) run(d time.Duration) {
	s.t.Helper()
	for end := s.now.Add(d); s.now.Before(end); s.now = s.now.Add(s.step) {
		s.tick()
		if s.t.Failed() {
			s.t.FailNow()
		}
	}
}

func (s *sim) tick() {
	s.t.Helper()
	// The world moves: boots finish, deletions complete.
	kept := s.reps[:0]
	for _, r := range s.reps {
		if r.deleting() && !s.now.Before(r.goneAt) {
			continue
		}
		if !r.Ready && !r.never && !r.bootAt.IsZero() && !s.now.Before(r.bootAt) {
			r.Ready, r.ReadyChanged, r.bootAt = true, s.now, time.Time{}
		}
		r.UpToDate = r.hash == s.hash
		kept = append(kept, r)
	}
	s.reps = kept
	if s.hook != nil {
		s.hook(s)
	}
	availBefore, existBefore := s.available()

	state := State{Now: s.now, LastRotation: s.last, RecentCreates: s.rec, Lineages: s.memo, Rand: s.rng}
	for _, r := range s.reps {
		state.Replicas = append(state.Replicas, r.Replica)
	}
	plan := Decide(s.p, state)

	drained := map[string]bool{}
	for _, n := range plan.Drain {
		drained[n] = true
	}
	for _, n := range plan.Publish {
		r := s.replica(n)
		if !r.Ready || r.deleting() || !r.DrainingSince.IsZero() || drained[n] {
			s.t.Errorf("%s: published %s, which is not Ready or is draining", s.now.Sub(t0), n)
		}
	}
	for _, n := range plan.Drain {
		s.replica(n).DrainingSince = s.now
		s.stats.drains++
	}
	for _, n := range plan.Delete {
		r := s.replica(n)
		if FailedToStart(s.p, s.now, r.Replica) && !s.covered(n) {
			s.memo = append(s.memo, Lineage{Failures: r.StartupFailures + 1, Replaces: n})
		}
		r.DeletingSince, r.goneAt = s.now, s.now.Add(s.gone)
		if s.hung[n] {
			r.goneAt = s.now.Add(100 * 365 * 24 * time.Hour)
		}
		s.stats.deletes++
	}
	for _, n := range plan.Rotate {
		s.replica(n).RotatingSince = s.now
		s.last = s.now
		s.stats.rotations = append(s.stats.rotations, s.now)
	}
	for _, c := range plan.Create {
		r := s.newReplica()
		r.StartupFailures, r.Replaces = c.Failures, c.Replaces
		s.memo = slices.DeleteFunc(s.memo, func(l Lineage) bool { return l.Replaces == c.Replaces })
		d, ok := s.boot(s, &r.Replica)
		r.bootAt, r.never = s.now.Add(d), !ok
		s.reps = append(s.reps, r)
		s.rec = append(s.rec, s.now)
		s.stats.creates++
		s.stats.createdAt = append(s.stats.createdAt, s.now)
	}

	availAfter, existAfter := s.available()
	floor := min(s.p.Replicas-s.p.MaxUnavailable, availBefore)
	if s.rotationFloor {
		floor = min(s.p.Replicas, availBefore)
	}
	if availAfter < floor {
		s.t.Errorf("%s: available %d → %d, below the budget's %d (plan %+v)", s.now.Sub(t0), availBefore, availAfter, floor, plan)
	}
	if ceiling := max(s.p.Replicas+s.p.MaxSurge, existBefore); existAfter > ceiling {
		s.t.Errorf("%s: %d replicas → %d, above the budget's %d", s.now.Sub(t0), existBefore, existAfter, ceiling)
	}
	rotating := 0
	for _, r := range s.reps {
		if !r.RotatingSince.IsZero() {
			rotating++
		}
	}
	s.stats.maxRotating = max(s.stats.maxRotating, rotating)
	s.stats.minAvailable = min(s.stats.minAvailable, availAfter)
	s.stats.maxExist = max(s.stats.maxExist, existAfter)
}

func (s *sim) covered(name string) bool {
	for _, r := range s.reps {
		if r.Replaces == name {
			return true
		}
	}
	return false
}

// converged: replicas up to date and available, nothing else exists.
func (s *sim) converged() bool {
	avail, exist := s.available()
	if exist != s.p.Replicas || avail != s.p.Replicas {
		return false
	}
	for _, r := range s.reps {
		if r.hash != s.hash {
			return false
		}
	}
	return true
}

func (s *sim) runUntilConverged(limit time.Duration) time.Duration {
	s.t.Helper()
	start := s.now
	for !s.converged() {
		if s.now.Sub(start) > limit {
			avail, exist := s.available()
			s.t.Fatalf("not converged after %s: %d exist, %d available, want %d", limit, exist, avail, s.p.Replicas)
		}
		s.run(s.step)
	}
	return s.now.Sub(start)
}

func TestBudgetHoldsAtEveryStepOfARollout(t *testing.T) {
	for _, b := range []struct{ surge, unavail int }{{1, 0}, {3, 0}, {0, 1}, {0, 3}, {2, 2}, {10, 0}} {
		t.Run(fmt.Sprintf("maxSurge %d maxUnavailable %d", b.surge, b.unavail), func(t *testing.T) {
			s := newSim(t, policy(10, func(p *Policy) { p.MaxSurge, p.MaxUnavailable, p.MinReady = b.surge, b.unavail, 5*time.Second }), 10)
			s.hash = "v2"
			took := s.runUntilConverged(2 * time.Hour)
			if s.stats.creates != 10 {
				t.Errorf("%d creates for a rollout of 10", s.stats.creates)
			}
			if b.unavail == 0 && s.stats.minAvailable < 10 {
				t.Errorf("availability fell to %d with maxUnavailable 0", s.stats.minAvailable)
			}
			t.Logf("rolled 10 in %s, lowest availability %d, most replicas %d", took, s.stats.minAvailable, s.stats.maxExist)
		})
	}
}

func TestBudgetHoldsWhileScalingDuringARollout(t *testing.T) {
	s := newSim(t, policy(3, func(p *Policy) { p.MaxSurge, p.MaxUnavailable = 2, 1 }), 3)
	s.hash = "v2"
	s.run(30 * time.Second)
	s.p.Replicas = 10
	s.run(40 * time.Second)
	s.hash = "v3"
	s.p.Replicas = 2
	s.runUntilConverged(time.Hour)
}

func TestScaleDownGoesToTheVictimsAtOnce(t *testing.T) {
	s := newSim(t, policy(6), 6)
	s.p.Replicas = 2
	s.run(time.Second)
	if s.stats.drains != 4 || s.stats.creates != 0 {
		t.Fatalf("drains %d creates %d, want 4 and 0", s.stats.drains, s.stats.creates)
	}
	s.runUntilConverged(time.Minute)
}

func TestRotationReplacesByAgeWithinItsLimitsAndNeverCostsAvailability(t *testing.T) {
	// Six replicas of one age; maxUnavailable 2 is never spent on rotation.
	p := policy(6, func(p *Policy) {
		p.MaxSurge, p.MaxUnavailable = 2, 2
		p.MaxAge, p.Jitter = time.Hour, 20*time.Minute
		p.MaxConcurrentRotations, p.RotationInterval = 2, 2*time.Minute
	})
	s := newSim(t, p, 6)
	for _, r := range s.reps {
		r.Created = t0.Add(-30 * time.Minute)
	}
	s.step = 5 * time.Second
	s.rotationFloor = true
	s.run(4 * time.Hour)

	st := s.stats
	if len(st.rotations) < 6*3 {
		t.Fatalf("%d rotations in 4h of a 6-replica pool with maxAge 1h", len(st.rotations))
	}
	for i := 1; i < len(st.rotations); i++ {
		if gap := st.rotations[i].Sub(st.rotations[i-1]); gap < p.RotationInterval {
			t.Errorf("rotations %s apart, under minInterval %s", gap, p.RotationInterval)
		}
	}
	if st.maxRotating > 2 {
		t.Errorf("%d rotations in flight, maxConcurrent 2", st.maxRotating)
	}
	// Jitter: replicas of one age expired at spread-out times, the first
	// no sooner than maxAge-jitter.
	if first := st.rotations[0].Sub(t0.Add(-30 * time.Minute)); first < p.MaxAge-p.Jitter {
		t.Errorf("first rotation at age %s, before maxAge-jitter", first)
	}
	if st.rotations[5].Sub(st.rotations[0]) < 5*p.RotationInterval {
		t.Errorf("the first six rotations all within %s", st.rotations[5].Sub(st.rotations[0]))
	}
	// No replica lives much past maxAge: rotation keeps up.
	for _, r := range s.reps {
		if age := s.now.Sub(r.Created); age > p.MaxAge+10*time.Minute {
			t.Errorf("%s is %s old", r.Name, age)
		}
	}
	if st.minAvailable < 6 {
		t.Errorf("availability fell to %d during rotation", st.minAvailable)
	}
}

func TestRemediationReplacesAReplicaThatStopsServing(t *testing.T) {
	s := newSim(t, policy(5), 5)
	s.hook = func(s *sim) {
		if s.now.Equal(t0.Add(time.Minute)) {
			s.reps[2].Ready, s.reps[2].ReadyChanged = false, s.now
		}
	}
	// Not Ready at 1m, unhealthyTimeout 5m: replaced at 6m, not a step sooner.
	s.run(6 * time.Minute)
	if s.stats.creates != 0 {
		t.Fatalf("replaced before unhealthyTimeout")
	}
	s.run(2 * time.Second)
	if s.stats.creates != 1 {
		t.Fatalf("%d creates after unhealthyTimeout, want 1", s.stats.creates)
	}
	s.runUntilConverged(5 * time.Minute)
}

func TestShortCircuitDeletesNothingWhenMostAreUnhealthy(t *testing.T) {
	s := newSim(t, policy(5), 5)
	s.hook = func(s *sim) {
		if s.now.Equal(t0.Add(time.Minute)) {
			for _, r := range s.reps[:3] {
				r.Ready, r.ReadyChanged = false, s.now
			}
		}
	}
	s.run(2 * time.Hour)
	if st := s.stats; st.creates+st.drains+st.deletes != 0 {
		t.Fatalf("with 3 of 5 unhealthy: %d creates, %d drains, %d deletes; want none", st.creates, st.drains, st.deletes)
	}
}

func TestABrokenTemplateNeverTakesDownTheOldReplicasAndBacksOff(t *testing.T) {
	p := policy(4, func(p *Policy) { p.StartupTimeout = time.Minute; p.StartupBackoff = 30 * time.Second })
	s := newSim(t, p, 4)
	s.hash = "broken"
	s.boot = func(s *sim, r *Replica) (time.Duration, bool) { return time.Minute, s.hash != "broken" }
	s.step = 5 * time.Second
	s.run(90 * time.Minute)

	old := 0
	for _, r := range s.reps {
		if r.hash == "v1" && r.Ready && r.DrainingSince.IsZero() && !r.deleting() {
			old++
		}
	}
	if old != 4 {
		t.Fatalf("%d old replicas left serving, want all 4", old)
	}
	// One slot surges and fails over and over; its replacements come later
	// and later.
	c := s.stats.createdAt
	if len(c) < 4 {
		t.Fatalf("only %d creates", len(c))
	}
	for i := 2; i < len(c); i++ {
		if c[i].Sub(c[i-1]) <= c[i-1].Sub(c[i-2]) {
			t.Errorf("create %d came %s after the one before, no later than the gap before it (%s): no backoff", i, c[i].Sub(c[i-1]), c[i-1].Sub(c[i-2]))
		}
	}
	// Without backoff: a create every startupTimeout + drain (90s): 60 in 90 min.
	if len(c) > 10 {
		t.Errorf("%d creates in 90 minutes of a broken template", len(c))
	}
	// Fixing the template recovers.
	s.hash = "fixed"
	s.runUntilConverged(time.Hour)
}

func TestAFailedSlotInheritsItsFailuresEvenWhenDrainedFirst(t *testing.T) {
	// maxSurge 0: the failed replica is drained and gone before its
	// replacement is made; the controller's memory carries the count.
	p := policy(1, func(p *Policy) {
		p.MaxSurge, p.MaxUnavailable = 0, 1
		p.StartupTimeout, p.StartupBackoff, p.Drain = time.Minute, time.Minute, 10*time.Second
	})
	s := newSim(t, p, 0)
	s.boot = func(*sim, *Replica) (time.Duration, bool) { return 0, false }
	s.step = 5 * time.Second
	s.run(30 * time.Minute)
	var failures []int
	for _, r := range s.reps {
		failures = append(failures, r.StartupFailures)
	}
	if len(s.reps) == 0 || s.reps[len(s.reps)-1].StartupFailures < 3 {
		t.Fatalf("the slot's replica counts %v failures after 30 minutes of failing", failures)
	}
}

func TestScaleDownOrderIsPinned(t *testing.T) {
	// Marked, then not Ready, then by order, whatever the order.
	for _, order := range []crawlv1.ScaleDownOrder{crawlv1.ScaleDownOldest, crawlv1.ScaleDownNewest, crawlv1.ScaleDownRandom} {
		p := policy(0, func(p *Policy) { p.Order = order; p.Paused = true })
		rs := []Replica{ready("a", time.Hour), booting("b", time.Minute), with(ready("c", time.Hour), func(r *Replica) { r.Marked = true }), ready("d", 2*time.Hour)}
		plan := Decide(p, State{Now: t0, Replicas: rs, Rand: rand.New(rand.NewPCG(3, 4))})
		if len(plan.Drain) != 4 {
			t.Fatalf("%s: drained %v", order, plan.Drain)
		}
		// One victim: the marked c; while b boots, draining c would leave
		// 2 of 3 available, so it waits.
		p.Replicas = 3
		plan = Decide(p, State{Now: t0, Replicas: rs})
		if len(plan.Drain) != 0 {
			t.Errorf("%s: drained %v while b boots, want nothing", order, plan.Drain)
		}
		rs[1] = ready("b", time.Minute)
		plan = Decide(p, State{Now: t0, Replicas: rs})
		if !slices.Equal(plan.Drain, []string{"c"}) {
			t.Errorf("%s: one victim %v, want the marked c", order, plan.Drain)
		}
		rs[1] = booting("b", time.Minute)
		p.Replicas = 2
		plan = Decide(p, State{Now: t0, Replicas: rs})
		if !slices.Equal(plan.Drain, []string{"b", "c"}) {
			t.Errorf("%s: two victims %v, want c (marked) and b (not Ready)", order, plan.Drain)
		}
	}
}
