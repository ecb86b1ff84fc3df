// Package remote serves libvirt's remote protocol, what libvirtd speaks on
// its unix socket and go-libvirt's client sends, for daemons that tests and
// benchmarks stand up: packet framing, XDR, concurrent calls, upload streams
// and event messages. What the daemon answers is a Handler's:
// sshtest.Libvirt (a few built-ins and scripted answers) and fake.Serve (the
// in-memory libvirt, every procedure the kvm provider uses).
package remote

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"
)

// Program and version of libvirt's remote protocol (remote_protocol.x).
const (
	Program         = 0x20008086
	ProtocolVersion = 1

	headerSize = 4 + 24 // length word + socket.Header
	// maxPacket is libvirt's VIR_NET_MESSAGE_MAX.
	maxPacket = 32 << 20
)

// Procedure numbers (remote_protocol.x's remote_procedure) of what the kvm
// provider calls, and of the event messages it receives.
const (
	ProcConnectOpen                             = 1
	ProcConnectClose                            = 2
	ProcNodeGetInfo                             = 6
	ProcDomainCreate                            = 9
	ProcDomainGetXMLDesc                        = 14
	ProcDomainLookupByName                      = 23
	ProcDomainLookupByUUID                      = 24
	ProcDomainResume                            = 28
	ProcNetworkLookupByName                     = 46
	ProcConnectGetHostname                      = 59
	ProcAuthList                                = 66
	ProcStoragePoolRefresh                      = 83
	ProcStoragePoolLookupByName                 = 84
	ProcStoragePoolGetInfo                      = 87
	ProcStorageVolCreateXML                     = 93
	ProcStorageVolDelete                        = 94
	ProcStorageVolLookupByName                  = 95
	ProcStorageVolGetInfo                       = 98
	ProcStorageVolGetXMLDesc                    = 99
	ProcStorageVolGetPath                       = 100
	ProcConnectGetLibVersion                    = 157
	ProcStorageVolUpload                        = 208
	ProcDomainGetState                          = 212
	ProcNodeGetMemoryStats                      = 228
	ProcDomainUndefineFlags                     = 231
	ProcDomainDestroyFlags                      = 234
	ProcDomainGetMetadata                       = 265
	ProcConnectListAllDomains                   = 273
	ProcStoragePoolListAllVolumes               = 282
	ProcConnectDomainEventCallbackRegisterAny   = 316
	ProcConnectDomainEventCallbackDeregisterAny = 317
	ProcDomainEventCallbackLifecycle            = 318
	ProcNetworkGetDhcpLeases                    = 341
	ProcConnectGetAllDomainStats                = 344
	ProcDomainEventCallbackAgentLifecycle       = 348
	ProcDomainDefineXMLFlags                    = 350
	ProcDomainInterfaceAddresses                = 353
)

// Handshake answers the calls go-libvirt makes to open a connection
// (AuthList: no authentication; ConnectOpen; ConnectClose), so a Session
// needs no code of its own for them; ok is false for any other procedure.
func Handshake(proc uint32) (reply []byte, ok bool) {
	switch proc {
	case ProcAuthList:
		b, _ := Marshal(libvirt.AuthListRet{Types: []libvirt.AuthType{0}}) // REMOTE_AUTH_NONE
		return b, true
	case ProcConnectOpen, ProcConnectClose:
		return nil, true
	}
	return nil, false
}

// UnknownProcedure is libvirtd's answer to a procedure it does not
// implement; go-libvirt turns it into libvirt.ErrUnsupported.
func UnknownProcedure(proc uint32) error {
	return libvirt.Error{Code: uint32(libvirt.ErrNoSupport), Message: fmt.Sprintf("unknown procedure: %d", proc)}
}

func readPacket(r io.Reader) (socket.Header, []byte, error) {
	var buf [headerSize]byte
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return socket.Header{}, nil, err
	}
	be := binary.BigEndian
	n := be.Uint32(buf[0:])
	if n < headerSize || n > maxPacket {
		return socket.Header{}, nil, fmt.Errorf("remote: bad packet length %d", n)
	}
	h := socket.Header{
		Program:   be.Uint32(buf[4:]),
		Version:   be.Uint32(buf[8:]),
		Procedure: be.Uint32(buf[12:]),
		Type:      be.Uint32(buf[16:]),
		Serial:    int32(be.Uint32(buf[20:])),
		Status:    be.Uint32(buf[24:]),
	}
	payload := make([]byte, n-headerSize)
	_, err := io.ReadFull(r, payload)
	return h, payload, err
}

func appendPacket(b []byte, h socket.Header, payload []byte) []byte {
	be := binary.BigEndian
	b = be.AppendUint32(b, uint32(headerSize+len(payload)))
	b = be.AppendUint32(b, h.Program)
	b = be.AppendUint32(b, h.Version)
	b = be.AppendUint32(b, h.Procedure)
	b = be.AppendUint32(b, h.Type)
	b = be.AppendUint32(b, uint32(h.Serial))
	b = be.AppendUint32(b, h.Status)
	return append(b, payload...)
}

// remoteError is remote_error: code, domain, message (an optional string),
// level, domain, str1..3 (optional, absent), int1, int2 and network
// (optional, absent).
type remoteError struct {
	Code, Domain int32
	Message      []string
	Level        int32
	Dom          []libvirt.Domain
	Str1         []string
	Str2         []string
	Str3         []string
	Int1, Int2   int32
	Net          []libvirt.Network
}

// encodeError is err as libvirtd sends it: a libvirt.Error keeps its code
// and message, anything else is VIR_ERR_INTERNAL_ERROR.
func encodeError(err error) []byte {
	re := remoteError{Code: int32(libvirt.ErrInternalError), Message: []string{err.Error()}, Level: 2} // VIR_ERR_ERROR
	var le libvirt.Error
	if errors.As(err, &le) {
		re.Code, re.Message = int32(le.Code), []string{le.Message}
	}
	b, merr := Marshal(re)
	if merr != nil {
		panic(merr) // remoteError always encodes
	}
	return b
}
