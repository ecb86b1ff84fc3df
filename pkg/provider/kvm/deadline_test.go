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
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// callBudget is what the Proxy controller gives each provider call
// (controllers.DefaultProviderCallTimeout): only a backstop once every RPC
// has a deadline of its own.
const callBudget = 10 * time.Minute

// clocked is e's provider again, its RPC deadlines the production ones
// timed by clk.
func (e *env) clocked(clk *testclock.FakeClock, tune ...func(*kvm.Options)) *kvm.Provider {
	opts := kvm.Options{Hosts: e.hosts, Pool: e.conns, Observer: e.rpcs, RPCDeadlines: virt.Deadlines{Clock: clk}}
	for _, t := range tune {
		t(&opts)
	}
	return kvm.New(opts)
}

// async runs call and hands back its error.
func async(call func() error) <-chan error {
	res := make(chan error, 1)
	go func() { res <- call() }()
	return res
}

// result waits for a call's error, within a bound far below callBudget.
func result(t *testing.T, res <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still waiting on the host that does not answer", what)
		return nil
	}
}

// A host whose libvirtd stops answering while SSH stays up: Create, Get
// and Delete each return at the lookup's deadline, not at the caller's
// 10-minute budget, with a transient error naming the RPC and the host.
func TestWedgedLookupEndsTheCallAtTheLookupDeadline(t *testing.T) {
	tests := []struct {
		name string
		call func(ctx context.Context, p *kvm.Provider, m *provider.Machine) error
	}{
		{"Create", func(ctx context.Context, p *kvm.Provider, m *provider.Machine) error {
			_, err := p.Create(ctx, m)
			return err
		}},
		{"Get", func(ctx context.Context, p *kvm.Provider, m *provider.Machine) error {
			_, err := p.Get(ctx, m)
			return err
		}},
		{"Delete", func(ctx context.Context, p *kvm.Provider, m *provider.Machine) error { return p.Delete(ctx, m) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "hv1")
			m := e.created("hv1", "crawl", "p1", "uid-1")
			clk := testclock.NewFakeClock(time.Now())
			prov := e.clocked(clk)
			f := e.fakes["hv1"]
			t.Cleanup(f.Block(virt.RPCDomainLookupByName))
			ctx, cancel := context.WithTimeout(context.Background(), callBudget)
			defer cancel()

			res := async(func() error { return tt.call(ctx, prov, m) })
			testutil.WaitFor(t, func() bool { return f.Blocked(virt.RPCDomainLookupByName) == 1 })
			// The deadline the lookup got is the lookup class's: one
			// nanosecond short of it the call still waits.
			clk.Step(virt.DefaultQueryDeadline - time.Nanosecond)
			if clk.Waiters() != 1 {
				t.Fatalf("%d deadlines armed a nanosecond before the lookup's, want the lookup's", clk.Waiters())
			}
			clk.Step(time.Nanosecond)
			err := result(t, res, tt.name)

			want := "libvirt virDomainLookupByName on host hv1 did not answer within 10s"
			if provider.Class(err) != provider.ClassTransient || !strings.Contains(err.Error(), want) {
				t.Fatalf("%s = %v (class %s); want a transient error saying %q", tt.name, err, provider.Class(err), want)
			}
			if !errors.As(err, new(*virt.DeadlineError)) || errors.Is(err, provider.ErrBusy) || ctx.Err() != nil {
				t.Fatalf("%s = %v; want the lookup's own deadline, not busy or the caller's", tt.name, err)
			}
		})
	}
}

// A call whose RPC was abandoned at the RPC's deadline counts against
// MaxInFlightPerHost until the daemon answers it, as a call abandoned at
// the caller's deadline does: each deadline must not hand the wedged host
// another worker.
func TestRPCAbandonedAtItsDeadlineKeepsTheHostBusy(t *testing.T) {
	e := newEnv(t, "hv1", "hv2")
	stuck, other := e.created("hv1", "a", "p1", "u1"), e.created("hv2", "b", "p2", "u2")
	clk := testclock.NewFakeClock(time.Now())
	prov := e.clocked(clk, func(o *kvm.Options) { o.MaxInFlightPerHost = 1 })
	f := e.fakes["hv1"]
	release := f.Block(virt.RPCDomainLookupByName)
	t.Cleanup(release)

	res := async(func() error { _, err := prov.Get(context.Background(), stuck); return err })
	testutil.WaitFor(t, func() bool { return f.Blocked(virt.RPCDomainLookupByName) == 1 })
	clk.Step(virt.DefaultQueryDeadline)
	if err := result(t, res, "first Get"); !errors.As(err, new(*virt.DeadlineError)) {
		t.Fatalf("first Get = %v, want the lookup's deadline", err)
	}

	err := result(t, async(func() error { _, err := prov.Get(context.Background(), stuck); return err }), "second Get")
	if !errors.Is(err, provider.ErrBusy) || provider.Class(err) != provider.ClassTransient {
		t.Fatalf("second Get while the abandoned lookup runs = %v, want a transient provider.ErrBusy", err)
	}
	if n := f.Blocked(virt.RPCDomainLookupByName); n != 1 {
		t.Fatalf("%d lookups hang on the host, want only the abandoned one", n)
	}
	if _, err := prov.Get(context.Background(), other); err != nil {
		t.Fatalf("Get on another host: %v", err)
	}

	release() // the daemon answers: the host is free again
	testutil.WaitFor(t, func() bool { _, err := prov.Get(context.Background(), stuck); return err == nil })
}

// An image upload libvirt takes slowly, chunk by chunk, is not abandoned
// however long it takes in all; one libvirt stops taking is, after the
// stall bound, and Create says so.
func TestUploadIsBoundedByProgress(t *testing.T) {
	t.Run("slow but moving: cached", func(t *testing.T) {
		e := newEnv(t, "hv1")
		img := kvmtest.NewImageServer("big", 2<<20) // several chunks
		t.Cleanup(img.Close)
		clk := testclock.NewFakeClock(time.Now())
		prov := e.clocked(clk)
		f := e.fakes["hv1"]
		kvmtest.SlowLibvirt(f, clk, virt.DefaultStreamStall*3/4)
		start := clk.Now()

		got, err := prov.EnsureImage(context.Background(), "hv1", img.Image, nil)
		if err != nil {
			t.Fatalf("slow upload: %v", err)
		}
		if took := clk.Since(start); got.Bytes != 2<<20 || took < 4*virt.DefaultStreamStall {
			t.Fatalf("EnsureImage = %+v in %s; want all 2 MiB, taken slowly over several stall bounds", got, took)
		}
	})

	t.Run("stalled: Create fails transiently at the stall bound", func(t *testing.T) {
		e := newEnv(t, "hv1")
		clk := testclock.NewFakeClock(time.Now())
		prov := e.clocked(clk)
		f := e.fakes["hv1"]
		t.Cleanup(f.StallUploads(0))

		res := async(func() error {
			_, err := prov.Create(context.Background(), e.machine("hv1", "crawl", "p1", "uid-1"))
			return err
		})
		testutil.WaitFor(t, func() bool { return f.StalledUploads() == 1 })
		clk.Step(virt.DefaultStreamStall - time.Nanosecond)
		if clk.Waiters() != 1 {
			t.Fatalf("%d deadlines armed before the stall bound, want the upload's", clk.Waiters())
		}
		clk.Step(time.Nanosecond)
		err := result(t, res, "Create")
		want := "libvirt virStorageVolUpload on host hv1 made no progress for 2m0s"
		if provider.Class(err) != provider.ClassTransient || !strings.Contains(err.Error(), want) {
			t.Fatalf("Create = %v (class %s); want a transient error saying %q", err, provider.Class(err), want)
		}
		if _, ok := f.Domain("crawl.p1"); ok {
			t.Fatal("domain defined without its image")
		}
	})
}

// The health probe keeps its own bound, the check timeout: its RPCs get no
// per-RPC deadline, and it abandons them without touching the link.
func TestProbeKeepsTheCheckTimeout(t *testing.T) {
	e := newEnv(t, "hv1")
	clk := testclock.NewFakeClock(time.Now())
	prov := e.clocked(clk)
	f := e.fakes["hv1"]
	t.Cleanup(f.Block(virt.RPCConnectGetLibVersion))
	ctx, cancel := context.WithCancel(context.Background())
	res := async(func() error { _, err := prov.Probe(ctx, "hv1"); return err })
	testutil.WaitFor(t, func() bool { return f.Blocked(virt.RPCConnectGetLibVersion) == 1 })
	if clk.Waiters() != 0 {
		t.Fatalf("the probe's RPC got a deadline of its own (%d armed)", clk.Waiters())
	}
	clk.Step(time.Hour)
	notYet := len(res) == 0
	cancel() // the check ends
	if err := result(t, res, "Probe"); !notYet || !errors.Is(err, context.Canceled) || errors.As(err, new(*virt.DeadlineError)) {
		t.Fatalf("Probe = %v (returned before its context ended: %v), want it ended by its context only", err, !notYet)
	}
	// Abandoned, not dropped: the next probe is busy until the RPC returns.
	if _, err := prov.Probe(context.Background(), "hv1"); !errors.Is(err, kvm.ErrProbeBusy) || kvm.Reason(err) != crawlv1.HostTimeoutReason {
		t.Fatalf("probe while the abandoned one runs = %v, want ErrProbeBusy", err)
	}
}
