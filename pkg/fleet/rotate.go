package fleet

import (
	"slices"
	"strings"
	"time"
)

// rotate is the third step: it starts replacing expired replicas, earliest
// first, at most MaxConcurrentRotations in flight and one per
// RotationInterval, only while every desired replica is available and the
// budget can create every replacement at once: a rotation waits rather than
// costs availability. It returns the replicas whose rotation starts now.
func rotate(p Policy, s State, vs []*view, b budget, sum *Summary, next *nextTimer) []string {
	inFlight := 0
	for _, v := range vs {
		if !v.RotatingSince.IsZero() {
			inFlight++
		}
	}
	sum.RotationsInFlight = inFlight
	if p.MaxAge <= 0 {
		return nil
	}
	overdue(p, s.Now, vs, sum, next)
	if p.Paused {
		return nil
	}
	expired, earliest := expiredKept(s.Now, vs)
	var notBefore time.Time
	if p.RotationInterval > 0 && !s.LastRotation.IsZero() {
		notBefore = s.LastRotation.Add(p.RotationInterval)
	}
	start := 0
	if len(expired) > 0 && !s.Now.Before(notBefore) && b.available >= p.Replicas && !s.PlacementBlocked {
		start = rotationsToStart(p, vs, b, len(expired), inFlight)
	}
	var started []string
	for _, v := range expired[:start] {
		v.cause = causeRotation
		v.RotatingSince = s.Now
		started = append(started, v.Name)
		sum.LastRotation = s.Now
		sum.RotationsInFlight++
	}
	sum.ExpiredWaiting = len(expired) - start
	if start > 0 && p.RotationInterval > 0 {
		notBefore = s.Now.Add(p.RotationInterval)
	}
	nextRotation(s.Now, earliest, notBefore, sum, next)
	return started
}

// overdue counts the live replicas older than maxAge, and those older than
// maxAge by more than its grace, for RotationBehind; next is when the next
// of them crosses either line.
func overdue(p Policy, now time.Time, vs []*view, sum *Summary, next *nextTimer) {
	sum.RotationCapacity = p.RotationsPerMaxAge()
	for _, v := range vs {
		if !v.live {
			continue
		}
		due, late := v.Created.Add(p.MaxAge), v.Created.Add(p.MaxAge+p.RotationGrace())
		switch {
		case now.Before(due):
			next.at(due)
		case now.Before(late):
			sum.RotationOverdue++
			next.at(late)
		default:
			sum.RotationOverdue++
			sum.RotationLate++
		}
	}
}

// expiredKept lists the kept replicas past their expiry, earliest first,
// and the earliest expiry of the others (zero: none).
func expiredKept(now time.Time, vs []*view) (expired []*view, earliest time.Time) {
	for _, v := range vs {
		if !v.kept() {
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
	return expired, earliest
}

// rotationsToStart is how many of the expired rotations may start: within
// maxConcurrent, one per minInterval, and only as many as the budget can
// create replacements for once every other missing replica is made.
func rotationsToStart(p Policy, vs []*view, b budget, expired, inFlight int) int {
	othersNeed := max(0, p.Replicas-keptCount(vs))
	n := min(p.MaxConcurrentRotations-inFlight, expired, b.creates()-othersNeed)
	if p.RotationInterval > 0 {
		n = min(n, 1)
	}
	return max(0, n)
}

// nextRotation sets the status' NextRotation, and next to when a waiting
// rotation or the next expiry may start.
func nextRotation(now, earliest, notBefore time.Time, sum *Summary, next *nextTimer) {
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
