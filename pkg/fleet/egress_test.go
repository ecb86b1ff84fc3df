package fleet

import (
	"slices"
	"testing"
	"time"
)

// shared is a replica whose egress address an older replica has.
func shared(r Replica) Replica { r.EgressShared = true; return r }

// TestDecideEgressShared: with egress.distinct Required, a replica whose
// egress is another's is neither published nor available, and is replaced
// surge-first within the one budget; it goes once its replacement is
// available, never before.
func TestDecideEgressShared(t *testing.T) {
	cases := []struct {
		name                 string
		policy               Policy
		state                State
		creates              int
		drain, publish       []string
		available, egressSum int
	}{
		{
			name:      "a shared replica is unpublished, not available, and a replacement is made",
			policy:    policy(2),
			state:     State{Now: t0, Replicas: []Replica{ready("a", time.Hour), shared(ready("b", time.Hour))}},
			creates:   1,
			publish:   []string{"a"},
			available: 1, egressSum: 1,
		},
		{
			name:   "the replacement within maxSurge only: a second shared one waits",
			policy: policy(3),
			state: State{Now: t0, Replicas: []Replica{ready("a", time.Hour),
				shared(ready("b", time.Hour)), shared(ready("c", time.Hour))}},
			creates:   1,
			publish:   []string{"a"},
			available: 1, egressSum: 2,
		},
		{
			name:   "once the replacement is available the shared replica goes",
			policy: policy(2),
			state: State{Now: t0, Replicas: []Replica{ready("a", time.Hour), shared(ready("b", time.Hour)),
				ready("c", 10*time.Minute)}},
			drain:     []string{"b"},
			publish:   []string{"a", "c"},
			available: 2, egressSum: 1,
		},
		{
			name:   "placement refused: it is not drained first (its going gives no address)",
			policy: policy(2, func(p *Policy) { p.MaxUnavailable = 1 }),
			state: State{Now: t0, PlacementBlocked: true,
				Replicas: []Replica{ready("a", time.Hour), shared(ready("b", time.Hour))}},
			creates:   1,
			publish:   []string{"a"},
			available: 1, egressSum: 1,
		},
		{
			name:      "paused: not replaced, still not published",
			policy:    policy(2, func(p *Policy) { p.Paused = true }),
			state:     State{Now: t0, Replicas: []Replica{ready("a", time.Hour), shared(ready("b", time.Hour))}},
			publish:   []string{"a"},
			available: 1, egressSum: 1,
		},
		{
			name:      "a ban goes before a shared address: still one replacement",
			policy:    policy(2),
			state:     State{Now: t0, Replicas: []Replica{ready("a", time.Hour), shared(with(ready("b", time.Hour), func(r *Replica) { r.Marked = true }))}},
			creates:   1,
			publish:   []string{"a"},
			available: 1, egressSum: 1,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := Decide(tc.policy, tc.state)
			if len(plan.Create) != tc.creates {
				t.Errorf("creates %d, want %d", len(plan.Create), tc.creates)
			}
			if !slices.Equal(plan.Drain, tc.drain) || len(plan.Delete) != 0 {
				t.Errorf("drain %v delete %v, want drain %v, no delete", plan.Drain, plan.Delete, tc.drain)
			}
			if !slices.Equal(plan.Publish, tc.publish) {
				t.Errorf("publish %v, want %v", plan.Publish, tc.publish)
			}
			if plan.Status.Available != tc.available || plan.Status.EgressShared != tc.egressSum {
				t.Errorf("available %d, egress shared %d; want %d, %d", plan.Status.Available, plan.Status.EgressShared, tc.available, tc.egressSum)
			}
		})
	}
}
