package fake

import (
	"fmt"
	"net"
	"syscall"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// ErrDisconnected is returned by every call on a connection after it was
// closed (Conn.Disconnect, Fake.Disconnect). Like go-libvirt's own error for
// a dead socket it is a transport error, not a libvirt.Error: it matches both
// syscall.EINVAL (what go-libvirt returns) and net.ErrClosed.
//
// Calls that were in flight (blocked or delayed) when the connection dropped
// return libvirt.ErrInterrupted, as go-libvirt does.
var ErrDisconnected = fmt.Errorf("fake libvirt connection closed: %w (%w)", net.ErrClosed, syscall.EINVAL)

// msgFormats are libvirt's virErrorMsgStrings "msginfo" formats (virerror.c)
// for the codes the fake raises, so messages read exactly like the daemon's.
var msgFormats = map[libvirt.ErrorNumber]string{
	libvirt.ErrInternalError:       "internal error: %s",
	libvirt.ErrInvalidArg:          "invalid argument: %s",
	libvirt.ErrOperationFailed:     "operation failed: %s",
	libvirt.ErrNoName:              "missing name information in %s",
	libvirt.ErrXMLError:            "XML error: %s",
	libvirt.ErrDomExist:            "domain %s exists already",
	libvirt.ErrXMLDetail:           "%s",
	libvirt.ErrSystemError:         "%s",
	libvirt.ErrRPC:                 "%s",
	libvirt.ErrNoDomain:            "Domain not found: %s",
	libvirt.ErrNoNetwork:           "Network not found: %s",
	libvirt.ErrNoStoragePool:       "Storage pool not found: %s",
	libvirt.ErrNoStorageVol:        "Storage volume not found: %s",
	libvirt.ErrOperationInvalid:    "Requested operation is not valid: %s",
	libvirt.ErrArgumentUnsupported: "argument unsupported: %s",
	libvirt.ErrNoDomainMetadata:    "metadata not found: %s",
	libvirt.ErrAgentUnresponsive:   "Guest agent is not responding: %s",
	libvirt.ErrStorageVolExist:     "storage volume %s exists already",
}

// lverr builds the error the daemon would send for virReportError(code, format, args...).
func lverr(code libvirt.ErrorNumber, format string, args ...any) error {
	detail := fmt.Sprintf(format, args...)
	if f, ok := msgFormats[code]; ok {
		return virt.NewError(code, fmt.Sprintf(f, detail))
	}
	return virt.NewError(code, detail)
}

func errNoDomainUUID(u libvirt.UUID, name string) error {
	return lverr(libvirt.ErrNoDomain, "no domain with matching uuid '%s' (%s)", virt.FormatUUID(u), name)
}

func errNotRunning() error {
	return lverr(libvirt.ErrOperationInvalid, "domain is not running")
}

func errPoolInactive(name string) error {
	return lverr(libvirt.ErrOperationInvalid, "storage pool '%s' is not active", name)
}
