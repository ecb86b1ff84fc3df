package placement_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/placement"
)

const (
	mi = int64(1) << 20
	gi = int64(1) << 30
)

// replica1G is the replica most tests place: 1 vCPU, 1Gi, 10Gi disk.
var replica1G = placement.Resources{CPUs: 1, MemoryBytes: gi, DiskBytes: 10 * gi}

// idle is a host with nothing on it: 16 CPUs, free memory as given, 16Gi of
// physical memory (or free+1Gi if more), a 500Gi pool.
func idle(name string, free int64) placement.Host {
	return placement.Host{Name: name, Capacity: &placement.Capacity{
		CPUs: 16, MemoryBytes: max(16*gi, free+gi), FreeMemoryBytes: free, PoolAvailableBytes: 500 * gi,
	}}
}

func with(h placement.Host, edit func(c *placement.Capacity)) placement.Host {
	c := *h.Capacity
	edit(&c)
	h.Capacity = &c
	return h
}

// ours is n replicas of this pool on host, each of size r.
func ours(host string, n int, r placement.Resources, settled bool) []placement.Replica {
	out := make([]placement.Replica, n)
	for i := range out {
		out[i] = placement.Replica{Host: host, Resources: r, Settled: settled, Spreads: true}
	}
	return out
}

func concat(rs ...[]placement.Replica) []placement.Replica { return slices.Concat(rs...) }

func TestRoom(t *testing.T) {
	for _, tc := range []struct {
		name     string
		host     placement.Host
		replicas []placement.Replica
		ratio    int64
		want     placement.Resources
	}{
		{
			name: "idle host: free memory, CPUs times the default ratio, the pool",
			host: idle("h", 8*gi),
			want: placement.Resources{CPUs: 64, MemoryBytes: 8 * gi, DiskBytes: 500 * gi},
		},
		{
			name: "a ratio of 1", host: idle("h", 8*gi), ratio: 1,
			want: placement.Resources{CPUs: 16, MemoryBytes: 8 * gi, DiskBytes: 500 * gi},
		},
		{
			name:     "unsettled replicas are reserved on top of what the host reports",
			host:     idle("h", 8*gi),
			replicas: ours("h", 3, replica1G, false),
			want:     placement.Resources{CPUs: 61, MemoryBytes: 5 * gi, DiskBytes: 470 * gi},
		},
		{
			name: "settled replicas are in the host's figures and not subtracted again",
			host: with(idle("h", 6*gi), func(c *placement.Capacity) {
				c.MemoryBytes, c.AllocatedVCPUs, c.AllocatedMemoryBytes = 8*gi, 2, 2*gi
			}),
			replicas: ours("h", 2, replica1G, true),
			want:     placement.Resources{CPUs: 62, MemoryBytes: 6 * gi, DiskBytes: 500 * gi},
		},
		{
			name: "guests that have not touched their memory: what domains were given bounds it",
			host: with(idle("h", 7*gi+512*mi), func(c *placement.Capacity) {
				c.MemoryBytes, c.AllocatedVCPUs, c.AllocatedMemoryBytes = 8*gi, 2, 2*gi
			}),
			replicas: ours("h", 2, replica1G, true),
			want:     placement.Resources{CPUs: 62, MemoryBytes: 6 * gi, DiskBytes: 500 * gi},
		},
		{
			name:     "settled replicas a stale check has not seen: their sum is a floor",
			host:     with(idle("h", 8*gi), func(c *placement.Capacity) { c.MemoryBytes = 8 * gi }),
			replicas: ours("h", 3, placement.Resources{CPUs: 2, MemoryBytes: gi}, true),
			want:     placement.Resources{CPUs: 58, MemoryBytes: 5 * gi, DiskBytes: 500 * gi},
		},
		{
			name: "other tools' domains count through what libvirt reports",
			host: with(idle("h", 2*gi), func(c *placement.Capacity) {
				c.MemoryBytes, c.AllocatedVCPUs, c.AllocatedMemoryBytes = 8*gi, 20, 6*gi
			}),
			replicas: ours("h", 1, replica1G, true),
			want:     placement.Resources{CPUs: 44, MemoryBytes: 2 * gi, DiskBytes: 500 * gi},
		},
		{
			name:     "other pools' unsettled replicas are reserved too",
			host:     idle("h", 4*gi),
			replicas: []placement.Replica{{Host: "h", Resources: replica1G}},
			want:     placement.Resources{CPUs: 63, MemoryBytes: 3 * gi, DiskBytes: 490 * gi},
		},
		{
			name:     "overcommitted: negative room",
			host:     with(idle("h", 0), func(c *placement.Capacity) { c.AllocatedVCPUs = 70 }),
			replicas: nil,
			want:     placement.Resources{CPUs: -6, MemoryBytes: 0, DiskBytes: 500 * gi},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := placement.Room(tc.host, tc.replicas, tc.ratio); got != tc.want {
				t.Fatalf("Room = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestChooseHost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hosts    []placement.Host
		replicas []placement.Replica
		need     placement.Resources
		ratio    int64
		want     string
		reason   string
		message  []string // substrings of the Blocked message
	}{
		{
			name:  "empty equal hosts: the first name",
			hosts: []placement.Host{idle("c", 8*gi), idle("a", 8*gi), idle("b", 8*gi)},
			need:  replica1G, want: "a",
		},
		{
			name:  "equal counts: the most free memory",
			hosts: []placement.Host{idle("a", 4*gi), idle("b", 8*gi), idle("c", 2*gi)},
			need:  replica1G, want: "b",
		},
		{
			name:  "equal memory: the most free vCPUs",
			hosts: []placement.Host{idle("a", 8*gi), with(idle("b", 8*gi), func(c *placement.Capacity) { c.CPUs = 32 })},
			need:  replica1G, want: "b",
		},
		{
			name:     "the host with the fewest of the pool's replicas, even if smaller",
			hosts:    []placement.Host{idle("big", 15*gi), idle("small", 2*gi)},
			replicas: ours("big", 1, replica1G, true),
			need:     replica1G, want: "small",
		},
		{
			name:     "replicas being deleted or drained do not count for the spread",
			hosts:    []placement.Host{idle("a", 8*gi), idle("b", 4*gi)},
			replicas: []placement.Replica{{Host: "a", Resources: replica1G, Settled: true}},
			need:     replica1G, want: "a",
		},
		{
			name:     "other pools' replicas do not count for the spread",
			hosts:    []placement.Host{idle("a", 8*gi), idle("b", 4*gi)},
			replicas: []placement.Replica{{Host: "a", Resources: replica1G, Settled: true}, {Host: "a", Resources: replica1G, Settled: true}},
			need:     replica1G, want: "a",
		},
		{
			name:     "replicas on hosts that are not eligible are ignored",
			hosts:    []placement.Host{idle("a", 8*gi), idle("b", 4*gi)},
			replicas: ours("gone", 5, replica1G, true),
			need:     replica1G, want: "a",
		},
		{
			name:     "an existing skew is repaired: the emptiest host",
			hosts:    []placement.Host{idle("a", 8*gi), idle("b", 8*gi), idle("c", 8*gi)},
			replicas: concat(ours("a", 3, replica1G, true), ours("b", 1, replica1G, true)),
			need:     replica1G, want: "c",
		},
		{
			name:   "memory short everywhere",
			hosts:  []placement.Host{idle("a", 512*mi), idle("b", 900*mi)},
			need:   replica1G,
			reason: placement.InsufficientCapacity,
			message: []string{"no KVMHost has room for a replica of 1 vCPU, 1Gi memory, 10Gi disk",
				"a (0 replicas) memory 512Mi free, 1Gi needed", "b (0 replicas) memory 900Mi free, 1Gi needed"},
		},
		{
			name:    "vCPUs short with the overcommit ratio",
			hosts:   []placement.Host{with(idle("a", 8*gi), func(c *placement.Capacity) { c.CPUs, c.AllocatedVCPUs = 2, 7 })},
			need:    placement.Resources{CPUs: 2, MemoryBytes: gi},
			reason:  placement.InsufficientCapacity,
			message: []string{"a (0 replicas) vCPUs 1 of 8 free, 2 needed"},
		},
		{
			name:  "a higher ratio makes room",
			hosts: []placement.Host{with(idle("a", 8*gi), func(c *placement.Capacity) { c.CPUs, c.AllocatedVCPUs = 2, 7 })},
			need:  placement.Resources{CPUs: 2, MemoryBytes: gi}, ratio: 8, want: "a",
		},
		{
			name:    "pool short of the disk's full virtual size",
			hosts:   []placement.Host{with(idle("a", 8*gi), func(c *placement.Capacity) { c.PoolAvailableBytes = 9 * gi })},
			need:    replica1G,
			reason:  placement.InsufficientCapacity,
			message: []string{"pool 9Gi free, 10Gi needed"},
		},
		{
			name:    "a host that has not reported its capacity takes nothing",
			hosts:   []placement.Host{{Name: "new"}},
			need:    replica1G,
			reason:  placement.InsufficientCapacity,
			message: []string{"new (0 replicas) capacity not reported yet"},
		},
		{
			name:    "no host at all",
			need:    replica1G,
			reason:  placement.InsufficientCapacity,
			message: []string{"no eligible KVMHost"},
		},
		{
			name:     "the fewest-replica host is full while others have room: spread unsatisfiable",
			hosts:    []placement.Host{idle("h2", 2*gi), idle("h4", 4*gi), idle("h8", 8*gi)},
			replicas: concat(ours("h2", 2, replica1G, false), ours("h4", 3, replica1G, false), ours("h8", 3, replica1G, false)),
			need:     replica1G,
			reason:   placement.SpreadUnsatisfiable,
			message: []string{"the hosts with the fewest replicas (2) have no room for a replica of 1 vCPU, 1Gi memory, 10Gi disk",
				"h2 (2 replicas) memory 0 free, 1Gi needed", "h4 (3 replicas), h8 (3 replicas) have room, but one more there would exceed a skew of 1"},
		},
		{
			name:     "a full host not at the fewest does not block the spread",
			hosts:    []placement.Host{idle("a", 2*gi), idle("b", 8*gi)},
			replicas: concat(ours("a", 2, replica1G, false), ours("b", 1, replica1G, false)),
			need:     replica1G, want: "b",
		},
		{
			name: "more full hosts than a message names",
			hosts: []placement.Host{idle("h1", 0), idle("h2", 0), idle("h3", 0), idle("h4", 0),
				idle("h5", 0), idle("h6", 0), idle("h7", 0)},
			need:    replica1G,
			reason:  placement.InsufficientCapacity,
			message: []string{"h5 (0 replicas)", "; and 2 more"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, blocked := placement.ChooseHost(placement.Request{Hosts: tc.hosts, Replicas: tc.replicas, Need: tc.need, CPUOvercommit: tc.ratio})
			if tc.reason == "" {
				if blocked != nil || got != tc.want {
					t.Fatalf("ChooseHost = %q, %v; want %q", got, blocked, tc.want)
				}
				return
			}
			if blocked == nil || blocked.Reason != tc.reason || got != "" {
				t.Fatalf("ChooseHost = %q, %v; want blocked %s", got, blocked, tc.reason)
			}
			for _, m := range tc.message {
				if !strings.Contains(blocked.Message, m) {
					t.Errorf("message %q\nlacks %q", blocked.Message, m)
				}
			}
		})
	}
}

// burst places n replicas one after the other, each recorded as placed and
// not yet running, with the hosts' reported figures unchanged in between:
// what a pool does in one pass before any host is checked again.
func burst(hosts []placement.Host, existing []placement.Replica, need placement.Resources, n int) (map[string]int, *placement.Blocked, int) {
	replicas := slices.Clone(existing)
	placed := map[string]int{}
	for i := range n {
		h, blocked := placement.ChooseHost(placement.Request{Hosts: hosts, Replicas: replicas, Need: need})
		if blocked != nil {
			return placed, blocked, i
		}
		placed[h]++
		replicas = append(replicas, placement.Replica{Host: h, Resources: need, Spreads: true})
	}
	return placed, nil, n
}

func TestBurst(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hosts  []placement.Host
		n      int
		want   map[string]int
		placed int
		reason string
	}{
		{
			// The smallest host bounds the spread: 2+3+3, then the 9th
			// would need a 4th replica on h4 or h8 while h2 holds 2.
			name:  "hosts with 2, 4 and 8 Gi free, ten 1Gi replicas",
			hosts: []placement.Host{idle("h2", 2*gi), idle("h4", 4*gi), idle("h8", 8*gi)},
			n:     10, want: map[string]int{"h2": 2, "h4": 3, "h8": 3}, placed: 8,
			reason: placement.SpreadUnsatisfiable,
		},
		{
			name:  "three hosts with 4Gi free each take ten",
			hosts: []placement.Host{idle("a", 4*gi), idle("b", 4*gi), idle("c", 4*gi)},
			n:     10, want: map[string]int{"a": 4, "b": 3, "c": 3}, placed: 10,
		},
		{
			name:  "three hosts with 3Gi free each: nine, then no room anywhere",
			hosts: []placement.Host{idle("a", 3*gi), idle("b", 3*gi), idle("c", 3*gi)},
			n:     10, want: map[string]int{"a": 3, "b": 3, "c": 3}, placed: 9,
			reason: placement.InsufficientCapacity,
		},
		{
			// Without the reservation every replica would fit: the host's
			// reported figures do not change within the pass.
			name:  "one host with 4Gi free: four, then no room",
			hosts: []placement.Host{idle("only", 4*gi)},
			n:     10, want: map[string]int{"only": 4}, placed: 4,
			reason: placement.InsufficientCapacity,
		},
		{
			name: "vCPUs run out before memory",
			hosts: []placement.Host{
				with(idle("a", 32*gi), func(c *placement.Capacity) { c.CPUs = 1 }),
				with(idle("b", 32*gi), func(c *placement.Capacity) { c.CPUs = 1 }),
			},
			n: 10, want: map[string]int{"a": 4, "b": 4}, placed: 8,
			reason: placement.InsufficientCapacity,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			placed, blocked, n := burst(tc.hosts, nil, replica1G, tc.n)
			if n != tc.placed || fmt.Sprint(placed) != fmt.Sprint(tc.want) {
				t.Fatalf("placed %d: %v, want %d: %v (blocked: %v)", n, placed, tc.placed, tc.want, blocked)
			}
			if got := ""; blocked != nil {
				got = blocked.Reason
				if got != tc.reason {
					t.Fatalf("blocked %v, want %s", blocked, tc.reason)
				}
			} else if tc.reason != "" {
				t.Fatalf("not blocked, want %s", tc.reason)
			}
		})
	}
}

// Whatever the hosts and what is on them, a chosen host has room for the
// replica and holds the fewest of the pool's replicas; a refusal is
// SpreadUnsatisfiable exactly when some host has room.
func TestChooseHostInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		var hosts []placement.Host
		for h := range 1 + rng.IntN(5) {
			hosts = append(hosts, placement.Host{Name: fmt.Sprintf("h%d", h), Capacity: &placement.Capacity{
				CPUs: 1 + rng.Int64N(8), MemoryBytes: 16 * gi, FreeMemoryBytes: rng.Int64N(12) * gi,
				AllocatedVCPUs: rng.Int64N(16), AllocatedMemoryBytes: rng.Int64N(8) * gi, PoolAvailableBytes: rng.Int64N(40) * gi,
			}})
		}
		var replicas []placement.Replica
		for range rng.IntN(12) {
			replicas = append(replicas, placement.Replica{Host: hosts[rng.IntN(len(hosts))].Name, Resources: replica1G,
				Settled: rng.IntN(2) == 0, Spreads: rng.IntN(4) != 0})
		}
		req := placement.Request{Hosts: hosts, Replicas: replicas, Need: replica1G, CPUOvercommit: 1 + rng.Int64N(4)}
		got, blocked := placement.ChooseHost(req)

		counts, fits := map[string]int{}, map[string]bool{}
		fewest := -1
		for _, h := range hosts {
			var on []placement.Replica
			for _, r := range replicas {
				if r.Host == h.Name {
					on = append(on, r)
					if r.Spreads {
						counts[h.Name]++
					}
				}
			}
			room := placement.Room(h, on, req.CPUOvercommit)
			fits[h.Name] = room.CPUs >= 1 && room.MemoryBytes >= gi && room.DiskBytes >= 10*gi
			if fewest < 0 || counts[h.Name] < fewest {
				fewest = counts[h.Name]
			}
		}
		anyFits := slices.ContainsFunc(hosts, func(h placement.Host) bool { return fits[h.Name] })
		switch {
		case blocked == nil && (!fits[got] || counts[got] != fewest):
			t.Fatalf("case %d: chose %s (fits %v, %d replicas, fewest %d)", i, got, fits[got], counts[got], fewest)
		case blocked != nil && (blocked.Reason == placement.SpreadUnsatisfiable) != anyFits:
			t.Fatalf("case %d: %v while some host fits: %v", i, blocked, anyFits)
		case blocked != nil && slices.ContainsFunc(hosts, func(h placement.Host) bool { return fits[h.Name] && counts[h.Name] == fewest }):
			t.Fatalf("case %d: %v although a host with the fewest replicas fits", i, blocked)
		}
	}
}

func TestChooseZone(t *testing.T) {
	for _, tc := range []struct {
		zones, inUse []string
		want         string
	}{
		{nil, []string{"a"}, ""},
		{[]string{"a", "b", "c"}, nil, "a"},
		{[]string{"c", "b", "a"}, nil, "c"},
		{[]string{"a", "b", "c"}, []string{"a", "b"}, "c"},
		{[]string{"a", "b", "c"}, []string{"a", "a", "b", "c"}, "b"},
		{[]string{"a", "b"}, []string{"old", "old", "a"}, "b"},
	} {
		if got := placement.ChooseZone(tc.zones, tc.inUse); got != tc.want {
			t.Errorf("ChooseZone(%v, %v) = %q, want %q", tc.zones, tc.inUse, got, tc.want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{-gi: "0", 0: "0", 512 * mi: "512Mi", gi: "1Gi", 10 * gi: "10Gi", gi + gi/2: "1.5Gi"} {
		if got := placement.FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// creating is n replicas on host being created: of this pool (spreads) or
// of another.
func creating(host string, n int, spreads bool) []placement.Replica {
	out := make([]placement.Replica, n)
	for i := range out {
		out[i] = placement.Replica{Host: host, Resources: replica1G, Spreads: spreads, Creating: true}
	}
	return out
}

func TestChooseHostCreateConcurrency(t *testing.T) {
	for _, tc := range []struct {
		name        string
		hosts       []placement.Host
		replicas    []placement.Replica
		maxCreating int
		want        string
		reason      string
		message     []string
	}{
		{
			name:     "no limit: a host creating many still takes one",
			hosts:    []placement.Host{idle("a", 8*gi), idle("b", 4*gi)},
			replicas: concat(creating("a", 3, true), creating("b", 3, true)),
			want:     "a",
		},
		{
			name:     "a host at its limit is passed over for one that is not, with less memory",
			hosts:    []placement.Host{idle("a", 8*gi), idle("b", 4*gi)},
			replicas: concat(creating("a", 2, true), ours("b", 2, replica1G, true)),
			want:     "b", maxCreating: 2,
		},
		{
			name:     "another pool's creates count against the host",
			hosts:    []placement.Host{idle("a", 8*gi), idle("b", 4*gi)},
			replicas: creating("a", 2, false),
			want:     "b", maxCreating: 2,
		},
		{
			name:     "Ready replicas do not count",
			hosts:    []placement.Host{idle("a", 8*gi), idle("b", 4*gi)},
			replicas: concat(ours("a", 3, replica1G, true), ours("b", 3, replica1G, true)),
			want:     "a", maxCreating: 1,
		},
		{
			name:     "below the limit",
			hosts:    []placement.Host{idle("a", 8*gi)},
			replicas: creating("a", 3, true),
			want:     "a", maxCreating: 4,
		},
		{
			// The spread allows only a; b has room but one more there
			// would exceed the skew. Waiting for a, not blocked.
			name:        "the only host the spread allows is at its limit: wait, not SpreadUnsatisfiable",
			hosts:       []placement.Host{idle("a", 8*gi), idle("b", 8*gi)},
			replicas:    concat(creating("a", 2, true), ours("b", 3, replica1G, true)),
			maxCreating: 2, reason: placement.CreatesInFlight,
			message: []string{"each creating 2 replicas already: a (2 replicas)"},
		},
		{
			name:        "every host at its limit",
			hosts:       []placement.Host{idle("a", 8*gi), idle("b", 8*gi)},
			replicas:    concat(creating("a", 2, true), creating("b", 2, true)),
			maxCreating: 2, reason: placement.CreatesInFlight,
			message: []string{"a (2 replicas), b (2 replicas)"},
		},
		{
			name:        "a full host is full, whatever it is creating",
			hosts:       []placement.Host{idle("a", 2*gi)},
			replicas:    creating("a", 2, true),
			maxCreating: 2, reason: placement.InsufficientCapacity,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, blocked := placement.ChooseHost(placement.Request{Hosts: tc.hosts, Replicas: tc.replicas, Need: replica1G, MaxCreating: tc.maxCreating})
			if tc.reason == "" {
				if blocked != nil || got != tc.want {
					t.Fatalf("ChooseHost = %q, %v; want %q", got, blocked, tc.want)
				}
				return
			}
			if blocked == nil || blocked.Reason != tc.reason {
				t.Fatalf("ChooseHost = %q, %v; want blocked %s", got, blocked, tc.reason)
			}
			for _, m := range tc.message {
				if !strings.Contains(blocked.Message, m) {
					t.Errorf("message %q\nlacks %q", blocked.Message, m)
				}
			}
		})
	}
}

// A burst on two hosts with a limit of two places four, then waits; once
// one replica on a is Ready, a takes the next.
func TestBurstCreateConcurrency(t *testing.T) {
	hosts := []placement.Host{idle("a", 8*gi), idle("b", 8*gi)}
	var replicas []placement.Replica
	place := func() (string, *placement.Blocked) {
		h, blocked := placement.ChooseHost(placement.Request{Hosts: hosts, Replicas: replicas, Need: replica1G, MaxCreating: 2})
		if blocked == nil {
			replicas = append(replicas, placement.Replica{Host: h, Resources: replica1G, Spreads: true, Creating: true})
		}
		return h, blocked
	}
	placed := map[string]int{}
	for range 4 {
		h, blocked := place()
		if blocked != nil {
			t.Fatalf("blocked after %v: %v", placed, blocked)
		}
		placed[h]++
	}
	if placed["a"] != 2 || placed["b"] != 2 {
		t.Fatalf("placed %v, want 2 on each", placed)
	}
	if h, blocked := place(); blocked == nil || blocked.Reason != placement.CreatesInFlight {
		t.Fatalf("fifth: %q, %v; want %s", h, blocked, placement.CreatesInFlight)
	}
	replicas[0].Creating = false // on a, now Ready
	if h, blocked := place(); blocked != nil || h != "a" {
		t.Fatalf("after one on a is Ready: %q, %v; want a", h, blocked)
	}
}
