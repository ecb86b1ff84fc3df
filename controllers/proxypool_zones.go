package controllers

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/util/conditions"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/placement"
)

// A zone that said it has no room (a replica's InstanceProvisioned reason
// InsufficientCapacity, e.g. Compute Engine's ZONE_RESOURCE_POOL_EXHAUSTED)
// is tried again only after each of the pool's other zones has been tried
// since: spreading by count alone would send the next replica straight
// back to the zone that just emptied.

// zoneMemory is when each zone was last tried (a replica placed there)
// and last found without room.
type zoneMemory struct {
	tried     map[string]time.Time
	exhausted map[string]time.Time
	// seen: replicas already counted as a zone's answer.
	seen map[types.UID]bool
}

// observeZones notes, from the replicas, where they were placed and which
// zones have just said they have no room.
func (m *poolMemory) observeZones(replicas []crawlv1.Proxy, now time.Time) {
	z := &m.zones
	if z.tried == nil {
		z.tried, z.exhausted, z.seen = map[string]time.Time{}, map[string]time.Time{}, map[types.UID]bool{}
	}
	live := make(map[types.UID]bool, len(replicas))
	for i := range replicas {
		p := &replicas[i]
		zone := p.Spec.Placement.Zone
		if zone == "" {
			continue
		}
		live[p.UID] = true
		// A restart knows only the replicas that are there.
		if t := p.CreationTimestamp.Time; t.After(z.tried[zone]) {
			z.tried[zone] = t
		}
		if conditions.GetReason(p, crawlv1.InstanceProvisionedCondition) == crawlv1.ProxyInsufficientCapacityReason &&
			!conditions.IsTrue(p, crawlv1.InstanceProvisionedCondition) && !z.seen[p.UID] {
			z.seen[p.UID] = true
			z.exhausted[zone] = now
		}
	}
	for uid := range z.seen {
		if !live[uid] {
			delete(z.seen, uid)
		}
	}
}

// chooseZone is the zone of a pool's new replica: among the zones not
// waiting for the others to be tried, the one with the fewest replicas
// (inUse), first listed on a tie.
func (r *ProxyPoolReconciler) chooseZone(pool *crawlv1.ProxyPool, inUse []string) string {
	zones := pool.Spec.Placement.Zones
	mem := r.memory(pool)
	var eligible []string
	for _, z := range zones {
		if !mem.zones.waiting(z, zones) {
			eligible = append(eligible, z)
		}
	}
	if len(eligible) == 0 {
		eligible = zones
	}
	z := placement.ChooseZone(eligible, inUse)
	if z != "" {
		if mem.zones.tried == nil {
			mem.zones.tried = map[string]time.Time{}
		}
		mem.zones.tried[z] = r.Clock.Now()
	}
	return z
}

// waiting: zone found no room, and another zone has not been tried since.
func (z *zoneMemory) waiting(zone string, zones []string) bool {
	at, ok := z.exhausted[zone]
	if !ok {
		return false
	}
	for _, other := range zones {
		if other != zone && z.tried[other].Before(at) {
			return true
		}
	}
	return false
}
