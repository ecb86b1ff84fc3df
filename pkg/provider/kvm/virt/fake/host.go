package fake

import (
	"fmt"
	"maps"
	"slices"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// Host size of a new Fake: large enough that tests not about capacity never
// run out of it.
const (
	DefaultCPUs        = 16
	DefaultMemoryBytes = 64 << 30
	// DefaultHostUsedBytes is what the host's own processes take.
	DefaultHostUsedBytes = 1 << 30
)

// Linux reports four figures for the whole host and two per NUMA cell
// (virHostMemGetStatsLinux); the fake host has one cell.
const (
	memoryStatsAll  = 4
	memoryStatsCell = 2
)

// hostSize is the machine the daemon runs on.
type hostSize struct {
	cpus    int32
	memory  uint64 // bytes
	used    uint64 // bytes taken outside domains
	buffers uint64
	cached  uint64
}

// WithHostSize sets the host's logical CPUs and physical memory (bytes).
func WithHostSize(cpus int32, memoryBytes uint64) Option {
	return func(f *Fake) { f.host.cpus, f.host.memory = cpus, memoryBytes }
}

// SetHostMemoryUsed sets the memory the host takes outside domains (its own
// processes, VMs of other tools): free memory is what is left after it, the
// running domains and the page cache.
func (f *Fake) SetHostMemoryUsed(bytes uint64) { f.mu.Lock(); f.host.used = bytes; f.mu.Unlock() }

// SetPageCache sets the buffers and page cache the kernel reports apart
// from free memory (reclaimable, as in /proc/meminfo).
func (f *Fake) SetPageCache(buffers, cached uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.host.buffers, f.host.cached = buffers, cached
}

// domainSize is what one domain was given: vCPUs online and at most, and
// its memory (current balloon and maximum) in KiB.
type domainSize struct {
	vcpus, maxVCPUs         uint32
	memoryKiB, maxMemoryKiB uint64
}

func sizeOf(def *definition) domainSize {
	var s domainSize
	if def == nil {
		return s
	}
	d := def.dom
	s.maxVCPUs = 1
	if d.VCPU != nil && d.VCPU.Value > 0 {
		s.maxVCPUs = uint32(d.VCPU.Value)
	}
	s.vcpus = s.maxVCPUs
	if d.VCPU != nil && d.VCPU.Current > 0 {
		s.vcpus = uint32(d.VCPU.Current)
	}
	if d.Memory != nil {
		s.maxMemoryKiB = kib(d.Memory.Value, d.Memory.Unit)
	}
	s.memoryKiB = s.maxMemoryKiB
	if d.CurrentMemory != nil {
		s.memoryKiB = kib(d.CurrentMemory.Value, d.CurrentMemory.Unit)
	}
	return s
}

// kib converts a libvirt memory value to KiB, rounding up as
// virDomainParseMemory does; the unit defaults to KiB.
func kib(v uint, unit string) uint64 {
	scale := map[string]uint64{
		"b": 1, "bytes": 1,
		"KB": 1000, "k": 1 << 10, "KiB": 1 << 10,
		"MB": 1000 * 1000, "M": 1 << 20, "MiB": 1 << 20,
		"GB": 1000 * 1000 * 1000, "G": 1 << 30, "GiB": 1 << 30,
		"TB": 1000 * 1000 * 1000 * 1000, "T": 1 << 40, "TiB": 1 << 40,
	}
	s, ok := scale[unit]
	if !ok {
		s = 1 << 10
	}
	return (uint64(v)*s + 1023) / 1024
}

// usedByDomains is the memory running domains take, in bytes: their current
// size, as if the guests had touched all of it.
func (f *Fake) usedByDomains() uint64 {
	var n uint64
	for _, d := range f.domains {
		if d.active() {
			n += sizeOf(d.live).memoryKiB << 10
		}
	}
	return n
}

// freeBytes is MemFree: what neither the host, the domains nor the page
// cache hold.
func (f *Fake) freeBytes() uint64 {
	taken := f.host.used + f.host.buffers + f.host.cached + f.usedByDomains()
	if taken >= f.host.memory {
		return 0
	}
	return f.host.memory - taken
}

// NodeGetInfo implements virt.Client: one NUMA cell, one socket, a core per
// CPU; memory in KiB.
func (c *Conn) NodeGetInfo() ([32]int8, uint64, int32, int32, int32, int32, int32, int32, error) {
	type info struct {
		memory uint64
		cpus   int32
	}
	r, err := do(c, virt.RPCNodeGetInfo, func(f *Fake) (info, error) {
		return info{f.host.memory >> 10, f.host.cpus}, nil
	})
	var model [32]int8
	for i, b := range []byte("x86_64") {
		model[i] = int8(b)
	}
	if err != nil {
		return model, 0, 0, 0, 0, 0, 0, 0, err
	}
	return model, r.memory, r.cpus, 2400, 1, 1, r.cpus, 1, nil
}

// NodeGetMemoryStats implements virt.Client as Linux does: nparams 0 asks
// for the count; any other count than the one for that cell is refused;
// values are KiB.
func (c *Conn) NodeGetMemoryStats(nparams int32, cellNum int32, flags uint32) ([]libvirt.NodeGetMemoryStats, int32, error) {
	type res struct {
		params []libvirt.NodeGetMemoryStats
		n      int32
	}
	r, err := do(c, virt.RPCNodeGetMemoryStats, func(f *Fake) (res, error) {
		if flags != 0 {
			return res{}, lverr(libvirt.ErrInvalidArg, "unsupported flags (0x%x) in function virHostMemGetStats", flags)
		}
		want := int32(memoryStatsAll)
		switch {
		case cellNum == int32(libvirt.NodeMemoryStatsAllCells):
		case cellNum == 0:
			want = memoryStatsCell
		default:
			return res{}, lverr(libvirt.ErrInvalidArg, "cellNum in virHostMemGetStats must be less than or equal to 0")
		}
		if nparams == 0 {
			return res{n: want}, nil
		}
		if nparams != want {
			return res{}, lverr(libvirt.ErrInvalidArg, "nparams in virHostMemGetStatsLinux must be %d", want)
		}
		out := []libvirt.NodeGetMemoryStats{
			{Field: "total", Value: f.host.memory >> 10},
			{Field: "free", Value: f.freeBytes() >> 10},
		}
		if want == memoryStatsAll {
			out = append(out,
				libvirt.NodeGetMemoryStats{Field: "buffers", Value: f.host.buffers >> 10},
				libvirt.NodeGetMemoryStats{Field: "cached", Value: f.host.cached >> 10})
		}
		return res{out, want}, nil
	})
	return r.params, r.n, err
}

// Stats groups and flags ConnectGetAllDomainStats understands here.
const (
	statsServed  = libvirt.DomainStatsState | libvirt.DomainStatsBalloon | libvirt.DomainStatsVCPU
	statsFilters = libvirt.ConnectGetAllDomainsStatsActive | libvirt.ConnectGetAllDomainsStatsInactive |
		libvirt.ConnectGetAllDomainsStatsPersistent | libvirt.ConnectGetAllDomainsStatsTransient |
		libvirt.ConnectGetAllDomainsStatsRunning | libvirt.ConnectGetAllDomainsStatsPaused |
		libvirt.ConnectGetAllDomainsStatsShutoff | libvirt.ConnectGetAllDomainsStatsOther
	statsFlags = statsFilters | libvirt.ConnectGetAllDomainsStatsNowait |
		libvirt.ConnectGetAllDomainsStatsBacking | libvirt.ConnectGetAllDomainsStatsEnforceStats
)

// ConnectGetAllDomainStats implements virt.Client for the state, balloon
// and vcpu groups (stats 0 means all of them), with libvirt's filters, in
// name order. As in the qemu driver an inactive domain reports its
// definition's vCPUs and memory; an active one adds per-vCPU entries.
// Asking with ENFORCE_STATS for a group the fake does not serve fails as
// the daemon does for a group it lacks.
func (c *Conn) ConnectGetAllDomainStats(doms []libvirt.Domain, stats uint32, flags uint32) ([]libvirt.DomainStatsRecord, error) {
	return do(c, virt.RPCConnectGetAllDomainStats, func(f *Fake) ([]libvirt.DomainStatsRecord, error) {
		fl := libvirt.ConnectGetAllDomainStatsFlags(flags)
		if extra := fl &^ statsFlags; extra != 0 {
			return nil, lverr(libvirt.ErrInvalidArg, "unsupported flags (0x%x) in function qemuConnectGetAllDomainStats", uint32(extra))
		}
		want := libvirt.DomainStatsTypes(stats)
		if want == 0 {
			want = statsServed
		}
		if missing := want &^ statsServed; missing != 0 && fl&libvirt.ConnectGetAllDomainsStatsEnforceStats != 0 {
			return nil, lverr(libvirt.ErrArgumentUnsupported, "Stats types bits 0x%x are not supported by this daemon", uint32(missing))
		}
		var picked []*domain
		if len(doms) > 0 {
			if fl&statsFilters != 0 {
				return nil, lverr(libvirt.ErrInvalidArg, "filtering flags are not supported with a domain list")
			}
			for _, h := range doms {
				d, err := f.lookup(h)
				if err != nil {
					return nil, err
				}
				picked = append(picked, d)
			}
		} else {
			for _, name := range slices.Sorted(maps.Keys(f.domains)) {
				// The list filters share their bits with virConnectListAllDomains.
				if d := f.domains[name]; matchFlags(d, libvirt.ConnectListAllDomainsFlags(fl&statsFilters)) {
					picked = append(picked, d)
				}
			}
		}
		out := make([]libvirt.DomainStatsRecord, 0, len(picked))
		for _, d := range picked {
			out = append(out, libvirt.DomainStatsRecord{Dom: d.handle(), Params: domainStats(d, want)})
		}
		return out, nil
	})
}

func domainStats(d *domain, want libvirt.DomainStatsTypes) []libvirt.TypedParam {
	size := sizeOf(d.current())
	var ps []libvirt.TypedParam
	add := func(field string, v *libvirt.TypedParamValue) {
		ps = append(ps, libvirt.TypedParam{Field: field, Value: *v})
	}
	if want&libvirt.DomainStatsState != 0 {
		add("state.state", libvirt.NewTypedParamValueInt(int32(d.state)))
		add("state.reason", libvirt.NewTypedParamValueInt(d.reason))
	}
	if want&libvirt.DomainStatsVCPU != 0 {
		add(libvirt.DomainStatsVCPUCurrent, libvirt.NewTypedParamValueUint(size.vcpus))
		add("vcpu.maximum", libvirt.NewTypedParamValueUint(size.maxVCPUs))
		if d.active() {
			for i := range size.vcpus {
				add(vcpuField(i, "state"), libvirt.NewTypedParamValueInt(1)) // VIR_VCPU_RUNNING
				add(vcpuField(i, "time"), libvirt.NewTypedParamValueUllong(0))
			}
		}
	}
	if want&libvirt.DomainStatsBalloon != 0 {
		add(libvirt.DomainStatsBalloonCurrent, libvirt.NewTypedParamValueUllong(size.memoryKiB))
		add(libvirt.DomainStatsBalloonMaximum, libvirt.NewTypedParamValueUllong(size.maxMemoryKiB))
	}
	return ps
}

func vcpuField(i uint32, what string) string { return fmt.Sprintf("vcpu.%d.%s", i, what) }
