// Package placement chooses where a new ProxyPool replica goes: a KVMHost,
// spread with a maximum skew of 1 by host and only where it fits, or a zone,
// spread with a maximum skew of 1. It is pure: the caller reads KVMHosts and
// Proxies and passes what matters here.
//
// Capacity. A host's reported figures (KVMHost status.capacity and pool) come
// from its last health check; replicas placed since are not in them. So every
// replica on a host that is not settled (its instance not running when the
// host's figures were taken) is subtracted from what the host reports, and a burst of creates placed in
// one pass, with no check in between, spreads instead of piling onto the
// host that looked emptiest. Settled replicas are in the host's figures and
// are not subtracted again; to cover a check that has not yet seen one, the
// sum of every replica on the host is a floor under what the host reports
// as taken. Memory: the smaller of free memory and physical memory less
// what domains were given, both less unsettled replicas (a guest touches
// its memory lazily, so free memory alone would invite overcommitment).
// vCPUs: host CPUs times the overcommit ratio, less vCPUs given. Disk: the
// pool's free space, less the full virtual size of unsettled replicas'
// disks, must hold the new disk's full virtual size (see Need).
//
// Spread. Semantics are Kubernetes' topologySpreadConstraints with
// whenUnsatisfiable DoNotSchedule and maxSkew 1: the domains are the
// eligible hosts (Ready, matching the selector), a replica may only go to a
// host holding the fewest of the pool's replicas, and a full host stays a
// domain. So when the hosts with the fewest replicas are full while others
// have room, placement is blocked with SpreadUnsatisfiable rather than
// piling onto the bigger hosts: losing one host never loses more than its
// share of the pool. Replicas being deleted or drained do not count.
//
// Create concurrency. A host boots a bounded number of guests at a time
// well; more only slow each other down. A host already creating
// Request.MaxCreating replicas (of any pool) is passed over, and when every
// host the spread allows is, the outcome is CreatesInFlight: the caller
// waits for one of them to finish rather than report the pool blocked.
package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// Reasons a replica cannot be placed now: the ProxyPool's PlacementBlocked
// reasons.
const (
	InsufficientCapacity = crawlv1.PoolInsufficientCapacityReason
	SpreadUnsatisfiable  = crawlv1.PoolSpreadUnsatisfiableReason
	// CreatesInFlight: the hosts that may take the replica are each
	// creating Request.MaxCreating already. Not a PlacementBlocked
	// reason: the pool waits for those creates, it is not stuck.
	CreatesInFlight = "CreatesInFlight"
)

// DefaultCPUOvercommit is the vCPUs allowed per host CPU when the pool does
// not say.
const DefaultCPUOvercommit = 4

// maxHostsInMessage bounds the hosts a Blocked message names.
const maxHostsInMessage = 5

// Resources are what one replica takes. DiskBytes is the disk's full
// virtual size: a qcow2 overlay starts nearly empty but may grow to it, and
// a full pool pauses every VM writing to it.
type Resources struct {
	CPUs        int64
	MemoryBytes int64
	DiskBytes   int64
}

func (r *Resources) add(o Resources) {
	r.CPUs += o.CPUs
	r.MemoryBytes += o.MemoryBytes
	r.DiskBytes += o.DiskBytes
}

// Capacity is a host as its last check saw it.
type Capacity struct {
	CPUs                 int64
	MemoryBytes          int64
	FreeMemoryBytes      int64
	AllocatedVCPUs       int64
	AllocatedMemoryBytes int64
	// PoolAvailableBytes is the free space of the host's storage pool.
	PoolAvailableBytes int64
}

// Host is an eligible KVMHost: Ready and matching the pool's selector.
type Host struct {
	Name string
	// Capacity is nil until the host has reported it (or its pool): such a
	// host counts for the spread but takes nothing.
	Capacity *Capacity
}

// Replica is a Proxy on or placed on a host: the pool's own or any other.
type Replica struct {
	Host string
	Resources
	// Settled: its instance was running when the host's figures were
	// taken, so they include it.
	Settled bool
	// Spreads: one of this pool's replicas that counts for the spread (not
	// being deleted or drained).
	Spreads bool
	// Creating: its instance is being created (not Ready yet, not failed);
	// it counts against the host's Request.MaxCreating.
	Creating bool
}

// Request is one placement decision.
type Request struct {
	Hosts    []Host
	Replicas []Replica
	// Need is what the new replica takes.
	Need Resources
	// CPUOvercommit is vCPUs per host CPU; 0 means DefaultCPUOvercommit.
	CPUOvercommit int64
	// MaxCreating is the replicas a host may be creating at once; 0 means
	// no limit.
	MaxCreating int
}

// Blocked says why no host can take the replica now. It is an outcome the
// caller reports (the pool's PlacementBlocked condition), not an error: as
// an error type it would read as one dropped where the caller returns nil.
type Blocked struct {
	Reason  string
	Message string
}

func (b *Blocked) String() string { return b.Reason + ": " + b.Message }

// Room is what a host can still give, after everything placed on it. It is
// negative where the host is already short.
func Room(h Host, onHost []Replica, cpuOvercommit int64) Resources {
	c := h.Capacity
	if c == nil {
		return Resources{}
	}
	if cpuOvercommit <= 0 {
		cpuOvercommit = DefaultCPUOvercommit
	}
	var all, unsettled Resources
	for _, r := range onHost {
		all.add(r.Resources)
		if !r.Settled {
			unsettled.add(r.Resources)
		}
	}
	return Resources{
		CPUs: c.CPUs*cpuOvercommit - max(c.AllocatedVCPUs+unsettled.CPUs, all.CPUs),
		MemoryBytes: min(c.FreeMemoryBytes-unsettled.MemoryBytes,
			c.MemoryBytes-max(c.AllocatedMemoryBytes+unsettled.MemoryBytes, all.MemoryBytes)),
		DiskBytes: c.PoolAvailableBytes - unsettled.DiskBytes,
	}
}

// hostView is one host with what placement needs to know about it.
type hostView struct {
	name     string
	replicas int // this pool's, counting for the spread
	creating int // any pool's, being created
	room     Resources
	short    string // why the new replica does not fit; "" if it does
}

// ChooseHost returns the host the new replica goes to, or why none can take
// it now. Among the hosts with the fewest of the pool's replicas that fit,
// the one with the most free memory wins, then the most free vCPUs, then
// the first name.
func ChooseHost(req Request) (string, *Blocked) {
	if len(req.Hosts) == 0 {
		return "", &Blocked{InsufficientCapacity, "no eligible KVMHost"}
	}
	views, fewest := viewsOf(req)
	busy := func(v hostView) bool { return req.MaxCreating > 0 && v.creating >= req.MaxCreating }
	var candidates, busyAtFewest, fitElsewhere, full []hostView
	for _, v := range views {
		switch {
		case v.short == "" && v.replicas == fewest && busy(v):
			busyAtFewest = append(busyAtFewest, v)
		case v.short == "" && v.replicas == fewest:
			candidates = append(candidates, v)
		case v.short == "":
			fitElsewhere = append(fitElsewhere, v)
		default:
			full = append(full, v)
		}
	}
	if len(candidates) > 0 {
		slices.SortFunc(candidates, func(a, b hostView) int {
			return cmp.Or(
				cmp.Compare(b.room.MemoryBytes, a.room.MemoryBytes),
				cmp.Compare(b.room.CPUs, a.room.CPUs),
				cmp.Compare(a.name, b.name))
		})
		return candidates[0].name, nil
	}
	if len(busyAtFewest) > 0 {
		sortByName(busyAtFewest)
		return "", &Blocked{CreatesInFlight, fmt.Sprintf("the KVMHosts the spread allows are each creating %d replicas already: %s",
			req.MaxCreating, names(busyAtFewest))}
	}
	sortByName(full)
	sortByName(fitElsewhere)
	need := describe(req.Need)
	if len(fitElsewhere) > 0 {
		var fullAtFewest []hostView
		for _, v := range full {
			if v.replicas == fewest {
				fullAtFewest = append(fullAtFewest, v)
			}
		}
		return "", &Blocked{SpreadUnsatisfiable, fmt.Sprintf(
			"the hosts with the fewest replicas (%d) have no room for a replica of %s: %s; %s %s room, but one more there would exceed a skew of 1",
			fewest, need, shortList(fullAtFewest), names(fitElsewhere), hasHave(len(fitElsewhere)))}
	}
	return "", &Blocked{InsufficientCapacity, fmt.Sprintf("no KVMHost has room for a replica of %s: %s", need, shortList(full))}
}

// viewsOf is each eligible host as placement sees it, and the fewest of
// the pool's replicas any of them holds.
func viewsOf(req Request) ([]hostView, int) {
	ratio := req.CPUOvercommit
	if ratio <= 0 {
		ratio = DefaultCPUOvercommit
	}
	byHost := map[string][]Replica{}
	for _, r := range req.Replicas {
		byHost[r.Host] = append(byHost[r.Host], r)
	}
	views := make([]hostView, 0, len(req.Hosts))
	fewest := -1
	for _, h := range req.Hosts {
		v := hostView{name: h.Name}
		for _, r := range byHost[h.Name] {
			if r.Spreads {
				v.replicas++
			}
			if r.Creating {
				v.creating++
			}
		}
		if h.Capacity == nil {
			v.short = "capacity not reported yet"
		} else {
			v.room = Room(h, byHost[h.Name], ratio)
			v.short = shortOf(v.room, req.Need, h.Capacity.CPUs*ratio)
		}
		if fewest < 0 || v.replicas < fewest {
			fewest = v.replicas
		}
		views = append(views, v)
	}
	return views, fewest
}

// shortOf says what the host lacks for need, "" if nothing.
func shortOf(room, need Resources, vcpuLimit int64) string {
	var s []string
	if room.MemoryBytes < need.MemoryBytes {
		s = append(s, fmt.Sprintf("memory %s free, %s needed", FormatBytes(room.MemoryBytes), FormatBytes(need.MemoryBytes)))
	}
	if room.CPUs < need.CPUs {
		s = append(s, fmt.Sprintf("vCPUs %d of %d free, %d needed", max(room.CPUs, 0), vcpuLimit, need.CPUs))
	}
	if room.DiskBytes < need.DiskBytes {
		s = append(s, fmt.Sprintf("pool %s free, %s needed", FormatBytes(room.DiskBytes), FormatBytes(need.DiskBytes)))
	}
	return strings.Join(s, ", ")
}

func describe(r Resources) string {
	return fmt.Sprintf("%d vCPU, %s memory, %s disk", r.CPUs, FormatBytes(r.MemoryBytes), FormatBytes(r.DiskBytes))
}

func sortByName(vs []hostView) {
	slices.SortFunc(vs, func(a, b hostView) int { return cmp.Compare(a.name, b.name) })
}

// shortList names each full host and what it lacks, the first few only.
func shortList(vs []hostView) string {
	var parts []string
	for i, v := range vs {
		if i == maxHostsInMessage {
			parts = append(parts, fmt.Sprintf("and %d more", len(vs)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%s) %s", v.name, replicasText(v.replicas), v.short))
	}
	return strings.Join(parts, "; ")
}

func names(vs []hostView) string {
	var parts []string
	for i, v := range vs {
		if i == maxHostsInMessage {
			parts = append(parts, fmt.Sprintf("%d more", len(vs)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", v.name, replicasText(v.replicas)))
	}
	return strings.Join(parts, ", ")
}

func replicasText(n int) string {
	if n == 1 {
		return "1 replica"
	}
	return fmt.Sprintf("%d replicas", n)
}

func hasHave(n int) string {
	if n == 1 {
		return "has"
	}
	return "have"
}

// FormatBytes prints n for people: whole or tenths of Gi, else whole Mi;
// below zero is 0.
func FormatBytes(n int64) string {
	const mi, gi = 1 << 20, 1 << 30
	switch {
	case n <= 0:
		return "0"
	case n%gi == 0:
		return fmt.Sprintf("%dGi", n/gi)
	case n >= gi:
		return fmt.Sprintf("%.1fGi", float64(n)/gi)
	default:
		return fmt.Sprintf("%dMi", n/mi)
	}
}

// ChooseZone returns the listed zone with the fewest of the pool's replicas
// (inUse: the zone of each replica that counts for the spread); ties go to
// the first listed. Replicas in zones no longer listed are ignored. Zones
// have no capacity to check: the provider reports a zone that is out of
// resources when it creates the instance.
func ChooseZone(zones, inUse []string) string {
	if len(zones) == 0 {
		return ""
	}
	count := map[string]int{}
	for _, z := range inUse {
		count[z]++
	}
	best := zones[0]
	for _, z := range zones[1:] {
		if count[z] < count[best] {
			best = z
		}
	}
	return best
}
