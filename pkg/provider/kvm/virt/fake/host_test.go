package fake_test

import (
	"fmt"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// sized renders a domain with vcpus and memory (MiB) in the units libvirt
// accepts, so the fake's unit handling is exercised.
func sized(name string, vcpus, current int, memory string) string {
	vc := fmt.Sprintf("<vcpu placement='static'>%d</vcpu>", vcpus)
	if current > 0 {
		vc = fmt.Sprintf("<vcpu placement='static' current='%d'>%d</vcpu>", current, vcpus)
	}
	return "<domain type='kvm'><name>" + name + "</name>" + memory + vc +
		"<os><type arch='x86_64'>hvm</type></os></domain>"
}

func memStats(t *testing.T, c virt.Client) map[string]uint64 {
	t.Helper()
	ps, n, err := c.NodeGetMemoryStats(4, int32(libvirt.NodeMemoryStatsAllCells), 0)
	if err != nil || n != 4 || len(ps) != 4 {
		t.Fatalf("NodeGetMemoryStats = %v, %d, %v", ps, n, err)
	}
	out := map[string]uint64{}
	for _, p := range ps {
		out[p.Field] = p.Value
	}
	return out
}

func TestNodeGetInfoReportsTheHostSize(t *testing.T) {
	f := fake.New(fake.WithHostSize(12, 48<<30))
	model, mem, cpus, mhz, nodes, sockets, cores, threads, err := f.NodeGetInfo()
	if err != nil || mem != 48<<20 || cpus != 12 || nodes != 1 || sockets*cores*threads != cpus || mhz == 0 || model[0] != 'x' {
		t.Fatalf("NodeGetInfo = %v %d %d %d %d %d %d %d, %v", model, mem, cpus, mhz, nodes, sockets, cores, threads, err)
	}
	_, mem, cpus, _, _, _, _, _, _ = fake.New().NodeGetInfo()
	if mem != fake.DefaultMemoryBytes>>10 || cpus != fake.DefaultCPUs {
		t.Fatalf("default host: %d KiB, %d CPUs", mem, cpus)
	}
}

// Free memory falls with what running domains were given and with the
// host's own use and page cache, and comes back when a domain stops.
func TestFreeMemoryFollowsRunningDomains(t *testing.T) {
	f := fake.New(fake.WithHostSize(4, 8<<30))
	const gib uint64 = 1 << 20 // in KiB
	if s := memStats(t, f); s["total"] != 8*gib || s["free"] != 7*gib || s["buffers"] != 0 || s["cached"] != 0 {
		t.Fatalf("idle host: %v", s)
	}
	// Defined only: nothing taken.
	if err := f.AddDomain(sized("a", 2, 0, "<memory unit='GiB'>2</memory>"), false); err != nil {
		t.Fatal(err)
	}
	if s := memStats(t, f); s["free"] != 7*gib {
		t.Fatalf("shut-off domain took memory: %v", s)
	}
	// currentMemory is what a running domain holds; units convert.
	if err := f.AddDomain(sized("b", 1, 0, "<memory unit='MiB'>1024</memory><currentMemory unit='KiB'>524288</currentMemory>"), true); err != nil {
		t.Fatal(err)
	}
	if s := memStats(t, f); s["free"] != 7*gib-gib/2 {
		t.Fatalf("with b running: %v", s)
	}
	a, _ := f.DomainLookupByName("a")
	if err := f.DomainCreate(a); err != nil {
		t.Fatal(err)
	}
	f.SetHostMemoryUsed(2 << 30)
	f.SetPageCache(256<<20, 512<<20)
	s := memStats(t, f)
	if want := 8*gib - 2*gib - gib/2 - 2*gib - gib/4 - gib/2; s["free"] != want || s["buffers"] != gib/4 || s["cached"] != gib/2 {
		t.Fatalf("with a and b running, 2Gi host use, 768Mi cache: %v, want free %d", s, want)
	}
	if err := f.DomainDestroyFlags(a, 0); err != nil {
		t.Fatal(err)
	}
	if s := memStats(t, f); s["free"] != 8*gib-2*gib-gib/2-gib/4-gib/2 {
		t.Fatalf("after a stopped: %v", s)
	}
	// Everything taken: free is 0, not a wrap-around.
	f.SetHostMemoryUsed(16 << 30)
	if s := memStats(t, f); s["free"] != 0 {
		t.Fatalf("overcommitted host: %v", s)
	}
}

// The nparams protocol is Linux's: 0 asks for the count, any other count
// than the cell's is refused (the caller must not guess).
func TestNodeGetMemoryStatsArguments(t *testing.T) {
	f := fake.New()
	all := int32(libvirt.NodeMemoryStatsAllCells)
	if ps, n, err := f.NodeGetMemoryStats(0, all, 0); err != nil || n != 4 || len(ps) != 0 {
		t.Fatalf("count query = %v, %d, %v", ps, n, err)
	}
	if _, n, err := f.NodeGetMemoryStats(0, 0, 0); err != nil || n != 2 {
		t.Fatalf("cell 0 count = %d, %v", n, err)
	}
	if ps, _, err := f.NodeGetMemoryStats(2, 0, 0); err != nil || len(ps) != 2 || ps[0].Field != "total" || ps[1].Field != "free" {
		t.Fatalf("cell 0 = %v, %v", ps, err)
	}
	for _, tc := range []struct {
		nparams, cell int32
		flags         uint32
	}{{3, all, 0}, {5, all, 0}, {4, 0, 0}, {2, 1, 0}, {4, all, 1}} {
		if _, _, err := f.NodeGetMemoryStats(tc.nparams, tc.cell, tc.flags); !virt.IsCode(err, libvirt.ErrInvalidArg) {
			t.Errorf("nparams %d cell %d flags %d: err %v, want VIR_ERR_INVALID_ARG", tc.nparams, tc.cell, tc.flags, err)
		}
	}
}

func TestConnectGetAllDomainStats(t *testing.T) {
	f := fake.New()
	for _, d := range []struct {
		xml     string
		running bool
	}{
		{sized("on", 4, 2, "<memory unit='MiB'>2048</memory><currentMemory unit='MiB'>1024</currentMemory>"), true},
		{sized("off", 1, 0, "<memory unit='GiB'>1</memory>"), false},
	} {
		if err := f.AddDomain(d.xml, d.running); err != nil {
			t.Fatal(err)
		}
	}
	type row struct {
		vcpus, maxVCPUs uint32
		mem, maxMem     uint64
		others          int
		state           int32
	}
	read := func(recs []libvirt.DomainStatsRecord) map[string]row {
		out := map[string]row{}
		for _, r := range recs {
			var x row
			for _, p := range r.Params {
				switch p.Field {
				case "vcpu.current":
					x.vcpus = p.Value.I.(uint32)
				case "vcpu.maximum":
					x.maxVCPUs = p.Value.I.(uint32)
				case "balloon.current":
					x.mem = p.Value.I.(uint64)
				case "balloon.maximum":
					x.maxMem = p.Value.I.(uint64)
				case "state.state":
					x.state = p.Value.I.(int32)
				default:
					x.others++
				}
			}
			out[r.Dom.Name] = x
		}
		return out
	}
	vcpuBalloon := uint32(libvirt.DomainStatsVCPU | libvirt.DomainStatsBalloon)

	recs, err := f.ConnectGetAllDomainStats(nil, vcpuBalloon, uint32(libvirt.ConnectGetAllDomainsStatsActive|libvirt.ConnectGetAllDomainsStatsNowait))
	got := read(recs)
	if err != nil || len(got) != 1 || got["on"] != (row{vcpus: 2, maxVCPUs: 4, mem: 1 << 20, maxMem: 2 << 20, others: 4}) {
		t.Fatalf("active = %+v, %v", got, err)
	}
	recs, err = f.ConnectGetAllDomainStats(nil, 0, 0)
	got = read(recs)
	if err != nil || len(got) != 2 || got["off"] != (row{vcpus: 1, maxVCPUs: 1, mem: 1 << 20, maxMem: 1 << 20, state: int32(libvirt.DomainShutoff), others: 1}) {
		t.Fatalf("all groups, all domains = %+v, %v", got, err)
	}
	off, _ := f.DomainLookupByName("off")
	if recs, err := f.ConnectGetAllDomainStats([]libvirt.Domain{off}, vcpuBalloon, 0); err != nil || len(recs) != 1 || recs[0].Dom.Name != "off" {
		t.Fatalf("by domain = %+v, %v", recs, err)
	}
	if _, err := f.ConnectGetAllDomainStats([]libvirt.Domain{off}, vcpuBalloon, uint32(libvirt.ConnectGetAllDomainsStatsActive)); !virt.IsCode(err, libvirt.ErrInvalidArg) {
		t.Errorf("domain list with a filter: %v", err)
	}
	if _, err := f.ConnectGetAllDomainStats(nil, uint32(libvirt.DomainStatsBlock), uint32(libvirt.ConnectGetAllDomainsStatsEnforceStats)); !virt.IsCode(err, libvirt.ErrArgumentUnsupported) {
		t.Errorf("enforced unserved group: %v", err)
	}
	if _, err := f.ConnectGetAllDomainStats(nil, vcpuBalloon, 1<<20); !virt.IsCode(err, libvirt.ErrInvalidArg) {
		t.Errorf("unknown flag: %v", err)
	}
}
