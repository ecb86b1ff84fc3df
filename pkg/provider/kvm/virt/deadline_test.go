package virt_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	testclock "k8s.io/utils/clock/testing"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

func TestCallClasses(t *testing.T) {
	for _, rpc := range virt.RPCNames {
		if _, ok := virt.ClassOf(rpc); !ok {
			t.Errorf("%s has no call class, so no deadline of its own", rpc)
		}
	}
	for rpc, want := range map[string]virt.CallClass{
		virt.RPCDomainLookupByName:    virt.CallQuery,
		virt.RPCDomainGetState:        virt.CallQuery,
		virt.RPCDomainGetMetadata:     virt.CallQuery,
		virt.RPCConnectListAllDomains: virt.CallQuery,
		virt.RPCDomainDefineXMLFlags:  virt.CallChange,
		virt.RPCStorageVolCreateXML:   virt.CallChange,
		virt.RPCDomainCreate:          virt.CallLifecycle,
		virt.RPCDomainDestroyFlags:    virt.CallLifecycle,
		virt.RPCStorageVolUpload:      virt.CallStream,
	} {
		if got, _ := virt.ClassOf(rpc); got != want {
			t.Errorf("ClassOf(%s) = %s, want %s", rpc, got, want)
		}
	}
	if _, ok := virt.ClassOf("virNotAnRPC"); ok {
		t.Error("ClassOf knows an RPC that does not exist")
	}
}

func TestDeadlinesFor(t *testing.T) {
	tests := []struct {
		name string
		d    virt.Deadlines
		want map[virt.CallClass]time.Duration
	}{
		{"zero takes the defaults", virt.Deadlines{}, map[virt.CallClass]time.Duration{
			virt.CallQuery: virt.DefaultQueryDeadline, virt.CallChange: virt.DefaultChangeDeadline,
			virt.CallLifecycle: virt.DefaultLifecycleDeadline, virt.CallStream: virt.DefaultStreamStall}},
		{"set fields win, others default", virt.Deadlines{Query: time.Second, StreamStall: time.Minute}, map[virt.CallClass]time.Duration{
			virt.CallQuery: time.Second, virt.CallChange: virt.DefaultChangeDeadline,
			virt.CallLifecycle: virt.DefaultLifecycleDeadline, virt.CallStream: time.Minute}},
		{"negative: none", virt.Deadlines{Change: -1, Lifecycle: -time.Second}, map[virt.CallClass]time.Duration{
			virt.CallQuery: virt.DefaultQueryDeadline, virt.CallChange: 0, virt.CallLifecycle: 0, virt.CallStream: virt.DefaultStreamStall}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for class, want := range tt.want {
				if got := tt.d.For(class); got != want {
					t.Errorf("For(%s) = %s, want %s", class, got, want)
				}
			}
		})
	}
	// Seconds for reads, longer but bounded for what waits on QEMU.
	if !(virt.DefaultQueryDeadline < virt.DefaultChangeDeadline && virt.DefaultChangeDeadline < virt.DefaultLifecycleDeadline) {
		t.Errorf("defaults out of order: %+v", virt.DefaultDeadlines)
	}
}

// wedged runs call with rpc blocked at the daemon, under a fake clock and
// the default deadlines, and returns once the inner call hangs.
func wedged(t *testing.T, f *fake.Fake, rpc string, call func(virt.Client) error, opts ...virt.Option) (*testclock.FakeClock, <-chan error) {
	t.Helper()
	clk := testclock.NewFakeClock(time.Now())
	t.Cleanup(f.Block(rpc))
	c := virt.Instrument(context.Background(), f, append([]virt.Option{virt.WithHost("hv1"), virt.WithDeadlines(virt.Deadlines{Clock: clk})}, opts...)...)
	res := make(chan error, 1)
	go func() { res <- call(c) }()
	testutil.WaitFor(t, func() bool { return f.Blocked(rpc) == 1 })
	return clk, res
}

// notYet fails the test if the call has returned. Weak on its own (the
// caller may not have been scheduled yet); the fake clock's waiters say
// whether the deadline fired.
func notYet(t *testing.T, res <-chan error, what string) {
	t.Helper()
	select {
	case err := <-res:
		t.Fatalf("%s: returned %v", what, err)
	default:
	}
}

// answer waits for the call's error, up to a generous bound.
func answer(t *testing.T, res <-chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return once its deadline was past")
		return nil
	}
}

// Every RPC the daemon never answers is abandoned at the deadline of its
// class, exactly, with a transient error naming the RPC and the host; the
// connection stays open and the RPC stays with the daemon.
func TestEveryRPCIsAbandonedAtItsClassDeadline(t *testing.T) {
	var covered []string
	for _, m := range everyMethod {
		covered = append(covered, m.rpc)
		t.Run(m.rpc, func(t *testing.T) {
			f := newHost(t)
			h := handles{dom: seed(t, f, false)}
			var err error
			if h.pool, err = f.StoragePoolLookupByName("default"); err != nil {
				t.Fatal(err)
			}
			if h.vol, err = f.StorageVolCreateXML(h.pool, "<volume><name>v</name><capacity>1</capacity></volume>", 0); err != nil {
				t.Fatal(err)
			}
			if h.net, err = f.NetworkLookupByName("default"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if h.cancel != nil {
					h.cancel()
				}
			})
			class, _ := virt.ClassOf(m.rpc)
			limit := virt.DefaultDeadlines.For(class)

			clk, res := wedged(t, f, m.rpc, func(c virt.Client) error { return m.call(c, &h) })
			clk.Step(limit - time.Nanosecond)
			notYet(t, res, "before its deadline")
			if clk.Waiters() != 1 {
				t.Fatalf("%d timers armed a nanosecond before the %s deadline of %s, want 1", clk.Waiters(), class, limit)
			}
			clk.Step(time.Nanosecond)
			err = answer(t, res)

			var de *virt.DeadlineError
			if !errors.As(err, &de) || de.RPC != m.rpc || de.Host != "hv1" || de.Class != class || de.Limit != limit {
				t.Fatalf("err = %#v, want a DeadlineError for %s on hv1 after %s", err, m.rpc, limit)
			}
			what := "did not answer within " + limit.String()
			if class == virt.CallStream {
				what = "made no progress for " + limit.String()
			}
			if want := "libvirt " + m.rpc + " on host hv1 " + what; err.Error() != want {
				t.Errorf("message %q, want %q", err, want)
			}
			if provider.Class(err) != provider.ClassTransient || !provider.HasClass(err) ||
				!errors.Is(err, context.DeadlineExceeded) || virt.ErrorCodeName(err) != "DeadlineExceeded" {
				t.Errorf("%v: class %s, want transient and DeadlineExceeded (metrics: %s)", err, provider.Class(err), virt.ErrorCodeName(err))
			}
			if f.Blocked(m.rpc) != 1 || !f.IsConnected() {
				t.Errorf("abandoning the call touched the daemon: blocked %d, connected %v", f.Blocked(m.rpc), f.IsConnected())
			}
			if clk.Waiters() != 0 {
				t.Errorf("%d timers left armed", clk.Waiters())
			}
		})
	}
	slices.Sort(covered)
	if !slices.Equal(covered, slices.Sorted(slices.Values(virt.RPCNames))) {
		t.Fatalf("covered %v\nwant every RPC %v", covered, virt.RPCNames)
	}
}

// An RPC that answers in time leaves no timer behind, and its caller's
// tracker is already clear when it has the answer.
func TestAnsweredRPCStopsItsDeadline(t *testing.T) {
	f := newHost(t)
	clk := testclock.NewFakeClock(time.Now())
	var rpcs virt.CallTracker
	c := virt.Instrument(context.Background(), f, virt.WithDeadlines(virt.Deadlines{Clock: clk}), virt.WithCallTracker(&rpcs))
	if _, err := c.ConnectGetHostname(); err != nil {
		t.Fatal(err)
	}
	if clk.Waiters() != 0 || rpcs.Running() != 0 {
		t.Fatalf("after the answer: %d timers armed, %d calls counted", clk.Waiters(), rpcs.Running())
	}
}

// The tracker counts an RPC abandoned at its deadline until the daemon
// really answers it.
func TestCallTrackerCountsAbandonedRPCs(t *testing.T) {
	f := newHost(t)
	var rpcs virt.CallTracker
	clk, res := wedged(t, f, virt.RPCDomainLookupByName,
		func(c virt.Client) error { _, err := c.DomainLookupByName("a"); return err }, virt.WithCallTracker(&rpcs))
	clk.Step(virt.DefaultQueryDeadline)
	if err := answer(t, res); !errors.As(err, new(*virt.DeadlineError)) {
		t.Fatalf("err = %v", err)
	}
	if rpcs.Running() != 1 {
		t.Fatalf("tracker counts %d calls, want the abandoned one", rpcs.Running())
	}
	f.ClearFaults() // the daemon answers
	rpcs.Wait()
	if rpcs.Running() != 0 {
		t.Fatalf("tracker counts %d after the answer", rpcs.Running())
	}
}

// WithoutDeadlines leaves the RPC to ctx: no timer, however long it hangs.
func TestWithoutDeadlinesOnlyCtxEndsTheWait(t *testing.T) {
	f := newHost(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk, res := wedged(t, f, virt.RPCConnectGetLibVersion, func(c virt.Client) error {
		_, err := virt.Instrument(ctx, c).ConnectGetLibVersion()
		return err
	}, virt.WithoutDeadlines())
	if clk.Waiters() != 0 {
		t.Fatalf("%d timers armed without deadlines", clk.Waiters())
	}
	clk.Step(time.Hour)
	notYet(t, res, "an hour later, ctx not done")
	cancel()
	if err := answer(t, res); !errors.Is(err, context.Canceled) || errors.As(err, new(*virt.DeadlineError)) {
		t.Fatalf("err = %v, want Canceled", err)
	}
}

// Re-instrumenting keeps the host and the deadlines.
func TestRebindKeepsDeadlinesAndHost(t *testing.T) {
	f := newHost(t)
	clk := testclock.NewFakeClock(time.Now())
	base := virt.Instrument(context.Background(), f, virt.WithHost("hv1"), virt.WithDeadlines(virt.Deadlines{Query: time.Second, Clock: clk}))
	t.Cleanup(f.Block(virt.RPCConnectGetHostname))
	res := make(chan error, 1)
	go func() {
		_, err := virt.Instrument(context.Background(), base).ConnectGetHostname()
		res <- err
	}()
	testutil.WaitFor(t, func() bool { return f.Blocked(virt.RPCConnectGetHostname) == 1 })
	clk.Step(time.Second)
	err := answer(t, res)
	var de *virt.DeadlineError
	if !errors.As(err, &de) || de.Host != "hv1" || de.Limit != time.Second {
		t.Fatalf("err = %v, want the 1s deadline on hv1 kept through the rebind", err)
	}
}

// slowBody steps the clock while the upload's body is read: the time a
// download takes is not libvirt's.
type slowBody struct {
	r    io.Reader
	step func()
}

func (b slowBody) Read(p []byte) (int, error) {
	b.step()
	return b.r.Read(p)
}

// countingBody counts the bytes read from it.
type countingBody struct {
	r io.Reader
	n atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// An upload is bounded by progress: libvirt taking its chunks slowly, or
// the body arriving slowly, never ends it; libvirt not taking the next
// chunk for StreamStall does.
func TestUploadDeadlineIsAStallBound(t *testing.T) {
	const size = 8 * 256 << 10 // eight of the fake's chunks
	payload := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	upload := func(t *testing.T, f *fake.Fake, clk *testclock.FakeClock, body io.Reader) (<-chan error, libvirt.StorageVol) {
		p, err := f.StoragePoolLookupByName("default")
		if err != nil {
			t.Fatal(err)
		}
		v, err := f.StorageVolCreateXML(p, "<volume><name>img</name><capacity>1</capacity></volume>", 0)
		if err != nil {
			t.Fatal(err)
		}
		c := virt.Instrument(context.Background(), f, virt.WithHost("hv1"), virt.WithDeadlines(virt.Deadlines{Clock: clk}))
		res := make(chan error, 1)
		go func() { res <- c.StorageVolUpload(v, body, 0, size, 0) }()
		return res, v
	}
	uploaded := func(t *testing.T, f *fake.Fake) uint64 {
		t.Helper()
		info, ok := f.Volume("default", "img")
		if !ok {
			t.Fatal("volume gone")
		}
		return info.Size
	}

	for _, tt := range []struct {
		name string
		slow func(f *fake.Fake, clk *testclock.FakeClock) io.Reader
	}{
		{"libvirt slow but taking bytes", func(f *fake.Fake, clk *testclock.FakeClock) io.Reader {
			kvmtest.SlowLibvirt(f, clk, virt.DefaultStreamStall*3/4)
			return bytes.NewReader(payload)
		}},
		{"body slow to read: its time is not libvirt's", func(_ *fake.Fake, clk *testclock.FakeClock) io.Reader {
			return slowBody{r: bytes.NewReader(payload), step: func() { kvmtest.StepSettled(clk, 2*virt.DefaultStreamStall) }}
		}},
	} {
		t.Run(tt.name+": not abandoned", func(t *testing.T) {
			f := newHost(t)
			clk := testclock.NewFakeClock(time.Now())
			begin := clk.Now()
			res, _ := upload(t, f, clk, tt.slow(f, clk))
			if err := answer(t, res); err != nil {
				t.Fatalf("slow upload abandoned: %v", err)
			}
			if got := uploaded(t, f); got != size {
				t.Fatalf("uploaded %d of %d bytes", got, size)
			}
			if took := clk.Since(begin); took < virt.DefaultStreamStall {
				t.Fatalf("the upload took %s of the clock's time; the test means more than one stall bound", took)
			}
		})
	}

	t.Run("libvirt stops taking bytes: abandoned after StreamStall, stream aborted", func(t *testing.T) {
		f := newHost(t)
		clk := testclock.NewFakeClock(time.Now())
		const taken = 2 * 256 << 10
		release := f.StallUploads(taken)
		t.Cleanup(release)
		body := &countingBody{r: bytes.NewReader(payload)}
		res, vol := upload(t, f, clk, body)
		testutil.WaitFor(t, func() bool { return f.StalledUploads() == 1 })
		clk.Step(virt.DefaultStreamStall - time.Nanosecond)
		notYet(t, res, "before the stall bound")
		if clk.Waiters() != 1 {
			t.Fatalf("%d timers armed before the stall bound, want 1", clk.Waiters())
		}
		clk.Step(time.Nanosecond)
		err := answer(t, res)
		var de *virt.DeadlineError
		if !errors.As(err, &de) || de.Class != virt.CallStream || provider.Class(err) != provider.ClassTransient ||
			err.Error() != "libvirt virStorageVolUpload on host hv1 made no progress for 2m0s" {
			t.Fatalf("err = %v, want a transient stall naming the RPC and host", err)
		}
		// The daemon takes the stream again: the abandoned upload reads
		// no further from the body, and ends (its volume can go).
		release()
		testutil.WaitFor(t, func() bool { return f.StorageVolDelete(vol, 0) == nil })
		if n := body.n.Load(); n != taken {
			t.Fatalf("abandoned upload read %d bytes of its body, want the %d taken before the stall", n, taken)
		}
	})
}
