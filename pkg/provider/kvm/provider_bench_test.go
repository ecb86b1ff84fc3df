package kvm_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// benchFleet is n in-memory hosts behind kvmtest.Conns, one provider.
type benchFleet struct {
	prov  *kvm.Provider
	names []string
	fakes map[string]*fake.Fake
	img   *kvmtest.ImageServer
	rpcs  *virt.RPCCounter
}

func newBenchFleet(b *testing.B, n int) *benchFleet {
	b.Helper()
	f := &benchFleet{fakes: map[string]*fake.Fake{}, rpcs: &virt.RPCCounter{}}
	conns := kvmtest.NewConns()
	for i := range n {
		name := fmt.Sprintf("hv%02d", i)
		h := kvmtest.NewHost()
		f.names = append(f.names, name)
		f.fakes[name] = h
		conns.Add(name, h)
	}
	f.img = kvmtest.NewImageServer("debian", 64<<10)
	b.Cleanup(f.img.Close)
	f.prov = kvm.New(kvm.Options{Hosts: kvmtest.NewHosts(f.names...), Pool: conns, Observer: f.rpcs})
	return f
}

func (f *benchFleet) machine(host, name string) *provider.Machine {
	return &provider.Machine{
		Namespace: "bench", Name: name, UID: "uid-" + name, Tag: "bench", Host: host,
		Image: f.img.Image, CPUs: 1, MemoryBytes: 512 << 20, DiskBytes: 10 << 30,
		UserData: []byte("#cloud-config\n"), InstallGuestAgent: true, Port: 3128,
	}
}

// timedCreate creates m and says how long it took.
func (f *benchFleet) timedCreate(m *provider.Machine) (time.Duration, error) {
	start := time.Now()
	_, err := f.prov.Create(context.Background(), m)
	took := time.Since(start)
	if err != nil {
		return took, fmt.Errorf("create %s on %s: %w", m.Name, m.Host, err)
	}
	return took, nil
}

// BenchmarkHealthRound is one health-check round over 50 hosts of which 5
// never answer (fake.Block on virConnectGetLibVersion: the RPC hangs, as on
// a blackholed daemon). Every host is probed concurrently with its own
// 200ms deadline, as the KVMHost controller does (one reconcile per host).
//
// Reported per round:
//
//	round-ms, round/timeout   wall time until all 50 verdicts are in; the
//	                          5 stuck hosts must cost one timeout, not more
//	busy-round-ms             the next round while the 5 probes are still
//	                          hanging: those hosts answer ErrProbeBusy at once
//	create-alone-us           a Create on a healthy host with nothing else
//	                          running (measured in the same iteration)
//	create-in-round-us        the same Create started together with the round
//	create-in-round/alone     their ratio: ~1 means the round does not delay it
//	                          (both are medians over the iterations)
//
// ns/op is the first round only. The release of the blocked RPCs, waiting
// for the abandoned probes to return, and deleting the created domains are
// outside the timer.
func BenchmarkHealthRound(b *testing.B) {
	const (
		hosts   = 50
		stuck   = 5
		timeout = 200 * time.Millisecond
	)
	f := newBenchFleet(b, hosts)
	stuckHosts := f.names[hosts-stuck:]
	createHost := f.names[0]
	ctx := context.Background()

	// Warm up: the image is cached on createHost, every host probed once.
	if _, err := f.prov.Create(ctx, f.machine(createHost, "warmup")); err != nil {
		b.Fatal(err)
	}
	if verdicts := probeRound(f.prov, f.names, timeout); verdicts[crawlv1.HostReadyReason] != hosts {
		b.Fatalf("warm-up round: %v", verdicts)
	}

	var roundTotal, busyTotal time.Duration
	var alones, inRounds []time.Duration
	iter := 0
	for b.Loop() {
		b.StopTimer()
		alone := f.machine(createHost, fmt.Sprintf("alone-%d", iter))
		inRound := f.machine(createHost, fmt.Sprintf("round-%d", iter))
		took, err := f.timedCreate(alone)
		if err != nil {
			b.Fatal(err)
		}
		alones = append(alones, took)
		var releases []func()
		for _, h := range stuckHosts {
			releases = append(releases, f.fakes[h].Block(virt.RPCConnectGetLibVersion))
		}

		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		var createTook time.Duration
		var createErr error
		wg.Go(func() { createTook, createErr = f.timedCreate(inRound) })
		verdicts := probeRound(f.prov, f.names, timeout)
		round := time.Since(start)
		b.StopTimer()
		wg.Wait()
		if createErr != nil {
			b.Fatal(createErr)
		}
		roundTotal += round
		inRounds = append(inRounds, createTook)
		if verdicts[crawlv1.HostReadyReason] != hosts-stuck || verdicts[crawlv1.HostTimeoutReason] != stuck {
			b.Fatalf("round %d verdicts: %v", iter, verdicts)
		}

		// The stuck probes still hang: the next round must not wait for them.
		start = time.Now()
		verdicts = probeRound(f.prov, f.names, timeout)
		busyTotal += time.Since(start)
		if verdicts[crawlv1.HostReadyReason] != hosts-stuck || verdicts[crawlv1.HostTimeoutReason] != stuck {
			b.Fatalf("busy round %d verdicts: %v", iter, verdicts)
		}

		for _, release := range releases {
			release()
		}
		for _, h := range stuckHosts { // until the abandoned probe has returned
			for {
				if _, err := f.prov.Probe(ctx, h); err == nil {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		for _, m := range []*provider.Machine{alone, inRound} {
			if err := f.prov.Delete(ctx, m); err != nil {
				b.Fatal(err)
			}
		}
		iter++
		b.StartTimer()
	}
	n := float64(iter)
	b.ReportMetric(roundTotal.Seconds()*1e3/n, "round-ms")
	b.ReportMetric(roundTotal.Seconds()/n/timeout.Seconds(), "round/timeout")
	b.ReportMetric(busyTotal.Seconds()*1e3/n, "busy-round-ms")
	alone, inRound := median(alones), median(inRounds)
	b.ReportMetric(alone.Seconds()*1e6, "create-alone-us")
	b.ReportMetric(inRound.Seconds()*1e6, "create-in-round-us")
	b.ReportMetric(inRound.Seconds()/alone.Seconds(), "create-in-round/alone")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// probeRound probes every host concurrently, each with its own timeout,
// and returns how many hosts got each Ready reason.
func probeRound(p *kvm.Provider, hosts []string, timeout time.Duration) map[string]int {
	reasons := make([]string, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_, err := p.Probe(ctx, h)
			reasons[i] = kvm.Reason(err)
		})
	}
	wg.Wait()
	out := map[string]int{}
	for _, r := range reasons {
		out[r]++
	}
	return out
}

// BenchmarkSteadyStateGet counts the libvirt RPCs of one Get of a running
// Proxy VM, through the tracing seam (kvm.Options.Observer = a
// virt.RPCCounter), i.e. what every resync of a Ready Proxy costs its host.
// Sub-benchmarks: the guest agent reports the address (the steady state),
// and no address anywhere yet (the whole agent → lease → ARP chain, what a
// booting VM costs per provision poll). rpcs/op is the total; <RPC>/op the
// breakdown.
func BenchmarkSteadyStateGet(b *testing.B) {
	for _, tc := range []struct {
		name    string
		address bool
	}{{"address-from-agent", true}, {"no-address-yet", false}} {
		b.Run(tc.name, func(b *testing.B) {
			f := newBenchFleet(b, 1)
			ctx := context.Background()
			m := f.machine("hv00", "p1")
			inst, err := f.prov.Create(ctx, m)
			if err != nil {
				b.Fatal(err)
			}
			m.ProviderID = inst.ProviderID
			if tc.address {
				f.fakes["hv00"].SetAgentAddresses("bench.p1", []libvirt.DomainInterface{{Name: "eth0",
					Addrs: []libvirt.DomainIPAddr{{Type: int32(libvirt.IPAddrTypeIpv4), Addr: "192.0.2.10", Prefix: 24}}}})
			}
			f.rpcs.Reset()
			b.ReportAllocs()
			for b.Loop() {
				got, err := f.prov.Get(ctx, m)
				if err != nil {
					b.Fatal(err)
				}
				if (got.Address != "") != tc.address {
					b.Fatalf("Get = %+v", got)
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(f.rpcs.Total())/n, "rpcs/op")
			snap := f.rpcs.Snapshot()
			names := make([]string, 0, len(snap))
			for k := range snap {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				b.ReportMetric(float64(snap[k])/n, k+"/op")
			}
		})
	}
}
