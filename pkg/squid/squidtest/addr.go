package squidtest

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"crawl.example.com/proxy-operator/internal/testutil"
)

// AddLoopbackAddress puts addr on lo, in the test's network namespace
// (Main), so an Origin can listen on an address that stands for another
// network (a cluster's Service range, a node) and squid's connection to it
// stays on this machine. It fails unless the namespace holds only lo.
// An address already there is fine.
func AddLoopbackAddress(t testing.TB, addr netip.Addr) {
	t.Helper()
	RequireOnlyLoopback(t)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := addAddress(lo.Index, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		t.Fatalf("adding %s to lo: %v", addr, err)
	}
	// The kernel installs an IPv6 address's local route from a workqueue,
	// even with NODAD, so on a loaded machine a connect right after
	// RTM_NEWADDR can find no route: wait until a TCP connection to the
	// address goes through. Not a UDP connect, which looks the route up
	// without sending anything: on this project's CI kernel (6.18), about
	// one IPv6 address in twenty probed that way lost its route a second
	// later, for good ("network is unreachable"; none of 48 probed by TCP).
	l, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	defer l.Close()
	testutil.WaitFor(t, func() bool {
		c, err := net.Dial("tcp", l.Addr().String())
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// addAddress sends RTM_NEWADDR (what ip addr add sends) and reads the
// kernel's answer.
func addAddress(ifindex int, addr netip.Addr) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}

	family := unix.AF_INET6
	if addr.Is4() {
		family = unix.AF_INET
	}
	raw := addr.AsSlice()
	attr := func(typ uint16, data []byte) []byte {
		b := make([]byte, unix.SizeofRtAttr, unix.SizeofRtAttr+len(data)+3)
		binary.NativeEndian.PutUint16(b[0:2], uint16(unix.SizeofRtAttr+len(data)))
		binary.NativeEndian.PutUint16(b[2:4], typ)
		b = append(b, data...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	body := make([]byte, unix.SizeofIfAddrmsg)
	body[0] = byte(family)
	body[1] = byte(addr.BitLen()) // prefix length: this address alone
	body[2] = unix.IFA_F_NODAD
	body[3] = unix.RT_SCOPE_UNIVERSE
	binary.NativeEndian.PutUint32(body[4:8], uint32(ifindex))
	body = append(body, attr(unix.IFA_LOCAL, raw)...)
	body = append(body, attr(unix.IFA_ADDRESS, raw)...)

	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:4], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:6], unix.RTM_NEWADDR)
	binary.NativeEndian.PutUint16(msg[6:8], unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	binary.NativeEndian.PutUint32(msg[8:12], 1) // sequence
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}

	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	// One NLMSG_ERROR: the header, then the error code (0: done).
	if n < unix.SizeofNlMsghdr+4 || binary.NativeEndian.Uint16(buf[4:6]) != unix.NLMSG_ERROR {
		return errors.New("unexpected answer from the kernel")
	}
	if code := int32(binary.NativeEndian.Uint32(buf[unix.SizeofNlMsghdr:])); code != 0 {
		return unix.Errno(-code)
	}
	return nil
}

// LastAddr is the highest address of p (its first is p.Masked().Addr()):
// a range is checked at both ends.
func LastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
