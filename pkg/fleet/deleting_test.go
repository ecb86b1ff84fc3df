package fleet

import (
	"slices"
	"testing"
	"time"
)

// TestDecideStopsWaitingForDeletionsThatDoNotFinish: a replica being
// deleted holds its room (against maxSurge, and as room being made) for
// deletionTimeout, or not at all when its deletion cannot finish; then its
// replacement goes ahead, and the status says which replicas wait for
// deletions and until when.
func TestDecideStopsWaitingForDeletionsThatDoNotFinish(t *testing.T) {
	deleting := func(r Replica, ago time.Duration) Replica {
		return with(r, func(r *Replica) { r.DeletingSince = t0.Add(-ago) })
	}
	stuck := func(r Replica) Replica { r.DeletionStuck = true; return r }
	// unhealthy is a replica not Ready for 10 minutes: on a dead host.
	unhealthy := func(name string) Replica {
		return with(ready(name, time.Hour), func(r *Replica) { r.Ready, r.ReadyChanged = false, t0.Add(-10*time.Minute) })
	}
	type want struct {
		creates     int
		drain       []string
		released    []string
		waiting     int
		waitUntil   time.Duration // from t0; 0: zero time
		remediating int
		next        time.Duration // from t0; 0: none
	}
	cases := []struct {
		name   string
		policy Policy
		state  State
		want   want
	}{
		{
			name:   "maxUnavailable 0: a rollout waits for a deletion within deletionTimeout",
			policy: policy(3),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), outdated(ready("c", time.Hour)),
				deleting(outdated(ready("d", time.Hour)), time.Minute)}},
			want: want{waiting: 1, waitUntil: 4 * time.Minute, next: 4 * time.Minute},
		},
		{
			name:   "maxUnavailable 0: past deletionTimeout the deletion holds no surge and the rollout goes on",
			policy: policy(3),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), outdated(ready("c", time.Hour)),
				deleting(outdated(ready("d", time.Hour)), DefaultDeletionTimeout)}},
			want: want{creates: 1, released: []string{"d"}},
		},
		{
			name:   "maxUnavailable 0: a deletion blocked for good holds nothing at once",
			policy: policy(3),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), outdated(ready("c", time.Hour)),
				stuck(deleting(outdated(ready("d", time.Hour)), time.Second))}},
			want: want{creates: 1, released: []string{"d"}},
		},
		{
			name:   "a deletionTimeout of the pool's own is kept",
			policy: policy(3, func(p *Policy) { p.DeletionTimeout = 30 * time.Minute }),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), outdated(ready("c", time.Hour)),
				deleting(outdated(ready("d", time.Hour)), 10*time.Minute)}},
			want: want{waiting: 1, waitUntil: 20 * time.Minute, next: 20 * time.Minute},
		},
		{
			// A host died holding d and e. One replacement (f) was made
			// within the surge and e was drained for it; e's deletion
			// cannot reach the host. Counted, it held the last room for
			// good: one short, with Remediating claiming a replacement.
			name:   "a host dead holding two replicas: its deletion past deletionTimeout makes room for the second replacement",
			policy: policy(5),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), ready("c", time.Hour), ready("f", 10*time.Minute),
				unhealthy("d"), deleting(unhealthy("e"), 6*time.Minute)}},
			want: want{creates: 1, released: []string{"e"}, remediating: 1},
		},
		{
			name:   "a host dead holding two replicas: within deletionTimeout the second replacement waits, and says until when",
			policy: policy(5),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), ready("c", time.Hour), ready("f", 10*time.Minute),
				unhealthy("d"), deleting(unhealthy("e"), time.Minute)}},
			want: want{waiting: 1, waitUntil: 4 * time.Minute, remediating: 1, next: 4 * time.Minute},
		},
		{
			name:   "maxUnavailable 1: a released deletion no longer counts as room being made, so a replaced replica drains first",
			policy: policy(2, func(p *Policy) { p.MaxSurge, p.MaxUnavailable = 0, 1 }),
			state: State{Replicas: []Replica{outdated(ready("a", 2*time.Hour)), outdated(ready("b", time.Hour)),
				deleting(outdated(ready("c", time.Hour)), DefaultDeletionTimeout+time.Minute)}},
			want: want{drain: []string{"a"}, released: []string{"c"}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.state
			s.Now = t0
			plan := Decide(tc.policy, s)
			w, st := tc.want, plan.Status
			if len(plan.Create) != w.creates {
				t.Errorf("creates %d, want %d", len(plan.Create), w.creates)
			}
			if !slices.Equal(plan.Drain, w.drain) {
				t.Errorf("drain %v, want %v", plan.Drain, w.drain)
			}
			if !slices.Equal(st.DeletionsReleased, w.released) {
				t.Errorf("deletions released %v, want %v", st.DeletionsReleased, w.released)
			}
			if st.WaitingForDeletions != w.waiting || !st.DeletionsReleaseAt.Equal(at(t0, w.waitUntil)) {
				t.Errorf("waiting for deletions %d until %s, want %d until %s", st.WaitingForDeletions, st.DeletionsReleaseAt, w.waiting, at(t0, w.waitUntil))
			}
			if st.Remediating != w.remediating {
				t.Errorf("remediating %d, want %d", st.Remediating, w.remediating)
			}
			if !plan.Next.Equal(at(t0, w.next)) {
				t.Errorf("next %s, want %s", plan.Next, at(t0, w.next))
			}
		})
	}
}

// A host dies holding two replicas, and deleting anything on it never
// finishes. The pool replaces both and ends with every replica available,
// the two it could not delete left behind, holding nothing.
func TestAHostThatDiesHoldingTwoReplicasIsReplacedInFull(t *testing.T) {
	s := newSim(t, policy(5), 5)
	s.hung = map[string]bool{}
	s.hook = func(s *sim) {
		if s.now.Equal(t0.Add(time.Minute)) {
			for _, r := range s.reps[1:3] {
				r.Ready, r.ReadyChanged = false, s.now
				s.hung[r.Name] = true
			}
		}
	}
	s.run(2 * time.Minute)
	s.runUntilConverged(30 * time.Minute)
	if n := len(s.reps); n != 7 {
		t.Fatalf("%d replicas exist, want 5 and the 2 whose deletion hangs", n)
	}
	if s.stats.creates != 2 {
		t.Fatalf("%d creates, want 2", s.stats.creates)
	}
}
