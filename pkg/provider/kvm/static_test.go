package kvm_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/seed"
)

var testNameserver = netip.MustParseAddr("192.0.2.53")

func staticMachine(e *env, uid, mac string) *provider.Machine {
	m := e.machine("hv1", "crawl", "p-"+uid, uid)
	m.StaticNetwork = &provider.StaticNetwork{
		Address: netip.MustParsePrefix("203.0.113.5/28"),
		Gateway: netip.MustParseAddr("203.0.113.1"),
		MAC:     mac,
	}
	return m
}

// On a bridged host the static address reaches the guest: the seed carries
// the network-config for it, matching the NIC by the MAC the domain XML
// gives it: the address's virtual MAC, else the Proxy's own.
func TestStaticAddressReachesTheSeedAndTheNIC(t *testing.T) {
	for _, tc := range []struct {
		name, mac, wantMAC string
	}{
		{"virtual MAC of the address", "02:00:5e:10:00:05", "02:00:5e:10:00:05"},
		{"no virtual MAC: the Proxy's own", "", domxml.ProxyMAC("uid-s2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "hv1")
			e.hosts.SetBridge("hv1", "br0", testNameserver)
			uid := "uid-s1"
			if tc.mac == "" {
				uid = "uid-s2"
			}
			m := staticMachine(e, uid, tc.mac)
			if _, err := e.prov.Create(context.Background(), m); err != nil {
				t.Fatalf("Create: %v", err)
			}
			d, ok := e.fakes["hv1"].Domain(domxml.DomainName(m.Namespace, m.Name))
			if !ok {
				t.Fatal("no domain")
			}
			if !strings.Contains(d.ConfigXML, `<mac address="`+tc.wantMAC+`">`) || !strings.Contains(d.ConfigXML, `<source bridge="br0">`) {
				t.Errorf("domain XML lacks the MAC %s on bridge br0:\n%s", tc.wantMAC, d.ConfigXML)
			}
			got := seedFiles(t, e, "hv1", uid)[seed.NetworkConfigFile]
			want, err := seed.NetworkConfig(seed.Network{Address: m.StaticNetwork.Address, Gateway: m.StaticNetwork.Gateway, MAC: tc.wantMAC, Nameservers: []netip.Addr{testNameserver}})
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("seed network-config:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// A host whose VMs sit behind libvirt's NAT network, or one without
// nameservers for static guests, refuses the static address before
// anything is made for it, naming the cause.
func TestStaticAddressRefusedWhereItCannotWork(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bridge bool
		want   string
	}{
		{"NAT network", false, `needs a KVMHost with networkMode bridge: KVMHost "hv1" attaches VMs to libvirt network`},
		{"bridge without nameservers", true, `KVMHost "hv1" has no spec.nameservers`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "hv1")
			if tc.bridge {
				e.hosts.SetBridge("hv1", "br0")
			}
			m := staticMachine(e, "uid-nat", "")
			_, err := e.prov.Create(context.Background(), m)
			if err == nil || !strings.Contains(err.Error(), tc.want) || provider.Class(err) != provider.ClassPermanent {
				t.Fatalf("Create = %v (class %s), want a permanent error containing %q", err, provider.Class(err), tc.want)
			}
			if disk, seedVol := volumes(e.fakes["hv1"], "uid-nat"); disk || seedVol || e.img.Downloads() != 0 {
				t.Errorf("made something for a refused address: disk=%v seed=%v downloads=%d", disk, seedVol, e.img.Downloads())
			}
		})
	}
}

// Without a static address nothing changes: no network-config (the guest
// falls back to DHCP) and libvirt chooses the MAC.
func TestNoStaticAddressNoNetworkConfig(t *testing.T) {
	e := newEnv(t, "hv1")
	e.hosts.SetBridge("hv1", "br0", testNameserver)
	m := e.created("hv1", "crawl", "p1", "uid-dhcp")
	if f := seedFiles(t, e, "hv1", "uid-dhcp"); f[seed.NetworkConfigFile] != nil {
		t.Errorf("network-config without a static address: %q", f[seed.NetworkConfigFile])
	}
	d, _ := e.fakes["hv1"].Domain(domxml.DomainName(m.Namespace, m.Name))
	if strings.Contains(d.ConfigXML, domxml.ProxyMAC("uid-dhcp")) {
		t.Errorf("the operator chose the MAC without a static address (libvirt's to choose):\n%s", d.ConfigXML)
	}
}
