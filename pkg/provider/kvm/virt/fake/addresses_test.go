package fake_test

import (
	"fmt"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

const mac = "52:54:00:aa:bb:01"

func flatten(ifs []libvirt.DomainInterface) string {
	var s string
	for _, i := range ifs {
		for _, a := range i.Addrs {
			s += fmt.Sprintf("%s=%s/%d ", i.Name, a.Addr, a.Prefix)
		}
	}
	return s
}

func TestInterfaceAddresses(t *testing.T) {
	src := func(s libvirt.DomainInterfaceAddressesSource) uint32 { return uint32(s) }
	tests := []struct {
		name    string
		d       dom
		running bool
		opts    []fake.Option
		setup   func(f *fake.Fake)
		source  uint32
		want    string
		code    libvirt.ErrorNumber
		msg     string
	}{
		{
			name: "agent on shut-off domain", d: dom{agent: true, mac: mac},
			source: src(libvirt.DomainInterfaceAddressesSrcAgent),
			code:   libvirt.ErrOperationInvalid, msg: "domain is not running",
		},
		{
			name: "lease on shut-off domain", d: dom{agent: true, mac: mac},
			source: src(libvirt.DomainInterfaceAddressesSrcLease),
			code:   libvirt.ErrOperationInvalid, msg: "domain is not running",
		},
		{
			name: "agent not connected yet", d: dom{agent: true, mac: mac}, running: true,
			opts:   []fake.Option{fake.WithAgentAutoConnect(false)},
			source: src(libvirt.DomainInterfaceAddressesSrcAgent),
			code:   libvirt.ErrAgentUnresponsive, msg: "Guest agent is not responding: QEMU guest agent is not connected",
		},
		{
			name: "agent disconnected by test", d: dom{agent: true, mac: mac}, running: true,
			setup:  func(f *fake.Fake) { f.SetAgentConnected("a", false) },
			source: src(libvirt.DomainInterfaceAddressesSrcAgent),
			code:   libvirt.ErrAgentUnresponsive, msg: "QEMU guest agent is not connected",
		},
		{
			name: "agent not configured", d: dom{mac: mac}, running: true,
			source: src(libvirt.DomainInterfaceAddressesSrcAgent),
			code:   libvirt.ErrArgumentUnsupported, msg: "QEMU guest agent is not configured",
		},
		{
			name: "agent reports lo first, then leased NIC", d: dom{agent: true, mac: mac}, running: true,
			setup:  func(f *fake.Fake) { f.SetLease("default", mac, "192.168.122.10", "a") },
			source: src(libvirt.DomainInterfaceAddressesSrcAgent),
			want:   "lo=127.0.0.1/8 lo=::1/128 eth0=192.168.122.10/24 ",
		},
		{
			name: "agent up, no DHCP lease yet: only lo", d: dom{agent: true, mac: mac}, running: true,
			source: src(libvirt.DomainInterfaceAddressesSrcAgent),
			want:   "lo=127.0.0.1/8 lo=::1/128 ",
		},
		{
			name: "agent addresses set by test", d: dom{agent: true, mac: mac}, running: true,
			setup: func(f *fake.Fake) {
				f.SetAgentAddresses("a", []libvirt.DomainInterface{{Name: "enp1s0", Hwaddr: libvirt.OptString{mac},
					Addrs: []libvirt.DomainIPAddr{{Type: int32(libvirt.IPAddrTypeIpv4), Addr: "10.0.0.7", Prefix: 16}}}})
			},
			source: src(libvirt.DomainInterfaceAddressesSrcAgent),
			want:   "lo=127.0.0.1/8 lo=::1/128 enp1s0=10.0.0.7/16 ",
		},
		{
			name: "lease source", d: dom{mac: mac}, running: true,
			setup:  func(f *fake.Fake) { f.SetLease("default", "52:54:00:AA:BB:01", "192.168.122.10", "a") },
			source: src(libvirt.DomainInterfaceAddressesSrcLease),
			want:   "vnet0=192.168.122.10/24 ",
		},
		{
			name: "lease source without lease", d: dom{mac: mac}, running: true,
			source: src(libvirt.DomainInterfaceAddressesSrcLease),
			want:   "",
		},
		{
			name: "arp source", d: dom{mac: mac}, running: true,
			setup:  func(f *fake.Fake) { f.SetARP(mac, "192.168.122.11") },
			source: src(libvirt.DomainInterfaceAddressesSrcArp),
			want:   "vnet0=192.168.122.11/24 ",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, tt.opts...)
			tt.d.name = "a"
			must(t, f.AddDomain(tt.d.xml(), tt.running))
			if tt.setup != nil {
				tt.setup(f)
			}
			h, _ := f.DomainLookupByName("a")
			ifs, err := f.DomainInterfaceAddresses(h, tt.source, 0)
			wantErr(t, err, tt.code, tt.msg)
			if got := flatten(ifs); err == nil && got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestAgentConnectsLate(t *testing.T) {
	f := newFake(t, fake.WithAgentAutoConnect(false))
	f.SetLease("default", mac, "192.168.122.10", "")
	must(t, f.AddDomain(dom{name: "a", agent: true, mac: mac}.xml(), true))
	h, _ := f.DomainLookupByName("a")
	_, err := f.DomainInterfaceAddresses(h, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
	if !virt.IsCode(err, libvirt.ErrAgentUnresponsive) {
		t.Fatalf("before connect: %v", err)
	}
	f.SetAgentConnected("a", true)
	ifs, err := f.DomainInterfaceAddresses(h, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
	must(t, err)
	if got := flatten(ifs); got != "lo=127.0.0.1/8 lo=::1/128 eth0=192.168.122.10/24 " {
		t.Fatalf("after connect: %q", got)
	}
}

func TestNetworkDHCPLeases(t *testing.T) {
	f := newFake(t)
	if _, err := f.NetworkLookupByName("nope"); !virt.IsCode(err, libvirt.ErrNoNetwork) {
		t.Fatalf("missing network: %v", err)
	}
	f.SetLease("default", "52:54:00:00:00:01", "192.168.122.2", "one")
	f.SetLease("default", "52:54:00:00:00:02", "192.168.122.3", "")
	f.SetLease("default", "52:54:00:00:00:01", "192.168.122.4", "one") // renewed with a new IP
	nw, err := f.NetworkLookupByName("default")
	must(t, err)

	tests := []struct {
		mac  libvirt.OptString
		want []string
	}{
		{nil, []string{"192.168.122.4", "192.168.122.3"}},
		{libvirt.OptString{"52:54:00:00:00:02"}, []string{"192.168.122.3"}},
		{libvirt.OptString{"52:54:00:00:00:09"}, nil},
	}
	for _, tt := range tests {
		leases, n, err := f.NetworkGetDhcpLeases(nw, tt.mac, 1, 0)
		must(t, err)
		var got []string
		for _, l := range leases {
			got = append(got, l.Ipaddr)
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) || int(n) != len(tt.want) {
			t.Errorf("mac %v: got %v (n=%d), want %v", tt.mac, got, n, tt.want)
		}
	}
	leases, _, _ := f.NetworkGetDhcpLeases(nw, libvirt.OptString{"52:54:00:00:00:01"}, 1, 0)
	if l := leases[0]; len(l.Hostname) != 1 || l.Hostname[0] != "one" || l.Prefix != 24 || l.Iface == "" {
		t.Errorf("lease fields: %+v", l)
	}
}
