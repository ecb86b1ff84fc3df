package seed

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// NetworkConfigFile is the NoCloud file holding the network configuration
// (v1 or v2); when present it replaces cloud-init's fallback (DHCP on the
// first NIC).
const NetworkConfigFile = "network-config"

// NICName is the name the statically configured NIC gets (set-name), so
// the configuration does not depend on the guest's predictable name for it
// (enp1s0 on q35, ens3 on i440fx).
const NICName = "eth0"

// Network is the static configuration of the guest's one NIC.
type Network struct {
	// Address with its prefix length.
	Address netip.Prefix
	// Gateway is the default route's next hop, inside Address's prefix;
	// the zero Addr for none.
	Gateway netip.Addr
	// MAC the configuration matches the NIC by: the one in the domain XML.
	MAC string
	// Nameservers the guest resolves with; a static configuration has no
	// DHCP to learn them from.
	Nameservers []netip.Addr
}

// NetworkConfig renders n as cloud-init network-config version 2, in the
// subset every renderer of cloud-init 22.4 (Debian 12) turns into the same
// configuration: ENI (ifupdown), netplan (passed through) and networkd.
// The NIC is matched by MAC and renamed NICName, DHCP is off, the address
// carries its prefix, and the default route is gateway4/gateway6, which ENI
// renders as "gateway" and networkd as [Route] Gateway=; a routes entry
// would need "to: default" (not parsed before cloud-init 25.3) or net-tools'
// route on ENI. The gateway is inside the prefix (the caller checked), so
// no on-link route is needed. Values are YAML double-quoted scalars
// (strconv.Quote, as MetaData), so nothing in them can add keys. Bad input
// is a permanent error naming what is wrong.
func NetworkConfig(n Network) ([]byte, error) {
	hw, err := n.check()
	if err != nil {
		return nil, err
	}
	q := func(s string) string { return strconv.Quote(s) }
	var b bytes.Buffer
	b.WriteString("version: 2\nethernets:\n")
	fmt.Fprintf(&b, "  %s:\n", NICName)
	fmt.Fprintf(&b, "    match:\n      macaddress: %s\n", q(hw.String()))
	fmt.Fprintf(&b, "    set-name: %s\n", q(NICName))
	b.WriteString("    dhcp4: false\n    dhcp6: false\n")
	fmt.Fprintf(&b, "    addresses:\n      - %s\n", q(n.Address.String()))
	if n.Gateway.IsValid() {
		key := "gateway4"
		if n.Gateway.Is6() {
			key = "gateway6"
		}
		fmt.Fprintf(&b, "    %s: %s\n", key, q(n.Gateway.String()))
	}
	b.WriteString("    nameservers:\n      addresses:\n")
	for _, ns := range n.Nameservers {
		fmt.Fprintf(&b, "        - %s\n", q(ns.String()))
	}
	return b.Bytes(), nil
}

// check returns n's MAC, parsed, or why n cannot be rendered.
func (n Network) check() (net.HardwareAddr, error) {
	hw, err := net.ParseMAC(n.MAC)
	switch {
	case !n.Address.IsValid():
		return nil, provider.Permanentf("network-config: no valid address")
	case n.Address.Addr().Zone() != "":
		return nil, provider.Permanentf("network-config: address %s has a zone", n.Address)
	case err != nil || len(hw) != 6:
		return nil, provider.Permanentf("network-config: MAC %q is not a 48-bit MAC address", n.MAC)
	case len(n.Nameservers) == 0:
		return nil, provider.Permanentf("network-config: no nameservers")
	case n.Gateway.IsValid() && (n.Gateway.Zone() != "" || !n.Address.Masked().Contains(n.Gateway) || n.Gateway == n.Address.Addr()):
		return nil, provider.Permanentf("network-config: gateway %s is not another address inside %s", n.Gateway, n.Address.Masked())
	}
	for _, ns := range n.Nameservers {
		if !ns.IsValid() || ns.Zone() != "" {
			return nil, provider.Permanentf("network-config: nameserver %q is not an IP address", ns)
		}
	}
	return hw, nil
}
