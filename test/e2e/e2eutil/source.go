package e2eutil

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
)

// ExtraSource adds a second address beside local (an address of this
// network namespace, e.g. the guests' gateway): the next address of local's
// network, on local's interface, with its prefix length. A client bound to
// it reaches the guests from outside an allow-list that names only local.
// remove deletes the address again. Only for a namespace the test created
// (the test hypervisor's): never in the root namespace.
func ExtraSource(ctx context.Context, local string) (addr string, remove func(context.Context) error, err error) {
	want, err := netip.ParseAddr(local)
	if err != nil {
		return "", nil, fmt.Errorf("local address %q: %w", local, err)
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", nil, err
	}
	for _, ifc := range ifaces {
		addrs, err := ifc.Addrs()
		if err != nil {
			return "", nil, err
		}
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok || ip.Unmap() != want {
				continue
			}
			ones, _ := n.Mask.Size()
			next := want.Next()
			if !netip.PrefixFrom(want, ones).Masked().Contains(next) {
				return "", nil, fmt.Errorf("no next address after %s in %s/%d", want, want, ones)
			}
			cidr := fmt.Sprintf("%s/%d", next, ones)
			if out, err := exec.CommandContext(ctx, "ip", "addr", "add", cidr, "dev", ifc.Name).CombinedOutput(); err != nil {
				return "", nil, fmt.Errorf("ip addr add %s dev %s: %w: %s", cidr, ifc.Name, err, strings.TrimSpace(string(out)))
			}
			remove = func(ctx context.Context) error {
				if out, err := exec.CommandContext(ctx, "ip", "addr", "del", cidr, "dev", ifc.Name).CombinedOutput(); err != nil {
					return fmt.Errorf("ip addr del %s dev %s: %w: %s", cidr, ifc.Name, err, strings.TrimSpace(string(out)))
				}
				return nil
			}
			return next.String(), remove, nil
		}
	}
	return "", nil, fmt.Errorf("no interface of this network namespace has address %s", local)
}
