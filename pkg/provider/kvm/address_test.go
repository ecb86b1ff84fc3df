package kvm_test

import (
	"context"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

func ipv4s(name string, ips ...string) []libvirt.DomainInterface {
	i := libvirt.DomainInterface{Name: name}
	for _, ip := range ips {
		i.Addrs = append(i.Addrs, libvirt.DomainIPAddr{Type: int32(libvirt.IPAddrTypeIpv4), Addr: ip, Prefix: 24})
	}
	return []libvirt.DomainInterface{i}
}

// TestPublishedAddressPrefersTheDHCPLease: the host's lease beats the guest
// agent's claim, and a disagreement is said, never settled silently.
func TestPublishedAddressPrefersTheDHCPLease(t *testing.T) {
	const leased = "192.168.122.10"
	cases := []struct {
		name              string
		lease             bool
		agent             []libvirt.DomainInterface // nil: the fake's default (the leased address)
		agentDown         bool
		wantAddr, wantSrc string
		wantMsg           string
	}{
		{name: "agent agrees", lease: true, wantAddr: leased, wantSrc: provider.AddressSourceLease},
		{name: "agent claims another address", lease: true, agent: ipv4s("eth0", "10.96.0.1"),
			wantAddr: leased, wantSrc: provider.AddressSourceLease, wantMsg: "guest agent reports 10.96.0.1, DHCP lease says " + leased},
		{name: "agent lists the lease among others", lease: true, agent: ipv4s("eth0", "172.17.0.1", leased),
			wantAddr: leased, wantSrc: provider.AddressSourceLease},
		{name: "agent not connected", lease: true, agentDown: true, wantAddr: leased, wantSrc: provider.AddressSourceLease},
		{name: "no lease: the agent's address", agent: ipv4s("eth0", "192.0.2.10"),
			wantAddr: "192.0.2.10", wantSrc: provider.AddressSourceAgent},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "hv1")
			ctx := context.Background()
			m := e.created("hv1", "crawl", "p1", "uid-1")
			f := e.fakes["hv1"]
			if tc.lease {
				f.SetLease(kvmtest.NetworkName, domainMAC(t, f), leased, "p1")
			}
			if tc.agent != nil {
				f.SetAgentAddresses("crawl.p1", tc.agent)
			}
			if tc.agentDown {
				f.SetAgentConnected("crawl.p1", false)
			}
			got, err := e.prov.Get(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			if got.Address != tc.wantAddr || got.AddressSource != tc.wantSrc || got.Message != tc.wantMsg {
				t.Fatalf("Get = address %q from %q, message %q; want %q from %q, message %q",
					got.Address, got.AddressSource, got.Message, tc.wantAddr, tc.wantSrc, tc.wantMsg)
			}
		})
	}
}

// domainMAC is the MAC libvirt (the fake) gave crawl.p1's NIC.
func domainMAC(t *testing.T, f *fake.Fake) string {
	t.Helper()
	d, ok := f.Domain("crawl.p1")
	if !ok {
		t.Fatal("no domain crawl.p1")
	}
	var x libvirtxml.Domain
	if err := x.Unmarshal(d.ConfigXML); err != nil {
		t.Fatal(err)
	}
	if x.Devices == nil || len(x.Devices.Interfaces) == 0 || x.Devices.Interfaces[0].MAC == nil {
		t.Fatalf("crawl.p1 has no NIC with a MAC:\n%s", d.ConfigXML)
	}
	return x.Devices.Interfaces[0].MAC.Address
}
