package kvm_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/image"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

type env struct {
	t     *testing.T
	prov  *kvm.Provider
	conns *kvmtest.Conns
	hosts *kvmtest.Hosts
	fakes map[string]*fake.Fake
	img   *kvmtest.ImageServer
	rpcs  *virt.RPCCounter
}

func newEnv(t *testing.T, hostNames ...string) *env {
	t.Helper()
	e := &env{t: t, conns: kvmtest.NewConns(), hosts: kvmtest.NewHosts(hostNames...), fakes: map[string]*fake.Fake{}, rpcs: &virt.RPCCounter{}}
	for _, h := range hostNames {
		f := kvmtest.NewHost()
		e.fakes[h] = f
		e.conns.Add(h, f)
	}
	e.img = kvmtest.NewImageServer("debian", 64<<10)
	t.Cleanup(e.img.Close)
	e.prov = kvm.New(kvm.Options{Hosts: e.hosts, Pool: e.conns, Observer: e.rpcs})
	return e
}

func (e *env) machine(host, ns, name, uid string) *provider.Machine {
	return &provider.Machine{
		Namespace: ns, Name: name, UID: uid, Tag: "test", Host: host,
		Image: e.img.Image, CPUs: 1, MemoryBytes: 512 << 20, DiskBytes: 10 << 30,
		UserData: []byte("#cloud-config\n"), InstallGuestAgent: true, Port: 3128,
	}
}

// created is machine, created on its host, with its providerID recorded as
// the Proxy controller records it.
func (e *env) created(host, ns, name, uid string) *provider.Machine {
	e.t.Helper()
	m := e.machine(host, ns, name, uid)
	inst, err := e.prov.Create(context.Background(), m)
	if err != nil {
		e.t.Fatal(err)
	}
	m.ProviderID = inst.ProviderID
	return m
}

func volumes(f *fake.Fake, uid string) (disk, seed bool) {
	_, disk = f.Volume(kvmtest.PoolName, domxml.DiskVolumeName(uid))
	_, seed = f.Volume(kvmtest.PoolName, domxml.SeedVolumeName(uid))
	return disk, seed
}

func TestCreateGetDelete(t *testing.T) {
	e := newEnv(t, "hv1")
	ctx := context.Background()
	m := e.machine("hv1", "crawl", "p1", "uid-1")
	f := e.fakes["hv1"]

	inst, err := e.prov.Create(ctx, m)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	host, uuid, err := provider.ParseKVMProviderID(inst.ProviderID)
	if err != nil || host != "hv1" {
		t.Fatalf("providerID %q: %v", inst.ProviderID, err)
	}
	d, ok := f.Domain("crawl.p1")
	if !ok || d.State != libvirt.DomainRunning || virt.FormatUUID(d.UUID) != uuid {
		t.Fatalf("domain after Create: %+v ok=%v", d, ok)
	}
	if disk, seed := volumes(f, "uid-1"); !disk || !seed {
		t.Fatalf("volumes after Create: disk=%v seed=%v", disk, seed)
	}
	if !strings.Contains(d.ConfigXML, "uid-1") || strings.Contains(d.ConfigXML, "type=\"volume\"") {
		t.Fatalf("domain XML lacks metadata or uses volume references:\n%s", d.ConfigXML)
	}

	// Idempotent: a second Create defines nothing and downloads nothing.
	defines, downloads := f.Calls(virt.RPCDomainDefineXMLFlags), e.img.Downloads()
	m.ProviderID = inst.ProviderID
	if _, err := e.prov.Create(ctx, m); err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if f.Calls(virt.RPCDomainDefineXMLFlags) != defines || e.img.Downloads() != downloads {
		t.Fatalf("second Create redefined (%d→%d) or re-downloaded (%d→%d)", defines, f.Calls(virt.RPCDomainDefineXMLFlags), downloads, e.img.Downloads())
	}

	// Address from the guest agent, skipping its loopback.
	f.SetAgentAddresses("crawl.p1", []libvirt.DomainInterface{{Name: "eth0", Addrs: []libvirt.DomainIPAddr{
		{Type: int32(libvirt.IPAddrTypeIpv4), Addr: "169.254.3.3", Prefix: 16},
		{Type: int32(libvirt.IPAddrTypeIpv4), Addr: "192.0.2.10", Prefix: 24}}}})
	got, err := e.prov.Get(ctx, m)
	if err != nil || got.State != provider.StateRunning || got.Address != "192.0.2.10" || got.AddressSource != provider.AddressSourceAgent {
		t.Fatalf("Get = %+v, %v", got, err)
	}

	if err := e.prov.Delete(ctx, m); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, ok := f.Domain("crawl.p1"); ok {
		t.Fatal("domain survived Delete")
	}
	if disk, seed := volumes(f, "uid-1"); disk || seed {
		t.Fatalf("volumes survived Delete: disk=%v seed=%v", disk, seed)
	}
	if !f.NVRAMRemoved("crawl.p1") {
		t.Fatal("Delete did not remove the NVRAM")
	}
	if err := e.prov.Delete(ctx, m); err != nil {
		t.Fatalf("Delete of a gone domain: %v", err)
	}
	if _, err := e.prov.Get(ctx, m); provider.Class(err) != provider.ClassNotFound {
		t.Fatalf("Get after Delete: %v (class %s)", err, provider.Class(err))
	}
}

func TestAddressWaitSaysWhatIsMissing(t *testing.T) {
	e := newEnv(t, "hv1")
	ctx := context.Background()
	m := e.machine("hv1", "crawl", "p1", "uid-1")
	if _, err := e.prov.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	e.fakes["hv1"].SetAgentConnected("crawl.p1", false)
	got, err := e.prov.Get(ctx, m)
	if err != nil || got.Address != "" || !strings.Contains(got.Message, "guest agent not connected") || !strings.Contains(got.Message, "no DHCP lease") {
		t.Fatalf("Get without agent: %+v, %v", got, err)
	}
}

func TestIdentity(t *testing.T) {
	ctx := context.Background()
	foreignXML := `<domain type="kvm"><name>crawl.p1</name><memory unit="MiB">64</memory><os><type arch="x86_64" machine="q35">hvm</type></os></domain>`

	t.Run("foreign domain with the Proxy's name is never touched", func(t *testing.T) {
		e := newEnv(t, "hv1")
		f := e.fakes["hv1"]
		if err := f.AddDomain(foreignXML, true); err != nil {
			t.Fatal(err)
		}
		m := e.machine("hv1", "crawl", "p1", "uid-1")
		for name, call := range map[string]func() error{
			"Create": func() error { _, err := e.prov.Create(ctx, m); return err },
			"Get":    func() error { _, err := e.prov.Get(ctx, m); return err },
			"Delete": func() error { return e.prov.Delete(ctx, m) },
		} {
			err := call()
			var idErr *provider.IdentityError
			if !errors.As(err, &idErr) || provider.Class(err) != provider.ClassPermanent || !strings.Contains(err.Error(), "crawl.p1") {
				t.Errorf("%s on a foreign domain: %v", name, err)
			}
		}
		if d, ok := f.Domain("crawl.p1"); !ok || d.State != libvirt.DomainRunning {
			t.Fatalf("foreign domain was touched: %+v %v", d, ok)
		}
		if f.Calls(virt.RPCDomainDestroyFlags)+f.Calls(virt.RPCDomainUndefineFlags) != 0 {
			t.Fatal("destroy or undefine was called on a foreign domain")
		}
	})

	t.Run("a failed metadata read is not a foreign domain", func(t *testing.T) {
		for name, readErr := range map[string]error{
			"interrupted call": libvirt.ErrInterrupted,
			"daemon error":     virt.NewError(libvirt.ErrInternalError, "internal error: client socket is closed"),
		} {
			t.Run(name, func(t *testing.T) {
				e := newEnv(t, "hv1")
				f := e.fakes["hv1"]
				m := e.created("hv1", "crawl", "p1", "uid-1")
				for call, do := range map[string]func() error{
					"Create": func() error { _, err := e.prov.Create(ctx, m); return err },
					"Get":    func() error { _, err := e.prov.Get(ctx, m); return err },
					"Delete": func() error { return e.prov.Delete(ctx, m) },
				} {
					f.FailNext(virt.RPCDomainGetMetadata, readErr)
					err := do()
					var idErr *provider.IdentityError
					if errors.As(err, &idErr) || provider.Class(err) != provider.ClassTransient {
						t.Errorf("%s with a failed metadata read: %v (class %s), want transient and no IdentityError", call, err, provider.Class(err))
					}
				}
				if _, ok := f.Domain("crawl.p1"); !ok {
					t.Fatal("the domain was deleted although its metadata could not be read")
				}
				if got, err := e.prov.Get(ctx, m); err != nil || got.State != provider.StateRunning {
					t.Fatalf("Get once the read works = %+v, %v", got, err)
				}
			})
		}
	})

	t.Run("domain recreated by hand with a new UUID", func(t *testing.T) {
		e := newEnv(t, "hv1")
		f := e.fakes["hv1"]
		m := e.machine("hv1", "crawl", "p1", "uid-1")
		inst, err := e.prov.Create(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := f.Domain("crawl.p1")
		// Undefine and define the same XML without its UUID: same metadata,
		// new UUID, as `virsh undefine; virsh define` of an edited dump does.
		_ = f.DomainDestroyFlags(libvirt.Domain{Name: d.Name, UUID: d.UUID}, 0)
		if err := f.DomainUndefineFlags(libvirt.Domain{Name: d.Name, UUID: d.UUID}, libvirt.DomainUndefineNvram); err != nil {
			t.Fatal(err)
		}
		xml := stripUUID(d.ConfigXML)
		if err := f.AddDomain(xml, true); err != nil {
			t.Fatal(err)
		}
		m.ProviderID = inst.ProviderID
		err = e.prov.Delete(ctx, m)
		var idErr *provider.IdentityError
		if !errors.As(err, &idErr) || !strings.Contains(idErr.Mismatch, "UUID") {
			t.Fatalf("Delete of a recreated domain: %v", err)
		}
		if _, ok := f.Domain("crawl.p1"); !ok {
			t.Fatal("recreated domain was deleted")
		}
		if disk, _ := volumes(f, "uid-1"); !disk {
			t.Fatal("volumes were removed although the domain check failed")
		}
	})

	t.Run("two namespaces, one Proxy name, one host", func(t *testing.T) {
		e := newEnv(t, "hv1")
		f := e.fakes["hv1"]
		a, b := e.machine("hv1", "team-a", "p1", "uid-a"), e.machine("hv1", "team-b", "p1", "uid-b")
		for _, m := range []*provider.Machine{a, b} {
			if _, err := e.prov.Create(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.prov.Delete(ctx, a); err != nil {
			t.Fatal(err)
		}
		if _, ok := f.Domain("team-b.p1"); !ok {
			t.Fatal("deleting team-a/p1 removed team-b/p1")
		}
		if disk, seed := volumes(f, "uid-b"); !disk || !seed {
			t.Fatal("deleting team-a/p1 removed team-b/p1's volumes")
		}
	})
}

func stripUUID(xml string) string {
	i := strings.Index(xml, "<uuid>")
	j := strings.Index(xml, "</uuid>")
	if i < 0 || j < 0 {
		return xml
	}
	return xml[:i] + xml[j+len("</uuid>"):]
}

func TestUnconfiguredHost(t *testing.T) {
	e := newEnv(t, "hv1")
	ctx := context.Background()
	m := e.machine("typo-host", "crawl", "p1", "uid-1")
	if err := e.prov.Delete(ctx, m); err != nil {
		t.Fatalf("Delete on an unconfigured host must be a no-op success: %v", err)
	}
	_, err := e.prov.Get(ctx, m)
	if provider.Class(err) != provider.ClassPermanent {
		t.Fatalf("Get on an unconfigured host must be permanent (never NotFound, which would rebuild): %v class %s", err, provider.Class(err))
	}
}

func TestChecksumMismatchBootsNothing(t *testing.T) {
	e := newEnv(t, "hv1")
	m := e.machine("hv1", "crawl", "p1", "uid-1")
	m.Image.Checksum = "sha256:" + strings.Repeat("0", 64)
	_, err := e.prov.Create(context.Background(), m)
	if provider.Class(err) != provider.ClassPermanent || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("Create with a corrupt image: %v", err)
	}
	f := e.fakes["hv1"]
	if len(f.DomainNames()) != 0 {
		t.Fatalf("a domain was defined from a corrupt image: %v", f.DomainNames())
	}
}

func TestListByTag(t *testing.T) {
	e := newEnv(t, "hv1", "hv2")
	ctx := context.Background()
	for _, m := range []*provider.Machine{e.machine("hv1", "a", "p1", "u1"), e.machine("hv2", "b", "p2", "u2")} {
		if _, err := e.prov.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	other := e.machine("hv1", "c", "p3", "u3")
	other.Tag = "another-install"
	if _, err := e.prov.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := e.fakes["hv2"].AddDomain(`<domain type="kvm"><name>hand-made</name><memory unit="MiB">64</memory><os><type arch="x86_64" machine="q35">hvm</type></os></domain>`, false); err != nil {
		t.Fatal(err)
	}
	list, err := e.prov.ListByTag(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]string{}
	for _, inst := range list {
		owners[inst.Owner.UID] = inst.Host
	}
	if len(list) != 2 || owners["u1"] != "hv1" || owners["u2"] != "hv2" {
		t.Fatalf("ListByTag = %+v", list)
	}

	// An unreachable host fails the listing but not the other hosts' part.
	e.conns.FailDial("hv2", provider.Transientf("tcp connect refused"))
	list, err = e.prov.ListByTag(ctx, "test")
	if err == nil || len(list) != 1 || list[0].Owner.UID != "u1" {
		t.Fatalf("ListByTag with hv2 down = %+v, %v", list, err)
	}
}

func TestProbe(t *testing.T) {
	ctx := context.Background()
	t.Run("healthy", func(t *testing.T) {
		e := newEnv(t, "hv1")
		h, err := e.prov.Probe(ctx, "hv1")
		if err != nil || h.LibvirtVersion != "11.6.0" || h.Hostname == "" || h.Pool.Capacity != kvmtest.PoolBytes || h.Pool.Available == 0 {
			t.Fatalf("Probe = %+v, %v", h, err)
		}
	})
	t.Run("capacity: the host's size and what its running domains take", func(t *testing.T) {
		e := newEnv(t)
		f := kvmtest.NewHost(fake.WithHostSize(8, 16<<30))
		f.SetHostMemoryUsed(1 << 30)
		f.SetPageCache(256<<20, 768<<20)
		e.hosts.Add("hv1")
		e.conns.Add("hv1", f)
		a := e.machine("hv1", "ns", "a", "u1")
		a.CPUs, a.MemoryBytes = 2, 2<<30
		if _, err := e.prov.Create(ctx, a); err != nil {
			t.Fatal(err)
		}
		e.created("hv1", "ns", "b", "u2") // 1 vCPU, 512Mi
		stopped := e.created("hv1", "ns", "c", "u3")
		if err := e.prov.Delete(ctx, stopped); err != nil {
			t.Fatal(err)
		}
		foreignOff := `<domain type='kvm'><name>foreign</name><memory unit='GiB'>4</memory><vcpu>4</vcpu><os><type>hvm</type></os></domain>`
		if err := f.AddDomain(foreignOff, false); err != nil {
			t.Fatal(err)
		}
		h, err := e.prov.Probe(ctx, "hv1")
		want := kvm.CapacityHealth{CPUs: 8, MemoryBytes: 16 << 30,
			// 16Gi - 1Gi host - 2.5Gi domains; the 1Gi of cache counts as free.
			FreeMemoryBytes: 16<<30 - 1<<30 - 2<<30 - 512<<20,
			RunningDomains:  2, AllocatedVCPUs: 3, AllocatedMemoryBytes: 2<<30 + 512<<20}
		if err != nil || h.Capacity != want {
			t.Fatalf("Probe capacity = %+v, %v\nwant %+v", h.Capacity, err, want)
		}
	})
	t.Run("capacity unreadable: the check fails", func(t *testing.T) {
		e := newEnv(t, "hv1")
		e.fakes["hv1"].FailNext(virt.RPCNodeGetMemoryStats, virt.NewError(libvirt.ErrInternalError, "no available memory line found"))
		_, err := e.prov.Probe(ctx, "hv1")
		if err == nil || kvm.Reason(err) != crawlv1.HostProbeFailedReason {
			t.Fatalf("reason %q for %v", kvm.Reason(err), err)
		}
	})
	t.Run("pool inactive", func(t *testing.T) {
		e := newEnv(t, "hv1")
		e.fakes["hv1"].SetPoolActive(kvmtest.PoolName, false)
		_, err := e.prov.Probe(ctx, "hv1")
		if kvm.Reason(err) != crawlv1.HostPoolInactiveReason {
			t.Fatalf("reason %q for %v", kvm.Reason(err), err)
		}
	})
	t.Run("pool missing", func(t *testing.T) {
		e := newEnv(t)
		e.hosts.Add("hv1")
		f := fake.New()
		e.conns.Add("hv1", f)
		_, err := e.prov.Probe(ctx, "hv1")
		if kvm.Reason(err) != crawlv1.HostPoolMissingReason {
			t.Fatalf("reason %q for %v", kvm.Reason(err), err)
		}
	})
	t.Run("blackholed daemon: Timeout within the deadline, then busy at once", func(t *testing.T) {
		e := newEnv(t, "hv1")
		release := e.fakes["hv1"].Block(virt.RPCConnectGetLibVersion)
		defer release()
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := e.prov.Probe(pctx, "hv1")
		if took := time.Since(start); took > time.Second || kvm.Reason(err) != crawlv1.HostTimeoutReason {
			t.Fatalf("blocked probe took %s, reason %q (%v)", took, kvm.Reason(err), err)
		}
		start = time.Now()
		_, err = e.prov.Probe(ctx, "hv1")
		if !errors.Is(err, kvm.ErrProbeBusy) || time.Since(start) > 50*time.Millisecond || kvm.Reason(err) != crawlv1.HostTimeoutReason {
			t.Fatalf("probe while the abandoned one runs: %v after %s", err, time.Since(start))
		}
		release()
		deadline := time.Now().Add(2 * time.Second)
		for {
			if _, err = e.prov.Probe(ctx, "hv1"); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("probe after release: %v", err)
		}
	})
}

func TestSteadyStateGetRPCs(t *testing.T) {
	e := newEnv(t, "hv1")
	ctx := context.Background()
	m := e.created("hv1", "crawl", "p1", "uid-1")
	e.fakes["hv1"].SetAgentAddresses("crawl.p1", []libvirt.DomainInterface{{Name: "eth0", Addrs: []libvirt.DomainIPAddr{{Type: int32(libvirt.IPAddrTypeIpv4), Addr: "192.0.2.10", Prefix: 24}}}})
	e.rpcs.Reset()
	if _, err := e.prov.Get(ctx, m); err != nil {
		t.Fatal(err)
	}
	// Lookup, metadata, state, lease and agent addresses (both, so that a
	// disagreement is seen).
	if total := e.rpcs.Total(); total != 5 {
		t.Fatalf("steady-state Get made %d RPCs: %v", total, e.rpcs.Snapshot())
	}
}

func TestCachedImageDoesNotWaitBehindUploads(t *testing.T) {
	e := newEnv(t, "hv1")
	prov := kvm.New(kvm.Options{Hosts: e.hosts, Pool: e.conns, MaxUploadsPerHost: 1})
	ctx := context.Background()
	if _, err := prov.Create(ctx, e.machine("hv1", "crawl", "p1", "uid-1")); err != nil {
		t.Fatalf("Create: %v", err)
	}

	// Another image's download holds the host's only upload slot.
	other := kvmtest.NewImageServer("other", 4<<10)
	other.Close()
	started, release := make(chan struct{}), make(chan struct{})
	blocked := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		<-release
		_, _ = w.Write(other.Body)
	}))
	defer blocked.Close()
	defer close(release)
	img := other.Image
	img.URL = blocked.URL + "/other.img"
	done := make(chan error, 1)
	go func() {
		_, err := prov.EnsureImage(ctx, "hv1", img, nil)
		done <- err
	}()
	<-started

	// A Create whose image is cached goes through at once.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := prov.Create(cctx, e.machine("hv1", "crawl", "p2", "uid-2")); err != nil {
		t.Fatalf("Create with a cached image while an upload holds the slot: %v", err)
	}
	// An image that is not cached still waits for the slot.
	uncached := kvmtest.NewImageServer("third", 4<<10+1) // another digest: not the upload under way
	defer uncached.Close()
	m := e.machine("hv1", "crawl", "p3", "uid-3")
	m.Image = uncached.Image
	sctx, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	if _, err := prov.Create(sctx, m); err == nil || !strings.Contains(err.Error(), "waiting for an upload slot") {
		t.Fatalf("Create with an uncached image = %v, want it to wait for the slot", err)
	}
	if uncached.Downloads() != 0 {
		t.Fatal("an upload ran beyond MaxUploadsPerHost")
	}
	release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatalf("blocked EnsureImage: %v", err)
	}
}

// TestUploadsBoundedOverAllHosts: MaxUploads bounds the uploads in flight
// over all hosts (each holds its buffers in the manager), whatever the
// per-host bound allows; a negative MaxUploads does not bound them.
func TestUploadsBoundedOverAllHosts(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxUploads  int
		wantRunning int // of 3 hosts, each with a free host slot
	}{
		{name: "bounded", maxUploads: 2, wantRunning: 2},
		{name: "default", maxUploads: 0, wantRunning: 3}, // DefaultMaxUploads is more than 3
		{name: "unbounded", maxUploads: -1, wantRunning: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts := []string{"hv1", "hv2", "hv3"}
			e := newEnv(t, hosts...)
			prov := kvm.New(kvm.Options{Hosts: e.hosts, Pool: e.conns, MaxUploadsPerHost: 2, MaxUploads: tc.maxUploads})
			src := kvmtest.NewImageServer("held", 4<<10)
			src.Close()
			// Each host's download names its host, and is held until release.
			started, release := make(chan string, len(hosts)), make(chan struct{})
			held := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				started <- strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/"), ".img")
				<-release
				_, _ = w.Write(src.Body)
			}))
			defer held.Close()
			releaseAll := sync.OnceFunc(func() { close(release) })
			defer releaseAll() // before held.Close, which waits for the handlers

			cancels := map[string]context.CancelFunc{}
			done := map[string]chan error{}
			for _, h := range hosts {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				cancels[h], done[h] = cancel, make(chan error, 1)
				img := src.Image
				img.URL = held.URL + "/" + h + ".img"
				go func() {
					_, err := prov.EnsureImage(ctx, h, img, nil)
					done[h] <- err
				}()
			}
			running := map[string]bool{}
			for range tc.wantRunning {
				running[<-started] = true
			}
			// The others wait (for a slot, or still in their lookups) until
			// their context ends, without reaching the source: a download
			// that had started is in started.
			for _, h := range hosts {
				if running[h] {
					continue
				}
				cancels[h]()
				if err := <-done[h]; err == nil || provider.Class(err) != provider.ClassTransient {
					t.Fatalf("upload to %s beyond the bound = %v, want a transient error once its context ended", h, err)
				}
			}
			if len(started) != 0 {
				t.Fatalf("%d uploads beyond %d started: %s", len(started), tc.wantRunning, <-started)
			}
			releaseAll()
			for h := range running {
				if err := <-done[h]; err != nil {
					t.Fatalf("EnsureImage on %s: %v", h, err)
				}
			}
		})
	}
}

func TestPausedDomainIsResumedNotStarted(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "hv1")
	f := e.fakes["hv1"]
	m := e.created("hv1", "crawl", "p1", "uid-1")

	// libvirt pauses the guest on ENOSPC: Get says so and why.
	if err := f.Pause("crawl.p1", libvirt.DomainPausedIoerror); err != nil {
		t.Fatal(err)
	}
	got, err := e.prov.Get(ctx, m)
	if err != nil || got.State != provider.StateStopped || !strings.Contains(got.Message, "disk I/O error") {
		t.Fatalf("Get of a paused domain = %+v, %v; want Stopped naming the reason", got, err)
	}

	// Space still short: the resume fails, and Create says so.
	f.FailNext(virt.RPCDomainResume, virt.NewError(libvirt.ErrOperationFailed, "operation failed: resume operation failed"))
	if _, err := e.prov.Create(ctx, m); provider.Class(err) != provider.ClassTransient || !strings.Contains(err.Error(), "resume operation failed") {
		t.Fatalf("Create with a failing resume = %v (class %s), want the transient resume error", err, provider.Class(err))
	}
	// Space freed: the next Create resumes it; nothing is "started".
	creates := f.Calls(virt.RPCDomainCreate)
	if _, err := e.prov.Create(ctx, m); err != nil {
		t.Fatalf("Create of a paused domain: %v", err)
	}
	if d, _ := f.Domain("crawl.p1"); d.State != libvirt.DomainRunning {
		t.Fatalf("domain state after Create = %d, want running", d.State)
	}
	if f.Calls(virt.RPCDomainCreate) != creates {
		t.Fatal("Create called DomainCreate on a paused domain")
	}

	// Paused by a job (migration): left to it, reported as waiting.
	if err := f.Pause("crawl.p1", libvirt.DomainPausedMigration); err != nil {
		t.Fatal(err)
	}
	resumes := f.Calls(virt.RPCDomainResume)
	if _, err := e.prov.Create(ctx, m); provider.Class(err) != provider.ClassTransient || !strings.Contains(err.Error(), "migrating") {
		t.Fatalf("Create during a migration = %v, want transient naming it", err)
	}
	if f.Calls(virt.RPCDomainResume) != resumes {
		t.Fatal("a domain paused by a migration was resumed")
	}
}

func TestStartErrorOfAnExistingDomainIsNotIgnored(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "hv1")
	f := e.fakes["hv1"]
	m := e.machine("hv1", "crawl", "p1", "uid-1")
	if _, err := e.prov.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	d, _ := f.Domain("crawl.p1")
	if err := f.DomainDestroyFlags(libvirt.Domain{Name: d.Name, UUID: d.UUID}, 0); err != nil {
		t.Fatal(err)
	}
	f.FailNext(virt.RPCDomainCreate, virt.NewError(libvirt.ErrOperationInvalid, "Requested operation is not valid: domain is already running"))
	if _, err := e.prov.Create(ctx, m); err == nil || !strings.Contains(err.Error(), "starting domain crawl.p1") {
		t.Fatalf("Create whose DomainCreate failed = %v, want the error", err)
	}
	if _, err := e.prov.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	if d, _ := f.Domain("crawl.p1"); d.State != libvirt.DomainRunning {
		t.Fatalf("domain state = %d, want running", d.State)
	}
}

// Two installs on one host list only their own domains, and domains made
// before install ids (none recorded) are nobody's to collect. The id
// survives libvirt's metadata handling: the fake stores and returns the
// <metadata> element the way libvirt does.
func TestListByTagReturnsOnlyThisInstall(t *testing.T) {
	e := newEnv(t, "hv1")
	ctx := context.Background()
	mine := kvm.New(kvm.Options{InstallID: "install-a", Hosts: e.hosts, Pool: e.conns})
	theirs := kvm.New(kvm.Options{InstallID: "install-b", Hosts: e.hosts, Pool: e.conns})
	a, b, old := e.machine("hv1", "a", "p1", "u1"), e.machine("hv1", "b", "p2", "u2"), e.machine("hv1", "c", "p3", "u3")
	for p, m := range map[*kvm.Provider]*provider.Machine{mine: a, theirs: b, e.prov: old} {
		if _, err := p.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	list, err := mine.ListByTag(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Owner.UID != "u1" || list[0].InstallID != "install-a" {
		t.Fatalf("ListByTag = %+v, want only u1 of install-a", list)
	}

	f := e.fakes["hv1"]
	dom, err := f.DomainLookupByName(domxml.DomainName("a", "p1"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := f.DomainGetMetadata(dom, int32(libvirt.DomainMetadataElement), libvirt.OptString{domxml.MetadataNS}, libvirt.DomainAffectCurrent)
	if err != nil {
		t.Fatal(err)
	}
	if md, err := domxml.ParseMetadata(s); err != nil || md.InstallID != "install-a" {
		t.Fatalf("DomainGetMetadata = %q: %+v, %v; want install-a", s, md, err)
	}
	x, err := f.DomainGetXMLDesc(dom, 0)
	if err != nil {
		t.Fatal(err)
	}
	if md, found, err := domxml.MetadataFromDomainXML(x); err != nil || !found || md.InstallID != "install-a" {
		t.Fatalf("metadata in the domain XML: %+v, %v, %v; want install-a", md, found, err)
	}
}

// A host whose libvirtd hangs fails its part of the listing when the
// deadline ends; the hosts listed after it are still listed.
func TestListByTagPastAWedgedHost(t *testing.T) {
	e := newEnv(t, "hv1", "hv2", "hv3")
	for _, m := range []*provider.Machine{e.machine("hv2", "a", "p1", "u1"), e.machine("hv3", "b", "p2", "u2")} {
		if _, err := e.prov.Create(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(kvmtest.Wedge(e.fakes["hv1"]))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	list, err := e.prov.ListByTag(ctx, "test")
	if err == nil || !strings.Contains(err.Error(), `host "hv1"`) || provider.Class(err) != provider.ClassTransient {
		t.Errorf("error %v, want a transient one naming hv1", err)
	}
	if len(list) != 2 {
		t.Fatalf("ListByTag = %+v, want the domains of hv2 and hv3", list)
	}
}

// A host whose libvirtd hangs holds at most MaxInFlightPerHost callers: the
// next call fails at once, transiently, while other hosts' calls go
// through. Calls abandoned at their deadline keep counting until their RPCs
// return, so the host stays busy instead of taking a fresh worker per
// deadline.
func TestHostBusyFailsFastBeyondMaxInFlight(t *testing.T) {
	e := newEnv(t, "hv1", "hv2")
	prov := kvm.New(kvm.Options{Hosts: e.hosts, Pool: e.conns, MaxInFlightPerHost: 2})
	stuck, other := e.machine("hv1", "a", "p1", "u1"), e.machine("hv2", "b", "p2", "u2")
	for _, m := range []*provider.Machine{stuck, other} {
		if _, err := prov.Create(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	release := kvmtest.Wedge(e.fakes["hv1"])
	t.Cleanup(release)

	ctx, abandon := context.WithCancel(context.Background())
	defer abandon()
	hung := make(chan error, 2)
	for range 2 {
		go func() { _, err := prov.Get(ctx, stuck); hung <- err }()
	}
	testutil.WaitFor(t, func() bool { return e.fakes["hv1"].Blocked(virt.RPCDomainLookupByName) == 2 })

	busy := func() {
		t.Helper()
		done := make(chan error, 1)
		start := time.Now()
		go func() { _, err := prov.Get(context.Background(), stuck); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, provider.ErrBusy) || provider.Class(err) != provider.ClassTransient ||
				!strings.Contains(err.Error(), `host "hv1" busy: 2 calls in flight`) {
				t.Fatalf("third call on the hung host: %v; want a transient provider.ErrBusy", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("third call took %s, want at once", d)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("third call on the hung host is waiting, want it to fail at once")
		}
		if _, err := prov.Get(context.Background(), other); err != nil {
			t.Fatalf("call on another host: %v", err)
		}
	}
	busy()

	// The callers give up; their RPCs still hang on the host.
	abandon()
	for range 2 {
		if err := <-hung; !errors.Is(err, context.Canceled) {
			t.Fatalf("abandoned call: %v", err)
		}
	}
	busy()

	// The daemon answers again: its calls return and free the host.
	release()
	testutil.WaitFor(t, func() bool { _, err := prov.Get(context.Background(), stuck); return err == nil })
}

// A cached image backing a Proxy's overlay survives PruneImages; once the
// Proxy is deleted the image, its marker and the claim go.
func TestPruneImagesKeepsImagesBackingOverlays(t *testing.T) {
	e := newEnv(t, "hv1")
	ctx := context.Background()
	m := e.machine("hv1", "ns", "p", "uid-1")
	if _, err := e.prov.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	vol, err := image.VolumeName(m.Image)
	if err != nil {
		t.Fatal(err)
	}
	digest, _ := image.ParseChecksum(m.Image.Checksum)
	keepNone := func(string) bool { return false }

	res, err := e.prov.PruneImages(ctx, "hv1", keepNone)
	if err != nil || len(res.Deleted) != 0 || len(res.InUse) != 1 || res.InUse[0] != digest {
		t.Fatalf("PruneImages with an overlay = %+v, %v; want nothing deleted, %s in use", res, err, digest)
	}
	if _, ok := e.fakes["hv1"].Volume(kvmtest.PoolName, vol); !ok {
		t.Fatalf("image volume %s pruned under a running overlay", vol)
	}
	if err := e.prov.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	res, err = e.prov.PruneImages(ctx, "hv1", keepNone)
	if err != nil || len(res.Deleted) != 3 || len(res.InUse) != 0 {
		t.Fatalf("PruneImages after Delete = %+v, %v; want image, marker and this install's claim deleted", res, err)
	}
	if _, ok := e.fakes["hv1"].Volume(kvmtest.PoolName, vol); ok {
		t.Errorf("image volume %s left behind", vol)
	}
	if res, err := e.prov.PruneImages(ctx, "gone", keepNone); err != nil || len(res.Deleted) != 0 {
		t.Errorf("PruneImages on an unconfigured host = %+v, %v; want nothing, no error", res, err)
	}
}

// Two KVMImages of one digest cached at once: the second waits for the
// first's upload instead of failing or downloading again.
func TestEnsureImageSameDigestWaitsForTheUploadUnderWay(t *testing.T) {
	e := newEnv(t, "hv1")
	ctx := context.Background()
	f := e.fakes["hv1"]
	f.Delay(virt.RPCStorageVolUpload, 300*time.Millisecond)
	a, b := e.img.Image, e.img.Image
	a.Name, b.Name = "image-a", "image-b"

	first := make(chan error, 1)
	go func() {
		_, err := e.prov.EnsureImage(ctx, "hv1", a, nil)
		first <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for f.Calls(virt.RPCStorageVolUpload) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	got, err := e.prov.EnsureImage(ctx, "hv1", b, nil)
	if err != nil {
		t.Fatalf("second EnsureImage: %v", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first EnsureImage: %v", err)
	}
	want, _ := image.VolumeName(a)
	if got.Volume != want || got.Bytes != 0 || got.Allocated <= 0 {
		t.Errorf("second EnsureImage = %+v; want the shared volume %s, cached, with its allocation", got, want)
	}
	if n := e.img.Downloads(); n != 1 {
		t.Errorf("downloaded %d times, want 1", n)
	}
}
