package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	clientfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/gcp"
	"crawl.example.com/proxy-operator/pkg/provider/gcp/gcptest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

// sweepInstall is one operator install for sweep tests: its own cluster (a
// fake API holding its Proxies), its providers and its collector, on
// hypervisors or a cloud project it may share with other installs. Every
// install uses the default tag, as installs with default flags do.
type sweepInstall struct {
	t      *testing.T
	id     string
	api    client.Client
	gc     *OrphanCollector
	img    *kvmtest.ImageServer
	events *eventLog
}

func newSweepInstall(t *testing.T, id string) *sweepInstall {
	t.Helper()
	api := clientfake.NewClientBuilder().WithScheme(envtestutil.Scheme()).Build()
	img := kvmtest.NewImageServer("debian", 4<<10)
	t.Cleanup(img.Close)
	events := &eventLog{}
	return &sweepInstall{t: t, id: id, api: api, img: img, events: events,
		gc: &OrphanCollector{Reader: api, Registry: provider.NewRegistry(), Plugins: Plugins(), Tag: "proxy-operator", InstallID: id, Recorder: events}}
}

// withKVM adds this install's kvm provider on the shared hosts.
func (s *sweepInstall) withKVM(conns *kvmtest.Conns, hosts *kvmtest.Hosts) *kvm.Provider {
	p := kvm.New(kvm.Options{InstallID: s.id, Hosts: hosts, Pool: conns})
	s.gc.Registry.Add(p)
	return p
}

// withGCP adds this install's gcp provider on the shared project.
func (s *sweepInstall) withGCP(srv *gcptest.Server) provider.Provider {
	s.t.Helper()
	p, err := gcp.New(context.Background(), gcp.Options{InstallID: s.id, Project: "shared", Zone: "europe-west4-a",
		Endpoint: srv.Endpoint(), HTTPClient: srv.Client(), PollInterval: time.Millisecond})
	if err != nil {
		s.t.Fatal(err)
	}
	s.gc.Registry.Add(p)
	return p
}

// proxy records a Proxy in this install's cluster and creates its instance,
// as the Proxy controller would (kvm when host is set, else gcp).
func (s *sweepInstall) proxy(prov provider.Provider, host, ns, name, uid string) {
	s.t.Helper()
	p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
	if err := s.api.Create(context.Background(), p); err != nil {
		s.t.Fatal(err)
	}
	m := &provider.Machine{Namespace: ns, Name: name, UID: uid, Tag: s.gc.Tag, Host: host,
		CPUs: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, UserData: []byte("#cloud-config\n"), Port: 3128}
	if host != "" {
		m.Image = s.img.Image
	}
	if _, err := prov.Create(context.Background(), m); err != nil {
		s.t.Fatal(err)
	}
}

// forget deletes the Proxy from the cluster without its finalizer running:
// its instance becomes an orphan of this install.
func (s *sweepInstall) forget(ns, name string) {
	s.t.Helper()
	if err := s.api.Delete(context.Background(), &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *sweepInstall) sweep() int {
	s.t.Helper()
	n, err := s.gc.Sweep(context.Background())
	if err != nil {
		s.t.Fatalf("sweep of install %s: %v", s.id, err)
	}
	return n
}

// Two installs with default flags on one hypervisor: each one's Proxies are
// absent from the other's cluster, so each must leave the other's domains
// alone and still collect its own orphans.
func TestSweepNeverDeletesAnotherInstallsDomains(t *testing.T) {
	conns, hosts := kvmtest.NewConns(), kvmtest.NewHosts("hv1")
	host := kvmtest.NewHost()
	conns.Add("hv1", host)
	staging, production := newSweepInstall(t, "staging-cluster"), newSweepInstall(t, "production-cluster")
	sk, pk := staging.withKVM(conns, hosts), production.withKVM(conns, hosts)
	staging.proxy(sk, "hv1", "crawl", "s1", "5a1e0000-0000-4000-8000-000000000001")
	staging.proxy(sk, "hv1", "crawl", "s2", "5a1e0000-0000-4000-8000-000000000002")
	production.proxy(pk, "hv1", "web", "p1", "9e0d0000-0000-4000-8000-000000000001")

	if n := staging.sweep(); n != 0 {
		t.Errorf("staging swept %d instances, want 0", n)
	}
	if n := production.sweep(); n != 0 {
		t.Errorf("production swept %d instances, want 0", n)
	}
	wantDomains(t, host, "crawl.s1", "crawl.s2", "web.p1")

	// A real orphan of staging is still collected, by staging only.
	staging.forget("crawl", "s2")
	if n := production.sweep(); n != 0 {
		t.Errorf("production swept %d instances, want 0", n)
	}
	wantDomains(t, host, "crawl.s1", "crawl.s2", "web.p1")
	if n := staging.sweep(); n != 1 {
		t.Errorf("staging swept %d instances, want 1", n)
	}
	wantDomains(t, host, "crawl.s1", "web.p1")
}

// The same two installs sharing one GCP project.
func TestSweepNeverDeletesAnotherInstallsGCEInstances(t *testing.T) {
	srv := gcptest.NewServer()
	t.Cleanup(srv.Close)
	staging, production := newSweepInstall(t, "staging-cluster"), newSweepInstall(t, "production-cluster")
	sg, pg := staging.withGCP(srv), production.withGCP(srv)
	staging.proxy(sg, "", "crawl", "s1", "5a1e0000-0000-4000-8000-000000000001")
	staging.proxy(sg, "", "crawl", "s2", "5a1e0000-0000-4000-8000-000000000002")
	production.proxy(pg, "", "web", "p1", "9e0d0000-0000-4000-8000-000000000001")
	want := func(owners ...string) {
		t.Helper()
		var got []string
		for _, inst := range srv.Instances("shared") {
			got = append(got, inst.Labels[gcp.LabelNamespace]+"/"+inst.Labels[gcp.LabelName])
		}
		slices.Sort(got)
		if !slices.Equal(got, owners) {
			t.Fatalf("instances of %v, want %v", got, owners)
		}
	}

	if n := staging.sweep() + production.sweep(); n != 0 {
		t.Errorf("swept %d instances, want 0", n)
	}
	want("crawl/s1", "crawl/s2", "web/p1")
	staging.forget("crawl", "s2")
	if n := production.sweep(); n != 0 {
		t.Errorf("production swept %d instances, want 0", n)
	}
	if n := staging.sweep(); n != 1 {
		t.Errorf("staging swept %d instances, want 1", n)
	}
	want("crawl/s1", "web/p1")
}

// Domains made before install ids record none: whose they are cannot be
// proven, so no install ever sweeps them, even when their owner is gone.
func TestSweepKeepsDomainsWithoutInstallID(t *testing.T) {
	conns, hosts := kvmtest.NewConns(), kvmtest.NewHosts("hv1")
	host := kvmtest.NewHost()
	conns.Add("hv1", host)
	s := newSweepInstall(t, "c0ffee00-0000-4000-8000-000000000001")
	s.withKVM(conns, hosts)
	// As an operator without install ids defined it.
	xml, err := domxml.Domain(domxml.Params{Name: "crawl.old", DomainType: domxml.DomainTypeKVM, VCPUs: 1, MemoryBytes: 256 << 20,
		DiskPath: "/var/lib/libvirt/images/x.qcow2", SeedPath: "/var/lib/libvirt/images/x.iso",
		Network:  domxml.Network{Type: domxml.NetworkTypeNetwork, Name: kvmtest.NetworkName},
		Metadata: domxml.Metadata{Namespace: "crawl", Name: "old", UID: "0c7f0d0e-dead-4bee-8000-000000000001", Tag: s.gc.Tag}})
	if err != nil {
		t.Fatal(err)
	}
	if err := host.AddDomain(xml, true); err != nil {
		t.Fatal(err)
	}
	if n := s.sweep(); n != 0 {
		t.Errorf("swept %d instances, want 0", n)
	}
	wantDomains(t, host, "crawl.old")
}

// A collector without an install id refuses to sweep rather than treat
// every tagged instance as its own.
func TestSweepRefusesWithoutInstallID(t *testing.T) {
	conns, hosts := kvmtest.NewConns(), kvmtest.NewHosts("hv1")
	host := kvmtest.NewHost()
	conns.Add("hv1", host)
	s := newSweepInstall(t, "")
	s.proxy(s.withKVM(conns, hosts), "hv1", "crawl", "s1", "5a1e0000-0000-4000-8000-000000000001")
	s.forget("crawl", "s1")
	n, err := s.gc.Sweep(context.Background())
	if err == nil || !strings.Contains(err.Error(), "install id") || n != 0 {
		t.Fatalf("Sweep = %d, %v; want a refusal naming the install id", n, err)
	}
	wantDomains(t, host, "crawl.s1")
}

func wantDomains(t *testing.T, f *fake.Fake, want ...string) {
	t.Helper()
	got := f.DomainNames()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("domains %v, want %v", got, want)
	}
}

// One hypervisor whose libvirtd hangs (behind a live sshd) and one whose
// deletes hang must cost the sweep a deadline each, not the sweep: orphans
// on the other hosts and of the other providers are still deleted, and the
// second orphan on the host that did not answer is not tried.
func TestSweepFinishesPastAWedgedHost(t *testing.T) {
	conns, hosts := kvmtest.NewConns(), kvmtest.NewHosts("hv1-wedged", "hv2-ok", "hv3-nodelete")
	fakes := map[string]*fake.Fake{}
	for _, h := range []string{"hv1-wedged", "hv2-ok", "hv3-nodelete"} {
		fakes[h] = kvmtest.NewHost()
		conns.Add(h, fakes[h])
	}
	srv := gcptest.NewServer()
	t.Cleanup(srv.Close)
	s := newSweepInstall(t, "c0ffee00-0000-4000-8000-000000000001")
	s.gc.CallTimeout = 300 * time.Millisecond
	k, g := s.withKVM(conns, hosts), s.withGCP(srv)
	s.proxy(k, "hv1-wedged", "crawl", "w1", "00000000-0000-4000-8000-000000000001")
	s.proxy(k, "hv2-ok", "crawl", "ok1", "00000000-0000-4000-8000-000000000002")
	s.proxy(k, "hv3-nodelete", "crawl", "nd1", "00000000-0000-4000-8000-000000000003")
	s.proxy(k, "hv3-nodelete", "crawl", "nd2", "00000000-0000-4000-8000-000000000004")
	s.proxy(g, "", "crawl", "cloud", "00000000-0000-4000-8000-000000000005")
	for _, name := range []string{"w1", "ok1", "nd1", "nd2", "cloud"} {
		s.forget("crawl", name)
	}
	t.Cleanup(kvmtest.Wedge(fakes["hv1-wedged"]))
	t.Cleanup(fakes["hv3-nodelete"].Block(virt.RPCDomainDestroyFlags))

	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := s.gc.Sweep(context.Background())
		done <- result{n, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("sweep still running after 10s: a host that does not answer holds it")
	}
	if r.n != 2 {
		t.Errorf("swept %d instances, want 2 (hv2-ok's and the gcp one)", r.n)
	}
	if r.err == nil || !strings.Contains(r.err.Error(), "hv1-wedged") {
		t.Errorf("sweep error %v, want one naming hv1-wedged", r.err)
	}
	wantDomains(t, fakes["hv2-ok"])
	if len(srv.Instances("shared")) != 0 {
		t.Errorf("gcp orphan not swept: %v", srv.Instances("shared"))
	}
	if n := fakes["hv3-nodelete"].Calls(virt.RPCDomainDestroyFlags); n != 1 {
		t.Errorf("%d deletes tried on hv3-nodelete, want 1 (the host did not answer the first)", n)
	}
}

// eventLog is a record.EventRecorder keeping what each Event is about.
type eventLog struct {
	mu     sync.Mutex
	events []recordedEvent
}

type recordedEvent struct {
	ref                  corev1.ObjectReference
	typ, reason, message string
}

func (l *eventLog) Event(obj runtime.Object, typ, reason, message string) {
	var ref corev1.ObjectReference
	if r, ok := obj.(*corev1.ObjectReference); ok {
		ref = *r
	} else if o, ok := obj.(client.Object); ok {
		ref = corev1.ObjectReference{Kind: fmt.Sprintf("%T", o), Namespace: o.GetNamespace(), Name: o.GetName(), UID: o.GetUID()}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, recordedEvent{ref, typ, reason, message})
}

func (l *eventLog) Eventf(obj runtime.Object, typ, reason, format string, args ...any) {
	l.Event(obj, typ, reason, fmt.Sprintf(format, args...))
}

func (l *eventLog) AnnotatedEventf(obj runtime.Object, _ map[string]string, typ, reason, format string, args ...any) {
	l.Eventf(obj, typ, reason, format, args...)
}

// Each swept instance leaves an Event where someone will look: on its
// KVMHost for a kvm domain, on the gone Proxy (in its namespace) otherwise.
// Instances not swept leave none.
func TestSweepRecordsAnEventPerDeletedInstance(t *testing.T) {
	conns, hosts := kvmtest.NewConns(), kvmtest.NewHosts("hv1")
	conns.Add("hv1", kvmtest.NewHost())
	srv := gcptest.NewServer()
	t.Cleanup(srv.Close)
	s := newSweepInstall(t, "c0ffee00-0000-4000-8000-000000000001")
	kvmHost := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: "hv1", UID: "4b000000-0000-4000-8000-000000000001"}}
	if err := s.api.Create(context.Background(), kvmHost); err != nil {
		t.Fatal(err)
	}
	k, g := s.withKVM(conns, hosts), s.withGCP(srv)
	s.proxy(k, "hv1", "crawl", "vm", "00000000-0000-4000-8000-000000000001")
	s.proxy(k, "hv1", "crawl", "alive", "00000000-0000-4000-8000-000000000002")
	s.proxy(g, "", "crawl", "cloud", "00000000-0000-4000-8000-000000000003")
	s.forget("crawl", "vm")
	s.forget("crawl", "cloud")

	if n := s.sweep(); n != 2 {
		t.Fatalf("swept %d, want 2", n)
	}
	s.events.mu.Lock()
	defer s.events.mu.Unlock()
	if len(s.events.events) != 2 {
		t.Fatalf("events %+v, want one per swept instance", s.events.events)
	}
	for _, e := range s.events.events {
		if e.typ != corev1.EventTypeNormal || e.reason != OrphanDeletedReason {
			t.Errorf("event %+v: want Normal %s", e, OrphanDeletedReason)
		}
	}
	onHost, onProxy := s.events.events[0], s.events.events[1]
	if onHost.ref.Kind == "Proxy" { // providers are swept in name order
		onHost, onProxy = onProxy, onHost
	}
	if onHost.ref.Name != "hv1" || onHost.ref.UID != kvmHost.UID || !strings.Contains(onHost.message, "crawl.vm") ||
		!strings.Contains(onHost.message, "00000000-0000-4000-8000-000000000001") {
		t.Errorf("kvm event %+v: want it on KVMHost hv1 (with its UID), naming the domain and the Proxy UID", onHost)
	}
	if onProxy.ref.Kind != "Proxy" || onProxy.ref.Namespace != "crawl" || onProxy.ref.Name != "cloud" ||
		onProxy.ref.UID != "00000000-0000-4000-8000-000000000003" || !strings.Contains(onProxy.message, "gcp") {
		t.Errorf("gcp event %+v: want it on the gone Proxy crawl/cloud", onProxy)
	}
}

// A collector without a recorder is a wiring mistake, caught before it
// deletes anything.
func TestSweepRefusesWithoutRecorder(t *testing.T) {
	s := newSweepInstall(t, "c0ffee00-0000-4000-8000-000000000001")
	s.gc.Recorder = nil
	if _, err := s.gc.Sweep(context.Background()); err == nil || !strings.Contains(err.Error(), "recorder") {
		t.Fatalf("Sweep without a recorder: %v", err)
	}
}
