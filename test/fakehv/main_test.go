package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn/sshtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// TestHostsServeTheConnPool starts two hosts and reaches one as the
// manager does, through conn.Pool: TCP, SSH with the written known_hosts,
// libvirt's socket forwarded, go-libvirt; a domain defined and started
// there sends its lifecycle events to the pool's OnConnect, gets a guest
// agent address from the guest player, and shows in /stats.
func TestHostsServeTheConnPool(t *testing.T) {
	dir, err := os.MkdirTemp("", "fhv") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	signer, keyPEM := sshtest.NewKey(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fl, err := start(ctx, config{hosts: 2, prefix: "hv", dir: dir, maxRequests: 5, cpus: 8, memoryGiB: 16, bootGuests: true, clientKey: signer.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fl.close)

	var hosts []Host
	readJSON(t, filepath.Join(dir, "hosts.json"), &hosts)
	if len(hosts) != 2 || hosts[1].Name != "hv-001" {
		t.Fatalf("hosts.json: %+v", hosts)
	}
	known, err := os.ReadFile(filepath.Join(dir, "known_hosts"))
	if err != nil {
		t.Fatal(err)
	}
	material, err := conn.SecretMaterial(map[string][]byte{crawlv1.SSHPrivateKeyKey: keyPEM, crawlv1.KnownHostsKey: known})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan libvirt.DomainEventLifecycleMsg, 16)
	// OnConnect runs in a goroutine of its own: the domain is defined only
	// once the callback is registered, or its Defined event may go unseen.
	subscribed := make(chan struct{})
	pool := conn.New(conn.Options{OnConnect: func(_ string, c virt.Client, gone <-chan struct{}) {
		ch, err := c.LifecycleEvents(ctx)
		close(subscribed)
		if err != nil {
			t.Error(err)
			return
		}
		for ev := range ch {
			events <- ev
		}
	}})
	t.Cleanup(pool.Close)
	h := hosts[1]
	if err := pool.Set(conn.HostConfig{Name: h.Name, Address: h.Address, User: "root"},
		func(context.Context) (*conn.Material, error) { return material, nil }); err != nil {
		t.Fatal(err)
	}

	const xml = `<domain type='kvm'><name>ns.p1</name><memory unit='MiB'>256</memory><os><type arch='x86_64'>hvm</type></os>` +
		`<devices><channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel></devices></domain>`
	var addrs []libvirt.DomainInterface
	err = pool.Do(ctx, h.Name, func(c virt.Client) error {
		if name, err := c.ConnectGetHostname(); err != nil || name != h.Name {
			t.Errorf("hostname %q (%v), want %q", name, err, h.Name)
		}
		select {
		case <-subscribed:
		case <-time.After(5 * time.Second):
			return errors.New("OnConnect did not register for lifecycle events")
		}
		dom, err := c.DomainDefineXMLFlags(xml, 0)
		if err != nil {
			return err
		}
		if err := c.DomainCreate(dom); err != nil {
			return err
		}
		for end := time.Now().Add(5 * time.Second); !hasEth0(addrs) && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			addrs, err = c.DomainInterfaceAddresses(dom, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !hasEth0(addrs) {
		t.Fatalf("agent addresses %+v, want eth0's that the guest player gave", addrs)
	}
	for _, want := range []libvirt.DomainEventType{libvirt.DomainEventDefined, libvirt.DomainEventStarted} {
		select {
		case ev := <-events:
			if ev.Dom.Name != "ns.p1" || libvirt.DomainEventType(ev.Event) != want {
				t.Errorf("event %+v, want %v of ns.p1", ev, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %v event through the pool", want)
		}
	}

	var st Stats
	hc := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(dir, "control.sock"))
	}}}
	resp, err := hc.Get("http://fakehv/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.Hosts != 2 || st.Domains != 1 || st.Booted != 1 || st.Calls[virt.RPCDomainCreate] != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestOnlyLibvirtsSocketIsForwarded: a KVMHost naming another socket path
// fails to connect, as sshd would find nothing there.
func TestOnlyLibvirtsSocketIsForwarded(t *testing.T) {
	dir, err := os.MkdirTemp("", "fhv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	signer, _ := sshtest.NewKey(t)
	fl, err := start(context.Background(), config{hosts: 1, prefix: "hv", dir: dir, clientKey: signer.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fl.close)
	cl, err := ssh.Dial("tcp", fl.hosts[0].Address, &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey()}) //nolint:gosec // the host key check is conn.Pool's, tested above
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if c, err := cl.Dial("unix", "/run/other-sock"); err == nil {
		_ = c.Close()
		t.Fatal("forwarded a socket other than libvirt's")
	}
	c, err := cl.Dial("unix", crawlv1.DefaultLibvirtSocket)
	if err != nil {
		t.Fatalf("libvirt's socket: %v", err)
	}
	_ = c.Close()
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func hasEth0(ifaces []libvirt.DomainInterface) bool {
	for _, i := range ifaces {
		if i.Name == "eth0" && len(i.Addrs) == 1 && strings.HasPrefix(i.Addrs[0].Addr, "10.") {
			return true
		}
	}
	return false
}
