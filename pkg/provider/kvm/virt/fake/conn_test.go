package fake_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

type ev struct {
	name   string
	event  libvirt.DomainEventType
	detail int32
}

func recv(t *testing.T, ch <-chan libvirt.DomainEventLifecycleMsg) ev {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatal("event channel closed")
		}
		return ev{m.Dom.Name, libvirt.DomainEventType(m.Event), m.Detail}
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
	return ev{}
}

func waitClosed(t *testing.T, ch <-chan libvirt.DomainEventLifecycleMsg) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("event channel not closed")
		}
	}
}

func TestLifecycleEvents(t *testing.T) {
	f := newFake(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := f.LifecycleEvents(ctx)
	must(t, err)

	h := mustDefine(t, f, dom{name: "a", uuid: uuidA})
	mustDefine(t, f, dom{name: "a", uuid: uuidA})
	must(t, f.DomainCreate(h))
	must(t, f.DomainDestroyFlags(h, 0))
	must(t, f.DomainCreate(h))
	must(t, f.Crash("a"))
	must(t, f.DomainUndefineFlags(h, 0))

	want := []ev{
		{"a", libvirt.DomainEventDefined, int32(libvirt.DomainEventDefinedAdded)},
		{"a", libvirt.DomainEventDefined, int32(libvirt.DomainEventDefinedUpdated)},
		{"a", libvirt.DomainEventStarted, int32(libvirt.DomainEventStartedBooted)},
		{"a", libvirt.DomainEventStopped, int32(libvirt.DomainEventStoppedDestroyed)},
		{"a", libvirt.DomainEventStarted, int32(libvirt.DomainEventStartedBooted)},
		{"a", libvirt.DomainEventStopped, int32(libvirt.DomainEventStoppedCrashed)},
		{"a", libvirt.DomainEventUndefined, int32(libvirt.DomainEventUndefinedRemoved)},
	}
	for i, w := range want {
		if got := recv(t, ch); got != w {
			t.Errorf("event %d: got %+v, want %+v", i, got, w)
		}
	}
	cancel()
	waitClosed(t, ch)
}

func TestDisconnect(t *testing.T) {
	f := newFake(t)
	must(t, f.AddDomain(dom{name: "a"}.xml(), true))
	ch, err := f.LifecycleEvents(context.Background())
	must(t, err)

	release := f.Block(virt.RPCDomainLookupByName)
	defer release()
	inflight := make(chan error, 1)
	go func() { _, err := f.DomainLookupByName("a"); inflight <- err }()
	testutil.WaitFor(t, func() bool { return f.Blocked(virt.RPCDomainLookupByName) == 1 })

	must(t, f.Disconnect())
	waitClosed(t, ch)
	if err := <-inflight; !errors.Is(err, libvirt.ErrInterrupted) {
		t.Errorf("in-flight call: %v, want libvirt.ErrInterrupted", err)
	}
	if f.IsConnected() {
		t.Error("IsConnected after Disconnect")
	}
	select {
	case <-f.Disconnected():
	default:
		t.Error("Disconnected() not closed")
	}

	calls := map[string]func() error{
		"version": func() error { _, err := f.ConnectGetLibVersion(); return err },
		"lookup":  func() error { _, err := f.DomainLookupByName("a"); return err },
		"pool":    func() error { _, err := f.StoragePoolLookupByName("default"); return err },
		"events":  func() error { _, err := f.LifecycleEvents(context.Background()); return err },
		"upload": func() error {
			return f.StorageVolUpload(libvirt.StorageVol{Pool: "default", Name: "x"}, nil, 0, 0, 0)
		},
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, fake.ErrDisconnected) || !errors.Is(err, net.ErrClosed) || !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s after disconnect: %v", name, err)
		}
		if _, isLibvirt := virt.ErrorCode(err); isLibvirt {
			t.Errorf("%s: transport failure looks like a daemon answer: %v", name, err)
		}
	}

	// The daemon is still there for a new connection.
	release()
	c := f.Connect()
	if _, err := c.DomainLookupByName("a"); err != nil {
		t.Fatalf("after reconnect: %v", err)
	}
}

func TestFaultInjection(t *testing.T) {
	injected := virt.NewError(libvirt.ErrInternalError, "internal error: injected")
	tests := []struct {
		name string
		run  func(t *testing.T, f *fake.Fake)
	}{
		{"FailNext fails once, without effect", func(t *testing.T, f *fake.Fake) {
			f.FailNext(virt.RPCDomainDefineXMLFlags, injected)
			_, err := f.DomainDefineXMLFlags(dom{name: "a"}.xml(), 0)
			wantErr(t, err, libvirt.ErrInternalError, "injected")
			if _, ok := f.Domain("a"); ok {
				t.Error("failed define took effect")
			}
			mustDefine(t, f, dom{name: "a"})
		}},
		{"FailNext queues", func(t *testing.T, f *fake.Fake) {
			f.FailNext(virt.RPCConnectGetHostname, injected)
			f.FailNext(virt.RPCConnectGetHostname, injected)
			for i, wantFail := range []bool{true, true, false} {
				if _, err := f.ConnectGetHostname(); (err != nil) != wantFail {
					t.Errorf("call %d: %v", i, err)
				}
			}
		}},
		{"Fail persists until cleared", func(t *testing.T, f *fake.Fake) {
			f.Fail(virt.RPCConnectGetLibVersion, injected)
			for range 3 {
				if _, err := f.ConnectGetLibVersion(); !errors.Is(err, injected) {
					t.Fatalf("got %v", err)
				}
			}
			f.Fail(virt.RPCConnectGetLibVersion, nil)
			if v, err := f.ConnectGetLibVersion(); err != nil || v != fake.DefaultVersion {
				t.Fatalf("after clear: %d %v", v, err)
			}
		}},
		{"FailNextAfter applies the call, loses the reply", func(t *testing.T, f *fake.Fake) {
			f.FailNextAfter(virt.RPCDomainDefineXMLFlags, libvirt.ErrInterrupted)
			_, err := f.DomainDefineXMLFlags(dom{name: "a", uuid: uuidA}.xml(), 0)
			if !errors.Is(err, libvirt.ErrInterrupted) {
				t.Fatalf("got %v", err)
			}
			if _, ok := f.Domain("a"); !ok {
				t.Fatal("call did not take effect")
			}
			mustDefine(t, f, dom{name: "a", uuid: uuidA}) // an idempotent retry works
		}},
		{"Delay", func(t *testing.T, f *fake.Fake) {
			f.Delay(virt.RPCConnectGetHostname, 30*time.Millisecond)
			start := time.Now()
			_, err := f.ConnectGetHostname()
			must(t, err)
			if d := time.Since(start); d < 30*time.Millisecond {
				t.Errorf("returned after %v", d)
			}
		}},
		{"Block until release", func(t *testing.T, f *fake.Fake) {
			release := f.Block(virt.RPCConnectGetHostname)
			done := make(chan error, 2)
			for range 2 {
				go func() { _, err := f.ConnectGetHostname(); done <- err }()
			}
			testutil.WaitFor(t, func() bool { return f.Blocked(virt.RPCConnectGetHostname) == 2 })
			select {
			case err := <-done:
				t.Fatalf("blocked call returned (%v)", err)
			case <-time.After(20 * time.Millisecond):
			}
			release()
			release() // idempotent
			must(t, <-done)
			must(t, <-done)
			_, err := f.ConnectGetHostname() // no longer blocked
			must(t, err)
		}},
		{"Stop hangs every call on every connection until cont", func(t *testing.T, f *fake.Fake) {
			other := f.Connect()
			cont := f.Stop()
			version, lookup := make(chan error, 1), make(chan error, 1)
			go func() { _, err := f.ConnectGetLibVersion(); version <- err }()
			go func() { _, err := other.DomainLookupByName("x"); lookup <- err }()
			testutil.WaitFor(t, func() bool { return f.Stopped() == 2 })
			select {
			case err := <-version:
				t.Fatalf("a call returned from a stopped daemon: %v", err)
			case err := <-lookup:
				t.Fatalf("a call returned from a stopped daemon: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
			if !other.IsConnected() {
				t.Fatal("Stop closed a connection; a stopped daemon keeps its sockets")
			}
			cont()
			cont() // idempotent
			must(t, <-version)
			if err := <-lookup; !virt.IsCode(err, libvirt.ErrNoDomain) {
				t.Errorf("lookup after cont = %v, want the daemon's answer (no domain)", err)
			}
			if n := f.Calls(virt.RPCDomainLookupByName); n != 1 {
				t.Errorf("Calls = %d, want the stopped call counted once", n)
			}
			// A call hanging in a stop returns when its connection drops.
			f.Stop()
			res := make(chan error, 1)
			go func() { _, err := other.ConnectGetHostname(); res <- err }()
			testutil.WaitFor(t, func() bool { return f.Stopped() == 1 })
			_ = other.Disconnect()
			if err := <-res; !errors.Is(err, libvirt.ErrInterrupted) {
				t.Errorf("stopped call on a dropped connection = %v, want ErrInterrupted", err)
			}
			f.ClearFaults() // ends the stop
			_, err := f.ConnectGetHostname()
			must(t, err)
		}},
		{"ClearFaults", func(t *testing.T, f *fake.Fake) {
			f.Fail(virt.RPCConnectGetHostname, injected)
			release := f.Block(virt.RPCConnectGetLibVersion)
			f.ClearFaults()
			defer release() // safe after ClearFaults
			_, err := f.ConnectGetHostname()
			must(t, err)
			_, err = f.ConnectGetLibVersion()
			must(t, err)
		}},
		{"counters", func(t *testing.T, f *fake.Fake) {
			f.ResetCalls()
			f.FailNext(virt.RPCDomainLookupByName, injected)
			for range 3 {
				_, _ = f.DomainLookupByName("x")
			}
			_, _ = f.ConnectGetHostname()
			if n := f.Calls(virt.RPCDomainLookupByName); n != 3 {
				t.Errorf("Calls = %d", n)
			}
			if n := f.TotalCalls(); n != 4 {
				t.Errorf("TotalCalls = %d", n)
			}
		}},
		{"version and hostname", func(t *testing.T, f *fake.Fake) {
			f.SetVersion(10_000_000)
			f.SetHostname("kvm-7")
			v, _ := f.ConnectGetLibVersion()
			h, _ := f.ConnectGetHostname()
			if v != 10_000_000 || h != "kvm-7" {
				t.Errorf("got %d %q", v, h)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, newFake(t)) })
	}
}

// Many goroutines on one host, under -race.
func TestConcurrentUse(t *testing.T) {
	f := newFake(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := f.LifecycleEvents(ctx)
	must(t, err)
	go func() {
		for range events { // a consumer that keeps up
		}
	}()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			c := f.Connect()
			name := fmt.Sprintf("p%d", i)
			h, err := c.DomainDefineXMLFlags(dom{name: name, mac: "auto", agent: true}.xml(), 0)
			if err != nil {
				t.Error(err)
				return
			}
			p, _ := c.StoragePoolLookupByName("default")
			v, err := c.StorageVolCreateXML(p, volXML(name, "<capacity>1</capacity>", "raw", ""), 0)
			if err != nil {
				t.Error(err)
				return
			}
			if err := c.StorageVolUpload(v, bytesReader(1000), 0, 0, 0); err != nil {
				t.Error(err)
			}
			if err := c.DomainCreate(h); err != nil {
				t.Error(err)
			}
			_, _ = c.DomainInterfaceAddresses(h, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
			_, _, _ = c.ConnectListAllDomains(1, 0)
			if err := c.DomainDestroyFlags(h, 0); err != nil {
				t.Error(err)
			}
			if err := c.DomainUndefineFlags(h, libvirt.DomainUndefineNvram); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if names := f.DomainNames(); len(names) != 0 {
		t.Errorf("left over: %v", names)
	}
}

func bytesReader(n int) *errReader { return &errReader{data: make([]byte, n), err: io.EOF} }

// BenchmarkProxyLifecycle is the fake's cost for one proxy's create/delete
// RPC sequence.
func BenchmarkProxyLifecycle(b *testing.B) {
	f := newFake(b)
	p, _ := f.StoragePoolLookupByName("default")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("p%d", i)
		h, err := f.DomainDefineXMLFlags(dom{name: name, mac: "auto", agent: true,
			metadata: `<p:instance xmlns:p="` + ns + `"><p:uid>u</p:uid></p:instance>`}.xml(), 0)
		if err != nil {
			b.Fatal(err)
		}
		v, _ := f.StorageVolCreateXML(p, volXML(name, "<capacity>1</capacity>", "raw", ""), 0)
		_ = f.StorageVolUpload(v, bytesReader(64<<10), 0, 0, 0)
		_ = f.DomainCreate(h)
		_, _ = f.DomainGetMetadata(h, int32(libvirt.DomainMetadataElement), libvirt.OptString{ns}, 0)
		_, _ = f.DomainInterfaceAddresses(h, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
		_ = f.DomainDestroyFlags(h, 0)
		_ = f.DomainUndefineFlags(h, 0)
		_ = f.StorageVolDelete(v, 0)
	}
}

func TestAgentLifecycleEventsFollowTheGuestAgent(t *testing.T) {
	f := newFake(t, fake.WithAgentAutoConnect(false))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := f.SubscribeEvents(ctx, libvirt.DomainEventIDAgentLifecycle, nil)
	must(t, err)
	type agentEv struct {
		dom    string
		state  libvirt.ConnectDomainEventAgentLifecycleState
		reason libvirt.ConnectDomainEventAgentLifecycleReason
	}
	next := func() agentEv {
		t.Helper()
		select {
		case raw, ok := <-ch:
			if !ok {
				t.Fatal("event channel closed")
			}
			m := raw.(*libvirt.DomainEventCallbackAgentLifecycleMsg)
			return agentEv{m.Dom.Name, libvirt.ConnectDomainEventAgentLifecycleState(m.State), libvirt.ConnectDomainEventAgentLifecycleReason(m.Reason)}
		case <-time.After(5 * time.Second):
			t.Fatal("no agent event")
		}
		return agentEv{}
	}

	h := mustDefine(t, f, dom{name: "a", uuid: uuidA, agent: true})
	f.SetAgentConnected("a", true) // not running: no channel to connect
	f.SetAgentConnected("a", false)
	must(t, f.DomainCreate(h))
	f.SetAgentConnected("a", true)
	f.SetAgentConnected("a", true) // no change, no event
	f.SetAgentConnected("a", false)
	must(t, f.DomainDestroyFlags(h, 0))
	f.SetAgentConnected("a", true)
	must(t, f.DomainCreate(h)) // connected at start

	want := []agentEv{
		{"a", libvirt.ConnectDomainEventAgentLifecycleStateConnected, libvirt.ConnectDomainEventAgentLifecycleReasonChannel},
		{"a", libvirt.ConnectDomainEventAgentLifecycleStateDisconnected, libvirt.ConnectDomainEventAgentLifecycleReasonChannel},
		{"a", libvirt.ConnectDomainEventAgentLifecycleStateConnected, libvirt.ConnectDomainEventAgentLifecycleReasonDomainStarted},
	}
	for i, w := range want {
		if got := next(); got != w {
			t.Errorf("event %d: got %+v, want %+v", i, got, w)
		}
	}
	select {
	case raw := <-ch:
		t.Errorf("unexpected event %+v", raw)
	case <-time.After(50 * time.Millisecond):
	}

	if _, err := f.SubscribeEvents(ctx, libvirt.DomainEventIDReboot, nil); !virt.IsCode(err, libvirt.ErrArgumentUnsupported) {
		t.Errorf("unsupported event type: %v, want VIR_ERR_ARGUMENT_UNSUPPORTED", err)
	}
	cancel()
	for range ch {
	}
}
