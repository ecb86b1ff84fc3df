package fleet

import (
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// classified runs the first two steps on rs at t0, as Decide does.
func classified(p Policy, rs ...Replica) ([]*view, Summary) {
	next := nextTimer{now: t0}
	s := State{Now: t0, Replicas: rs}
	vs, sum := classify(p, s, &next)
	bans(p, s, vs, &sum, &next)
	replace(p, t0, vs, &sum, &next)
	return vs, sum
}

func TestClassify(t *testing.T) {
	p := policy(3, func(p *Policy) { p.MinReady = 30 * time.Second })
	type want struct {
		live, draining, available, unhealthy, startupFailed bool
		released                                            bool
		unhealthyAt, remediateAt                            time.Time
		next                                                time.Duration // from t0; 0: none
	}
	cases := []struct {
		name string
		r    Replica
		want want
	}{
		{"Ready past minReady: live and available", ready("a", time.Hour),
			want{live: true, available: true}},
		{"Ready within minReady: not yet available, due when it passes",
			with(ready("a", time.Hour), func(r *Replica) { r.ReadyChanged = t0.Add(-10 * time.Second) }),
			want{live: true, next: 20 * time.Second}},
		{"draining: not live, due when the drain ends",
			with(ready("a", time.Hour), func(r *Replica) { r.DrainingSince = t0.Add(-10 * time.Second) }),
			want{draining: true, next: 20 * time.Second}},
		{"deleting: neither live nor draining, holds its room until deletionTimeout",
			with(ready("a", time.Hour), func(r *Replica) { r.DeletingSince, r.DrainingSince = t0.Add(-time.Second), t0.Add(-time.Hour) }),
			want{next: DefaultDeletionTimeout - time.Second}},
		{"deleting for deletionTimeout: released",
			with(ready("a", time.Hour), func(r *Replica) { r.DeletingSince = t0.Add(-DefaultDeletionTimeout) }),
			want{released: true}},
		{"deleting, stuck: released at once",
			with(ready("a", time.Hour), func(r *Replica) { r.DeletingSince, r.DeletionStuck = t0.Add(-time.Second), true }),
			want{released: true}},
		{"booting inside startupTimeout: judged at the window's end", booting("b", 4*time.Minute),
			want{live: true, unhealthyAt: t0.Add(6 * time.Minute), remediateAt: t0.Add(6 * time.Minute), next: 6 * time.Minute}},
		{"not Ready at startupTimeout: failed to start, unhealthy", booting("b", 11*time.Minute),
			want{live: true, unhealthy: true, startupFailed: true, unhealthyAt: t0.Add(-time.Minute), remediateAt: t0.Add(-time.Minute)}},
		{"a slot that failed three times before waits two minutes more",
			with(booting("b", 11*time.Minute), func(r *Replica) { r.StartupFailures = 3 }),
			want{live: true, unhealthy: true, startupFailed: true, unhealthyAt: t0.Add(-time.Minute), remediateAt: t0.Add(time.Minute), next: time.Minute}},
		{"ran, then not Ready: unhealthy unhealthyTimeout later",
			with(ready("c", time.Hour), func(r *Replica) { r.Ready, r.ReadyChanged = false, t0.Add(-2*time.Minute) }),
			want{live: true, unhealthyAt: t0.Add(3 * time.Minute), remediateAt: t0.Add(3 * time.Minute), next: 3 * time.Minute}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next := nextTimer{now: t0}
			vs, _ := classify(p, State{Now: t0, Replicas: []Replica{tc.r}}, &next)
			replace(p, t0, vs, &Summary{RemediationAllowed: true}, &next)
			v, w := vs[0], tc.want
			got := want{v.live, v.draining, v.available, v.unhealthy, v.startupFailed, v.released, v.unhealthyAt, v.remediateAt, 0}
			w.next = 0
			if got != w {
				t.Errorf("got %+v\nwant %+v", got, w)
			}
			if !next.t.Equal(at(t0, tc.want.next)) {
				t.Errorf("next %s, want %s", next.t, at(t0, tc.want.next))
			}
		})
	}
}

func TestClassifyCounts(t *testing.T) {
	notReady := func(r Replica) Replica { r.Ready, r.ReadyChanged = false, t0.Add(-time.Hour); return r }
	cases := []struct {
		name string
		p    Policy
		rs   []Replica
		want Summary
	}{
		{
			name: "draining replicas count as Ready, not available; deleting ones as neither; 40% of 2 live is 1",
			p:    policy(3, func(p *Policy) { p.MaxUnavailable = 1 }),
			rs: []Replica{ready("a", time.Hour), outdated(ready("b", time.Hour)),
				with(ready("c", time.Hour), func(r *Replica) { r.DrainingSince = t0 }),
				with(ready("d", time.Hour), func(r *Replica) { r.DeletingSince = t0.Add(-time.Second) })},
			want: Summary{Replicas: 4, Ready: 3, Available: 2, UpToDate: 1, Outdated: 1, Draining: 1,
				MinAvailable: 2, MaxUnhealthy: 1, RemediationAllowed: true},
		},
		{
			name: "2 of 5 live unhealthy is within 40%",
			p:    policy(5),
			rs:   []Replica{ready("a", time.Hour), ready("b", time.Hour), ready("c", time.Hour), notReady(ready("d", time.Hour)), notReady(ready("e", time.Hour))},
			want: Summary{Replicas: 5, Ready: 3, Available: 3, UpToDate: 5, Unhealthy: 2, MinAvailable: 5, MaxUnhealthy: 2, RemediationAllowed: true},
		},
		{
			name: "3 of 5 is not",
			p:    policy(5),
			rs:   []Replica{ready("a", time.Hour), ready("b", time.Hour), notReady(ready("c", time.Hour)), notReady(ready("d", time.Hour)), notReady(ready("e", time.Hour))},
			want: Summary{Replicas: 5, Ready: 2, Available: 2, UpToDate: 5, Unhealthy: 3, MinAvailable: 5, MaxUnhealthy: 2},
		},
		{
			name: "maxUnhealthy is of the live replicas, not of replicas",
			p:    policy(2, func(p *Policy) { p.MaxUnhealthy = intstr.FromString("50%") }),
			rs: []Replica{ready("a", time.Hour), notReady(ready("b", time.Hour)), ready("c", time.Hour), ready("d", time.Hour),
				with(ready("e", time.Hour), func(r *Replica) { r.DrainingSince = t0 })},
			want: Summary{Replicas: 5, Ready: 4, Available: 3, UpToDate: 4, Unhealthy: 1, Draining: 1, MinAvailable: 2, MaxUnhealthy: 2, RemediationAllowed: true},
		},
		{
			name: "deletions past deletionTimeout or stuck are named, those within it are not",
			p:    policy(1),
			rs: []Replica{ready("a", time.Hour),
				with(ready("z", time.Hour), func(r *Replica) { r.DeletingSince = t0.Add(-5 * time.Minute) }),
				with(ready("y", time.Hour), func(r *Replica) { r.DeletingSince, r.DeletionStuck = t0.Add(-time.Second), true }),
				with(ready("x", time.Hour), func(r *Replica) { r.DeletingSince = t0.Add(-5*time.Minute + time.Second) })},
			want: Summary{Replicas: 4, Ready: 1, Available: 1, UpToDate: 1, MinAvailable: 1, MaxUnhealthy: 1, RemediationAllowed: true,
				DeletionsReleased: []string{"y", "z"}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next := nextTimer{now: t0}
			_, got := classify(tc.p, State{Now: t0, Replicas: tc.rs}, &next)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestReplace(t *testing.T) {
	failed := booting("f", 11*time.Minute)
	cases := []struct {
		name   string
		p      Policy
		r      Replica
		others []Replica
		cause  cause
		// remediating, backing off, backoff until (from t0; 0: none)
		remediating, backingOff int
		backoffUntil            time.Duration
	}{
		{name: "a ban before a rollout", p: policy(3), r: with(outdated(ready("a", time.Hour)), func(r *Replica) { r.Marked = true }), cause: causeMarked},
		{name: "outdated", p: policy(3), r: outdated(ready("a", time.Hour)), cause: causeOutdated},
		{name: "outdated under OnDelete is kept", p: policy(3, func(p *Policy) { p.OnDelete = true }), r: outdated(ready("a", time.Hour)), cause: keep},
		{name: "a rollout before a rotation in flight",
			p: policy(3), r: with(outdated(ready("a", time.Hour)), func(r *Replica) { r.RotatingSince = t0 }), cause: causeOutdated},
		{name: "a rotation in flight goes on",
			p: policy(3), r: with(ready("a", time.Hour), func(r *Replica) { r.RotatingSince = t0.Add(-time.Minute) }), cause: causeRotation},
		{name: "a failed start is remediated", p: policy(3), r: failed, cause: causeUnhealthy, remediating: 1},
		{name: "a failed start waits its slot's backoff",
			p: policy(3), r: with(failed, func(r *Replica) { r.StartupFailures = 3 }), cause: keep, backingOff: 1, backoffUntil: time.Minute},
		{name: "past maxUnhealthy nothing is remediated nor backs off",
			p: policy(3, func(p *Policy) { p.MaxUnhealthy = intstr.FromInt32(0) }), r: with(failed, func(r *Replica) { r.StartupFailures = 3 }), cause: keep},
		{name: "paused replaces nothing", p: policy(3, func(p *Policy) { p.Paused = true }),
			r: with(outdated(failed), func(r *Replica) { r.Marked = true }), cause: keep},
		{name: "a draining replica is not replaced again", p: policy(3),
			r: with(ready("a", time.Hour), func(r *Replica) { r.Marked, r.DrainingSince = true, t0 }), cause: keep},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs, sum := classified(tc.p, append([]Replica{tc.r}, tc.others...)...)
			if vs[0].cause != tc.cause {
				t.Errorf("cause %d, want %d", vs[0].cause, tc.cause)
			}
			if sum.Remediating != tc.remediating || sum.BackingOff != tc.backingOff || !sum.BackoffUntil.Equal(at(t0, tc.backoffUntil)) {
				t.Errorf("remediating %d, backing off %d until %s; want %d, %d, %s",
					sum.Remediating, sum.BackingOff, sum.BackoffUntil, tc.remediating, tc.backingOff, at(t0, tc.backoffUntil))
			}
		})
	}
}
