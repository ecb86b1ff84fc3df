package fake

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

type network struct {
	name   string
	uuid   libvirt.UUID
	bridge string
	leases []lease // in the order they were handed out
}

type lease struct {
	mac, ip, hostname string
}

// leaseIP returns the DHCP lease of a NIC on its libvirt network.
func (f *Fake) leaseIP(n nic) (string, bool) {
	nw := f.networks[n.network]
	if nw == nil {
		return "", false
	}
	for _, l := range nw.leases {
		if l.mac == n.mac {
			return l.ip, true
		}
	}
	return "", false
}

// NetworkLookupByName implements virt.Client.
func (c *Conn) NetworkLookupByName(name string) (libvirt.Network, error) {
	return do(c, virt.RPCNetworkLookupByName, func(f *Fake) (libvirt.Network, error) {
		nw := f.networks[name]
		if nw == nil {
			return libvirt.Network{}, lverr(libvirt.ErrNoNetwork, "no network with matching name '%s'", name)
		}
		return libvirt.Network{Name: nw.name, UUID: nw.uuid}, nil
	})
}

// NetworkGetDhcpLeases implements virt.Client; mac, if given, filters
// (case-insensitively). Leases expire an hour from the call.
func (c *Conn) NetworkGetDhcpLeases(net libvirt.Network, mac libvirt.OptString, needResults int32, flags uint32) ([]libvirt.NetworkDhcpLease, uint32, error) {
	type res struct {
		leases []libvirt.NetworkDhcpLease
		n      uint32
	}
	r, err := do(c, virt.RPCNetworkGetDHCPLeases, func(f *Fake) (res, error) {
		var nw *network
		for _, n := range f.networks {
			if n.uuid == net.UUID {
				nw = n
			}
		}
		if nw == nil {
			return res{}, lverr(libvirt.ErrNoNetwork, "no network with matching uuid '%s' (%s)", virt.FormatUUID(net.UUID), net.Name)
		}
		expiry := time.Now().Add(time.Hour).Unix()
		var out []libvirt.NetworkDhcpLease
		for _, l := range nw.leases {
			if len(mac) > 0 && !strings.EqualFold(mac[0], l.mac) {
				continue
			}
			typ, prefix := int32(libvirt.IPAddrTypeIpv4), uint32(24)
			if strings.Contains(l.ip, ":") {
				typ, prefix = int32(libvirt.IPAddrTypeIpv6), 64
			}
			dl := libvirt.NetworkDhcpLease{Iface: nw.bridge, Expirytime: expiry, Type: typ,
				Mac: libvirt.OptString{l.mac}, Ipaddr: l.ip, Prefix: prefix}
			if l.hostname != "" {
				dl.Hostname = libvirt.OptString{l.hostname}
			}
			out = append(out, dl)
		}
		n := uint32(len(out))
		if needResults == 0 {
			out = nil
		}
		return res{out, n}, nil
	})
	return r.leases, r.n, err
}

// Test controls for networking.

// AddNetwork adds an active libvirt network with its own bridge.
func (f *Fake) AddNetwork(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.networks[name]; ok {
		return
	}
	f.networks[name] = &network{name: name, uuid: virt.NewUUID(), bridge: fmt.Sprintf("virbr%d", len(f.networks))}
}

// SetLease records (or replaces) the DHCP lease of mac on network, which
// must exist. It feeds NetworkGetDhcpLeases, the lease address source and
// the agent's default addresses.
func (f *Fake) SetLease(networkName, mac, ip, hostname string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	nw := f.networks[networkName]
	if nw == nil {
		panic(fmt.Sprintf("fake: SetLease on unknown network %q", networkName))
	}
	mac = strings.ToLower(mac)
	l := lease{mac: mac, ip: ip, hostname: hostname}
	if i := slices.IndexFunc(nw.leases, func(l lease) bool { return l.mac == mac }); i >= 0 {
		nw.leases[i] = l
		return
	}
	nw.leases = append(nw.leases, l)
}

// RemoveLease drops mac's lease on network.
func (f *Fake) RemoveLease(networkName, mac string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if nw := f.networks[networkName]; nw != nil {
		nw.leases = slices.DeleteFunc(nw.leases, func(l lease) bool { return strings.EqualFold(l.mac, mac) })
	}
}

// SetARP sets the host neighbour-table entry for mac ("" ip removes it),
// used by the arp address source.
func (f *Fake) SetARP(mac, ip string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ip == "" {
		delete(f.arp, strings.ToLower(mac))
		return
	}
	f.arp[strings.ToLower(mac)] = ip
}
