package fleet

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func marked(r Replica) Replica      { r.Marked = true; return r }
func quarantined(r Replica) Replica { r.Quarantined = true; return r }

func TestBans(t *testing.T) {
	type want struct {
		accepted, publ, drain []string
		creates, available    int
		paused                string
		waiting, replacing    int
		freeAt                time.Duration // from t0; 0: none
	}
	cases := []struct {
		name   string
		policy Policy
		state  State
		want   want
	}{
		{
			name:   "a report is accepted, unpublished at once and replaced surge first",
			policy: policy(3),
			state:  State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), marked(ready("c", time.Hour))}},
			want:   want{accepted: []string{"c"}, publ: []string{"a", "b"}, creates: 1, available: 2, replacing: 1},
		},
		{
			name:   "once its replacement is available the banned replica is drained",
			policy: policy(2),
			state: State{Replicas: []Replica{ready("a", time.Hour), marked(ready("b", time.Hour)), ready("new", time.Minute)},
				BanRecords: []BanRecord{{Replica: "b", Time: t0.Add(-time.Minute)}}},
			want: want{publ: []string{"a", "new"}, drain: []string{"b"}, available: 2, replacing: 1},
		},
		{
			name:   "past the hourly budget a report waits, still published, until the oldest record leaves the window",
			policy: policy(3, func(p *Policy) { p.MaxBanReplacementsPerHour = 2 }),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), marked(ready("c", time.Hour))},
				BanRecords: []BanRecord{{Replica: "gone1", Time: t0.Add(-50 * time.Minute)}, {Replica: "gone2", Time: t0.Add(-10 * time.Minute)},
					{Replica: "gone0", Time: t0.Add(-2 * time.Hour)}}},
			want: want{publ: []string{"a", "b", "c"}, available: 3, paused: BanPausedBudget, waiting: 1, freeAt: 10 * time.Minute},
		},
		{
			name:   "a record older than an hour leaves the budget",
			policy: policy(3, func(p *Policy) { p.MaxBanReplacementsPerHour = 1 }),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), marked(ready("c", time.Hour))},
				BanRecords: []BanRecord{{Replica: "gone", Time: t0.Add(-time.Hour)}}},
			want: want{accepted: []string{"c"}, publ: []string{"a", "b"}, creates: 1, available: 2, replacing: 1},
		},
		{
			name:   "maxReplacementsPerHour 0 replaces none",
			policy: policy(3, func(p *Policy) { p.MaxBanReplacementsPerHour = 0 }),
			state:  State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour), marked(ready("c", time.Hour))}},
			want:   want{publ: []string{"a", "b", "c"}, available: 3, paused: BanPausedBudget, waiting: 1},
		},
		{
			name:   "budget for one: the older report goes first",
			policy: policy(3, func(p *Policy) { p.MaxBanReplacementsPerHour, p.MaxBanned = 1, intstr.FromString("100%") }),
			state:  State{Replicas: []Replica{ready("a", time.Hour), marked(ready("b", time.Hour)), marked(ready("c", 2*time.Hour))}},
			want:   want{accepted: []string{"c"}, publ: []string{"a", "b"}, creates: 1, available: 2, paused: BanPausedBudget, waiting: 1, replacing: 1, freeAt: time.Hour},
		},
		{
			name:   "more reported than maxBanned: none replaced (the short-circuit)",
			policy: policy(4),
			state: State{Replicas: []Replica{ready("a", time.Hour), marked(ready("b", time.Hour)), marked(ready("c", time.Hour)),
				marked(ready("d", time.Hour))}},
			want: want{publ: []string{"a", "b", "c", "d"}, available: 4, paused: BanPausedTooMany, waiting: 3},
		},
		{
			name:   "maxBanned as a count",
			policy: policy(4, func(p *Policy) { p.MaxBanned = intstr.FromInt32(3) }),
			state: State{Replicas: []Replica{ready("a", time.Hour), marked(ready("b", time.Hour)), marked(ready("c", time.Hour)),
				marked(ready("d", time.Hour))}},
			// Withheld, they serve nothing: drained first to make room.
			want: want{accepted: []string{"b", "c", "d"}, publ: []string{"a"}, drain: []string{"b", "c"}, creates: 1, available: 1, replacing: 3},
		},
		{
			name:   "a paused pool accepts no report",
			policy: policy(2, func(p *Policy) { p.Paused = true }),
			state:  State{Replicas: []Replica{ready("a", time.Hour), marked(ready("b", time.Hour))}},
			want:   want{publ: []string{"a", "b"}, available: 2, paused: BanPausedPoolPause, waiting: 1},
		},
		{
			name:   "a quarantined replica is never published, even while its replacement waits",
			policy: policy(2, func(p *Policy) { p.MaxBanReplacementsPerHour = 0 }),
			state:  State{Replicas: []Replica{ready("a", time.Hour), quarantined(ready("b", time.Hour))}},
			want:   want{publ: []string{"a"}, available: 1, paused: BanPausedBudget, waiting: 1},
		},
		{
			name:   "a quarantined replica is replaced within the budget, reports first",
			policy: policy(3, func(p *Policy) { p.MaxBanReplacementsPerHour, p.MaxBanned = 1, intstr.FromString("100%") }),
			state:  State{Replicas: []Replica{ready("a", time.Hour), quarantined(ready("b", 2*time.Hour)), marked(ready("c", time.Hour))}},
			want:   want{accepted: []string{"c"}, publ: []string{"a"}, creates: 1, available: 1, paused: BanPausedBudget, waiting: 1, replacing: 1, freeAt: time.Hour},
		},
		{
			name:   "a replacement under way goes on without its report and costs nothing more",
			policy: policy(2, func(p *Policy) { p.MaxBanReplacementsPerHour = 1 }),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour)},
				BanRecords: []BanRecord{{Replica: "b", Time: t0.Add(-time.Minute)}}},
			want: want{publ: []string{"a"}, creates: 1, available: 1, replacing: 1},
		},
		{
			name:   "draining and deleting replicas are not reported again",
			policy: policy(2),
			state: State{Replicas: []Replica{ready("a", time.Hour), ready("b", time.Hour),
				with(marked(ready("c", time.Hour)), func(r *Replica) { r.DrainingSince = t0.Add(-time.Second) })}},
			want: want{publ: []string{"a", "b"}, available: 2},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.state.Now = t0
			plan := Decide(tc.policy, tc.state)
			w, s := tc.want, plan.Status
			if !slices.Equal(plan.BanAccepted, w.accepted) {
				t.Errorf("accepted %v, want %v", plan.BanAccepted, w.accepted)
			}
			if !slices.Equal(plan.Publish, w.publ) {
				t.Errorf("published %v, want %v", plan.Publish, w.publ)
			}
			if !slices.Equal(plan.Drain, w.drain) {
				t.Errorf("drained %v, want %v", plan.Drain, w.drain)
			}
			if len(plan.Create) != w.creates || s.Available != w.available {
				t.Errorf("creates %d, available %d; want %d, %d", len(plan.Create), s.Available, w.creates, w.available)
			}
			if s.BanPaused != w.paused || s.BanWaiting != w.waiting || s.BanReplacing != w.replacing {
				t.Errorf("paused %q, waiting %d, replacing %d; want %q, %d, %d", s.BanPaused, s.BanWaiting, s.BanReplacing, w.paused, w.waiting, w.replacing)
			}
			if !s.BanBudgetFreeAt.Equal(at(t0, w.freeAt)) {
				t.Errorf("budget frees at %s, want %s", s.BanBudgetFreeAt, at(t0, w.freeAt))
			}
			if w.freeAt != 0 && plan.Next.After(at(t0, w.freeAt)) {
				t.Errorf("next look %s, after the budget frees at %s", plan.Next, at(t0, w.freeAt))
			}
			if err := checkPlan(tc.policy, tc.state, plan); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestBanPolicy(t *testing.T) {
	p, err := PolicyFor(&crawlv1.ProxyPoolSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if p.DomainBanDuration != DefaultDomainBanDuration || p.ReplaceAfterDomains != DefaultReplaceAfterDomains ||
		p.MaxBanReplacementsPerHour != DefaultMaxBanReplacementsHour || p.MaxBanned != DefaultMaxBanned {
		t.Errorf("defaults %v %v %v %v", p.DomainBanDuration, p.ReplaceAfterDomains, p.MaxBanReplacementsPerHour, p.MaxBanned)
	}
	zero, pct := int32(0), intstr.FromString("25%")
	p, err = PolicyFor(&crawlv1.ProxyPoolSpec{Bans: crawlv1.ProxyPoolBans{DomainBanDuration: &metav1.Duration{Duration: time.Hour},
		ReplaceAfterDomains: 2, MaxReplacementsPerHour: &zero, MaxBanned: &pct}})
	if err != nil {
		t.Fatal(err)
	}
	if p.DomainBanDuration != time.Hour || p.ReplaceAfterDomains != 2 || p.MaxBanReplacementsPerHour != 0 || p.MaxBanned != pct {
		t.Errorf("set %v %v %v %v", p.DomainBanDuration, p.ReplaceAfterDomains, p.MaxBanReplacementsPerHour, p.MaxBanned)
	}
	bad := intstr.FromString("lots")
	if _, err := PolicyFor(&crawlv1.ProxyPoolSpec{Bans: crawlv1.ProxyPoolBans{MaxBanned: &bad}}); err == nil || !strings.Contains(err.Error(), "spec.bans.maxBanned") {
		t.Errorf("malformed maxBanned: %v, want an error naming spec.bans.maxBanned", err)
	}
}
