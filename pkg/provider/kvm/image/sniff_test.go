package image

import (
	"encoding/binary"
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider"
)

func TestSniff(t *testing.T) {
	be := binary.BigEndian
	for _, tc := range []struct {
		name    string
		format  string
		head    []byte
		size    int64
		wantCap uint64
		errHas  string
	}{
		{name: "raw", format: FormatRaw, head: []byte{0xeb, 0x63, 0x90}, size: 5 << 20, wantCap: 5 << 20},
		{name: "raw unknown size", format: FormatRaw, head: []byte{0}, size: -1, wantCap: 0},
		{name: "qcow2 v3", format: FormatQCOW2, head: qcow2Header(2<<30, nil), size: 600 << 20, wantCap: 2 << 30},
		{name: "qcow2 v2", format: FormatQCOW2, head: qcow2Header(1<<30, func(h []byte) { be.PutUint32(h[qcowVersionOff:], 2) })[:qcowV2HeaderLen], wantCap: 1 << 30},
		{name: "qcow2 dirty bit is fine", format: FormatQCOW2, head: qcow2Header(1<<30, func(h []byte) { h[qcowIncompatOff+7] = 1 }), wantCap: 1 << 30},
		{name: "empty", format: FormatRaw, errHas: "empty"},
		{name: "raw that is qcow2", format: FormatRaw, head: qcow2Header(1, nil), errHas: "declared raw"},
		{name: "qcow2 that is not", format: FormatQCOW2, head: []byte("<html>"), errHas: "not qcow2"},
		{name: "xz", format: FormatRaw, head: []byte{0xfd, '7', 'z', 'X', 'Z', 0, 1}, errHas: "xz-compressed"},
		{name: "gzip", format: FormatQCOW2, head: []byte{0x1f, 0x8b, 8}, errHas: "gzip-compressed"},
		{name: "qcow2 v1", format: FormatQCOW2, head: qcow2Header(1, func(h []byte) { be.PutUint32(h[qcowVersionOff:], 1) }), errHas: "version 1"},
		{name: "qcow2 truncated", format: FormatQCOW2, head: qcow2Header(1, nil)[:40], errHas: "truncated"},
		{name: "qcow2 backing file", format: FormatQCOW2, head: qcow2Header(1, func(h []byte) { be.PutUint64(h[qcowBackingOffsetOff:], 104) }), errHas: "backing file"},
		{name: "qcow2 data file", format: FormatQCOW2, head: qcow2Header(1, func(h []byte) { h[qcowIncompatOff+7] = qcowIncompatDataFile }), errHas: "external data file"},
		{name: "qcow2 corrupt", format: FormatQCOW2, head: qcow2Header(1, func(h []byte) { h[qcowIncompatOff+7] = qcowIncompatCorrupt }), errHas: "corrupt"},
		{name: "qcow2 unknown feature", format: FormatQCOW2, head: qcow2Header(1, func(h []byte) { h[qcowIncompatOff] = 0x80 }), errHas: "unknown incompatible"},
		{name: "qcow2 encrypted", format: FormatQCOW2, head: qcow2Header(1, func(h []byte) { be.PutUint32(h[qcowCryptMethodOff:], 1) }), errHas: "encrypted"},
		{name: "qcow2 zero size", format: FormatQCOW2, head: qcow2Header(0, nil), errHas: "virtual size of 0"},
		{name: "qcow2 cluster bits", format: FormatQCOW2, head: qcow2Header(1, func(h []byte) { be.PutUint32(h[qcowClusterBitsOff:], 40) }), errHas: "cluster_bits 40"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sniff(tc.format, tc.head, tc.size)
			if tc.errHas == "" {
				if err != nil || got != tc.wantCap {
					t.Fatalf("sniff = %d, %v; want %d", got, err, tc.wantCap)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.errHas) || provider.Class(err) != provider.ClassPermanent {
				t.Fatalf("sniff error = %v, want permanent mentioning %q", err, tc.errHas)
			}
		})
	}
}
