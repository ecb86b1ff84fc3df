package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Labels and annotations of pool replicas.
const (
	// PoolNameLabel names the ProxyPool a Proxy belongs to.
	PoolNameLabel = "crawl.example.com/pool"
	// TemplateHashLabel is the hash of the pool template a replica was made
	// from; a replica whose hash differs from the pool's is out of date.
	TemplateHashLabel = "crawl.example.com/template-hash"
	// DeleteProxyAnnotation on a replica (any value) is a ban report
	// without a domain that asks for replacement, as a ProxyBan with
	// replace: true would be; it also marks the replica first to go when
	// the pool scales down.
	DeleteProxyAnnotation = "crawl.example.com/delete-proxy"
	// DrainingAnnotation holds the RFC 3339 time a replica was unpublished
	// before its deletion.
	DrainingAnnotation = "crawl.example.com/draining-since"
	// RotationAnnotation holds the RFC 3339 time the pool started replacing
	// a replica for its age: rotations in flight are the replicas that
	// carry it, so the rate limit survives a manager restart.
	RotationAnnotation = "crawl.example.com/rotating-since"
	// StartupFailuresAnnotation counts the replicas before this one in its
	// slot that failed to become Ready in time (absent: none); it sets how
	// long the pool waits before replacing this one if it fails too.
	StartupFailuresAnnotation = "crawl.example.com/startup-failures"
	// ReplacesAnnotation names the replica that failed to start and that
	// this one replaces, so one failure is never counted twice.
	ReplacesAnnotation = "crawl.example.com/replaces"
	// ProxyPoolFinalizer holds a pool until its published objects are gone.
	ProxyPoolFinalizer = "crawl.example.com/proxypool"
)

// Marks of an IPAddressClaim a pool holds while its address is quarantined
// (docs/egress.md): the replica's deletion hands the claim to the pool
// instead of releasing the address to the IPAM pool.
const (
	// QuarantineHoldLabel holds the UID of the ProxyPool that holds the
	// claim (a UID, not the name: it fits a label value).
	QuarantineHoldLabel = "crawl.example.com/quarantine-hold"
	// QuarantinedAddressAnnotation is the quarantined address the claim
	// is held for; the pool releases the claim once it is no longer
	// quarantined.
	QuarantinedAddressAnnotation = "crawl.example.com/quarantined-address"
)

// What a pool publishes for crawlers, in its namespace: a Secret and a
// headless Service, both named <pool>-proxies (docs/pools.md).
const (
	// PublishedNameSuffix makes the names of the Secret and the Service.
	PublishedNameSuffix = "-proxies"
	// ProxiesTextKey of the Secret: one http://user:pass@address:port per
	// line, the list scrapy-rotating-proxies and Crawlee's proxyUrls take.
	ProxiesTextKey = "proxies.txt"
	// ProxiesJSONKey of the Secret: an array of {name, url, host,
	// egressAddress, createdAt, expiresAt}.
	ProxiesJSONKey = "proxies.json"
	// PublishedPortName names the port of the Service and EndpointSlices.
	PublishedPortName = "proxy"
)

// PublishedName is the name of the Secret and Service a pool publishes.
func PublishedName(pool string) string { return pool + PublishedNameSuffix }

// ProxyPool condition types.
const (
	PoolAvailableCondition          = "Available"
	PoolRollingOutCondition         = "RollingOut"
	PoolRotatingCondition           = "Rotating"
	PoolRemediatingCondition        = "Remediating"
	PoolRemediationAllowedCondition = "RemediationAllowed"
	PoolPlacementBlockedCondition   = "PlacementBlocked"
	PoolPausedCondition             = "Paused"
	// PoolPublishedCondition: the published objects list the Ready
	// replicas. False names the object in the way and why; creates,
	// remediation and deletions of replicas no list names go on, only
	// drains wait for a list without the replica.
	PoolPublishedCondition = "Published"
	// PoolDeletionStuckCondition: replicas whose deletion outlasted
	// spec.remediation.deletionTimeout, or cannot finish (their Proxy's
	// DeletionBlocked, their KVMHost not answering). The pool counts them
	// no more and has replaced them; they go when their provider lets them.
	PoolDeletionStuckCondition = "DeletionStuck"
	// PoolEgressDistinctCondition: with egress.distinct Required, every
	// available replica leaves from its own address. False gives the count
	// and the cause ("3 replicas share 203.0.113.9 on host hv1 (NAT)").
	PoolEgressDistinctCondition = "EgressDistinct"
	// PoolRotationBehindCondition: True while rotation does not keep the
	// replicas within rotation.maxAge: a replica is older than maxAge by
	// more than its grace (the longer of jitter and one rotation), or the
	// rotation limits (maxConcurrent, maxSurge, minInterval, the create
	// limits) replace fewer replicas per maxAge than the pool has.
	PoolRotationBehindCondition = "RotationBehind"
	// PoolBanReplacementPausedCondition: True while ban reports wait,
	// unreplaced, for spec.bans (the hourly budget or maxBanned).
	PoolBanReplacementPausedCondition = "BanReplacementPaused"
)

// ProxyPool condition reasons.
const (
	// Available.
	PoolMinimumAvailableReason   = "MinimumReplicasAvailable"
	PoolMinimumUnavailableReason = "MinimumReplicasUnavailable"
	// PoolInvalidSpecReason (Available Unknown): a spec the webhook would
	// refuse, stored without it; nothing is done until it changes.
	PoolInvalidSpecReason = "InvalidSpec"
	// PoolCredentialsRejectedReason (Available False): replicas answer
	// 407 to the credential they are probed with; the shortfall is theirs.
	PoolCredentialsRejectedReason = "CredentialsRejected"
	// RollingOut.
	PoolRollingOutReason = "RollingOut"
	// PoolCredentialsChangedReason (RollingOut True): the Secret the
	// template's auth.secretRef names changed; replicas made with the
	// previous credential are replaced.
	PoolCredentialsChangedReason = "CredentialsChanged"
	PoolUpToDateReason           = "UpToDate"
	// PoolOnDeleteReason (RollingOut False): outdated replicas wait until
	// someone deletes them.
	PoolOnDeleteReason = "OnDelete"
	// Rotating.
	PoolRotatingReason         = "Rotating"
	PoolRotationWaitingReason  = "Waiting"
	PoolRotationIdleReason     = "Idle"
	PoolRotationDisabledReason = "Disabled"
	// RotationBehind.
	PoolReplicasOverdueReason  = "ReplicasOverdue"
	PoolRotationTooSlowReason  = "LimitsTooLow"
	PoolRotationCaughtUpReason = "CaughtUp"
	// Remediating.
	PoolRemediatingReason = "Remediating"
	// PoolRemediationBackoffReason: the unhealthy replicas wait for their
	// slot's startup backoff.
	PoolRemediationBackoffReason = "BackingOff"
	PoolHealthyReason            = "Healthy"
	// RemediationAllowed.
	PoolRemediationAllowedReason = "WithinMaxUnhealthy"
	PoolTooManyUnhealthyReason   = "TooManyUnhealthy"
	// PlacementBlocked.
	PoolInsufficientCapacityReason = "InsufficientCapacity"
	PoolSpreadUnsatisfiableReason  = "SpreadUnsatisfiable"
	PoolPlacedReason               = "Placed"
	// Paused.
	PoolPausedReason    = "Paused"
	PoolNotPausedReason = "NotPaused"
	// PoolDeletingReason (Available False): the pool is being deleted,
	// its replicas with it.
	PoolDeletingReason = "Deleting"
	// DeletionStuck.
	PoolDeletionStuckReason   = "DeletionTimedOut"
	PoolNoDeletionStuckReason = "NoneStuck"
	// Published.
	PoolPublishedReason = "Published"
	// PoolReplicasLeftOutReason (Published True): some Ready replicas are
	// not listed yet (their credential Secret is not there yet).
	PoolReplicasLeftOutReason = "ReplicasLeftOut"
	// PoolPublishConflictReason (Published False): an object named
	// <pool>-proxies that the pool does not control is in the way.
	PoolPublishConflictReason = "NameConflict"
	// PoolPublishInvalidNameReason (Published False): <pool>-proxies is no
	// valid Service name (a pool admitted before the name rule).
	PoolPublishInvalidNameReason = "InvalidName"
	// PoolPublishFailedReason (Published False): a write failed; retried.
	PoolPublishFailedReason = "WriteFailed"
	// BanReplacementPaused.
	PoolBanBudgetExhaustedReason = "BudgetExhausted"
	PoolTooManyBannedReason      = "TooManyBanned"
	PoolBansWithinBudgetReason   = "WithinBudget"
)

// ProxyTemplate is what each replica is made from.
type ProxyTemplate struct {
	// Labels and annotations of each replica; labels must match the
	// pool's selector.
	// +optional
	Metadata ProxyTemplateMeta `json:"metadata,omitempty"`
	// +required
	Spec ProxySpec `json:"spec"`
}

// ProxyTemplateMeta is the part of a replica's metadata the pool sets.
type ProxyTemplateMeta struct {
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// RolloutStrategyType is how out-of-date replicas are replaced.
// +kubebuilder:validation:Enum=RollingUpdate;OnDelete
type RolloutStrategyType string

const (
	RollingUpdateStrategy RolloutStrategyType = "RollingUpdate"
	// OnDeleteStrategy replaces a replica only when it is deleted.
	OnDeleteStrategy RolloutStrategyType = "OnDelete"
)

// ProxyPoolRollout is the one disruption budget shared by rollout,
// rotation and remediation: never fewer than replicas - maxUnavailable
// available, never more than replicas + maxSurge in existence.
type ProxyPoolRollout struct {
	// +kubebuilder:default=RollingUpdate
	// +optional
	Type RolloutStrategyType `json:"type,omitempty"`
	// MaxSurge: count or percent of replicas (rounded up); default 1.
	// +optional
	MaxSurge *intstr.IntOrString `json:"maxSurge,omitempty"`
	// MaxUnavailable: count or percent of replicas (rounded down); default 0.
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// MinReadySeconds a new replica must be Ready before it counts as
	// available.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinReadySeconds int32 `json:"minReadySeconds,omitempty"`
	// DrainSeconds a replica stays unpublished before it is deleted, so
	// crawlers stop using it first. Default 30.
	// +kubebuilder:validation:Minimum=0
	// +optional
	DrainSeconds *int32 `json:"drainSeconds,omitempty"`
}

// ProxyPoolRotation replaces replicas by age, at a bounded rate.
type ProxyPoolRotation struct {
	// MaxAge of a replica; absent means no rotation.
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`
	// Jitter: each replica expires at a random point in [maxAge-jitter,
	// maxAge], fixed per replica, so replicas of one age do not expire
	// together.
	// +optional
	Jitter *metav1.Duration `json:"jitter,omitempty"`
	// MaxConcurrent rotations in flight. Default: as many as replace every
	// replica within 80% of maxAge (each rotation taken as 2 minutes of
	// boot, minReadySeconds and drainSeconds), at least 1 and at most
	// rollout.maxSurge. A value set here wins.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxConcurrent int32 `json:"maxConcurrent,omitempty"`
	// MinInterval between the starts of two rotations.
	// +optional
	MinInterval *metav1.Duration `json:"minInterval,omitempty"`
}

// ProxyPoolRemediation replaces replicas that do not become or stay Ready.
type ProxyPoolRemediation struct {
	// StartupTimeout for a new replica to become Ready; default 10m. A
	// replica whose Ready condition last changed within this time of its
	// creation and that is not Ready at this age failed to start.
	// +optional
	StartupTimeout *metav1.Duration `json:"startupTimeout,omitempty"`
	// UnhealthyTimeout a replica that has started may be not Ready before
	// it is replaced; default 5m.
	// +optional
	UnhealthyTimeout *metav1.Duration `json:"unhealthyTimeout,omitempty"`
	// StartupBackoff delays replacing a replica that failed to start when
	// the replica before it in its slot failed too: this long after the
	// second failure in a row, doubling with each further one up to 30
	// minutes (or this value, if longer). Default 30s.
	// +optional
	StartupBackoff *metav1.Duration `json:"startupBackoff,omitempty"`
	// DeletionTimeout a replica being deleted still counts against
	// maxSurge and as room being made; default 5m. Past it (or at once
	// when its deletion is blocked for good) it no longer holds room, so
	// an instance on a dead host or a provider that never answers does not
	// keep the pool short or freeze its rollouts; the DeletionStuck
	// condition names it, and it is still deleted when it can be.
	// +optional
	DeletionTimeout *metav1.Duration `json:"deletionTimeout,omitempty"`
	// MaxUnhealthy (count or percent): when more replicas are unhealthy,
	// remediation stops (RemediationAllowed=False, TooManyUnhealthy): an
	// outage must not delete the fleet. Default 40%.
	// +optional
	MaxUnhealthy *intstr.IntOrString `json:"maxUnhealthy,omitempty"`
	// MaxCreatesPerMinute caps replica creations of any cause, pool-wide;
	// absent means no such cap. Creates are bounded by
	// spec.placement.maxConcurrentCreates, which follows what the hosts
	// can boot; this is for a pool that must also go slowly.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxCreatesPerMinute int32 `json:"maxCreatesPerMinute,omitempty"`
}

// ScaleDownOrder picks which replicas go first when scaling down, after
// those annotated delete-proxy and the unhealthy.
// +kubebuilder:validation:Enum=Oldest;Newest;Random
type ScaleDownOrder string

const (
	ScaleDownOldest ScaleDownOrder = "Oldest"
	ScaleDownNewest ScaleDownOrder = "Newest"
	ScaleDownRandom ScaleDownOrder = "Random"
)

// ProxyPoolScaleDown orders deletions.
type ProxyPoolScaleDown struct {
	// +kubebuilder:default=Oldest
	// +optional
	Order ScaleDownOrder `json:"order,omitempty"`
}

// ProxyPoolPlacement spreads replicas.
type ProxyPoolPlacement struct {
	// HostSelector picks the KVMHosts replicas spread over (kvm), with a
	// maximum skew of 1 by host and room for each replica checked.
	// +optional
	HostSelector *metav1.LabelSelector `json:"hostSelector,omitempty"`
	// CPUOvercommit is the vCPUs per host CPU allowed (kvm); default 4.
	// +kubebuilder:validation:Minimum=1
	// +optional
	CPUOvercommit int32 `json:"cpuOvercommit,omitempty"`
	// Zones replicas spread over (gcp).
	// +optional
	// +listType=atomic
	Zones []string `json:"zones,omitempty"`
	// MaxConcurrentCreates is how many replicas may be being created at
	// once in one placement domain: on one KVMHost, counting every Proxy
	// on it, of any pool (kvm); in one zone (gcp) or on one node
	// (kubernetes), counting the pool's own, as zones (or nodes in use)
	// times this for the pool. A replica is being created until it is
	// Ready, fails for good, or reaches remediation.startupTimeout. So a
	// pool fills as fast as its hosts boot guests. Default 4.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxConcurrentCreates int32 `json:"maxConcurrentCreates,omitempty"`
}

// ProxyPoolSpec is the desired fleet.
type ProxyPoolSpec struct {
	// Replicas desired; the scale subresource sets it.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// Selector of the replicas; must match template.metadata.labels.
	// Immutable.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="selector is immutable"
	// +required
	Selector metav1.LabelSelector `json:"selector"`
	// Template of each replica.
	// +required
	Template ProxyTemplate `json:"template"`
	// +optional
	Rollout ProxyPoolRollout `json:"rollout,omitempty"`
	// +optional
	Rotation ProxyPoolRotation `json:"rotation,omitempty"`
	// +optional
	Remediation ProxyPoolRemediation `json:"remediation,omitempty"`
	// +optional
	ScaleDown ProxyPoolScaleDown `json:"scaleDown,omitempty"`
	// +optional
	Placement ProxyPoolPlacement `json:"placement,omitempty"`
	// Egress is what the pool promises about its replicas' source
	// addresses (docs/egress.md).
	// +optional
	Egress ProxyPoolEgress `json:"egress,omitempty"`
	// Bans is how the pool acts on ban reports (ProxyBan objects and the
	// delete-proxy annotation).
	// +optional
	Bans ProxyPoolBans `json:"bans,omitempty"`
	// Paused stops rollout, rotation and remediation (scaling and
	// publishing go on).
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// EgressDistinctPolicy says whether replicas must leave from distinct
// source addresses.
// +kubebuilder:validation:Enum=Required;Preferred;Ignore
type EgressDistinctPolicy string

const (
	// EgressDistinctRequired: a replica whose egress equals another's is
	// neither published nor counted available; the pool replaces it, or
	// says by EgressDistinct=False why it cannot.
	EgressDistinctRequired EgressDistinctPolicy = "Required"
	// EgressDistinctPreferred: placement prefers hosts and addresses not in
	// use; shared addresses are counted, not refused.
	EgressDistinctPreferred EgressDistinctPolicy = "Preferred"
	// EgressDistinctIgnore: egress addresses are measured and reported only.
	EgressDistinctIgnore EgressDistinctPolicy = "Ignore"
)

// ProxyPoolEgress is the pool's egress policy.
type ProxyPoolEgress struct {
	// Distinct: Required, Preferred (default) or Ignore.
	// +kubebuilder:default=Preferred
	// +optional
	Distinct EgressDistinctPolicy `json:"distinct,omitempty"`
	// EchoURL is requested through each replica to measure its egress
	// address (an answer that is one IP address, or JSON with an "ip"
	// field); it overrides the manager's --egress-echo-url.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://`
	// +optional
	EchoURL string `json:"echoURL,omitempty"`
	// Quarantine is how long an egress address reported banned is kept
	// from being published again; default 24h, from 1m to 720h.
	// +optional
	Quarantine *metav1.Duration `json:"quarantine,omitempty"`
}

// ProxyPoolBans bounds what ban reports do.
type ProxyPoolBans struct {
	// DomainBanDuration: how long a replica reported banned on a domain
	// carries it in proxies.json's bannedDomains (crawlers leave it out for
	// that domain); default 24h, from 1m to 720h.
	// +optional
	DomainBanDuration *metav1.Duration `json:"domainBanDuration,omitempty"`
	// ReplaceAfterDomains: a replica banned on this many domains at once
	// is replaced as if a report asked for it; default 3.
	// +kubebuilder:validation:Minimum=1
	// +optional
	ReplaceAfterDomains int32 `json:"replaceAfterDomains,omitempty"`
	// MaxReplacementsPerHour ban reports (and quarantined egress
	// addresses) may start; past it, reports wait and BanReplacementPaused
	// says so. Default 10; 0 replaces none.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxReplacementsPerHour *int32 `json:"maxReplacementsPerHour,omitempty"`
	// MaxBanned (count or percent of the live replicas): when more
	// replicas stand reported for replacement at once, no further one is
	// replaced (BanReplacementPaused, TooManyBanned): the cause is likely
	// the crawler or the site, not the addresses. Default 50%.
	// +optional
	MaxBanned *intstr.IntOrString `json:"maxBanned,omitempty"`
}

// ProxyPoolBanReplacement is one replacement a ban report started.
type ProxyPoolBanReplacement struct {
	// Replica replaced.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Replica string `json:"replica"`
	// Time the replacement started.
	// +required
	Time metav1.Time `json:"time"`
}

// QuarantinedAddress is an egress address reported banned.
type QuarantinedAddress struct {
	// Address is the egress address.
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=45
	// +required
	Address string `json:"address"`
	// Replica is the Proxy the ban was reported on.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Replica string `json:"replica,omitempty"`
	// Reason the report gave, if any.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Reason string `json:"reason,omitempty"`
	// ExpiresAt is when the address may be published again.
	// +required
	ExpiresAt metav1.Time `json:"expiresAt"`
}

// ProxyPoolRotationStatus is when rotation last started one and next will,
// and how far it is behind.
type ProxyPoolRotationStatus struct {
	// +optional
	LastTime *metav1.Time `json:"lastTime,omitempty"`
	// +optional
	NextTime *metav1.Time `json:"nextTime,omitempty"`
	// OverdueReplicas are the replicas older than maxAge that still serve
	// (a count, not an age, so that it changes only when a replica
	// crosses maxAge or goes).
	// +kubebuilder:validation:Minimum=0
	// +optional
	OverdueReplicas int32 `json:"overdueReplicas,omitempty"`
}

// ProxyPoolCreate is one replica creation.
type ProxyPoolCreate struct {
	// Name of the replica.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// Time it was created.
	// +required
	Time metav1.Time `json:"time"`
}

// ProxyPoolStatus is the observed fleet.
type ProxyPoolStatus struct {
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Replicas in existence (any state, draining included).
	// +optional
	Replicas int32 `json:"replicas"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`
	// AvailableReplicas are Ready for minReadySeconds and not draining.
	// +optional
	AvailableReplicas int32 `json:"availableReplicas"`
	// +optional
	UpToDateReplicas int32 `json:"upToDateReplicas"`
	// +optional
	DrainingReplicas int32 `json:"drainingReplicas"`
	// +optional
	UnhealthyReplicas int32 `json:"unhealthyReplicas"`
	// +optional
	DistinctHosts int32 `json:"distinctHosts"`
	// +optional
	DistinctEgressAddresses int32 `json:"distinctEgressAddresses"`
	// Selector is the label selector of the replicas in string form, for
	// the scale subresource (HPA, KEDA, kubectl scale).
	// +optional
	Selector string `json:"selector,omitempty"`
	// +optional
	Rotation *ProxyPoolRotationStatus `json:"rotation,omitempty"`
	// RecentCreates are the replicas the pool created within the last
	// minute, deleted ones too: remediation.maxCreatesPerMinute holds
	// across a restart of the manager. The newest 1000 at most.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=1000
	// +optional
	RecentCreates []ProxyPoolCreate `json:"recentCreates,omitempty"`
	// BanReplacements are the replacements ban reports started within the
	// last hour, and those still under way: spec.bans.maxReplacementsPerHour
	// holds across a restart of the manager. The newest 1000 at most.
	// +listType=map
	// +listMapKey=replica
	// +kubebuilder:validation:MaxItems=1000
	// +optional
	BanReplacements []ProxyPoolBanReplacement `json:"banReplacements,omitempty"`
	// Quarantine lists the egress addresses reported banned and until
	// when no replica leaving from them is published; the newest 1000 at
	// most.
	// +listType=map
	// +listMapKey=address
	// +kubebuilder:validation:MaxItems=1000
	// +optional
	Quarantine []QuarantinedAddress `json:"quarantine,omitempty"`
	// Traffic sums what the replicas' squids counted (docs/pools.md,
	// "Traffic"). It is rewritten only when it moves materially: by a
	// tenth, and by at least 0.5 requests per second, 1 denial or 1 ban
	// signal per minute, or when another replica starts or stops
	// reporting.
	// +optional
	Traffic *ProxyPoolTraffic `json:"traffic,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// ProxyPoolTraffic is a pool's traffic, summed over the replicas whose
// squid counters the operator read within the last three probe intervals;
// each replica's rate is over its last two readings. The operator's own
// probes and reads are left out.
type ProxyPoolTraffic struct {
	// RequestsPerSecond are client requests the squids answered, refused
	// ones included.
	// +required
	RequestsPerSecond resource.Quantity `json:"requestsPerSecond"`
	// DeniedPerMinute are client requests the squids refused: 407 (no or
	// a wrong credential) and 403 (a destination or port the access
	// policy refuses). Answers of target sites are not among them: see
	// BanSignalsPerMinute.
	// +required
	DeniedPerMinute resource.Quantity `json:"deniedPerMinute"`
	// BanSignalsPerMinute are the target sites' 403 and 429 answers
	// through the squids, the usual signs that a site bans a proxy, over
	// the replicas whose squid counts them. Plain HTTP only: an answer
	// inside a CONNECT tunnel (HTTPS) never reaches squid; there the
	// crawler's own ban reports are the source. Absent when no replica
	// counts them.
	// +optional
	BanSignalsPerMinute *resource.Quantity `json:"banSignalsPerMinute,omitempty"`
	// ReplicasReporting are the replicas whose counters count here.
	// +kubebuilder:validation:Minimum=0
	// +required
	ReplicasReporting int32 `json:"replicasReporting"`
}

// ProxyPool is a fleet of Proxies that scales, rolls, rotates, heals and
// publishes its Ready replicas for crawlers (Secret <pool>-proxies and a
// headless Service).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:categories=crawl,shortName=ppool
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.availableReplicas`
// +kubebuilder:printcolumn:name="Egress",type=integer,JSONPath=`.status.distinctEgressAddresses`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProxyPool struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec ProxyPoolSpec `json:"spec,omitempty"`
	// +optional
	Status ProxyPoolStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ProxyPoolList contains a list of ProxyPool.
type ProxyPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyPool `json:"items"`
}

func (p *ProxyPool) GetConditions() []metav1.Condition  { return p.Status.Conditions }
func (p *ProxyPool) SetConditions(c []metav1.Condition) { p.Status.Conditions = c }

func init() {
	addKnownTypes(&ProxyPool{}, &ProxyPoolList{})
}
