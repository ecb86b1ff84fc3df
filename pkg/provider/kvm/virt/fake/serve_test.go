package fake_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/remote"
)

// client is what both ends of the conformance tests offer: the in-process
// *fake.Conn and go-libvirt's *libvirt.Libvirt on a served fake.
type client interface {
	virt.Client
	Disconnected() <-chan struct{}
}

// harness opens connections to a fake one way or the other.
type harness struct {
	name    string
	connect func(t *testing.T, f *fake.Fake) func() client
}

var harnesses = []harness{
	{"in-process", func(t *testing.T, f *fake.Fake) func() client {
		return func() client { return f.Connect() }
	}},
	{"served", func(t *testing.T, f *fake.Fake) func() client {
		path := serveFake(t, f)
		return func() client { return dialServed(t, path) }
	}},
}

// serveFake serves f on a unix socket (libvirtd's default bound of 5
// requests per connection) and returns its path.
func serveFake(t *testing.T, f *fake.Fake) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fk") // unix socket paths are short
	must(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", path)
	must(t, err)
	s := fake.Serve(f, ln, remote.Options{MaxClientRequests: 5})
	t.Cleanup(s.Close)
	return path
}

// dialServed connects go-libvirt, as the conn pool does over its SSH
// forward.
func dialServed(t *testing.T, path string) *libvirt.Libvirt {
	t.Helper()
	c, err := net.Dial("unix", path)
	must(t, err)
	lv := libvirt.NewWithDialer(dialers.NewAlreadyConnected(c))
	must(t, lv.ConnectToURI(libvirt.QEMUSystem))
	t.Cleanup(func() { _ = c.Close() })
	return lv
}

// recorder writes what each step returned, in a form both ends must agree
// on: UUIDs (random per fake) as the order they first appeared in, errors
// as libvirt code and message, or the transport failure they are.
type recorder struct {
	lines []string
	uuids map[string]string
}

var uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

func (r *recorder) text(s string) string {
	return uuidRE.ReplaceAllStringFunc(s, func(u string) string {
		if r.uuids == nil {
			r.uuids = map[string]string{}
		}
		if _, ok := r.uuids[u]; !ok {
			r.uuids[u] = fmt.Sprintf("uuid#%d", len(r.uuids))
		}
		return r.uuids[u]
	})
}

func (r *recorder) add(step string, err error, vals ...any) {
	var b strings.Builder
	b.WriteString(step)
	b.WriteString(": ")
	b.WriteString(errClass(err))
	for _, v := range vals {
		switch x := v.(type) {
		case libvirt.UUID:
			v = virt.FormatUUID(x)
		case libvirt.Domain:
			v = fmt.Sprintf("dom{%s %s %d}", x.Name, virt.FormatUUID(x.UUID), x.ID)
		case libvirt.StoragePool:
			v = fmt.Sprintf("pool{%s %s}", x.Name, virt.FormatUUID(x.UUID))
		case libvirt.Network:
			v = fmt.Sprintf("net{%s %s}", x.Name, virt.FormatUUID(x.UUID))
		}
		fmt.Fprintf(&b, " | %v", v)
	}
	r.lines = append(r.lines, r.text(b.String()))
}

func errClass(err error) string {
	var le libvirt.Error
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &le):
		return fmt.Sprintf("libvirt error %d %q", le.Code, le.Message)
	case errors.Is(err, libvirt.ErrInterrupted):
		return "interrupted"
	case errors.Is(err, syscall.EINVAL):
		return "disconnected"
	}
	return "other error " + err.Error()
}

const (
	confUUID = "6f0d2c1e-8a55-4c1b-9d3e-2b7c1a0e5f44"
	confMAC  = "52:54:00:12:34:56"
)

// conformanceScenario drives one connection (reopened where the scenario
// drops it) through what the kvm provider does, and the traps it must
// handle: not-found and exists-already codes, repeated starts and stops,
// metadata namespace stripping, an upload past its length, injected
// failures, a lost reply and a wedged call cut by a dropped connection.
func conformanceScenario(t *testing.T, f *fake.Fake, connect func() client) []string {
	r := &recorder{}
	c := connect()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lifecycle, err := c.LifecycleEvents(ctx)
	r.add("LifecycleEvents", err)
	agentEvents, err := c.SubscribeEvents(ctx, libvirt.DomainEventIDAgentLifecycle, nil)
	r.add("SubscribeEvents agent", err)
	_, err = c.SubscribeEvents(ctx, libvirt.DomainEventIDReboot, nil)
	r.add("SubscribeEvents reboot", err)

	// Daemon and host.
	ver, err := c.ConnectGetLibVersion()
	r.add("ConnectGetLibVersion", err, ver)
	host, err := c.ConnectGetHostname()
	r.add("ConnectGetHostname", err, host)
	model, mem, cpus, mhz, nodes, sockets, cores, threads, err := c.NodeGetInfo()
	r.add("NodeGetInfo", err, model, mem, cpus, mhz, nodes, sockets, cores, threads)
	_, nparams, err := c.NodeGetMemoryStats(0, -1, 0)
	r.add("NodeGetMemoryStats count", err, nparams)
	stats, n, err := c.NodeGetMemoryStats(nparams, -1, 0)
	r.add("NodeGetMemoryStats", err, stats, n)
	_, _, err = c.NodeGetMemoryStats(1, 7, 0)
	r.add("NodeGetMemoryStats bad cell", err)

	// Storage: the image cache and a Proxy's volumes.
	_, err = c.StoragePoolLookupByName("nope")
	r.add("StoragePoolLookupByName missing", err)
	pl, err := c.StoragePoolLookupByName("default")
	r.add("StoragePoolLookupByName", err, pl)
	state, capacity, alloc, avail, err := c.StoragePoolGetInfo(pl)
	r.add("StoragePoolGetInfo", err, state, capacity, alloc, avail)
	r.add("StoragePoolRefresh", c.StoragePoolRefresh(pl, 0))
	_, err = c.StorageVolLookupByName(pl, "base.raw")
	r.add("StorageVolLookupByName missing", err)
	img, err := c.StorageVolCreateXML(pl, volXML("base.raw", "<capacity>0</capacity>", "raw", ""), 0)
	r.add("StorageVolCreateXML", err, img)
	_, err = c.StorageVolCreateXML(pl, volXML("base.raw", "<capacity>0</capacity>", "raw", ""), 0)
	r.add("StorageVolCreateXML again", err)
	body := bytes.Repeat([]byte("0123456789abcdef"), 40<<10) // 640 KiB: several stream messages
	r.add("StorageVolUpload", c.StorageVolUpload(img, bytes.NewReader(body), 0, uint64(len(body)), 0))
	sum, err := f.VolumeSHA256("default", "base.raw")
	r.add("uploaded content", err, sum)
	r.add("StorageVolUpload past its length", c.StorageVolUpload(img, bytes.NewReader(body), 0, 1000, 0))
	r.add("StorageVolUpload missing volume", c.StorageVolUpload(libvirt.StorageVol{Pool: "default", Name: "gone", Key: "gone"}, bytes.NewReader(body), 0, 0, 0))
	typ, vcap, valloc, err := c.StorageVolGetInfo(img)
	r.add("StorageVolGetInfo", err, typ, vcap, valloc)
	path, err := c.StorageVolGetPath(img)
	r.add("StorageVolGetPath", err, path)
	overlay, err := c.StorageVolCreateXML(pl, volXML("disk.qcow2", "", "qcow2", path), 0)
	r.add("StorageVolCreateXML overlay", err, overlay)
	vx, err := c.StorageVolGetXMLDesc(overlay, 0)
	r.add("StorageVolGetXMLDesc", err, vx)
	vols, nv, err := c.StoragePoolListAllVolumes(pl, 1, 0)
	r.add("StoragePoolListAllVolumes", err, vols, nv)
	r.add("StorageVolDelete backing store", c.StorageVolDelete(img, 0))

	// A domain's life.
	_, err = c.DomainLookupByName("a")
	r.add("DomainLookupByName missing", err)
	d := dom{name: "a", uuid: confUUID, mac: confMAC, agent: true, efi: true,
		metadata: `<proxy:instance xmlns:proxy="` + ns + `"><proxy:uid>u-1</proxy:uid></proxy:instance>`}
	h, err := c.DomainDefineXMLFlags(d.xml(), 0)
	r.add("DomainDefineXMLFlags", err, h)
	_, err = c.DomainDefineXMLFlags("<domain><name>bad", 0)
	r.add("DomainDefineXMLFlags bad XML", err)
	h, err = c.DomainLookupByName("a")
	r.add("DomainLookupByName", err, h)
	byUUID, err := c.DomainLookupByUUID(h.UUID)
	r.add("DomainLookupByUUID", err, byUUID)
	md, err := c.DomainGetMetadata(h, int32(libvirt.DomainMetadataElement), libvirt.OptString{ns}, libvirt.DomainAffectConfig)
	r.add("DomainGetMetadata", err, md)
	_, err = c.DomainGetMetadata(h, int32(libvirt.DomainMetadataElement), libvirt.OptString{"urn:none"}, 0)
	r.add("DomainGetMetadata missing", err)
	_, err = c.DomainInterfaceAddresses(h, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
	r.add("DomainInterfaceAddresses shut off", err)
	r.add("DomainCreate", c.DomainCreate(h))
	r.add("DomainCreate again", c.DomainCreate(h))
	st, reason, err := c.DomainGetState(h, 0)
	r.add("DomainGetState", err, st, reason)
	f.SetLease("default", confMAC, "192.168.122.10", "a")
	f.SetAgentAddresses("a", []libvirt.DomainInterface{{Name: "eth0", Hwaddr: libvirt.OptString{confMAC},
		Addrs: []libvirt.DomainIPAddr{{Type: int32(libvirt.IPAddrTypeIpv4), Addr: "192.168.122.10", Prefix: 24}}}})
	for _, src := range []libvirt.DomainInterfaceAddressesSource{libvirt.DomainInterfaceAddressesSrcAgent, libvirt.DomainInterfaceAddressesSrcLease, libvirt.DomainInterfaceAddressesSrcArp} {
		ifaces, err := c.DomainInterfaceAddresses(h, uint32(src), 0)
		r.add(fmt.Sprintf("DomainInterfaceAddresses source %d", src), err, ifaces)
	}
	nw, err := c.NetworkLookupByName("default")
	r.add("NetworkLookupByName", err, nw)
	_, err = c.NetworkLookupByName("nope")
	r.add("NetworkLookupByName missing", err)
	leases, nl, err := c.NetworkGetDhcpLeases(nw, libvirt.OptString{confMAC}, 1, 0)
	for i := range leases {
		leases[i].Expirytime = 0 // the fake's clock
	}
	r.add("NetworkGetDhcpLeases", err, leases, nl)
	doms, nd, err := c.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive)
	r.add("ConnectListAllDomains", err, doms, nd)
	recs, err := c.ConnectGetAllDomainStats(nil, uint32(libvirt.DomainStatsVCPU|libvirt.DomainStatsBalloon), 0)
	r.add("ConnectGetAllDomainStats", err, recs)
	x, err := c.DomainGetXMLDesc(h, 0)
	r.add("DomainGetXMLDesc", err, x)

	// Injected failures travel as the daemon's answers.
	f.FailNext(virt.RPCDomainGetState, virt.NewError(libvirt.ErrOperationFailed, "injected"))
	_, _, err = c.DomainGetState(h, 0)
	r.add("DomainGetState injected failure", err)
	if err := f.Pause("a", libvirt.DomainPausedIoerror); err != nil {
		t.Fatal(err)
	}
	r.add("DomainResume", c.DomainResume(h))

	// A sentinel domain ends each event stream, so everything before it
	// has arrived.
	sentinel(t, r, c, "zz-sentinel1")
	r.add("events", nil, collect(t, lifecycle, "zz-sentinel1"))
	r.add("agent events", nil, collectAgent(t, agentEvents, "zz-sentinel1"))

	// A lost reply: the stop happened, the client does not know; the
	// retry on a new connection finds it done.
	f.FailNextAfter(virt.RPCDomainDestroyFlags, libvirt.ErrInterrupted)
	r.add("DomainDestroyFlags reply lost", c.DomainDestroyFlags(h, 0))
	if _, served := c.(*libvirt.Libvirt); !served {
		_ = c.(*fake.Conn).Disconnect() // what losing a reply means on the wire
	}
	c = connect()
	lifecycle2, err := c.LifecycleEvents(ctx)
	r.add("LifecycleEvents again", err)
	r.add("DomainDestroyFlags retried", c.DomainDestroyFlags(h, 0))
	r.add("DomainUndefineFlags", c.DomainUndefineFlags(h, libvirt.DomainUndefineNvram))
	_, err = c.DomainLookupByUUID(h.UUID)
	r.add("DomainLookupByUUID undefined", err)

	sentinel(t, r, c, "zz-sentinel2")
	r.add("events of the second connection", nil, collect(t, lifecycle2, "zz-sentinel2"))

	// A wedged call, then the connection drops under it.
	release := f.Block(virt.RPCDomainLookupByName)
	defer release()
	inflight := make(chan error, 1)
	go func() { _, err := c.DomainLookupByName("zz"); inflight <- err }()
	testutil.WaitFor(t, func() bool { return f.Blocked(virt.RPCDomainLookupByName) == 1 })
	must(t, f.Disconnect())
	r.add("wedged call when the connection drops", <-inflight)
	select {
	case <-c.Disconnected():
		r.add("Disconnected closed", nil)
	case <-time.After(5 * time.Second):
		r.add("Disconnected not closed", nil)
	}
	_, err = c.ConnectGetLibVersion()
	r.add("call after the drop", err)
	return r.lines
}

// sentinel defines, starts (its agent connects), stops and undefines a
// domain.
func sentinel(t *testing.T, r *recorder, c client, name string) {
	t.Helper()
	h, err := c.DomainDefineXMLFlags(dom{name: name, agent: true}.xml(), 0)
	r.add("define "+name, err)
	r.add("start "+name, c.DomainCreate(h))
	r.add("destroy "+name, c.DomainDestroyFlags(h, 0))
	r.add("undefine "+name, c.DomainUndefineFlags(h, 0))
}

// collect reads lifecycle events until the last one for until, and
// returns them as name/event/detail.
func collect(t *testing.T, ch <-chan libvirt.DomainEventLifecycleMsg, until string) []string {
	t.Helper()
	var out []string
	for {
		select {
		case m, ok := <-ch:
			if !ok {
				return append(out, "closed")
			}
			out = append(out, fmt.Sprintf("%s/%d/%d", m.Dom.Name, m.Event, m.Detail))
			if m.Dom.Name == until && libvirt.DomainEventType(m.Event) == libvirt.DomainEventUndefined {
				return out
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no undefined event of %s; got %v", until, out)
		}
	}
}

// collectAgent reads guest agent events up to until's agent connecting.
func collectAgent(t *testing.T, ch <-chan any, until string) []string {
	t.Helper()
	var out []string
	for {
		select {
		case ev, open := <-ch:
			if !open {
				return append(out, "closed")
			}
			m, ok := ev.(*libvirt.DomainEventCallbackAgentLifecycleMsg)
			if !ok {
				t.Fatalf("agent event of type %T", ev)
			}
			out = append(out, fmt.Sprintf("%s/%d/%d", m.Dom.Name, m.State, m.Reason))
			if m.Dom.Name == until && libvirt.ConnectDomainEventAgentLifecycleState(m.State) == libvirt.ConnectDomainEventAgentLifecycleStateConnected {
				return out
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no agent event of %s; got %v", until, out)
		}
	}
}

// TestServedFakeConformance runs one scenario against the in-process fake
// and against a fake served over libvirt's protocol to go-libvirt, and
// requires the same results, step by step: whatever a test or benchmark
// learns from the in-process fake holds when the manager talks to it as to
// libvirtd.
func TestServedFakeConformance(t *testing.T) {
	results := map[string][]string{}
	for _, h := range harnesses {
		t.Run(h.name, func(t *testing.T) {
			f := newFake(t)
			results[h.name] = conformanceScenario(t, f, h.connect(t, f))
		})
	}
	want, got := results["in-process"], results["served"]
	if len(want) == 0 || len(got) == 0 {
		t.Fatal("a scenario did not run to its end")
	}
	for i := range max(len(want), len(got)) {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			t.Errorf("step %d:\n  in-process: %s\n  served:     %s", i, w, g)
		}
	}
	if testing.Verbose() {
		t.Logf("%d steps agree:\n%s", len(want), strings.Join(want, "\n"))
	}
}
