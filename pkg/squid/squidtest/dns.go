package squidtest

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
)

// DNSAddress is where squid's resolver is pointed (squid always asks
// port 53). Any 127/8 address is local on Linux; this one is unlikely to
// be taken by a system resolver.
const DNSAddress = "127.0.0.153"

// ServeDNS answers A and AAAA queries for names from records on
// DNSAddress:53 (binding port 53 needs root, like the tests' squid
// dropping to the proxy user). Unknown names get NXDOMAIN. It exists so a
// name can resolve to several addresses, which /etc/hosts-style files
// cannot express to squid (its hosts_file keeps one address per name).
func ServeDNS(t *testing.T, records map[string][]string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", DNSAddress+":53")
	if err != nil {
		t.Fatalf("test DNS server on %s:53 (needs root): %v", DNSAddress, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := dnsAnswer(buf[:n], records); resp != nil {
				_, _ = pc.WriteTo(resp, from)
			}
		}
	}()
}

// dnsAnswer builds the response to one query (RFC 1035 wire format).
func dnsAnswer(q []byte, records map[string][]string) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	var labels []string
	i := 12
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if l > 63 || i+1+l > len(q) {
			return nil
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	if i+5 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i+1:])
	question := q[12 : i+5]
	name := strings.ToLower(strings.Join(labels, "."))

	var answers [][]byte
	addrs, known := records[name]
	for _, s := range addrs {
		a := netip.MustParseAddr(s)
		if (qtype == 1 && a.Is4()) || (qtype == 28 && a.Is6()) {
			answers = append(answers, a.AsSlice())
		}
	}
	resp := make([]byte, 12, 512)
	copy(resp, q[:2])
	flags := uint16(0x8580) // response, authoritative, RD, RA
	if !known {
		flags |= 3 // NXDOMAIN
	}
	binary.BigEndian.PutUint16(resp[2:], flags)
	binary.BigEndian.PutUint16(resp[4:], 1)
	binary.BigEndian.PutUint16(resp[6:], uint16(len(answers)))
	resp = append(resp, question...)
	for _, rdata := range answers {
		resp = append(resp, 0xc0, 12) // the question's name
		resp = binary.BigEndian.AppendUint16(resp, qtype)
		resp = binary.BigEndian.AppendUint16(resp, 1)   // IN
		resp = binary.BigEndian.AppendUint32(resp, 300) // TTL
		resp = binary.BigEndian.AppendUint16(resp, uint16(len(rdata)))
		resp = append(resp, rdata...)
	}
	return resp
}
