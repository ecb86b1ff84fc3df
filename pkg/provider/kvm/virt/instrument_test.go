package virt_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

const (
	ns    = "https://proxy.crawl.example.com/xmlns/instance/1"
	uuidA = "0b5a3c3e-6f0e-4d5c-9a53-0c1f0d6b2a11"
)

func domainXML(name string) string {
	return `<domain type='kvm'><name>` + name + `</name><uuid>` + uuidA + `</uuid>` +
		`<metadata><p:instance xmlns:p="` + ns + `"><p:uid>secret-ish-uid</p:uid></p:instance></metadata>` +
		`<memory unit='MiB'>256</memory><os><type arch='x86_64'>hvm</type></os>` +
		`<devices><interface type='network'><mac address='52:54:00:00:00:01'/><source network='default'/></interface>` +
		`<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel></devices></domain>`
}

// logs captures funcr JSON lines.
type logs struct {
	mu    sync.Mutex
	lines []map[string]any
	raw   []string
}

func newLogger(t *testing.T, verbosity int) (logr.Logger, *logs) {
	l := &logs{}
	return funcr.NewJSON(func(obj string) {
		var m map[string]any
		if err := json.Unmarshal([]byte(obj), &m); err != nil {
			t.Errorf("bad log line %s: %v", obj, err)
		}
		l.mu.Lock()
		l.lines = append(l.lines, m)
		l.raw = append(l.raw, obj)
		l.mu.Unlock()
	}, funcr.Options{Verbosity: verbosity}), l
}

func (l *logs) get() ([]map[string]any, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines), strings.Join(l.raw, "\n")
}

func newHost(t *testing.T) *fake.Fake {
	t.Helper()
	f := fake.New()
	f.AddPool("default", 10<<30, true)
	f.AddNetwork("default")
	f.SetLease("default", "52:54:00:00:00:01", "192.168.122.50", "a")
	t.Cleanup(func() { _ = f.Disconnect() })
	return f
}

func seed(t *testing.T, f *fake.Fake, running bool) libvirt.Domain {
	t.Helper()
	if err := f.AddDomain(domainXML("a"), running); err != nil {
		t.Fatal(err)
	}
	h, err := f.Connect().DomainLookupByName("a")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestInstrumentLogs(t *testing.T) {
	type check struct {
		want   map[string]any // subset of the line; "*" = key present
		absent []string
	}
	tests := []struct {
		name      string
		verbosity int
		call      func(t *testing.T, c virt.Client, f *fake.Fake)
		lines     int
		check     check
	}{
		{
			name: "V(0) logs nothing", verbosity: 0, lines: 0,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) { _, _ = c.DomainLookupByName("a") },
		},
		{
			name: "lookup", verbosity: 1, lines: 1,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) { seed(t, f, false); _, _ = c.DomainLookupByName("a") },
			check: check{
				want:   map[string]any{"msg": "libvirt call", "level": 1.0, "rpc": "virDomainLookupByName", "domain": "a", "uuid": uuidA, "id": -1.0, "duration": "*"},
				absent: []string{"err", "code", "codeName"},
			},
		},
		{
			name: "failure carries code and name", verbosity: 1, lines: 1,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) { _, _ = c.DomainLookupByName("nope") },
			check: check{want: map[string]any{"rpc": "virDomainLookupByName", "domain": "nope",
				"err": "Domain not found: no domain with matching name 'nope'", "code": 42.0, "codeName": "ErrNoDomain"}},
		},
		{
			name: "host size", verbosity: 1, lines: 1,
			call:  func(t *testing.T, c virt.Client, f *fake.Fake) { _, _, _, _, _, _, _, _, _ = c.NodeGetInfo() },
			check: check{want: map[string]any{"rpc": "virNodeGetInfo", "cpus": float64(fake.DefaultCPUs), "memoryKiB": float64(fake.DefaultMemoryBytes >> 10)}},
		},
		{
			name: "memory figures by name", verbosity: 1, lines: 1,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) {
				_, _, _ = c.NodeGetMemoryStats(4, int32(libvirt.NodeMemoryStatsAllCells), 0)
			},
			check: check{want: map[string]any{"rpc": "virNodeGetMemoryStats", "nparams": 4.0, "cell": -1.0, "count": 4.0,
				"kib": map[string]any{"total": float64(fake.DefaultMemoryBytes >> 10), "free": float64((fake.DefaultMemoryBytes - fake.DefaultHostUsedBytes) >> 10), "buffers": 0.0, "cached": 0.0}}},
		},
		{
			name: "domain stats count records", verbosity: 1, lines: 1,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) {
				seed(t, f, true)
				_, _ = c.ConnectGetAllDomainStats(nil, 12, 1)
			},
			check: check{want: map[string]any{"rpc": "virConnectGetAllDomainStats", "domains": 0.0, "stats": 12.0, "flags": 1.0, "records": 1.0}},
		},
		{
			name: "define at V(1) has no XML", verbosity: 1, lines: 1,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) { _, _ = c.DomainDefineXMLFlags(domainXML("a"), 0) },
			check: check{
				want:   map[string]any{"rpc": "virDomainDefineXMLFlags", "flags": 0.0, "domain": "a", "uuid": uuidA},
				absent: []string{"xml"},
			},
		},
		{
			name: "define at V(2) has the XML", verbosity: 2, lines: 1,
			call:  func(t *testing.T, c virt.Client, f *fake.Fake) { _, _ = c.DomainDefineXMLFlags(domainXML("a"), 0) },
			check: check{want: map[string]any{"rpc": "virDomainDefineXMLFlags", "level": 1.0, "xml": domainXML("a")}},
		},
		{
			name: "metadata only at V(2)", verbosity: 1, lines: 1,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) {
				h := seed(t, f, false)
				_, _ = c.DomainGetMetadata(h, int32(libvirt.DomainMetadataElement), libvirt.OptString{ns}, 0)
			},
			check: check{
				want:   map[string]any{"rpc": "virDomainGetMetadata", "type": "DomainMetadataElement", "uri": ns},
				absent: []string{"metadata"},
			},
		},
		{
			name: "metadata at V(2)", verbosity: 2, lines: 1,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) {
				h := seed(t, f, false)
				_, _ = c.DomainGetMetadata(h, int32(libvirt.DomainMetadataElement), libvirt.OptString{ns}, 0)
			},
			check: check{want: map[string]any{"metadata": "<instance><uid>secret-ish-uid</uid></instance>"}},
		},
		{
			name: "XML description at V(2)", verbosity: 2, lines: 1,
			call:  func(t *testing.T, c virt.Client, f *fake.Fake) { _, _ = c.DomainGetXMLDesc(seed(t, f, false), 0) },
			check: check{want: map[string]any{"rpc": "virDomainGetXMLDesc", "xml": "*", "bytes": "*"}},
		},
		{
			name: "state", verbosity: 1, lines: 1,
			call:  func(t *testing.T, c virt.Client, f *fake.Fake) { _, _, _ = c.DomainGetState(seed(t, f, true), 0) },
			check: check{want: map[string]any{"rpc": "virDomainGetState", "state": "DomainRunning", "reason": 1.0}},
		},
		{
			name: "addresses", verbosity: 1, lines: 1,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) {
				_, _ = c.DomainInterfaceAddresses(seed(t, f, true), uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
			},
			check: check{want: map[string]any{"rpc": "virDomainInterfaceAddresses", "source": "DomainInterfaceAddressesSrcAgent",
				"count": 2.0, "addresses": []any{"lo=127.0.0.1/8", "lo=::1/128", "eth0=192.168.122.50/24"}}},
		},
		{
			name: "pool info", verbosity: 1, lines: 2,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) {
				p, _ := c.StoragePoolLookupByName("default")
				_, _, _, _, _ = c.StoragePoolGetInfo(p)
			},
			check: check{want: map[string]any{"rpc": "virStoragePoolGetInfo", "pool": "default", "state": "StoragePoolRunning",
				"capacity": float64(10 << 30), "allocation": 0.0, "available": float64(10 << 30)}},
		},
		{
			name: "upload logs offset/length/bytes, never the body", verbosity: 2, lines: 3,
			call: func(t *testing.T, c virt.Client, f *fake.Fake) {
				p, _ := c.StoragePoolLookupByName("default")
				v, err := c.StorageVolCreateXML(p, "<volume><name>seed.iso</name><capacity>1</capacity></volume>", 0)
				if err != nil {
					t.Fatal(err)
				}
				body := strings.Repeat("TOPSECRET-user-data ", 100)
				if err := c.StorageVolUpload(v, strings.NewReader(body), 0, uint64(len(body)), 0); err != nil {
					t.Fatal(err)
				}
			},
			check: check{want: map[string]any{"rpc": "virStorageVolUpload", "pool": "default", "volume": "seed.iso",
				"offset": 0.0, "length": 2000.0, "bytes": "2000"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newHost(t)
			log, captured := newLogger(t, tt.verbosity)
			c := virt.Instrument(logr.NewContext(context.Background(), log), f)
			tt.call(t, c, f)
			lines, raw := captured.get()
			if len(lines) != tt.lines {
				t.Fatalf("got %d lines, want %d:\n%s", len(lines), tt.lines, raw)
			}
			if strings.Contains(raw, "TOPSECRET") {
				t.Fatalf("upload body logged:\n%s", raw)
			}
			if tt.lines == 0 {
				return
			}
			last := lines[len(lines)-1]
			for k, want := range tt.check.want {
				got, ok := last[k]
				switch {
				case !ok:
					t.Errorf("key %q missing in %s", k, raw)
				case want != "*" && fmt.Sprint(got) != fmt.Sprint(want):
					t.Errorf("%s = %v, want %v", k, got, want)
				}
			}
			for _, k := range tt.check.absent {
				if _, ok := last[k]; ok {
					t.Errorf("key %q should be absent: %s", k, raw)
				}
			}
		})
	}
}

// Every Client method goes through Instrument under the same RPC name the
// fake counts and fault-injects by.
func TestInstrumentCoversEveryMethod(t *testing.T) {
	f := newHost(t)
	log, captured := newLogger(t, 1)
	var counter virt.RPCCounter
	c := virt.Instrument(logr.NewContext(context.Background(), log), f, virt.WithObserver(&counter))

	var h handles
	for _, m := range everyMethod {
		_ = m.call(c, &h)
	}
	h.cancel()

	lines, raw := captured.get()
	var logged []string
	for _, l := range lines {
		rpc, _ := l["rpc"].(string)
		logged = append(logged, rpc)
		if l["err"] != nil {
			t.Errorf("unexpected failure: %v", l)
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(logged)), slices.Sorted(slices.Values(virt.RPCNames))) {
		t.Fatalf("logged RPCs %v\nwant %v\n%s", logged, virt.RPCNames, raw)
	}
	for _, rpc := range virt.RPCNames {
		if f.Calls(rpc) != 1 || counter.Count(rpc) != 1 {
			t.Errorf("%s: fake saw %d calls, observer %d", rpc, f.Calls(rpc), counter.Count(rpc))
		}
	}
	if counter.Total() != len(virt.RPCNames) || f.TotalCalls() != len(virt.RPCNames) {
		t.Errorf("totals: observer %d fake %d", counter.Total(), f.TotalCalls())
	}
}

func TestInstrumentCancellation(t *testing.T) {
	t.Run("ctx already done: nothing sent", func(t *testing.T) {
		f := newHost(t)
		var counter virt.RPCCounter
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := virt.Instrument(ctx, f, virt.WithObserver(&counter)).DomainLookupByName("a")
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
		if f.Calls(virt.RPCDomainLookupByName) != 0 || counter.Total() != 0 {
			t.Fatal("a call was made")
		}
	})

	t.Run("blocked call is abandoned at the deadline, late result discarded", func(t *testing.T) {
		f := newHost(t)
		h := seed(t, f, false)
		release := f.Block(virt.RPCDomainCreate)
		defer release()
		var observed []error
		var mu sync.Mutex
		obs := virt.ObserverFunc(func(rpc string, d time.Duration, err error) {
			mu.Lock()
			observed = append(observed, err)
			mu.Unlock()
		})
		log, captured := newLogger(t, 1)
		ctx, cancel := context.WithTimeout(logr.NewContext(context.Background(), log), 50*time.Millisecond)
		defer cancel()

		start := time.Now()
		err := virt.Instrument(ctx, f, virt.WithObserver(obs)).DomainCreate(h)
		elapsed := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want DeadlineExceeded", err)
		}
		if elapsed > 2*time.Second {
			t.Fatalf("returned after %v", elapsed)
		}
		if n := f.Blocked(virt.RPCDomainCreate); n != 1 {
			t.Fatalf("inner call not still blocked (%d)", n)
		}
		if f.IsConnected() != true {
			t.Fatal("connection closed on abandonment")
		}
		mu.Lock()
		if len(observed) != 1 || !errors.Is(observed[0], context.DeadlineExceeded) {
			t.Errorf("observer saw %v", observed)
		}
		mu.Unlock()
		lines, raw := captured.get()
		if len(lines) != 1 || lines[0]["abandoned"] != true {
			t.Errorf("log: %s", raw)
		}

		// The abandoned call completes on its own; its effect lands, its
		// answer goes nowhere.
		release()
		testutil.WaitFor(t, func() bool { d, _ := f.Domain("a"); return d.State == libvirt.DomainRunning })
		mu.Lock()
		if len(observed) != 1 {
			t.Errorf("late result observed: %v", observed)
		}
		mu.Unlock()
	})

	t.Run("abandoned upload stops reading the body", func(t *testing.T) {
		f := newHost(t)
		p, _ := f.StoragePoolLookupByName("default")
		v, err := f.StorageVolCreateXML(p, "<volume><name>img</name><capacity>1</capacity></volume>", 0)
		if err != nil {
			t.Fatal(err)
		}
		pr, pw := io.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- virt.Instrument(ctx, f).StorageVolUpload(v, pr, 0, 0, 0) }()
		if _, err := pw.Write([]byte("chunk1")); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, func() bool { i, _ := f.Volume("default", "img"); return i.Size == 6 })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
		// The read in progress still delivers; the next one fails, which
		// aborts the abandoned upload and frees the volume.
		go func() { _, _ = pw.Write([]byte("chunk2")) }()
		testutil.WaitFor(t, func() bool { return f.StorageVolDelete(v, 0) == nil })
		_ = pw.Close()
	})

	t.Run("abandoned event registration is drained", func(t *testing.T) {
		proceed, entered, drained := make(chan struct{}), make(chan struct{}), make(chan struct{})
		inner := eventsStub{register: func(ctx context.Context) (<-chan libvirt.DomainEventLifecycleMsg, error) {
			close(entered)
			<-proceed
			ch := make(chan libvirt.DomainEventLifecycleMsg) // unbuffered, like go-libvirt's
			go func() {
				for range 3 {
					ch <- libvirt.DomainEventLifecycleMsg{}
				}
				close(ch)
				close(drained)
			}()
			return ch, nil
		}}
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-entered; cancel() }()
		if _, err := virt.Instrument(ctx, inner).LifecycleEvents(context.Background()); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
		close(proceed)
		select {
		case <-drained:
		case <-time.After(5 * time.Second):
			t.Fatal("late event channel not drained")
		}
	})
}

// Many goroutines through one instrumented client, under -race.
func TestInstrumentConcurrent(t *testing.T) {
	f := newHost(t)
	seed(t, f, true)
	log, captured := newLogger(t, 2)
	var counter virt.RPCCounter
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), log))
	defer cancel()
	c := virt.Instrument(ctx, f, virt.WithObserver(&counter))
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			h, err := c.DomainLookupByName("a")
			if err != nil {
				t.Error(err)
				return
			}
			_, _, _ = c.DomainGetState(h, 0)
			_, _ = c.DomainGetXMLDesc(h, 0)
		})
	}
	wg.Wait()
	if lines, _ := captured.get(); len(lines) != 150 || counter.Total() != 150 {
		t.Errorf("lines %d, observed %d, want 150", len(lines), counter.Total())
	}
}

type eventsStub struct {
	virt.Client // nil: only LifecycleEvents is called
	register    func(context.Context) (<-chan libvirt.DomainEventLifecycleMsg, error)
}

func (s eventsStub) LifecycleEvents(ctx context.Context) (<-chan libvirt.DomainEventLifecycleMsg, error) {
	return s.register(ctx)
}

// Re-instrumenting rebinds the context, keeps the observers, traces once.
func TestInstrumentRebind(t *testing.T) {
	f := newHost(t)
	var counter virt.RPCCounter
	ctx1, cancel1 := context.WithCancel(context.Background())
	cancel1()
	base := virt.Instrument(ctx1, f, virt.WithObserver(&counter))

	log, captured := newLogger(t, 1)
	c := virt.Instrument(logr.NewContext(context.Background(), log), base)
	if _, err := c.ConnectGetHostname(); err != nil {
		t.Fatalf("rebound client still uses the old context: %v", err)
	}
	if lines, raw := captured.get(); len(lines) != 1 {
		t.Errorf("want one line:\n%s", raw)
	}
	if counter.Count(virt.RPCConnectGetHostname) != 1 || f.Calls(virt.RPCConnectGetHostname) != 1 {
		t.Errorf("observer %d, fake %d", counter.Count(virt.RPCConnectGetHostname), f.Calls(virt.RPCConnectGetHostname))
	}
}

func TestErrorCodeName(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{virt.NewError(libvirt.ErrNoDomain, "x"), "ErrNoDomain"},
		{fmt.Errorf("wrapped: %w", virt.NewError(libvirt.ErrOperationInvalid, "x")), "ErrOperationInvalid"},
		{fmt.Errorf("libvirt x abandoned: %w", context.Canceled), "Canceled"},
		{fmt.Errorf("libvirt x abandoned: %w", context.DeadlineExceeded), "DeadlineExceeded"},
		{libvirt.ErrInterrupted, "Transport"},
		{fake.ErrDisconnected, "Transport"},
	}
	for _, tt := range tests {
		if got := virt.ErrorCodeName(tt.err); got != tt.want {
			t.Errorf("ErrorCodeName(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// The decorator's own overhead per call, with logging off.
func BenchmarkInstrumentOverhead(b *testing.B) {
	f := fake.New()
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{{"background", context.Background()}, {"cancellable", cancellable(b)}} {
		b.Run(tc.name, func(b *testing.B) {
			var counter virt.RPCCounter
			c := virt.Instrument(tc.ctx, f, virt.WithObserver(&counter))
			b.ReportAllocs()
			for b.Loop() {
				_, _ = c.ConnectGetLibVersion()
			}
		})
	}
}

func cancellable(b *testing.B) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	return ctx
}
