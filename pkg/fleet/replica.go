package fleet

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

	"sigs.k8s.io/cluster-api/util/conditions"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// Replica is what the decisions need to know of one Proxy of the pool.
type Replica struct {
	Name    string
	UID     string
	Created time.Time
	// Ready is the Proxy's Ready condition; ReadyChanged its last
	// transition (Created when the condition is absent).
	Ready        bool
	ReadyChanged time.Time
	// UpToDate: made from the pool's current template.
	UpToDate bool
	// Marked: a ban report asks to replace it (a ProxyBan with replace,
	// bans on ReplaceAfterDomains domains, or the delete-proxy
	// annotation). The bans step decides when.
	Marked bool
	// Quarantined: its egress address is in the pool's quarantine; it is
	// never published, and replaced as a ban would be.
	Quarantined bool
	// DrainingSince is when it was unpublished; zero while it is not.
	DrainingSince time.Time
	// DeletingSince is when its deletion started (it still exists); zero
	// while it is not being deleted.
	DeletingSince time.Time
	// DeletionStuck: its deletion cannot finish without someone acting
	// (its provider refused it for good, or its host is known down).
	DeletionStuck bool
	// RotatingSince is when its rotation started; zero when it has not.
	RotatingSince time.Time
	// StartupFailures is how many replicas before it in its slot failed to
	// start, one after the other.
	StartupFailures int
	// Replaces names the replica that failed to start and that it replaces.
	Replaces string
	// Creating: being created (not Ready yet, not failed for good,
	// younger than the startup timeout); counts against
	// Policy.MaxCreating. The controller sets it.
	Creating bool
	// Host and EgressAddress feed the status' diversity counts.
	Host, EgressAddress string
	// EgressShared: with egress.distinct Required, its measured egress
	// address is an older replica's. It is neither published nor
	// available, and is replaced surge-first (never drained first: its
	// going would give the pool no address).
	EgressShared bool
}

// deleting reports whether r's deletion has started.
func (r *Replica) deleting() bool { return !r.DeletingSince.IsZero() }

// ReplicaFrom reads a Proxy of the pool whose template hashes to hash.
func ReplicaFrom(p *crawlv1.Proxy, hash string) Replica {
	r := Replica{
		Name:          p.Name,
		UID:           string(p.UID),
		Created:       p.CreationTimestamp.Time,
		UpToDate:      p.Labels[crawlv1.TemplateHashLabel] == hash,
		Host:          p.Status.Host,
		EgressAddress: p.Status.EgressAddress,
		Replaces:      p.Annotations[crawlv1.ReplacesAnnotation],
	}
	_, r.Marked = p.Annotations[crawlv1.DeleteProxyAnnotation]
	if p.DeletionTimestamp != nil {
		r.DeletingSince = p.DeletionTimestamp.Time
	}
	r.DeletionStuck = conditions.IsTrue(p, crawlv1.DeletionBlockedCondition)
	r.DrainingSince = annotationTime(p, crawlv1.DrainingAnnotation)
	r.RotatingSince = annotationTime(p, crawlv1.RotationAnnotation)
	if n, err := strconv.Atoi(p.Annotations[crawlv1.StartupFailuresAnnotation]); err == nil && n > 0 {
		r.StartupFailures = n
	}
	r.ReadyChanged = r.Created
	if c := conditions.Get(p, crawlv1.ReadyCondition); c != nil {
		r.Ready = c.Status == "True"
		if !c.LastTransitionTime.IsZero() {
			r.ReadyChanged = c.LastTransitionTime.Time
		}
	}
	return r
}

// annotationTime reads an RFC 3339 time annotation. One that does not parse
// (edited by hand) counts as set long ago: the annotation's presence is the
// decision that was made, and a replica must not stay half-drained.
func annotationTime(p *crawlv1.Proxy, key string) time.Time {
	v, ok := p.Annotations[key]
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Unix(1, 0)
	}
	return t
}

// FormatTime is how the pool writes its time annotations: RFC 3339 with
// sub-second digits, so a short drain is not cut by rounding.
func FormatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// TemplateHash identifies a pool template: replicas labelled with another
// hash are out of date. It hashes the pool's template as stored (with the
// CRD's structural defaults, which the API server applies on every read),
// never a replica, which the Proxy webhook defaults further and placement
// fills in; so it is the same before and after a restart and for every
// replica. The JSON hashed is canonical: map keys sorted, quantities in
// canonical form, and every empty value (zero, "", false, {}, [], null)
// left out, so a field added to the API in a later release changes no hash
// until someone sets it.
func TemplateHash(t *crawlv1.ProxyTemplate) string {
	b, err := json.Marshal(t)
	if err != nil {
		// A typed struct without channels or funcs always marshals.
		panic(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		panic(err)
	}
	b, err = json.Marshal(pruneEmpty(v))
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// pruneEmpty drops the empty members of objects, recursively. Elements of
// lists stay where they are: their positions mean something.
func pruneEmpty(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			e = pruneEmpty(e)
			if isEmpty(e) {
				delete(x, k)
			} else {
				x[k] = e
			}
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = pruneEmpty(e)
		}
		return x
	}
	return v
}

func isEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case float64:
		return x == 0
	case string:
		return x == ""
	case map[string]any:
		return len(x) == 0
	case []any:
		return len(x) == 0
	}
	return false
}

// ExpiresAt is when rotation replaces a replica created at created: maxAge
// less its jitter. false (and the zero time) without rotation.
func ExpiresAt(created time.Time, uid string, maxAge, jitter time.Duration) (time.Time, bool) {
	if maxAge <= 0 {
		return time.Time{}, false
	}
	return created.Add(maxAge - JitterOf(uid, jitter)), true
}

// JitterOf is the replica's share of jitter, in [0, jitter): derived from its
// UID, so it is fixed for the replica's life, survives restarts, and
// replicas created together spread out.
func JitterOf(uid string, jitter time.Duration) time.Duration {
	if jitter <= 0 {
		return 0
	}
	// sha256, not FNV: UIDs differ in few characters, and FNV's high bits
	// barely move for such inputs.
	sum := sha256.Sum256([]byte(uid))
	frac := float64(binary.BigEndian.Uint64(sum[:8])>>11) / float64(1<<53)
	return time.Duration(frac * float64(jitter))
}
