package kvm_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
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
	rpcs  map[string]int
}

func newEnv(t *testing.T, hostNames ...string) *env {
	t.Helper()
	e := &env{t: t, conns: kvmtest.NewConns(), hosts: kvmtest.NewHosts(hostNames...), fakes: map[string]*fake.Fake{}, rpcs: map[string]int{}}
	for _, h := range hostNames {
		f := kvmtest.NewHost()
		e.fakes[h] = f
		e.conns.Add(h, f)
	}
	e.img = kvmtest.NewImageServer("debian", 64<<10)
	t.Cleanup(e.img.Close)
	e.prov = kvm.New(kvm.Options{Hosts: e.hosts, Pool: e.conns,
		Observer: virt.ObserverFunc(func(rpc string, _ time.Duration, _ error) { e.rpcs[rpc]++ })})
	return e
}

func (e *env) machine(host, ns, name, uid string) *provider.Machine {
	return &provider.Machine{
		Namespace: ns, Name: name, UID: uid, Tag: "test", Host: host,
		Image: e.img.Image, CPUs: 1, MemoryBytes: 512 << 20, DiskBytes: 10 << 30,
		UserData: []byte("#cloud-config\n"), InstallGuestAgent: true, Port: 3128,
	}
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
	m := e.machine("hv1", "crawl", "p1", "uid-1")
	inst, err := e.prov.Create(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	m.ProviderID = inst.ProviderID
	e.fakes["hv1"].SetAgentAddresses("crawl.p1", []libvirt.DomainInterface{{Name: "eth0", Addrs: []libvirt.DomainIPAddr{{Type: int32(libvirt.IPAddrTypeIpv4), Addr: "192.0.2.10", Prefix: 24}}}})
	clear(e.rpcs)
	if _, err := e.prov.Get(ctx, m); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range e.rpcs {
		total += n
	}
	// Lookup, metadata, state, agent addresses.
	if total != 4 {
		t.Fatalf("steady-state Get made %d RPCs: %v", total, e.rpcs)
	}
}
