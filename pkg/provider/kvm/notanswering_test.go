package kvm_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	testclock "k8s.io/utils/clock/testing"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// verdictClocked is e's provider with health verdicts timed by clk and a
// check interval of interval.
func (e *env) verdictClocked(clk *testclock.FakePassiveClock, interval time.Duration) *kvm.Provider {
	return kvm.New(kvm.Options{Hosts: e.hosts, Pool: e.conns, Observer: e.rpcs, Clock: clk, CheckInterval: interval})
}

// probeTimesOut runs a health check of host that gets no answer: the
// daemon's first RPC of the check hangs past the check's timeout.
func probeTimesOut(t *testing.T, prov *kvm.Provider, host string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := prov.Probe(ctx, host); kvm.Reason(err) != crawlv1.HostTimeoutReason {
		t.Fatalf("probe of a daemon that does not answer = %v (%s), want Timeout", err, kvm.Reason(err))
	}
}

// calls are the provider calls a Proxy reconcile makes.
var calls = []struct {
	name string
	call func(p *kvm.Provider, m *provider.Machine) error
}{
	{"Create", func(p *kvm.Provider, m *provider.Machine) error {
		_, err := p.Create(context.Background(), m)
		return err
	}},
	{"Get", func(p *kvm.Provider, m *provider.Machine) error { _, err := p.Get(context.Background(), m); return err }},
	{"Delete", func(p *kvm.Provider, m *provider.Machine) error { return p.Delete(context.Background(), m) }},
}

// A host whose health check got no answer is not called: Create, Get and
// Delete fail at once, without a single RPC, with a transient
// UnavailableError naming the host; the sweep's listing, image caching and
// pruning are refused the same way; another host is called as usual. The
// check that gets an answer again wakes each Proxy turned away, once.
func TestHostNotAnsweringIsNotCalled(t *testing.T) {
	e := newEnv(t, "hv1", "hv2")
	m := e.created("hv1", "crawl", "p1", "uid-1")
	other := e.created("hv2", "crawl", "p2", "uid-2")
	clk := testclock.NewFakePassiveClock(time.Date(2026, 12, 5, 5, 47, 11, 0, time.UTC))
	prov := e.verdictClocked(clk, 30*time.Second)
	f := e.fakes["hv1"]
	cont := f.Stop()
	t.Cleanup(cont)
	probeTimesOut(t, prov, "hv1")
	f.ResetCalls()

	for _, c := range calls {
		for range 2 { // a Proxy asking again is woken once
			start := time.Now()
			err := c.call(prov, m)
			var unavailable *provider.UnavailableError
			if !errors.As(err, &unavailable) || provider.Class(err) != provider.ClassTransient {
				t.Fatalf("%s on a host that does not answer = %v (class %s), want a transient UnavailableError", c.name, err, provider.Class(err))
			}
			if want := `KVM host "hv1" is not answering (no answer to its health checks since 2026-12-05T05:47:11Z)`; !strings.Contains(err.Error(), want) {
				t.Fatalf("%s = %q, want it to say %q", c.name, err, want)
			}
			if took := time.Since(start); took > time.Second {
				t.Fatalf("%s took %s: it waited on the host", c.name, took)
			}
		}
	}
	if _, err := prov.ListByTag(context.Background(), "test"); !errors.Is(err, provider.ErrUnavailable) || !strings.Contains(err.Error(), `host "hv1"`) {
		t.Fatalf("ListByTag = %v, want hv1's part refused", err)
	}
	// A KVMImage job or prune pass started from a cache that still shows
	// the host Ready is turned away the same way.
	downloads := e.img.Downloads()
	if _, err := prov.EnsureImage(context.Background(), "hv1", e.img.Image, nil); !errors.Is(err, provider.ErrUnavailable) {
		t.Fatalf("EnsureImage = %v, want refused", err)
	}
	if _, err := prov.PruneImages(context.Background(), "hv1", func(string) bool { return false }); !errors.Is(err, provider.ErrUnavailable) {
		t.Fatalf("PruneImages = %v, want refused", err)
	}
	if n := f.TotalCalls(); n != 0 {
		t.Fatalf("%d RPCs sent to the host that does not answer (%v), want none", n, f.CallCounts())
	}
	if n := e.img.Downloads() - downloads; n != 0 {
		t.Fatalf("%d downloads for a host that does not answer, want none", n)
	}
	if _, err := prov.Get(context.Background(), other); err != nil {
		t.Fatalf("Get on the other host: %v", err)
	}
	if len(prov.Events()) != 0 {
		t.Fatal("a Proxy was woken before its host answered")
	}

	// The daemon answers again; once the abandoned check has returned, the
	// next check gets an answer and wakes the Proxy it turned away.
	cont()
	testutil.WaitFor(t, func() bool { _, err := prov.Probe(context.Background(), "hv1"); return err == nil })
	select {
	case ev := <-prov.Events():
		if ev != (kvm.DomainEvent{Host: "hv1", Namespace: "crawl", Name: "p1", HostAnswers: true}) {
			t.Fatalf("wake-up event %+v, want crawl/p1 on hv1 with HostAnswers", ev)
		}
	default:
		t.Fatal("the Proxy turned away was not woken when its host answered")
	}
	if n := len(prov.Events()); n != 0 {
		t.Fatalf("%d more events, want the Proxy woken once", n)
	}
	if _, err := prov.Get(context.Background(), m); err != nil {
		t.Fatalf("Get once the host answers: %v", err)
	}
}

// Only a recent verdict counts: one no check has renewed for three check
// intervals of its host lapses and the host is called again; every check
// that gets no answer renews it (the outage's start stays in the message);
// only Timeout refuses calls, and a host never checked is called.
func TestNotAnsweringVerdictFreshness(t *testing.T) {
	const interval = time.Minute
	t.Run("lapses three intervals after the last check that got no answer", func(t *testing.T) {
		e := newEnv(t, "hv1")
		m := e.created("hv1", "crawl", "p1", "uid-1")
		clk := testclock.NewFakePassiveClock(time.Date(2026, 12, 5, 5, 0, 0, 0, time.UTC))
		prov := e.verdictClocked(clk, interval)
		f := e.fakes["hv1"]
		release := f.Block(virt.RPCConnectGetLibVersion)
		probeTimesOut(t, prov, "hv1")
		release()
		testutil.WaitFor(t, func() bool { return f.Blocked(virt.RPCConnectGetLibVersion) == 0 })

		clk.SetTime(clk.Now().Add(2 * interval))
		// The previous check still hangs or no longer does: either way a
		// Timeout renews the verdict.
		release = f.Block(virt.RPCConnectGetLibVersion)
		probeTimesOut(t, prov, "hv1")
		release()
		clk.SetTime(clk.Now().Add(3*interval - time.Nanosecond))
		_, err := prov.Get(context.Background(), m)
		if !errors.Is(err, provider.ErrUnavailable) || !strings.Contains(err.Error(), "since 2026-12-05T05:00:00Z") {
			t.Fatalf("Get just inside three intervals of the renewed verdict = %v, want refused since the first Timeout", err)
		}
		clk.SetTime(clk.Now().Add(time.Nanosecond))
		f.ResetCalls()
		if _, err := prov.Get(context.Background(), m); err != nil {
			t.Fatalf("Get once the verdict lapsed = %v, want the host called", err)
		}
		if f.TotalCalls() == 0 {
			t.Fatal("the lapsed verdict still kept the call from the host")
		}
	})

	t.Run("a host's own check interval sets the lapse", func(t *testing.T) {
		e := newEnv(t, "hv1")
		m := e.created("hv1", "crawl", "p1", "uid-1")
		e.hosts.SetCheckInterval("hv1", 10*interval)
		clk := testclock.NewFakePassiveClock(time.Now())
		prov := e.verdictClocked(clk, interval)
		release := e.fakes["hv1"].Block(virt.RPCConnectGetLibVersion)
		probeTimesOut(t, prov, "hv1")
		release()
		clk.SetTime(clk.Now().Add(29 * interval))
		if _, err := prov.Get(context.Background(), m); !errors.Is(err, provider.ErrUnavailable) {
			t.Fatalf("Get 29 minutes after a Timeout of a host checked every 10 = %v, want refused", err)
		}
	})

	t.Run("never checked, or checked with another failure: called", func(t *testing.T) {
		e := newEnv(t, "hv1")
		m := e.created("hv1", "crawl", "p1", "uid-1")
		prov := e.verdictClocked(testclock.NewFakePassiveClock(time.Now()), interval)
		if _, err := prov.Get(context.Background(), m); err != nil {
			t.Fatalf("Get on a host never checked: %v", err)
		}
		f := e.fakes["hv1"]
		f.Fail(virt.RPCConnectGetHostname, errors.New("broken pipe"))
		if _, err := prov.Probe(context.Background(), "hv1"); err == nil || kvm.Reason(err) == crawlv1.HostTimeoutReason {
			t.Fatalf("probe = %v (%s), want a failure other than Timeout", err, kvm.Reason(err))
		}
		if _, err := prov.Get(context.Background(), m); err != nil {
			t.Fatalf("Get on a host that answered its check with an error: %v", err)
		}
	})

	t.Run("forgotten with its host", func(t *testing.T) {
		e := newEnv(t, "hv1")
		m := e.created("hv1", "crawl", "p1", "uid-1")
		prov := e.verdictClocked(testclock.NewFakePassiveClock(time.Now()), interval)
		release := e.fakes["hv1"].Block(virt.RPCConnectGetLibVersion)
		probeTimesOut(t, prov, "hv1")
		release()
		prov.ForgetHost("hv1")
		if _, err := prov.Get(context.Background(), m); err != nil {
			t.Fatalf("Get after the host was forgotten and configured again: %v", err)
		}
	})
}

// oneCallNoDeadlines is e's provider with one call slot per host and RPCs
// bounded by their caller only, so a call on a stopped daemon ends when
// something ends it, never at a deadline.
func (e *env) oneCallNoDeadlines(clk *testclock.FakePassiveClock) *kvm.Provider {
	return kvm.New(kvm.Options{Hosts: e.hosts, Pool: e.conns, Observer: e.rpcs, Clock: clk, CheckInterval: 30 * time.Second,
		MaxInFlightPerHost: 1, RPCDeadlines: virt.Deadlines{Query: -1, Change: -1, Lifecycle: -1, StreamStall: -1}})
}

// nextEvent is the provider's next event, failing the test when none
// comes within a second.
func nextEvent(t *testing.T, prov *kvm.Provider) kvm.DomainEvent {
	t.Helper()
	select {
	case ev := <-prov.Events():
		return ev
	case <-time.After(time.Second):
		t.Fatal("no event")
	}
	return kvm.DomainEvent{}
}

// A call already under way when a health check finds its host not
// answering ends then, not at its RPCs' deadlines (minutes for a start or
// an upload): with the UnavailableError a refused call gets, and its Proxy
// woken when the host answers. A Proxy turned away as busy meanwhile is
// woken at the verdict, to be refused as not answering. Without this, a
// Proxy whose call was under way says nothing of its host, and holds a
// worker, for as long as its RPC's deadline.
func TestCallUnderWayEndsAtTheVerdict(t *testing.T) {
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, "hv1")
			m := e.machine("hv1", "crawl", "p1", "uid-1")
			if c.name != "Create" {
				m = e.created("hv1", "crawl", "p1", "uid-1")
			}
			clk := testclock.NewFakePassiveClock(time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC))
			prov := e.oneCallNoDeadlines(clk)
			f := e.fakes["hv1"]
			cont := f.Stop()
			t.Cleanup(cont)

			ended := make(chan error, 1)
			go func() { ended <- c.call(prov, m) }()
			testutil.WaitFor(t, func() bool { return f.Stopped() > 0 })
			busy := e.machine("hv1", "crawl", "p2", "uid-2")
			if _, err := prov.Get(context.Background(), busy); !errors.Is(err, provider.ErrBusy) {
				t.Fatalf("Get while the host's one call slot is taken = %v, want busy", err)
			}

			probeTimesOut(t, prov, "hv1")
			select {
			case err := <-ended:
				var unavailable *provider.UnavailableError
				if !errors.As(err, &unavailable) || !strings.Contains(err.Error(), `KVM host "hv1" is not answering (no answer to its health checks since 2026-12-06T07:00:00Z)`) {
					t.Fatalf("%s under way at the verdict = %v, want the host's UnavailableError", c.name, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s under way still waits on the stopped daemon after the verdict", c.name)
			}
			if ev := nextEvent(t, prov); ev != (kvm.DomainEvent{Host: "hv1", Namespace: "crawl", Name: "p2", SlotFree: true}) {
				t.Fatalf("event at the verdict %+v, want crawl/p2 woken", ev)
			}
			if _, err := prov.Get(context.Background(), busy); !errors.Is(err, provider.ErrUnavailable) {
				t.Fatalf("Get of the Proxy woken = %v, want refused as not answering", err)
			}

			cont()
			testutil.WaitFor(t, func() bool { _, err := prov.Probe(context.Background(), "hv1"); return err == nil })
			woken := map[string]bool{}
			for range 2 {
				ev := nextEvent(t, prov)
				if !ev.HostAnswers || ev.Host != "hv1" {
					t.Fatalf("event once the host answers %+v, want HostAnswers", ev)
				}
				woken[ev.Name] = true
			}
			if !woken["p1"] || !woken["p2"] {
				t.Fatalf("woken when the host answers: %v, want p1 (cut short) and p2 (refused)", woken)
			}
			testutil.WaitFor(t, func() bool { return c.call(prov, m) == nil })
		})
	}
}

// A Proxy turned away because its host has every call slot taken is woken
// when one frees, one Proxy per slot.
func TestBusyRefusalWokenWhenASlotFrees(t *testing.T) {
	e := newEnv(t, "hv1")
	m := e.created("hv1", "crawl", "p1", "uid-1")
	prov := e.oneCallNoDeadlines(testclock.NewFakePassiveClock(time.Now()))
	f := e.fakes["hv1"]
	release := f.Block(virt.RPCDomainLookupByName)
	t.Cleanup(release)
	ended := make(chan error, 1)
	go func() { _, err := prov.Get(context.Background(), m); ended <- err }()
	testutil.WaitFor(t, func() bool { return f.Blocked(virt.RPCDomainLookupByName) > 0 })
	for _, name := range []string{"p2", "p3"} {
		if _, err := prov.Get(context.Background(), e.machine("hv1", "crawl", name, "uid-"+name)); !errors.Is(err, provider.ErrBusy) {
			t.Fatalf("Get of %s = %v, want busy", name, err)
		}
	}
	if n := len(prov.Events()); n != 0 {
		t.Fatalf("%d events before a slot freed", n)
	}
	release()
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, prov)
	if !ev.SlotFree || ev.Host != "hv1" || (ev.Name != "p2" && ev.Name != "p3") {
		t.Fatalf("event when the slot freed %+v, want p2 or p3 woken", ev)
	}
	if n := len(prov.Events()); n != 0 {
		t.Fatalf("%d more events for one free slot, want one Proxy woken", n)
	}
	// The other asks again on its own and gets a slot: nothing is left
	// to wake it for.
	other := map[string]string{"p2": "p3", "p3": "p2"}[ev.Name]
	if _, err := prov.Get(context.Background(), e.machine("hv1", "crawl", other, "uid-"+other)); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("Get of %s with a slot free = %v, want its host's answer (not found)", other, err)
	}
	if n := len(prov.Events()); n != 0 {
		t.Fatalf("%d events after the last Proxy turned away got a slot, want none: %+v", n, <-prov.Events())
	}
}
