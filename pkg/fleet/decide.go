package fleet

import (
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// CreateWindow is the window of Policy.MaxCreatesPerMinute.
const CreateWindow = time.Minute

// State is what the pool observes now.
type State struct {
	Now      time.Time
	Replicas []Replica
	// LastRotation is when the last rotation started (status.rotation).
	LastRotation time.Time
	// RecentCreates are the creation times of replicas made lately, of any
	// cause, including replicas already gone (the per-minute cap).
	RecentCreates []time.Time
	// Lineages are slots whose replica failed to start and is gone before
	// its replacement was made.
	Lineages []Lineage
	// PlacementBlocked: the last attempt to place a replica was refused.
	PlacementBlocked bool
	// Rand orders replicas for ScaleDownRandom; nil uses a fixed order.
	Rand *rand.Rand
}

// Lineage carries a slot's startup failures to the replica replacing the
// one that failed.
type Lineage struct {
	// Failures the new replica inherits: its predecessor's plus one.
	Failures int
	// Replaces is the predecessor's name.
	Replaces string
}

// Create is one replica to create.
type Create struct{ Lineage }

// Plan is what to do now, in this order: publish, drain, delete, start
// rotations, create.
type Plan struct {
	// Publish: the Ready replicas that are not draining (nor about to),
	// sorted by name.
	Publish []string
	// Drain: unpublish now; deleted after Policy.Drain.
	Drain []string
	// Delete: drained long enough (or Drain is 0).
	Delete []string
	// Rotate: replicas whose rotation starts now (annotate them).
	Rotate []string
	// Create: replicas to create now, each placed first.
	Create []Create
	// Status summarises the pool as observed (before the plan's actions).
	Status Summary
	// Next is when time alone changes the decision (a drain ends, a
	// replica becomes available or expires, a timeout or backoff ends, the
	// create window frees); zero if nothing is due.
	Next time.Time
}

// Summary is the pool's state for its status and conditions.
type Summary struct {
	Replicas, Ready, Available, UpToDate, Draining, Unhealthy int
	// MinAvailable is replicas - maxUnavailable: the Available condition's
	// threshold.
	MinAvailable int
	Outdated     int
	// Want is the replicas of the current kind still to be made.
	Want int

	RotationsInFlight int
	// ExpiredWaiting are expired replicas whose rotation waits (rate,
	// budget or availability).
	ExpiredWaiting int
	LastRotation   time.Time
	// NextRotation is the earliest a rotation may start; zero without
	// rotation.
	NextRotation time.Time

	MaxUnhealthy       int
	RemediationAllowed bool
	// Remediating are unhealthy replicas being replaced; BackingOff those
	// that wait for their slot's backoff, until BackoffUntil.
	Remediating  int
	BackingOff   int
	BackoffUntil time.Time

	// CreateLimitedUntil: creates were held by the per-minute cap until
	// then.
	CreateLimitedUntil time.Time
}

// cause is why a replica is replaced.
type cause int

const (
	keep cause = iota
	causeMarked
	causeOutdated
	causeRotation
	causeUnhealthy
)

// view is one replica with what Decide derived about it.
type view struct {
	Replica
	live, draining, available bool
	startupFailed, unhealthy  bool
	// unhealthyAt: when a live not-Ready replica counts as unhealthy;
	// remediateAt: when it may be replaced (its slot's backoff included).
	unhealthyAt, remediateAt time.Time
	expiresAt                time.Time
	cause                    cause
	orderKey                 int
}

// Decide returns the plan for a pool with policy p in state s. It keeps the
// one disruption budget: no action of its own takes the available replicas
// below Replicas-MaxUnavailable, nor the replicas in existence (draining and
// deleting ones included) above Replicas+MaxSurge. Replacements go surge
// first: a replacement is created, and the replica it replaces is drained
// once that leaves at least Replicas available; only when no replica can be
// created (existence at its cap, or placement refused) with nothing in
// flight to make room does it drain first, spending MaxUnavailable, and
// never for a rotation.
func Decide(p Policy, s State) Plan {
	now := s.Now
	vs := make([]*view, len(s.Replicas))
	for i := range s.Replicas {
		vs[i] = classify(p, now, s.Replicas[i])
	}
	var plan Plan
	sum := &plan.Status
	sum.LastRotation = s.LastRotation
	sum.MinAvailable = p.Replicas - p.MaxUnavailable
	next := nextTimer{now: now}

	live := 0
	for _, v := range vs {
		sum.Replicas++
		if !v.Deleting && v.Ready {
			sum.Ready++
		}
		if v.draining {
			sum.Draining++
			next.at(v.DrainingSince.Add(p.Drain))
		}
		if !v.live {
			continue
		}
		live++
		if v.available {
			sum.Available++
		} else if v.Ready {
			next.at(v.ReadyChanged.Add(p.MinReady))
		}
		if v.UpToDate {
			sum.UpToDate++
		} else {
			sum.Outdated++
		}
		if v.unhealthy {
			sum.Unhealthy++
		}
	}
	maxUnhealthy := MaxUnhealthyOf(p.MaxUnhealthy, live)
	sum.MaxUnhealthy = maxUnhealthy
	sum.RemediationAllowed = sum.Unhealthy <= maxUnhealthy

	// Which live replicas are to be replaced, and why.
	for _, v := range vs {
		if !v.live {
			continue
		}
		if !v.Ready {
			// The status changes then, paused or not.
			next.at(v.unhealthyAt)
			if !p.Paused && sum.RemediationAllowed {
				next.at(v.remediateAt)
			}
		}
		if p.Paused {
			continue
		}
		switch {
		case v.Marked:
			v.cause = causeMarked
		case !v.UpToDate && !p.OnDelete:
			v.cause = causeOutdated
		case !v.RotatingSince.IsZero():
			v.cause = causeRotation
		case v.unhealthy && sum.RemediationAllowed:
			if !now.Before(v.remediateAt) {
				v.cause = causeUnhealthy
				sum.Remediating++
			} else {
				sum.BackingOff++
				if sum.BackoffUntil.IsZero() || v.remediateAt.Before(sum.BackoffUntil) {
					sum.BackoffUntil = v.remediateAt
				}
			}
		}
	}

	existing := len(vs)
	room := p.Replicas + p.MaxSurge - existing
	recent := 0
	var oldestRecent time.Time
	for _, t := range s.RecentCreates {
		if now.Sub(t) < CreateWindow && !t.After(now) {
			recent++
			if oldestRecent.IsZero() || t.Before(oldestRecent) {
				oldestRecent = t
			}
		}
	}
	rateLeft := max(0, p.MaxCreatesPerMinute-recent)
	kept := func() int {
		n := 0
		for _, v := range vs {
			if v.live && v.cause == keep {
				n++
			}
		}
		return n
	}

	// Rotation: start replacing expired replicas, at most
	// MaxConcurrentRotations at a time and one per RotationInterval, only
	// while every desired replica is available and a replacement can be
	// made at once: a rotation waits rather than costs availability.
	inFlight := 0
	for _, v := range vs {
		if !v.RotatingSince.IsZero() {
			inFlight++
		}
	}
	sum.RotationsInFlight = inFlight
	if p.MaxAge > 0 && !p.Paused {
		var expired []*view
		var earliest time.Time
		for _, v := range vs {
			if !v.live || v.cause != keep {
				continue
			}
			if !now.Before(v.expiresAt) {
				expired = append(expired, v)
			} else if earliest.IsZero() || v.expiresAt.Before(earliest) {
				earliest = v.expiresAt
			}
		}
		slices.SortFunc(expired, func(a, b *view) int {
			if c := a.expiresAt.Compare(b.expiresAt); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		})
		notBefore := time.Time{}
		if p.RotationInterval > 0 && !s.LastRotation.IsZero() {
			notBefore = s.LastRotation.Add(p.RotationInterval)
		}
		start := 0
		if len(expired) > 0 && !now.Before(notBefore) && sum.Available >= p.Replicas && !s.PlacementBlocked {
			othersNeed := max(0, p.Replicas-kept())
			start = min(p.MaxConcurrentRotations-inFlight, len(expired), min(room, rateLeft)-othersNeed)
			if p.RotationInterval > 0 {
				start = min(start, 1)
			}
			start = max(0, start)
		}
		for _, v := range expired[:start] {
			v.cause = causeRotation
			v.RotatingSince = now
			plan.Rotate = append(plan.Rotate, v.Name)
			sum.LastRotation = now
			sum.RotationsInFlight++
		}
		sum.ExpiredWaiting = len(expired) - start
		if start > 0 && p.RotationInterval > 0 {
			notBefore = now.Add(p.RotationInterval)
		}
		switch {
		case sum.ExpiredWaiting > 0:
			sum.NextRotation = later(now, notBefore)
		case !earliest.IsZero():
			sum.NextRotation = later(earliest, notBefore)
		}
		if sum.ExpiredWaiting > 0 && now.Before(notBefore) {
			next.at(notBefore)
		}
		if !earliest.IsZero() {
			next.at(later(earliest, notBefore))
		}
	}

	// Creates: as many as the desired count lacks, within the surge room
	// and the per-minute cap.
	var keepers, condemned []*view
	pending := 0
	for _, v := range vs {
		if !v.live {
			continue
		}
		if v.cause == keep {
			keepers = append(keepers, v)
			if !v.available {
				pending++
			}
		} else {
			condemned = append(condemned, v)
		}
	}
	want := p.Replicas - len(keepers)
	sum.Want = max(0, want)
	creates := max(0, min(want, room, rateLeft))
	if want > 0 && rateLeft < min(want, room) {
		// The cap holds the rest until the oldest create in the window,
		// counting those made now, leaves it.
		oldest := now
		if !oldestRecent.IsZero() {
			oldest = oldestRecent
		}
		sum.CreateLimitedUntil = oldest.Add(CreateWindow)
		next.at(sum.CreateLimitedUntil)
	}
	lineages := uncoveredLineages(p, vs, s.Lineages)
	for i := range creates {
		c := Create{}
		if i < len(lineages) {
			c.Lineage = lineages[i]
		}
		plan.Create = append(plan.Create, c)
	}

	// Drains. First the surplus over the desired count: the replaced
	// replicas before the kept ones, each group in scale-down order. The
	// victims are fixed; one the budget protects now waits, and another is
	// never drained in its place (that would take a new replica for an
	// old one).
	available := sum.Available
	drained := map[string]bool{}
	drain := func(v *view) {
		drained[v.Name] = true
		if v.available {
			available--
		}
	}
	rng := s.Rand
	ordered := func(list []*view) []*view {
		out := slices.Clone(list)
		scaleDownOrder(out, p.Order, rng)
		return out
	}
	surplus := len(keepers) + len(condemned) - p.Replicas
	if surplus > 0 {
		victims := append(ordered(condemned), ordered(keepers)...)[:surplus]
		for _, v := range victims {
			left := available
			if v.available {
				left--
			}
			switch {
			case left >= p.Replicas:
				// Every desired replica stays available: a replaced one
				// goes only once its replacement is, even when it serves
				// nothing itself (an outage must not remove instances that
				// may come back).
				drain(v)
			case v.cause == keep && !v.available:
				// Scaling down a replica that serves nothing costs nothing.
				drain(v)
			}
		}
	}
	// Then, when replicas are wanted that nothing in flight will make
	// room for, drain-first within maxUnavailable.
	needRoom := max(0, want-max(0, room))
	if s.PlacementBlocked {
		needRoom = max(0, want)
	}
	making := sum.Draining + pending + len(drained)
	for _, v := range vs {
		if v.Deleting {
			making++
		}
	}
	if k := needRoom - making; k > 0 {
		var candidates []*view
		for _, v := range ordered(condemned) {
			if !drained[v.Name] && v.cause != causeRotation {
				candidates = append(candidates, v)
			}
		}
		// Free ones first: those that never served, then those that
		// stopped; available ones last, within maxUnavailable.
		rank := func(v *view) int {
			switch {
			case v.startupFailed:
				return 0
			case !v.available:
				return 1
			}
			return 2
		}
		slices.SortStableFunc(candidates, func(a, b *view) int { return rank(a) - rank(b) })
		for _, v := range candidates {
			if k == 0 {
				break
			}
			if !v.available || available-1 >= p.Replicas-p.MaxUnavailable {
				drain(v)
				k--
			}
		}
	}
	for _, v := range vs {
		if drained[v.Name] {
			if p.Drain == 0 {
				plan.Delete = append(plan.Delete, v.Name)
			} else {
				plan.Drain = append(plan.Drain, v.Name)
			}
		}
	}
	slices.Sort(plan.Drain)

	// Deletes: drained long enough.
	for _, v := range vs {
		if v.draining && !now.Before(v.DrainingSince.Add(p.Drain)) {
			plan.Delete = append(plan.Delete, v.Name)
		}
	}
	slices.Sort(plan.Delete)

	for _, v := range vs {
		if v.live && v.Ready && !drained[v.Name] {
			plan.Publish = append(plan.Publish, v.Name)
		}
	}
	slices.Sort(plan.Publish)
	plan.Next = next.t
	return plan
}

// classify derives what Decide needs of one replica.
func classify(p Policy, now time.Time, r Replica) *view {
	v := &view{Replica: r}
	v.draining = !r.Deleting && !r.DrainingSince.IsZero()
	v.live = !r.Deleting && !v.draining
	v.expiresAt, _ = ExpiresAt(r.Created, r.UID, p.MaxAge, p.Jitter)
	if !v.live {
		return v
	}
	if r.Ready {
		v.available = !now.Before(r.ReadyChanged.Add(p.MinReady))
		return v
	}
	// Not Ready. Its Ready condition last changed within the startup window:
	// it never started (or fell over while starting), and is judged at the
	// window's end, later by its slot's backoff. Otherwise it ran and has
	// been not Ready since ReadyChanged.
	startupEnd := r.Created.Add(p.StartupTimeout)
	if r.ReadyChanged.Before(startupEnd) {
		v.unhealthyAt = startupEnd
		v.remediateAt = startupEnd.Add(p.StartupBackoffFor(r.StartupFailures))
		v.startupFailed = !now.Before(startupEnd)
	} else {
		v.unhealthyAt = r.ReadyChanged.Add(p.UnhealthyTimeout)
		v.remediateAt = v.unhealthyAt
	}
	v.unhealthy = !now.Before(v.unhealthyAt)
	return v
}

// failedToStart reports whether a replica that is being removed was
// replaced because it failed to start: never Ready since its startup window
// and past it when its removal began.
func failedToStart(p Policy, now time.Time, v *view) bool {
	if v.Ready || !v.ReadyChanged.Before(v.Created.Add(p.StartupTimeout)) {
		return false
	}
	since := v.DrainingSince
	if since.IsZero() {
		since = now
	}
	return !since.Before(v.Created.Add(p.StartupTimeout))
}

// uncoveredLineages lists the slots whose replica failed to start and is
// being replaced without a replacement made yet: the next creates inherit
// their failure counts.
func uncoveredLineages(p Policy, vs []*view, remembered []Lineage) []Lineage {
	covered := map[string]bool{}
	for _, v := range vs {
		if v.Replaces != "" {
			covered[v.Replaces] = true
		}
	}
	seen := map[string]bool{}
	var out []Lineage
	add := func(l Lineage) {
		if covered[l.Replaces] || seen[l.Replaces] {
			return
		}
		seen[l.Replaces] = true
		out = append(out, l)
	}
	for _, v := range vs {
		switch {
		case v.live && v.cause == causeUnhealthy && v.startupFailed,
			!v.live && failedToStart(p, time.Time{}, v) && !v.DrainingSince.IsZero():
			add(Lineage{Failures: v.StartupFailures + 1, Replaces: v.Name})
		}
	}
	for _, l := range remembered {
		add(l)
	}
	// The longest-failing slot first: its replica is the one most likely
	// waiting.
	slices.SortStableFunc(out, func(a, b Lineage) int { return b.Failures - a.Failures })
	return out
}

// FailedToStart reports whether r, about to be deleted, failed to start: the
// controller remembers its slot's failures if no replacement carries them
// yet.
func FailedToStart(p Policy, now time.Time, r Replica) bool {
	return failedToStart(p, now, &view{Replica: r})
}

// scaleDownOrder sorts replicas as they go first: marked, then not Ready,
// then the rest; within each, by order.
func scaleDownOrder(vs []*view, order crawlv1.ScaleDownOrder, rng *rand.Rand) {
	for i, v := range vs {
		v.orderKey = i
	}
	if order == crawlv1.ScaleDownRandom && rng != nil {
		for i, j := range rng.Perm(len(vs)) {
			vs[i].orderKey = j
		}
	}
	class := func(v *view) int {
		switch {
		case v.Marked:
			return 0
		case !v.Ready:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(vs, func(a, b *view) int {
		if c := class(a) - class(b); c != 0 {
			return c
		}
		switch order {
		case crawlv1.ScaleDownNewest:
			if c := b.Created.Compare(a.Created); c != 0 {
				return c
			}
		case crawlv1.ScaleDownRandom:
			if rng != nil {
				return a.orderKey - b.orderKey
			}
			fallthrough
		default:
			if c := a.Created.Compare(b.Created); c != 0 {
				return c
			}
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// MaxUnhealthyOf resolves maxUnhealthy against the live replicas, rounding
// down; a percentage above 0 allows at least one, or pools of one or two
// replicas could never be healed.
func MaxUnhealthyOf(v intstr.IntOrString, live int) int {
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, live, false)
	if err != nil {
		return 0 // PolicyFor validated it; never remediate on nonsense
	}
	if v.Type == intstr.String && n == 0 && live > 0 {
		if pct, err := intstr.GetScaledValueFromIntOrPercent(&v, 100, false); err == nil && pct > 0 {
			return 1
		}
	}
	return n
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// nextTimer keeps the earliest future time.
type nextTimer struct {
	now time.Time
	t   time.Time
}

func (n *nextTimer) at(t time.Time) {
	if t.IsZero() || !t.After(n.now) {
		return
	}
	if n.t.IsZero() || t.Before(n.t) {
		n.t = t
	}
}
