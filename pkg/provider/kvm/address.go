package kvm

import (
	"net"
	"slices"
	"strings"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// findAddress returns the routable IPv4 of dom to publish, where it came
// from, and a message. The DHCP lease comes first: the host's dnsmasq
// handed it out, whereas the guest agent repeats whatever the guest (whose
// user-data the Proxy's author wrote) claims. When the agent reports
// addresses and none is the leased one, the lease is still published and
// the message says both, so a disagreement is visible rather than silently
// resolved either way. Without a lease (bridged guests, static addresses)
// the agent is next, then the host's ARP table. When none has an address
// the message says what was missing.
func findAddress(c virt.Client, dom libvirt.Domain, network domxml.Network) (addr, source, message string) {
	var missing []string
	var leased string
	// Leases exist only on libvirt networks; ARP sees bridged guests too.
	if network.Type != domxml.NetworkTypeBridge {
		if ifaces, err := c.DomainInterfaceAddresses(dom, uint32(libvirt.DomainInterfaceAddressesSrcLease), 0); err == nil {
			leased = firstRoutableIPv4(ifaces)
		}
		if leased == "" {
			missing = append(missing, "no DHCP lease")
		}
	}

	var agentSays []string
	ifaces, err := c.DomainInterfaceAddresses(dom, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
	switch {
	case virt.IsCode(err, libvirt.ErrAgentUnresponsive, libvirt.ErrAgentUnsynced):
		missing = append(missing, "guest agent not connected")
	case err != nil:
		missing = append(missing, "guest agent: "+err.Error())
	default:
		if agentSays = routableIPv4s(ifaces); len(agentSays) == 0 {
			missing = append(missing, "guest agent reports no routable IPv4 yet")
		}
	}

	switch {
	case leased != "" && len(agentSays) > 0 && !slices.Contains(agentSays, leased):
		return leased, provider.AddressSourceLease,
			"guest agent reports " + strings.Join(agentSays, " and ") + ", DHCP lease says " + leased
	case leased != "":
		return leased, provider.AddressSourceLease, ""
	case len(agentSays) > 0:
		return agentSays[0], provider.AddressSourceAgent, ""
	}
	if ifaces, err := c.DomainInterfaceAddresses(dom, uint32(libvirt.DomainInterfaceAddressesSrcArp), 0); err == nil {
		if a := firstRoutableIPv4(ifaces); a != "" {
			return a, provider.AddressSourceARP, ""
		}
	}
	missing = append(missing, "no ARP entry")
	return "", "", strings.Join(missing, "; ")
}

// firstRoutableIPv4 is the first of routableIPv4s, or "".
func firstRoutableIPv4(ifaces []libvirt.DomainInterface) string {
	if all := routableIPv4s(ifaces); len(all) > 0 {
		return all[0]
	}
	return ""
}

// routableIPv4s skips loopback (the agent reports lo), link-local,
// unspecified and multicast addresses, and IPv6.
func routableIPv4s(ifaces []libvirt.DomainInterface) []string {
	var out []string
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
			out = append(out, ip.String())
		}
	}
	return out
}
