package virt

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/digitalocean/go-libvirt"
)

// FormatUUID renders u the way libvirt prints UUIDs (8-4-4-4-12, lower case).
func FormatUUID(u libvirt.UUID) string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], u[10:16])
	return string(b[:])
}

// ParseUUID parses s as libvirt's virUUIDParse does: 32 hex digits, dashes
// allowed anywhere between them, surrounding blanks ignored.
func ParseUUID(s string) (libvirt.UUID, error) {
	var u libvirt.UUID
	n := 0
	var hi byte
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '-' || ch == ' ' || ch == '\t' || ch == '\n':
			continue
		case n == 2*len(u):
			return libvirt.UUID{}, fmt.Errorf("malformed uuid %q", s)
		}
		v, ok := unhex(ch)
		if !ok {
			return libvirt.UUID{}, fmt.Errorf("malformed uuid %q", s)
		}
		if n%2 == 0 {
			hi = v
		} else {
			u[n/2] = hi<<4 | v
		}
		n++
	}
	if n != 2*len(u) {
		return libvirt.UUID{}, fmt.Errorf("malformed uuid %q", s)
	}
	return u, nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// NewUUID returns a random (version 4) UUID, as libvirt generates for a
// definition that has none.
func NewUUID() libvirt.UUID {
	var u libvirt.UUID
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails (Go ≥1.24)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}
