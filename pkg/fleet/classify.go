package fleet

import (
	"slices"
	"time"
)

// cause is why a replica is replaced.
type cause int

const (
	keep cause = iota
	causeMarked
	causeOutdated
	causeRotation
	causeUnhealthy
	causeEgressShared
)

// view is one replica with what the planner's steps derived about it.
type view struct {
	Replica
	live, draining, available bool
	// released: being deleted past Policy.DeletionTimeout, or stuck; it no
	// longer holds room nor counts as room being made.
	released                 bool
	startupFailed, unhealthy bool
	// unhealthyAt: when a live not-Ready replica counts as unhealthy;
	// remediateAt: when it may be replaced (its slot's backoff included).
	unhealthyAt, remediateAt time.Time
	expiresAt                time.Time
	// cause is set by replace and rotate; drainNow by the drains.
	cause    cause
	drainNow bool
	// banAccepted: the bans step replaces it for a ban report or a
	// quarantined egress address; it is withheld from crawlers.
	banAccepted bool
	orderKey    int
}

// kept reports whether v is a live replica the plan keeps.
func (v *view) kept() bool { return v.live && v.cause == keep }

// keptCount counts the replicas the plan keeps.
func keptCount(vs []*view) int {
	n := 0
	for _, v := range vs {
		if v.kept() {
			n++
		}
	}
	return n
}

// classify is the planner's first step: what each replica is (live,
// draining, available, unhealthy) and the counts the status reports. It
// sets next to when time alone changes a count (a drain ends, a Ready
// replica becomes available).
func classify(p Policy, s State, next *nextTimer) ([]*view, Summary) {
	sum := Summary{LastRotation: s.LastRotation, MinAvailable: p.Replicas - p.MaxUnavailable}
	vs := make([]*view, len(s.Replicas))
	live := 0
	for i := range s.Replicas {
		v := classifyReplica(p, s.Now, s.Replicas[i])
		vs[i] = v
		count(&sum, v)
		if v.draining {
			next.at(v.DrainingSince.Add(p.Drain))
		}
		if v.deleting() && !v.released {
			next.at(v.DeletingSince.Add(p.DeletionTimeout))
		}
		if v.released {
			sum.DeletionsReleased = append(sum.DeletionsReleased, v.Name)
		}
		if v.live {
			live++
			if v.Ready && !v.available {
				next.at(v.ReadyChanged.Add(p.MinReady))
			}
		}
	}
	slices.Sort(sum.DeletionsReleased)
	sum.MaxUnhealthy = MaxUnhealthyOf(p.MaxUnhealthy, live)
	sum.RemediationAllowed = sum.Unhealthy <= sum.MaxUnhealthy
	return vs, sum
}

// count adds v to the status counts.
func count(sum *Summary, v *view) {
	sum.Replicas++
	if !v.deleting() && v.Ready {
		sum.Ready++
	}
	if v.draining {
		sum.Draining++
	}
	if !v.live {
		return
	}
	if v.available {
		sum.Available++
	}
	if v.UpToDate {
		sum.UpToDate++
	} else {
		sum.Outdated++
	}
	if v.unhealthy {
		sum.Unhealthy++
	}
	if v.EgressShared {
		sum.EgressShared++
	}
}

// classifyReplica derives what the steps need of one replica.
func classifyReplica(p Policy, now time.Time, r Replica) *view {
	v := &view{Replica: r}
	v.draining = !r.deleting() && !r.DrainingSince.IsZero()
	v.live = !r.deleting() && !v.draining
	// A replica being deleted holds its room for DeletionTimeout, then no
	// more. Cluster API's MachineSet once stopped counting a Machine as
	// soon as its deletion started, and since kubernetes-sigs/cluster-api
	// #3434 counts it until it is gone, bounding the wait on the Machine
	// instead (nodeDrainTimeout, nodeDeletionTimeout). Neither fits here:
	// not counting it at all would put replicas+maxSurge+deleting instances
	// on the hosts at once during every rollout, while the Proxy's own
	// deletion has no bound (it retries so as not to leak an instance).
	// So the pool bounds its own wait, and waits not at all for a deletion
	// that cannot finish.
	v.released = r.deleting() && (r.DeletionStuck || !now.Before(r.DeletingSince.Add(p.DeletionTimeout)))
	v.expiresAt, _ = ExpiresAt(r.Created, r.UID, p.MaxAge, p.Jitter)
	if !v.live {
		return v
	}
	if r.Ready {
		// A replica leaving from another's address (egress.distinct
		// Required) serves, but not as a replica of its own.
		v.available = !r.EgressShared && !now.Before(r.ReadyChanged.Add(p.MinReady))
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

// replace is the second step: which live replicas are to be replaced, and
// why. A paused pool replaces none, but its status still learns when a
// replica turns unhealthy.
func replace(p Policy, now time.Time, vs []*view, sum *Summary, next *nextTimer) {
	for _, v := range vs {
		if !v.live {
			continue
		}
		if !v.Ready {
			next.at(v.unhealthyAt)
			if !p.Paused && sum.RemediationAllowed {
				next.at(v.remediateAt)
			}
		}
		if p.Paused {
			continue
		}
		v.cause = causeOf(p, now, v, sum.RemediationAllowed)
		switch {
		case v.cause == causeUnhealthy:
			sum.Remediating++
		case v.cause == keep && v.unhealthy && sum.RemediationAllowed:
			// Unhealthy, but its slot's backoff is not over.
			sum.BackingOff++
			if sum.BackoffUntil.IsZero() || v.remediateAt.Before(sum.BackoffUntil) {
				sum.BackoffUntil = v.remediateAt
			}
		}
	}
}

// causeOf is why a live replica of a pool that is not paused is replaced:
// a ban accepted by the bans step before a shared egress address before a
// rollout before a rotation in flight before remediation (which waits for
// the slot's backoff and stops past maxUnhealthy).
func causeOf(p Policy, now time.Time, v *view, remediationAllowed bool) cause {
	switch {
	case v.banAccepted:
		return causeMarked
	case v.EgressShared:
		return causeEgressShared
	case !v.UpToDate && !p.OnDelete:
		return causeOutdated
	case !v.RotatingSince.IsZero():
		return causeRotation
	case v.unhealthy && remediationAllowed && !now.Before(v.remediateAt):
		return causeUnhealthy
	}
	return keep
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

// FailedToStart reports whether r, about to be deleted, failed to start: the
// controller remembers its slot's failures if no replacement carries them
// yet.
func FailedToStart(p Policy, now time.Time, r Replica) bool {
	return failedToStart(p, now, &view{Replica: r})
}
