// Package fleet decides what a ProxyPool does next: which replicas to
// create, unpublish (drain), delete and start rotating, and what its status
// says. It is pure: the controller turns the pool and its Proxies into a
// Policy and a State, calls Decide, and carries out the Plan. Every rule of
// the one disruption budget lives here, so table tests can check it at each
// step with a clock they control.
package fleet

import (
	"fmt"
	"math"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// Defaults of the ProxyPool fields left empty. The API documents the same
// values; the controller applies them, not a webhook, so that an empty field
// keeps meaning "the operator's default".
const (
	DefaultMaxSurge         = 1
	DefaultMaxUnavailable   = 0
	DefaultDrain            = 30 * time.Second
	DefaultStartupTimeout   = 10 * time.Minute
	DefaultUnhealthyTimeout = 5 * time.Minute
	DefaultStartupBackoff   = 30 * time.Second
	// DefaultMaxConcurrentRotations is the least rotation.maxConcurrent
	// left empty comes to; a larger pool gets more (see
	// Policy.defaultMaxConcurrentRotations).
	DefaultMaxConcurrentRotations = 1
	// RotationBootEstimate is what sizing rotation assumes a replacement
	// takes from its creation to Ready: a guest's boot and first probes
	// (under a minute on kvm, about 100 s for a TCG guest in the e2e).
	RotationBootEstimate = 2 * time.Minute
	// RotationHeadroom: rotation.maxConcurrent left empty lets the pool
	// replace every replica within this share of maxAge, so that
	// replacements that fail, wait for room, or expire together do not
	// put it behind.
	RotationHeadroom = 0.8
	// DefaultMaxConcurrentCreates is the replicas one placement domain (a
	// KVMHost, a zone, a node) may be creating at once: a hypervisor
	// boots a few guests at a time well, and more only slow each other.
	DefaultMaxConcurrentCreates = 4
	// DefaultDeletionTimeout is how long a replica being deleted still
	// holds its room (against maxSurge) and counts as room being made.
	// Deleting an instance takes seconds on kvm and a minute or two on
	// gcp; one still there after this waits on a dead host or a provider
	// that will not answer, and the pool replaces it rather than wait.
	DefaultDeletionTimeout = 5 * time.Minute
	// MaxStartupBackoff caps the doubling (unless startupBackoff itself is
	// longer).
	MaxStartupBackoff = 30 * time.Minute
)

// DefaultMaxUnhealthy is the short-circuit: with more than 40% of the live
// replicas unhealthy, the cause is likely outside them (a network outage)
// and replacing them would only churn.
var DefaultMaxUnhealthy = intstr.FromString("40%")

// Policy is a pool's spec with every default applied and every percentage
// resolved against spec.replicas.
type Policy struct {
	Replicas       int
	MaxSurge       int
	MaxUnavailable int
	// MinReady a replica must be Ready before it counts as available.
	MinReady time.Duration
	// Drain is how long a replica stays unpublished before it is deleted.
	Drain time.Duration
	// OnDelete leaves outdated replicas alone.
	OnDelete bool
	// Paused stops every replacement (rollout, rotation, remediation,
	// marked replicas); scaling and publishing go on.
	Paused bool

	// MaxAge 0 disables rotation.
	MaxAge                 time.Duration
	Jitter                 time.Duration
	MaxConcurrentRotations int
	RotationInterval       time.Duration

	StartupTimeout   time.Duration
	UnhealthyTimeout time.Duration
	StartupBackoff   time.Duration
	// DeletionTimeout: how long a replica being deleted holds its room.
	DeletionTimeout time.Duration
	// MaxUnhealthy is resolved against the live replicas at each decision.
	MaxUnhealthy intstr.IntOrString
	// MaxCreatesPerMinute 0: no pool-wide cap.
	MaxCreatesPerMinute int
	// MaxConcurrentCreates is per placement domain (placement keeps it
	// for hosts); MaxCreating is the pool's replicas being created at
	// once, all domains together, which the controller sets where
	// placement cannot keep the per-domain bound (zones, nodes); 0: none.
	MaxConcurrentCreates int
	MaxCreating          int

	Order crawlv1.ScaleDownOrder

	// Bans (spec.bans). DomainBanDuration and ReplaceAfterDomains turn
	// reports into Replica.Marked (the controller); the planner's bans
	// step keeps the other two.
	DomainBanDuration         time.Duration
	ReplaceAfterDomains       int
	MaxBanReplacementsPerHour int
	MaxBanned                 intstr.IntOrString
}

// PolicyFor resolves spec into a Policy. It fails only on what the webhook
// refuses (a malformed percentage), for pools stored without it.
func PolicyFor(spec *crawlv1.ProxyPoolSpec) (Policy, error) {
	p := Policy{
		Replicas:               1,
		MinReady:               time.Duration(spec.Rollout.MinReadySeconds) * time.Second,
		Drain:                  DefaultDrain,
		OnDelete:               spec.Rollout.Type == crawlv1.OnDeleteStrategy,
		Paused:                 spec.Paused,
		MaxConcurrentRotations: DefaultMaxConcurrentRotations,
		StartupTimeout:         DefaultStartupTimeout,
		UnhealthyTimeout:       DefaultUnhealthyTimeout,
		StartupBackoff:         DefaultStartupBackoff,
		DeletionTimeout:        DefaultDeletionTimeout,
		MaxUnhealthy:           DefaultMaxUnhealthy,
		MaxConcurrentCreates:   DefaultMaxConcurrentCreates,
		Order:                  spec.ScaleDown.Order,
	}
	if spec.Replicas != nil {
		p.Replicas = max(0, int(*spec.Replicas))
	}
	var err error
	if p.MaxSurge, err = scaled(spec.Rollout.MaxSurge, DefaultMaxSurge, p.Replicas, true); err != nil {
		return Policy{}, fmt.Errorf("spec.rollout.maxSurge: %w", err)
	}
	if p.MaxUnavailable, err = scaled(spec.Rollout.MaxUnavailable, DefaultMaxUnavailable, p.Replicas, false); err != nil {
		return Policy{}, fmt.Errorf("spec.rollout.maxUnavailable: %w", err)
	}
	p.MaxUnavailable = min(p.MaxUnavailable, p.Replicas)
	if p.MaxSurge == 0 && p.MaxUnavailable == 0 {
		// A percentage that rounds to nothing on a small pool must not
		// freeze it: surge one, the budget that never costs availability.
		p.MaxSurge = 1
	}
	if d := spec.Rollout.DrainSeconds; d != nil {
		p.Drain = time.Duration(max(0, *d)) * time.Second
	}
	if r := spec.Rotation; r.MaxAge != nil {
		p.MaxAge = r.MaxAge.Duration
		if r.Jitter != nil {
			p.Jitter = min(max(0, r.Jitter.Duration), p.MaxAge)
		}
		p.MaxConcurrentRotations = p.defaultMaxConcurrentRotations()
		if r.MaxConcurrent > 0 {
			p.MaxConcurrentRotations = int(r.MaxConcurrent)
		}
		if r.MinInterval != nil {
			p.RotationInterval = max(0, r.MinInterval.Duration)
		}
	}
	rem := spec.Remediation
	for _, d := range []struct {
		from *metav1.Duration
		to   *time.Duration
	}{
		{rem.StartupTimeout, &p.StartupTimeout},
		{rem.UnhealthyTimeout, &p.UnhealthyTimeout},
		{rem.StartupBackoff, &p.StartupBackoff},
		{rem.DeletionTimeout, &p.DeletionTimeout},
	} {
		if d.from != nil && d.from.Duration > 0 {
			*d.to = d.from.Duration
		}
	}
	if rem.MaxUnhealthy != nil {
		if _, err := intstr.GetScaledValueFromIntOrPercent(rem.MaxUnhealthy, 100, false); err != nil {
			return Policy{}, fmt.Errorf("spec.remediation.maxUnhealthy: %w", err)
		}
		p.MaxUnhealthy = *rem.MaxUnhealthy
	}
	p.MaxCreatesPerMinute = max(0, int(rem.MaxCreatesPerMinute))
	if c := spec.Placement.MaxConcurrentCreates; c > 0 {
		p.MaxConcurrentCreates = int(c)
	}
	if p.Order == "" {
		p.Order = crawlv1.ScaleDownOldest
	}
	if err := banPolicy(&p, spec.Bans); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// RotationTime is how long one rotation holds its place among
// maxConcurrent: the replacement's boot (estimated), minReadySeconds, and
// the old replica's drain.
func (p Policy) RotationTime() time.Duration {
	return RotationBootEstimate + p.MinReady + p.Drain
}

// RotationGrace is how far past maxAge a replica may get before rotation
// counts as behind: its jitter (expiries spread over it) or one rotation's
// time (a replica serves until its replacement is available and it is
// drained), whichever is longer.
func (p Policy) RotationGrace() time.Duration {
	return max(p.Jitter, p.RotationTime())
}

// defaultMaxConcurrentRotations is rotation.maxConcurrent left empty: the
// rotations in flight that replace every replica within RotationHeadroom
// of maxAge, at least one and at most maxSurge (a rotation never spends
// maxUnavailable, so more could never start).
func (p Policy) defaultMaxConcurrentRotations() int {
	if p.MaxAge <= 0 {
		return DefaultMaxConcurrentRotations
	}
	need := math.Ceil(float64(p.Replicas) * float64(p.RotationTime()) / (RotationHeadroom * float64(p.MaxAge)))
	return max(DefaultMaxConcurrentRotations, min(int(min(need, math.MaxInt32)), p.MaxSurge))
}

// RotationsPerMaxAge is how many replicas the pool's limits let rotation
// replace within one maxAge: maxConcurrent places (no more than maxSurge)
// each freed every RotationTime, at most one start per minInterval, and
// within the pool-wide create limits. Fewer than Replicas cannot keep up.
func (p Policy) RotationsPerMaxAge() int {
	if p.MaxAge <= 0 {
		return 0
	}
	maxAge := float64(p.MaxAge)
	n := float64(min(p.MaxConcurrentRotations, p.MaxSurge)) * maxAge / float64(p.RotationTime())
	if p.RotationInterval > 0 {
		n = min(n, maxAge/float64(p.RotationInterval))
	}
	if p.MaxCreatesPerMinute > 0 {
		n = min(n, float64(p.MaxCreatesPerMinute)*maxAge/float64(CreateWindow))
	}
	if p.MaxCreating > 0 {
		n = min(n, float64(p.MaxCreating)*maxAge/float64(RotationBootEstimate))
	}
	return int(min(n, math.MaxInt32))
}

// RotationLimits names the limits RotationsPerMaxAge follows, with their
// values, for a message that says what to raise.
func (p Policy) RotationLimits() string {
	s := fmt.Sprintf("rotation.maxConcurrent %d, rollout.maxSurge %d, %s a rotation", p.MaxConcurrentRotations, p.MaxSurge, p.RotationTime())
	if p.RotationInterval > 0 {
		s += fmt.Sprintf(", rotation.minInterval %s", p.RotationInterval)
	}
	if p.MaxCreatesPerMinute > 0 {
		s += fmt.Sprintf(", remediation.maxCreatesPerMinute %d", p.MaxCreatesPerMinute)
	}
	if p.MaxCreating > 0 {
		s += fmt.Sprintf(", %d replicas being created at once", p.MaxCreating)
	}
	return s
}

// scaled resolves a count or percentage of replicas; nil is def.
func scaled(v *intstr.IntOrString, def, replicas int, roundUp bool) (int, error) {
	if v == nil {
		return def, nil
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(v, replicas, roundUp)
	if err != nil {
		return 0, err
	}
	return max(0, n), nil
}

// StartupBackoffFor is how long a slot waits before replacing a replica that
// failed to start when the slot's replicas before it failed failures times
// in a row: nothing after a first failure, then startupBackoff, doubling up
// to MaxStartupBackoff.
func (p Policy) StartupBackoffFor(failures int) time.Duration {
	if failures <= 0 {
		return 0
	}
	limit := max(MaxStartupBackoff, p.StartupBackoff)
	d := p.StartupBackoff
	for i := 1; i < failures && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}
