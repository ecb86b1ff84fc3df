package fleet

import (
	"slices"
	"time"
)

// create is the fourth step: as many replicas as the desired count lacks
// (what replace and rotate condemned included), within the budget's room
// and create rate. A slot whose replica failed to start passes its failures
// to the replica replacing it.
func create(p Policy, s State, vs []*view, b budget, sum *Summary, next *nextTimer) []Create {
	want := p.Replicas - keptCount(vs)
	sum.Want = max(0, want)
	n := max(0, min(want, b.creates()))
	if want > 0 && b.rate < min(want, b.room) {
		// The cap holds the rest until the oldest create in the window,
		// counting those made now, leaves it.
		oldest := s.Now
		if !b.oldestCreate.IsZero() {
			oldest = b.oldestCreate
		}
		sum.CreateLimitedUntil = oldest.Add(CreateWindow)
		next.at(sum.CreateLimitedUntil)
	}
	if short := min(want, b.rate) - max(0, b.room); short > 0 {
		// Room, not the cap, holds these: say how many wait for
		// deletions in progress and until when, so the status promises
		// nothing sooner.
		holders := 0
		for _, v := range vs {
			if v.deleting() && !v.released {
				holders++
				sum.DeletionsReleaseAt = later(sum.DeletionsReleaseAt, v.DeletingSince.Add(p.DeletionTimeout))
			}
		}
		sum.WaitingForDeletions = min(short, holders)
		if holders == 0 {
			sum.DeletionsReleaseAt = time.Time{}
		}
	}
	lineages := uncoveredLineages(p, vs, s.Lineages)
	var creates []Create
	for i := range n {
		c := Create{}
		if i < len(lineages) {
			c.Lineage = lineages[i]
		}
		creates = append(creates, c)
	}
	return creates
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
