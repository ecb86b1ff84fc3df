package fleet

import (
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// drainSurplus is the fifth step's first half: the live replicas over the
// desired count go, the replaced ones before the kept, each group in
// scale-down order, as long as every desired replica stays available. A
// replaced replica goes only once its replacement is available, even when
// it serves nothing itself (an outage must not remove instances that may
// come back); a kept one that serves nothing costs nothing. The victims are
// fixed: one the budget protects now waits, and another is never drained
// in its place (that would take a new replica for an old one). It returns
// the budget left.
func drainSurplus(p Policy, rng *rand.Rand, vs []*view, b budget) budget {
	kept, condemned := split(vs)
	surplus := len(kept) + len(condemned) - p.Replicas
	if surplus <= 0 {
		return b
	}
	victims := append(inScaleDownOrder(condemned, p.Order, rng), inScaleDownOrder(kept, p.Order, rng)...)[:surplus]
	for _, v := range victims {
		left := b.available
		if v.available {
			left--
		}
		if left >= p.Replicas || (v.cause == keep && !v.available) {
			b = b.drain(v)
		}
	}
	return b
}

// drainFirst is the fifth step's second half: when replicas are wanted
// that nothing in flight will make room for (existence at its cap, or
// placement refused), it drains replaced replicas first, those that serve
// nothing before the available ones, which go only within maxUnavailable.
// Never a rotating one: a rotation waits rather than costs availability;
// nor one whose egress is shared: it serves no one, and only a replacement
// placed elsewhere gives the pool an address.
func drainFirst(p Policy, s State, vs []*view, b budget) {
	want := p.Replicas - keptCount(vs)
	needRoom := max(0, want-max(0, b.room))
	if s.PlacementBlocked {
		needRoom = max(0, want)
	}
	k := needRoom - makingRoom(vs)
	if k <= 0 {
		return
	}
	_, condemned := split(vs)
	var candidates []*view
	for _, v := range inScaleDownOrder(condemned, p.Order, s.Rand) {
		if !v.drainNow && v.cause != causeRotation && v.cause != causeEgressShared {
			candidates = append(candidates, v)
		}
	}
	// Free ones first: those that never served, then those that stopped.
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
		if !v.available || b.available-1 >= p.Replicas-p.MaxUnavailable {
			b = b.drain(v)
			k--
		}
	}
}

// makingRoom counts what is already on its way to make room or a replica:
// replicas draining, deleting (until released) or drained now, and kept
// ones not yet available.
func makingRoom(vs []*view) int {
	n := 0
	for _, v := range vs {
		if v.draining || (v.deleting() && !v.released) || v.drainNow {
			n++
		}
		if v.kept() && !v.available {
			n++
		}
	}
	return n
}

// split divides the live replicas into those kept and those replaced.
func split(vs []*view) (kept, condemned []*view) {
	for _, v := range vs {
		switch {
		case !v.live:
		case v.cause == keep:
			kept = append(kept, v)
		default:
			condemned = append(condemned, v)
		}
	}
	return kept, condemned
}

// drains are the replicas to unpublish now: drained by this plan, unless
// Drain is 0 and they are deleted at once. Sorted by name.
func drains(p Policy, vs []*view) []string {
	var out []string
	for _, v := range vs {
		if v.drainNow && p.Drain != 0 {
			out = append(out, v.Name)
		}
	}
	slices.Sort(out)
	return out
}

// deletions is the sixth step: the replicas drained for Drain, and those
// drained now when Drain is 0. Sorted by name.
func deletions(p Policy, now time.Time, vs []*view) []string {
	var out []string
	for _, v := range vs {
		if (v.drainNow && p.Drain == 0) || (v.draining && !now.Before(v.DrainingSince.Add(p.Drain))) {
			out = append(out, v.Name)
		}
	}
	slices.Sort(out)
	return out
}

// published is the last step: the live Ready replicas not drained now nor
// sharing another's egress address nor withheld (bans), sorted by name.
func published(vs []*view) []string {
	var out []string
	for _, v := range vs {
		if v.live && v.Ready && !v.drainNow && !v.EgressShared && !v.withheld() {
			out = append(out, v.Name)
		}
	}
	slices.Sort(out)
	return out
}

// inScaleDownOrder is a copy of vs in scale-down order.
func inScaleDownOrder(vs []*view, order crawlv1.ScaleDownOrder, rng *rand.Rand) []*view {
	out := slices.Clone(vs)
	scaleDownOrder(out, order, rng)
	return out
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
