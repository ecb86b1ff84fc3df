package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// Defaults of spec.bans.
const (
	DefaultDomainBanDuration      = 24 * time.Hour
	DefaultReplaceAfterDomains    = 3
	DefaultMaxBanReplacementsHour = 10
	// BanWindow is the window of Policy.MaxBanReplacementsPerHour.
	BanWindow = time.Hour
)

// DefaultMaxBanned is the bans' short-circuit: with more than half the live
// replicas reported at once, the cause is likely the crawler (a ban
// detector gone wrong) or the site (it blocks everyone), and replacing
// them would only churn, as remediation's maxUnhealthy reasons.
var DefaultMaxBanned = intstr.FromString("50%")

// BanRecord is a replacement a ban report started (status.banReplacements).
type BanRecord struct {
	Replica string
	Time    time.Time
}

// Why ban replacement is paused (Summary.BanPaused).
const (
	BanPausedBudget    = "BudgetExhausted"
	BanPausedTooMany   = "TooManyBanned"
	BanPausedPoolPause = "Paused"
)

// withheld reports whether v is kept from crawlers: a ban replacement under
// way, or an egress address in quarantine. Such a replica is neither
// published nor available.
func (v *view) withheld() bool { return v.banAccepted || v.Quarantined }

// bans is the planner's step between classify and replace: which replicas
// reported banned (Marked) or leaving from a quarantined address are
// replaced now. A replica with a record of its own in State.BanRecords is
// under way already; another is accepted while the last hour's records stay
// below MaxBanReplacementsPerHour and no more than MaxBanned live replicas
// stand reported (under way or waiting). Accepted ones are withheld at once (unpublished, not
// available); replace gives them their cause, and the one disruption budget
// replaces them surge-first. A paused pool accepts none.
func bans(p Policy, s State, vs []*view, sum *Summary, next *nextTimer) []string {
	recorded := map[string]bool{}
	var recent []time.Time
	for _, r := range s.BanRecords {
		recorded[r.Replica] = true
		// A record a little ahead of now (the status keeps whole
		// seconds) counts: the budget errs on the safe side.
		if s.Now.Sub(r.Time) < BanWindow {
			recent = append(recent, r.Time)
		}
	}
	slices.SortFunc(recent, time.Time.Compare)
	var waiting []*view
	live, reported := 0, 0
	for _, v := range vs {
		if !v.live {
			continue
		}
		live++
		switch {
		case recorded[v.Name]:
			// Under way: it goes on even if its report was withdrawn.
			v.banAccepted = true
			reported++
		case v.Marked || v.Quarantined:
			reported++
			waiting = append(waiting, v)
		}
	}
	sum.BanMaxPerHour, sum.BanMaxReported = p.MaxBanReplacementsPerHour, MaxUnhealthyOf(p.MaxBanned, live)
	// Reports first, then quarantined addresses; oldest first within each.
	slices.SortStableFunc(waiting, func(a, b *view) int {
		if a.Marked != b.Marked {
			if a.Marked {
				return -1
			}
			return 1
		}
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	var accepted []string
	for _, v := range waiting {
		switch {
		case p.Paused:
			sum.BanPaused = BanPausedPoolPause
		case reported > sum.BanMaxReported:
			sum.BanPaused = BanPausedTooMany
		case len(recent) >= p.MaxBanReplacementsPerHour:
			sum.BanPaused = BanPausedBudget
			if p.MaxBanReplacementsPerHour > 0 {
				// The oldest record in the window frees a place.
				sum.BanBudgetFreeAt = recent[len(recent)-p.MaxBanReplacementsPerHour].Add(BanWindow)
				next.at(sum.BanBudgetFreeAt)
			}
		default:
			v.banAccepted = true
			recent = append(recent, s.Now)
			accepted = append(accepted, v.Name)
			continue
		}
		sum.BanWaiting++
		sum.BanWaitingReplicas = append(sum.BanWaitingReplicas, v.Name)
	}
	slices.Sort(sum.BanWaitingReplicas)
	sum.BanRecent = len(recent)
	withhold(vs, sum)
	slices.Sort(accepted)
	return accepted
}

// withhold takes the withheld replicas off the available ones.
func withhold(vs []*view, sum *Summary) {
	for _, v := range vs {
		if v.live && v.withheld() {
			sum.Withheld++
			if v.available {
				v.available = false
				sum.Available--
			}
		}
		if v.banAccepted {
			sum.BanReplacing++
		}
	}
}

// banPolicy resolves spec.bans into p.
func banPolicy(p *Policy, b crawlv1.ProxyPoolBans) error {
	p.DomainBanDuration, p.ReplaceAfterDomains = DefaultDomainBanDuration, DefaultReplaceAfterDomains
	p.MaxBanReplacementsPerHour, p.MaxBanned = DefaultMaxBanReplacementsHour, DefaultMaxBanned
	if b.DomainBanDuration != nil && b.DomainBanDuration.Duration > 0 {
		p.DomainBanDuration = b.DomainBanDuration.Duration
	}
	if b.ReplaceAfterDomains > 0 {
		p.ReplaceAfterDomains = int(b.ReplaceAfterDomains)
	}
	if b.MaxReplacementsPerHour != nil {
		p.MaxBanReplacementsPerHour = max(0, int(*b.MaxReplacementsPerHour))
	}
	if b.MaxBanned != nil {
		if _, err := intstr.GetScaledValueFromIntOrPercent(b.MaxBanned, 100, false); err != nil {
			return fmt.Errorf("spec.bans.maxBanned: %w", err)
		}
		p.MaxBanned = *b.MaxBanned
	}
	return nil
}
