package seed

import (
	"net"
	"net/netip"
	"testing"
)

// FuzzNetworkConfig: whatever the IPAddress, its MAC annotation and the
// KVMHost's nameservers hold (they reach the renderer parsed, but the MAC
// as text), the renderer either refuses it or writes one v2 document whose
// values are exactly the inputs: nothing in a value becomes a key.
func FuzzNetworkConfig(f *testing.F) {
	f.Add([]byte{203, 0, 113, 5}, 28, []byte{203, 0, 113, 1}, "02:00:5e:10:00:05", []byte{192, 0, 2, 53})
	f.Add([]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10}, 64, []byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, "52:54:00:AA:BB:CC", []byte{192, 0, 2, 53})
	f.Add([]byte{10, 0, 0, 1}, 32, []byte{}, "02:00:5e:10:00:05\"\nx: y", []byte{1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, addr []byte, bits int, gw []byte, mac string, ns []byte) {
		a, ok := netip.AddrFromSlice(addr)
		if !ok {
			return
		}
		n := Network{Address: netip.PrefixFrom(a, bits), MAC: mac}
		if g, ok := netip.AddrFromSlice(gw); ok {
			n.Gateway = g
		}
		if s, ok := netip.AddrFromSlice(ns); ok {
			n.Nameservers = []netip.Addr{s}
		}
		b, err := NetworkConfig(n)
		if err != nil {
			return
		}
		nic := parseV2(t, b)
		hw, _ := net.ParseMAC(mac)
		if nic.Match.MACAddress != hw.String() {
			t.Errorf("macaddress %q, want %q", nic.Match.MACAddress, mac)
		}
		if len(nic.Addresses) != 1 || nic.Addresses[0] != n.Address.String() {
			t.Errorf("addresses %v, want [%s]", nic.Addresses, n.Address)
		}
		if g := nic.Gateway4 + nic.Gateway6; n.Gateway.IsValid() && g != n.Gateway.String() {
			t.Errorf("gateway %q, want %s", g, n.Gateway)
		}
		if len(nic.Nameservers.Addresses) != 1 || nic.Nameservers.Addresses[0] != n.Nameservers[0].String() {
			t.Errorf("nameservers %v, want [%s]", nic.Nameservers.Addresses, n.Nameservers[0])
		}
	})
}
