package fleet

import (
	"math"
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
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
	// cause, including replicas already gone (the per-minute cap, if any).
	RecentCreates []time.Time
	// Lineages are slots whose replica failed to start and is gone before
	// its replacement was made.
	Lineages []Lineage
	// PlacementBlocked: the last attempt to place a replica was refused.
	PlacementBlocked bool
	// BanRecords are the ban replacements started lately or under way
	// (status.banReplacements).
	BanRecords []BanRecord
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
	// Publish: the Ready replicas that are not draining (nor about to)
	// nor sharing an older replica's egress address, sorted by name.
	Publish []string
	// Drain: unpublish now; deleted after Policy.Drain.
	Drain []string
	// Delete: drained long enough (or Drain is 0).
	Delete []string
	// Rotate: replicas whose rotation starts now (annotate them).
	Rotate []string
	// Create: replicas to create now, each placed first.
	Create []Create
	// BanAccepted: replicas whose ban replacement starts now (record them
	// in status.banReplacements; quarantine the egress of those reported).
	BanAccepted []string
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
	// RotationOverdue are live replicas older than maxAge; RotationLate
	// those older than maxAge by more than Policy.RotationGrace.
	RotationOverdue, RotationLate int
	// RotationCapacity is Policy.RotationsPerMaxAge: fewer than the
	// replicas, and rotation cannot keep up.
	RotationCapacity int

	// EgressShared are live replicas whose egress address an older one
	// has (egress.distinct Required): not published, being replaced.
	EgressShared int

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

	// DeletionsReleased are the replicas whose deletion has not finished
	// within Policy.DeletionTimeout, or cannot finish (DeletionStuck),
	// sorted by name: they no longer hold room, and are replaced.
	DeletionsReleased []string
	// WaitingForDeletions: replicas wanted but not created because
	// replicas being deleted still hold their room, which the last of
	// those gives up by DeletionsReleaseAt at the latest.
	WaitingForDeletions int
	DeletionsReleaseAt  time.Time

	// Withheld: live replicas kept from crawlers (a ban replacement under
	// way, a quarantined egress address); never counted available.
	Withheld int
	// BanReplacing: ban replacements under way; BanWaiting: reports (and
	// quarantined replicas) not replaced, because of BanPaused; BanRecent:
	// replacements started within BanWindow, of at most BanMaxPerHour;
	// BanMaxReported: the short-circuit, resolved.
	BanReplacing, BanWaiting, BanRecent int
	BanWaitingReplicas                  []string
	BanMaxPerHour, BanMaxReported       int
	// BanPaused says why reports wait (BanPaused* constants); empty: none
	// waits. BanBudgetFreeAt: when the hourly budget lets the next one go.
	BanPaused       string
	BanBudgetFreeAt time.Time
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
//
// It runs the planner's steps in order, each on what the ones before it
// decided: classify the replicas, accept ban replacements (withheld from
// crawlers at once, within spec.bans), mark those to replace, start rotations,
// create, drain (the surplus, then drain-first), delete, publish. The budget
// goes from step to step as a value; only the drains spend it.
func Decide(p Policy, s State) Plan {
	next := nextTimer{now: s.Now}
	vs, sum := classify(p, s, &next)
	banAccepted := bans(p, s, vs, &sum, &next)
	replace(p, s.Now, vs, &sum, &next)
	b := budgetOf(p, s, vs, sum.Available)

	var plan Plan
	plan.Rotate = rotate(p, s, vs, b, &sum, &next)
	plan.Create = create(p, s, vs, b, &sum, &next)
	b = drainSurplus(p, s.Rand, vs, b)
	drainFirst(p, s, vs, b)
	plan.Drain = drains(p, vs)
	plan.Delete = deletions(p, s.Now, vs)
	plan.Publish = published(vs)
	plan.BanAccepted = banAccepted
	plan.Status = sum
	plan.Next = next.t
	return plan
}

// budget is the one disruption budget as the steps find it: how many
// replicas may still come into existence, how many creates the per-minute
// cap allows, and how many replicas are available. The drains spend
// availability and pass on what is left.
type budget struct {
	// room is Replicas+MaxSurge less the replicas in existence; negative
	// when the pool is over it.
	room int
	// rate is the creates the per-minute cap leaves; oldestCreate is the
	// oldest create still in the window (zero: none).
	rate         int
	oldestCreate time.Time
	// inFlight is the creates Policy.MaxCreating leaves, when limited.
	inFlight        int
	inFlightLimited bool
	// available counts the available replicas, less those this plan drains.
	available int
}

// budgetOf is the budget before any step has acted. A replica whose
// deletion was released holds no room: it may never go.
func budgetOf(p Policy, s State, vs []*view, available int) budget {
	holding := 0
	for _, v := range vs {
		if !v.released {
			holding++
		}
	}
	b := budget{room: p.Replicas + p.MaxSurge - holding, available: available}
	recent := 0
	for _, t := range s.RecentCreates {
		if s.Now.Sub(t) < CreateWindow && !t.After(s.Now) {
			recent++
			if b.oldestCreate.IsZero() || t.Before(b.oldestCreate) {
				b.oldestCreate = t
			}
		}
	}
	b.rate = math.MaxInt
	if p.MaxCreatesPerMinute > 0 {
		b.rate = max(0, p.MaxCreatesPerMinute-recent)
	}
	if p.MaxCreating > 0 {
		creating := 0
		for _, v := range vs {
			if v.live && v.Creating {
				creating++
			}
		}
		b.inFlight, b.inFlightLimited = max(0, p.MaxCreating-creating), true
	}
	return b
}

// creates is how many replicas the budget lets this plan create.
func (b budget) creates() int {
	if b.inFlightLimited {
		return min(b.room, b.rate, b.inFlight)
	}
	return min(b.room, b.rate)
}

// drain marks v drained now and takes it off the available replicas.
func (b budget) drain(v *view) budget {
	v.drainNow = true
	if v.available {
		b.available--
	}
	return b
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
