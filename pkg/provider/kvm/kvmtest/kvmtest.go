// Package kvmtest provides what tests and benchmarks of the KVM provider and
// the controllers need around it: in-memory hosts (virt/fake) behind a
// connection pool stand-in, a static host source, and an image server.
package kvmtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/kdomanski/iso9660"
	testclock "k8s.io/utils/clock/testing"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// PoolName and NetworkName are what every test host has.
const (
	PoolName    = "default"
	NetworkName = "default"
	PoolBytes   = 100 << 30
)

// NewHost returns a fake daemon with an active pool and a network.
func NewHost(opts ...fake.Option) *fake.Fake {
	f := fake.New(opts...)
	f.AddPool(PoolName, PoolBytes, true)
	f.AddNetwork(NetworkName)
	return f
}

// Conns stands in for conn.Pool: each configured host name is served by a
// fake daemon. Like the pool, a host must be Set before Do, and Do on an
// unknown host fails with an error matching conn.ErrHostNotConfigured.
type Conns struct {
	mu      sync.Mutex
	fakes   map[string]*fake.Fake
	set     map[string]conn.HostConfig
	dialErr map[string]error
}

var _ kvm.Connections = (*Conns)(nil)

// NewConns returns an empty stand-in.
func NewConns() *Conns {
	return &Conns{fakes: map[string]*fake.Fake{}, set: map[string]conn.HostConfig{}, dialErr: map[string]error{}}
}

// Add serves host with f.
func (c *Conns) Add(host string, f *fake.Fake) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fakes[host] = f
}

// FailDial makes every Do on host fail with err until cleared with nil.
func (c *Conns) FailDial(host string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dialErr[host] = err
}

// Set implements kvm.Connections.
func (c *Conns) Set(cfg conn.HostConfig, _ conn.MaterialLoader) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set[cfg.Name] = cfg
	return nil
}

// Remove implements kvm.Connections.
func (c *Conns) Remove(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.set, name)
}

// Do implements kvm.Connections.
func (c *Conns) Do(ctx context.Context, host string, fn func(virt.Client) error) error {
	c.mu.Lock()
	_, ok := c.set[host]
	f, dialErr := c.fakes[host], c.dialErr[host]
	c.mu.Unlock()
	if !ok || f == nil {
		return fmt.Errorf("host %q: %w", host, conn.ErrHostNotConfigured)
	}
	if dialErr != nil {
		return dialErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fn(f)
}

// Hosts is a static kvm.HostSource: every name in it is a configured host
// with PoolName and NetworkName.
type Hosts struct {
	mu        sync.Mutex
	names     map[string]string        // name → domain type
	intervals map[string]time.Duration // name → its own check interval
	bridges   map[string]bridge        // name → its bridge, when not on NetworkName
}

// bridge is a host's network when its VMs sit on a bridge.
type bridge struct {
	name        string
	nameservers []netip.Addr
}

var _ kvm.HostSource = (*Hosts)(nil)

// NewHosts returns a source knowing names.
func NewHosts(names ...string) *Hosts {
	h := &Hosts{names: map[string]string{}, intervals: map[string]time.Duration{}, bridges: map[string]bridge{}}
	for _, n := range names {
		h.Add(n)
	}
	return h
}

// Add configures name.
func (h *Hosts) Add(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.names[name] = domxml.DomainTypeKVM
}

// SetCheckInterval gives name a health check interval of its own, as a
// KVMHost's spec.checkInterval does.
func (h *Hosts) SetCheckInterval(name string, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.intervals[name] = d
}

// SetBridge puts name's VMs on the host bridge br, with nameservers for
// those given a static address, as a KVMHost with networkMode bridge and
// spec.nameservers does.
func (h *Hosts) SetBridge(name, br string, nameservers ...netip.Addr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bridges[name] = bridge{name: br, nameservers: nameservers}
}

// Remove forgets name.
func (h *Hosts) Remove(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.names, name)
}

// Host implements kvm.HostSource.
func (h *Hosts) Host(_ context.Context, name string) (kvm.HostSpec, error) {
	h.mu.Lock()
	typ, ok := h.names[name]
	interval := h.intervals[name]
	br, bridged := h.bridges[name]
	h.mu.Unlock()
	if !ok {
		return kvm.HostSpec{}, provider.Permanent(fmt.Errorf("host %q: %w", name, conn.ErrHostNotConfigured))
	}
	hs := kvm.HostSpec{
		Conn:          conn.HostConfig{Name: name, Address: name + ":22", User: "root"},
		Material:      func(context.Context) (*conn.Material, error) { return &conn.Material{}, nil },
		Pool:          PoolName,
		Network:       domxml.Network{Type: domxml.NetworkTypeNetwork, Name: NetworkName},
		DomainType:    typ,
		CheckInterval: interval,
	}
	if bridged {
		hs.Network = domxml.Network{Type: domxml.NetworkTypeBridge, Name: br.name}
		hs.Nameservers = br.nameservers
	}
	return hs, nil
}

// List implements kvm.HostSource.
func (h *Hosts) List(context.Context) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.names))
	for n := range h.names {
		out = append(out, n)
	}
	sort.Strings(out) // deterministic, so a test can choose which host is listed first
	return out, nil
}

// ImageServer serves one raw image and counts downloads.
type ImageServer struct {
	*httptest.Server
	Image provider.Image
	Body  []byte

	mu        sync.Mutex
	downloads int
}

// NewImageServer serves size bytes of deterministic content as a raw image
// named name. Close it when done.
func NewImageServer(name string, size int) *ImageServer {
	body := make([]byte, size)
	for i := range body {
		body[i] = byte(i*7 + i/251)
	}
	sum := sha256.Sum256(body)
	s := &ImageServer{Body: body}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.downloads++
		s.mu.Unlock()
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = w.Write(body)
	}))
	s.Image = provider.Image{
		Name:     name,
		URL:      s.URL + "/" + name + ".img",
		Checksum: "sha256:" + hex.EncodeToString(sum[:]),
		Format:   "raw",
		Firmware: "uefi",
	}
	return s
}

// Downloads counts the requests served.
func (s *ImageServer) Downloads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.downloads
}

// Wedge makes every RPC on f hang, as a libvirtd that stopped answering
// behind a live sshd (keepalives still answered, so the link stays up).
// release frees the hanging calls; tests defer it.
func Wedge(f *fake.Fake) (release func()) {
	releases := make([]func(), 0, len(virt.RPCNames))
	for _, rpc := range virt.RPCNames {
		releases = append(releases, f.Block(rpc))
	}
	return func() {
		for _, r := range releases {
			r()
		}
	}
}

// UndefineOutside removes a domain as `virsh destroy; virsh undefine
// --nvram` would, leaving its volumes in the pool.
func UndefineOutside(t testing.TB, f *fake.Fake, name string) {
	t.Helper()
	c := f.Connect()
	dom, err := c.DomainLookupByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DomainDestroyFlags(dom, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.DomainUndefineFlags(dom, libvirt.DomainUndefineNvram); err != nil {
		t.Fatal(err)
	}
}

// SlowLibvirt makes f take each chunk of an upload after step of clk's time
// (PaceUploads, StepSettled): a daemon that keeps taking bytes, slowly. clk
// must time the uploads' deadlines (virt.Deadlines.Clock).
func SlowLibvirt(f *fake.Fake, clk *testclock.FakeClock, step time.Duration) {
	f.PaceUploads(func(uint64) { StepSettled(clk, step) })
}

// StepSettled steps clk by d. When that fires a deadline, it waits (up to
// 5 s) until the call has looked at it and armed it again, as a call does
// whose stream is still moving; a call that gives up instead arms nothing,
// and its caller sees the abandonment. Without the wait, the test would
// race the call's goroutine: the next step could land before the call
// re-armed its deadline.
func StepSettled(clk *testclock.FakeClock, d time.Duration) {
	before := clk.Waiters()
	clk.Step(d)
	for end := time.Now().Add(5 * time.Second); clk.Waiters() < before && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

// SeedFiles reads the files of the seed ISO Create uploaded for the Proxy
// with UID uid on f, by name.
func SeedFiles(f *fake.Fake, uid string) (map[string][]byte, error) {
	iso, err := f.VolumeBytes(PoolName, domxml.SeedVolumeName(uid))
	if err != nil {
		return nil, err
	}
	img, err := iso9660.OpenImage(bytes.NewReader(iso))
	if err != nil {
		return nil, err
	}
	root, err := img.RootDir()
	if err != nil {
		return nil, err
	}
	children, err := root.GetChildren()
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	for _, c := range children {
		b, err := io.ReadAll(c.Reader())
		if err != nil {
			return nil, err
		}
		files[c.Name()] = b
	}
	return files, nil
}
