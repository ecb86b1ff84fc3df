package kvm

import (
	"net"
	"strings"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// findAddress returns the first routable IPv4 of dom and where it came from:
// the guest agent first (it knows the guest's own view), then the libvirt
// network's DHCP lease, then the host's ARP table. When none has one, the
// message says what was missing.
func findAddress(c virt.Client, dom libvirt.Domain, network domxml.Network) (addr, source, message string) {
	var missing []string
	ifaces, err := c.DomainInterfaceAddresses(dom, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
	switch {
	case virt.IsCode(err, libvirt.ErrAgentUnresponsive, libvirt.ErrAgentUnsynced):
		missing = append(missing, "guest agent not connected")
	case err != nil:
		missing = append(missing, "guest agent: "+err.Error())
	default:
		if a := firstRoutableIPv4(ifaces); a != "" {
			return a, provider.AddressSourceAgent, ""
		}
		missing = append(missing, "guest agent reports no routable IPv4 yet")
	}
	// Leases exist only on libvirt networks; ARP sees bridged guests too.
	if network.Type != domxml.NetworkTypeBridge {
		if ifaces, err := c.DomainInterfaceAddresses(dom, uint32(libvirt.DomainInterfaceAddressesSrcLease), 0); err == nil {
			if a := firstRoutableIPv4(ifaces); a != "" {
				return a, provider.AddressSourceLease, ""
			}
		}
		missing = append(missing, "no DHCP lease")
	}
	if ifaces, err := c.DomainInterfaceAddresses(dom, uint32(libvirt.DomainInterfaceAddressesSrcArp), 0); err == nil {
		if a := firstRoutableIPv4(ifaces); a != "" {
			return a, provider.AddressSourceARP, ""
		}
	}
	missing = append(missing, "no ARP entry")
	return "", "", strings.Join(missing, "; ")
}

// firstRoutableIPv4 skips loopback (the agent reports lo), link-local and
// unspecified addresses, and IPv6.
func firstRoutableIPv4(ifaces []libvirt.DomainInterface) string {
	for _, iface := range ifaces {
		if iface.Name == "lo" {
			continue
		}
		for _, a := range iface.Addrs {
			if a.Type != int32(libvirt.IPAddrTypeIpv4) {
				continue
			}
			ip := net.ParseIP(a.Addr).To4()
			if ip == nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() {
				continue
			}
			return ip.String()
		}
	}
	return ""
}
