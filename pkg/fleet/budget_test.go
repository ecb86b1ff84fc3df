package fleet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// TestDecideKeepsTheBudgetOnRandomPools checks every plan for random pools
// against the rules of the one disruption budget, read from the state alone
// (not from the planner's own bookkeeping).
func TestDecideKeepsTheBudgetOnRandomPools(t *testing.T) {
	for seed := range uint64(5000) {
		r := rand.New(rand.NewPCG(seed, 0xb0d9e7))
		p, s := randomPolicy(r), randomState(r)
		if err := checkPlan(p, s, Decide(p, s)); err != nil {
			t.Fatalf("seed %d: %v\npolicy %+v\nstate %+v", seed, err, p, s)
		}
	}
}

// FuzzDecideKeepsTheBudget searches further: go test -fuzz FuzzDecideKeepsTheBudget ./pkg/fleet/
func FuzzDecideKeepsTheBudget(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Add(uint64(0xdead), uint64(0xbeef))
	f.Fuzz(func(t *testing.T, a, b uint64) {
		r := rand.New(rand.NewPCG(a, b))
		p, s := randomPolicy(r), randomState(r)
		if err := checkPlan(p, s, Decide(p, s)); err != nil {
			t.Fatalf("%v\npolicy %+v\nstate %+v", err, p, s)
		}
	})
}

// checkPlan returns what plan breaks of the rules every plan keeps.
func checkPlan(p Policy, s State, plan Plan) error {
	byName := map[string]Replica{}
	live := func(r Replica) bool { return !r.deleting() && r.DrainingSince.IsZero() }
	// Withheld from crawlers by a ban (recorded, or accepted now) or a
	// quarantined address: the crawler's report took it out, not the plan.
	withheld := map[string]bool{}
	for _, b := range s.BanRecords {
		withheld[b.Replica] = true
	}
	for _, n := range plan.BanAccepted {
		withheld[n] = true
	}
	for _, r := range s.Replicas {
		if r.Quarantined {
			withheld[r.Name] = true
		}
	}
	available := func(r Replica) bool {
		return live(r) && r.Ready && !s.Now.Before(r.ReadyChanged.Add(p.MinReady)) && !withheld[r.Name]
	}
	availBefore, liveBefore := 0, 0
	for _, r := range s.Replicas {
		byName[r.Name] = r
		if available(r) {
			availBefore++
		}
		if live(r) {
			liveBefore++
		}
	}
	removed := map[string]bool{}
	lost := 0
	for _, n := range append(append([]string(nil), plan.Drain...), plan.Delete...) {
		if removed[n] {
			return fmt.Errorf("%s drained or deleted twice", n)
		}
		removed[n] = true
		if available(byName[n]) {
			lost++
		}
	}
	return errors.Join(
		checkAvailability(p, availBefore, lost),
		checkCreates(p, s, plan),
		checkRotations(p, s, plan, availBefore),
		checkRemovals(p, s, plan, byName, liveBefore),
		checkPublish(s, plan, removed, func(r Replica) bool { return live(r) && !withheld[r.Name] }),
		checkBans(p, s, plan, byName),
	)
}

// checkAvailability: no drain of the plan takes availability below
// replicas-maxUnavailable, or below where it was.
func checkAvailability(p Policy, before, lost int) error {
	if floor := min(p.Replicas-p.MaxUnavailable, before); before-lost < floor {
		return fmt.Errorf("available %d -> %d, under the floor %d", before, before-lost, floor)
	}
	return nil
}

// checkCreates: existence stays within replicas+maxSurge (or where it was)
// and creates within the per-minute cap. A replica being deleted past
// deletionTimeout, or stuck, does not exist for the surge.
func checkCreates(p Policy, s State, plan Plan) error {
	holding := 0
	for _, r := range s.Replicas {
		if !r.deleting() || (!r.DeletionStuck && s.Now.Before(r.DeletingSince.Add(p.DeletionTimeout))) {
			holding++
		}
	}
	if exist, ceiling := holding+len(plan.Create), max(p.Replicas+p.MaxSurge, holding); exist > ceiling {
		return fmt.Errorf("%d replicas would exist, over the ceiling %d", exist, ceiling)
	}
	recent := 0
	for _, t := range s.RecentCreates {
		if s.Now.Sub(t) < CreateWindow && !t.After(s.Now) {
			recent++
		}
	}
	if len(plan.Create) > max(0, p.MaxCreatesPerMinute-recent) {
		return fmt.Errorf("%d creates with %d in the last minute, cap %d", len(plan.Create), recent, p.MaxCreatesPerMinute)
	}
	if !plan.Next.IsZero() && !plan.Next.After(s.Now) {
		return fmt.Errorf("next %s is not after now", plan.Next)
	}
	return nil
}

// checkRotations: rotations start only with rotation on, every desired
// replica available and placement working; within maxConcurrent and
// minInterval; never on a replica already rotating or not live.
func checkRotations(p Policy, s State, plan Plan, availBefore int) error {
	if len(plan.Rotate) == 0 {
		return nil
	}
	switch {
	case p.Paused || p.MaxAge <= 0 || s.PlacementBlocked:
		return fmt.Errorf("rotations %v while paused, without maxAge or with placement refused", plan.Rotate)
	case availBefore < p.Replicas:
		return fmt.Errorf("rotations %v with %d of %d available", plan.Rotate, availBefore, p.Replicas)
	case p.RotationInterval > 0 && (len(plan.Rotate) > 1 || (!s.LastRotation.IsZero() && s.Now.Before(s.LastRotation.Add(p.RotationInterval)))):
		return fmt.Errorf("rotations %v within minInterval of %s", plan.Rotate, s.LastRotation)
	}
	inFlight := 0
	for _, r := range s.Replicas {
		if !r.RotatingSince.IsZero() {
			inFlight++
		}
	}
	if inFlight+len(plan.Rotate) > p.MaxConcurrentRotations {
		return fmt.Errorf("rotations %v with %d in flight, maxConcurrent %d", plan.Rotate, inFlight, p.MaxConcurrentRotations)
	}
	for _, n := range plan.Rotate {
		for _, r := range s.Replicas {
			if r.Name == n && (!r.RotatingSince.IsZero() || !r.DrainingSince.IsZero() || r.deleting()) {
				return fmt.Errorf("rotation of %s, which is rotating, draining or deleting", n)
			}
		}
	}
	return nil
}

// checkRemovals: drains are live replicas, none when drainSeconds is 0;
// deletes were drained for drainSeconds (or are drained now with 0); a
// paused pool removes only the surplus.
func checkRemovals(p Policy, s State, plan Plan, byName map[string]Replica, liveBefore int) error {
	liveRemoved := 0
	for _, n := range plan.Drain {
		if r := byName[n]; p.Drain == 0 || r.deleting() || !r.DrainingSince.IsZero() {
			return fmt.Errorf("drain of %s (drainSeconds %s, deleting %v, draining since %s)", n, p.Drain, r.deleting(), r.DrainingSince)
		}
		liveRemoved++
	}
	for _, n := range plan.Delete {
		r := byName[n]
		switch {
		case r.deleting():
			return fmt.Errorf("delete of %s, which is deleting", n)
		case r.DrainingSince.IsZero() && p.Drain != 0:
			return fmt.Errorf("delete of %s, never drained", n)
		case r.DrainingSince.IsZero():
			liveRemoved++
		case s.Now.Before(r.DrainingSince.Add(p.Drain)):
			return fmt.Errorf("delete of %s, draining only since %s", n, r.DrainingSince)
		}
	}
	if p.Paused && liveRemoved > max(0, liveBefore-p.Replicas) {
		return fmt.Errorf("paused, %d of %d live removed for %d replicas", liveRemoved, liveBefore, p.Replicas)
	}
	return nil
}

// checkBans: ban replacements start only on live replicas reported or
// quarantined, not already under way, never while paused, within the
// hourly budget.
func checkBans(p Policy, s State, plan Plan, byName map[string]Replica) error {
	if len(plan.BanAccepted) == 0 {
		return nil
	}
	if p.Paused {
		return fmt.Errorf("ban replacements %v while paused", plan.BanAccepted)
	}
	recent := 0
	recorded := map[string]bool{}
	for _, b := range s.BanRecords {
		recorded[b.Replica] = true
		if s.Now.Sub(b.Time) < BanWindow {
			recent++
		}
	}
	if recent+len(plan.BanAccepted) > p.MaxBanReplacementsPerHour {
		return fmt.Errorf("ban replacements %v with %d in the last hour, budget %d", plan.BanAccepted, recent, p.MaxBanReplacementsPerHour)
	}
	for _, n := range plan.BanAccepted {
		r := byName[n]
		if r.deleting() || !r.DrainingSince.IsZero() || (!r.Marked && !r.Quarantined) || recorded[n] {
			return fmt.Errorf("ban replacement of %s: not live, not reported or quarantined, or under way", n)
		}
	}
	return nil
}

// checkPublish: exactly the live Ready replicas not removed now.
func checkPublish(s State, plan Plan, removed map[string]bool, live func(Replica) bool) error {
	var want []string
	for _, r := range s.Replicas {
		if live(r) && r.Ready && !removed[r.Name] {
			want = append(want, r.Name)
		}
	}
	slices.Sort(want)
	if !slices.Equal(plan.Publish, want) {
		return fmt.Errorf("published %v, want %v", plan.Publish, want)
	}
	return nil
}

// randomPolicy is a pool of up to 8 replicas with every knob of the
// budget, rotation and remediation drawn from r.
func randomPolicy(r *rand.Rand) Policy {
	p := policy(r.IntN(9))
	p.MaxSurge = r.IntN(4)
	p.MaxUnavailable = min(r.IntN(4), p.Replicas)
	if p.MaxSurge == 0 && p.MaxUnavailable == 0 {
		p.MaxSurge = 1
	}
	p.MinReady = time.Duration(r.IntN(3)) * 15 * time.Second
	p.Drain = time.Duration(r.IntN(3)) * 15 * time.Second
	p.OnDelete = r.IntN(5) == 0
	p.Paused = r.IntN(6) == 0
	if r.IntN(2) == 0 {
		p.MaxAge = time.Hour
		p.Jitter = time.Duration(r.IntN(3)) * 10 * time.Minute
		p.MaxConcurrentRotations = 1 + r.IntN(3)
		p.RotationInterval = time.Duration(r.IntN(3)) * time.Minute
	}
	p.StartupTimeout = time.Duration(1+r.IntN(10)) * time.Minute
	p.UnhealthyTimeout = time.Duration(1+r.IntN(5)) * time.Minute
	p.StartupBackoff = time.Duration(r.IntN(3)) * 30 * time.Second
	p.MaxUnhealthy = []intstr.IntOrString{intstr.FromString("40%"), intstr.FromInt32(int32(r.IntN(4))), intstr.FromString("100%"), intstr.FromString("0%")}[r.IntN(4)]
	p.MaxCreatesPerMinute = 1 + r.IntN(10)
	p.Order = []crawlv1.ScaleDownOrder{crawlv1.ScaleDownOldest, crawlv1.ScaleDownNewest, crawlv1.ScaleDownRandom}[r.IntN(3)]
	p.DeletionTimeout = time.Duration(1+r.IntN(20)) * time.Minute
	p.MaxBanReplacementsPerHour = r.IntN(4)
	p.MaxBanned = []intstr.IntOrString{intstr.FromString("50%"), intstr.FromInt32(int32(r.IntN(4))), intstr.FromString("100%")}[r.IntN(3)]
	return p
}

// randomState is up to 12 replicas in every condition a pool sees:
// booting, Ready, failed, draining, deleting, rotating, banned, outdated.
func randomState(r *rand.Rand) State {
	s := State{Now: t0, PlacementBlocked: r.IntN(5) == 0}
	ago := func(within time.Duration) time.Time { return t0.Add(-time.Duration(r.Int64N(int64(within)))) }
	n := r.IntN(13)
	for i := range n {
		rep := Replica{Name: fmt.Sprintf("r%02d", i), UID: fmt.Sprintf("uid-%d-%d", i, r.Uint32()), Created: ago(3 * time.Hour), UpToDate: r.IntN(3) != 0}
		rep.ReadyChanged = rep.Created.Add(time.Duration(r.Int64N(int64(t0.Sub(rep.Created)) + 1)))
		rep.Ready = r.IntN(3) != 0
		rep.Marked = r.IntN(8) == 0
		rep.Quarantined = r.IntN(10) == 0
		if r.IntN(10) == 0 {
			s.BanRecords = append(s.BanRecords, BanRecord{Replica: rep.Name, Time: ago(2 * time.Hour)})
		}
		if r.IntN(5) == 0 {
			rep.DrainingSince = ago(time.Minute)
		}
		if r.IntN(8) == 0 {
			// Some past randomPolicy's deletionTimeout, some stuck.
			rep.DeletingSince = ago(20 * time.Minute)
			rep.DeletionStuck = r.IntN(4) == 0
		}
		if r.IntN(5) == 0 {
			rep.RotatingSince = ago(10 * time.Minute)
		}
		rep.StartupFailures = r.IntN(4)
		if r.IntN(4) == 0 {
			rep.Replaces = fmt.Sprintf("r%02d", r.IntN(13))
		}
		s.Replicas = append(s.Replicas, rep)
	}
	if r.IntN(2) == 0 {
		s.LastRotation = ago(5 * time.Minute)
	}
	for range r.IntN(8) {
		s.RecentCreates = append(s.RecentCreates, ago(2*time.Minute))
	}
	for i := range r.IntN(3) {
		// Replacements of replicas already gone still count.
		s.BanRecords = append(s.BanRecords, BanRecord{Replica: fmt.Sprintf("gone%d", i), Time: ago(90 * time.Minute)})
	}
	for i := range r.IntN(3) {
		s.Lineages = append(s.Lineages, Lineage{Failures: 1 + r.IntN(3), Replaces: fmt.Sprintf("gone%d", i)})
	}
	if r.IntN(2) == 0 {
		s.Rand = rand.New(rand.NewPCG(r.Uint64(), 1))
	}
	return s
}
