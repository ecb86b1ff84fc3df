package conn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// Dial stages. The values are the KVMHost Ready condition reasons.
const (
	StageSSHMaterialMissing   = "SSHMaterialMissing"
	StageSSHMaterialInvalid   = "SSHMaterialInvalid"
	StageTCPUnreachable       = "TCPUnreachable"
	StageSSHHandshakeFailed   = "SSHHandshakeFailed"
	StageLibvirtConnectFailed = "LibvirtConnectFailed"
)

// ErrHostNotConfigured is matched (errors.Is) by the permanent error Do
// returns for a host name the pool does not know.
var ErrHostNotConfigured = errors.New("host is not configured")

type notConfiguredError struct{ host string }

func (e *notConfiguredError) Error() string { return fmt.Sprintf("host %q is not configured", e.host) }

func (e *notConfiguredError) Is(target error) bool {
	return target == ErrHostNotConfigured || target == provider.ErrPermanent
}

var errPoolClosed = provider.Transientf("kvm connection pool is closed")

// dialError is a failed dial: the stage that failed and its cause. It is
// classed (errors.Is) provider.ErrPermanent for invalid material and
// provider.ErrTransient otherwise.
type dialError struct {
	Stage string
	Host  string
	Addr  string
	Err   error
	class error
}

func (e *dialError) Error() string {
	var what string
	switch e.Stage {
	case StageSSHMaterialMissing:
		what = "ssh key material not available"
	case StageSSHMaterialInvalid:
		what = "ssh key material invalid"
	case StageTCPUnreachable:
		what = "tcp connect to " + e.Addr + " failed"
	case StageSSHHandshakeFailed:
		what = "ssh handshake with " + e.Addr + " failed"
	default:
		what = "libvirt connect over ssh to " + e.Addr + " failed"
	}
	return fmt.Sprintf("kvm host %q: %s: %v", e.Host, what, e.Err)
}

func (e *dialError) Unwrap() error { return e.Err }

func (e *dialError) Is(target error) bool { return target == e.class }

// DialStage returns the stage a dial failed at (one of the Stage
// constants), if err is a dial failure.
func DialStage(err error) (string, bool) {
	var de *dialError
	if errors.As(err, &de) {
		return de.Stage, true
	}
	return "", false
}

func materialError(cfg HostConfig, err error) error {
	if provider.Class(err) == provider.ClassPermanent {
		return &dialError{Stage: StageSSHMaterialInvalid, Host: cfg.Name, Addr: cfg.Address, Err: err, class: provider.ErrPermanent}
	}
	if errors.Is(err, provider.ErrNotFound) {
		// A loader's "Secret not found" must not read as "instance not
		// found" to the provider: keep the message, drop the sentinel.
		err = errors.New(err.Error())
	}
	return &dialError{Stage: StageSSHMaterialMissing, Host: cfg.Name, Addr: cfg.Address, Err: err, class: provider.ErrTransient}
}

func transientDialError(stage string, cfg HostConfig, err error) error {
	return &dialError{Stage: stage, Host: cfg.Name, Addr: cfg.Address, Err: err, class: provider.ErrTransient}
}

// isTransportError reports whether an RPC error means the link is broken, so
// it must be dropped and redialed. Verdicts of our own code (classed
// errors), answers of the daemon (libvirt.Error) and abandoned calls
// (context errors) leave a healthy link alone; anything else unknown does
// too, since a dead link is also caught by its Disconnected channel and by
// keepalives.
func isTransportError(err error) bool {
	if err == nil || provider.HasClass(err) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if _, ok := virt.ErrorCode(err); ok || errors.Is(err, libvirt.ErrUnsupported) {
		return false
	}
	var ne net.Error
	return errors.Is(err, libvirt.ErrInterrupted) || // socket closed while awaiting the reply
		errors.Is(err, syscall.EINVAL) || // go-libvirt: request on a disconnected socket
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, io.ErrClosedPipe) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) ||
		errors.As(err, &ne)
}
