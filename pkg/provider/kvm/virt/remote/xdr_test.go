package remote

import (
	"encoding/hex"
	"reflect"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"
)

// TestMarshalWireForm pins the bytes of each kind against RFC 4506 and
// go-libvirt's decoder (checked end to end by fake's conformance test).
func TestMarshalWireForm(t *testing.T) {
	tests := []struct {
		name string
		v    any
		want string // hex
	}{
		{"int32", int32(-2), "fffffffe"},
		{"int8 takes 4 bytes", int8(-1), "ffffffff"},
		{"uint8 takes 4 bytes", uint8(7), "00000007"},
		{"uint64", uint64(1) << 40, "0000010000000000"},
		{"bool", true, "00000001"},
		{"string padded", "abcde", "00000005" + "6162636465000000"},
		{"empty string", "", "00000000"},
		{"variable opaque", []byte{1, 2}, "00000002" + "01020000"},
		{"fixed opaque (UUID) has no length", libvirt.UUID{0: 0xab, 15: 0xcd}, "ab0000000000000000000000000000cd"},
		{"optional string absent", libvirt.OptString(nil), "00000000"},
		{"optional string present", libvirt.OptString{"x"}, "00000001" + "00000001" + "78000000"},
		{"array of int8 is elements", [2]int8{1, 2}, "00000001" + "00000002"},
		{"struct fields in order", libvirt.DomainGetStateRet{State: 1, Reason: 5}, "00000001" + "00000005"},
		{"typed param: discriminant then value", libvirt.TypedParamValue{D: 4, I: uint64(9)}, "00000004" + "0000000000000009"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Marshal(tt.v)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(b); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestUnmarshalRoundTrip(t *testing.T) {
	in := libvirt.NetworkGetDhcpLeasesRet{
		Leases: []libvirt.NetworkDhcpLease{{Iface: "virbr0", Expirytime: -3, Type: 1, Mac: libvirt.OptString{"52:54:00:00:00:01"},
			Ipaddr: "10.0.0.2", Prefix: 24, Hostname: libvirt.OptString{"h"}}},
		Ret: 1,
	}
	b, err := Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out libvirt.NetworkGetDhcpLeasesRet
	if err := Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("got %+v, want %+v", out, in)
	}
	args := libvirt.DomainGetMetadataArgs{Dom: libvirt.Domain{Name: "a", UUID: libvirt.UUID{1}, ID: -1}, Type: 2, Uri: libvirt.OptString{"urn:x"}, Flags: 2}
	if b, err = Marshal(args); err != nil {
		t.Fatal(err)
	}
	var back libvirt.DomainGetMetadataArgs
	if err := Unmarshal(b, &back); err != nil || !reflect.DeepEqual(args, back) {
		t.Errorf("got %+v (%v), want %+v", back, err, args)
	}
}

func TestUnmarshalRefusesMalformedPayloads(t *testing.T) {
	var s libvirt.DomainLookupByNameArgs
	for name, tt := range map[string]struct {
		hex, err string
	}{
		"short":                       {"00000005616263", "too short"},
		"left over":                   {"00000001" + "61000000" + "00000000", "left over"},
		"count beyond the payload":    {"7fffffff", "too short"},
		"padding missing after bytes": {"00000001" + "61", "too short"},
	} {
		t.Run(name, func(t *testing.T) {
			b, _ := hex.DecodeString(tt.hex)
			err := Unmarshal(b, &s)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("got %v, want an error containing %q", err, tt.err)
			}
		})
	}
}
