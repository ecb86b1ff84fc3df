// Package virt is the narrow seam between the KVM provider and libvirt.
//
// Client is the subset of *libvirt.Libvirt (github.com/digitalocean/go-libvirt)
// the provider uses, with go-libvirt's own signatures so the real client
// satisfies it unchanged. Tests use the in-memory fake in virt/fake; the
// tracing decorator in this package wraps either.
package virt

import (
	"context"
	"errors"
	"io"

	"github.com/digitalocean/go-libvirt"
)

// Client is the libvirt API the provider needs.
type Client interface {
	// Daemon.
	ConnectGetLibVersion() (uint64, error)
	ConnectGetHostname() (string, error)

	// Host capacity, read by the health check for placement: the host's
	// CPUs and memory, its free memory (kernel figures in KiB: total,
	// free, buffers, cached), and what the domains on it were given.
	NodeGetInfo() (model [32]int8, memoryKiB uint64, cpus int32, mhz int32, nodes int32, sockets int32, cores int32, threads int32, err error)
	NodeGetMemoryStats(nparams int32, cellNum int32, flags uint32) ([]libvirt.NodeGetMemoryStats, int32, error)
	ConnectGetAllDomainStats(doms []libvirt.Domain, stats uint32, flags uint32) ([]libvirt.DomainStatsRecord, error)

	// Domains.
	ConnectListAllDomains(needResults int32, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, uint32, error)
	DomainLookupByName(name string) (libvirt.Domain, error)
	DomainLookupByUUID(uuid libvirt.UUID) (libvirt.Domain, error)
	DomainDefineXMLFlags(xml string, flags libvirt.DomainDefineFlags) (libvirt.Domain, error)
	DomainCreate(dom libvirt.Domain) error
	DomainResume(dom libvirt.Domain) error
	DomainDestroyFlags(dom libvirt.Domain, flags libvirt.DomainDestroyFlagsValues) error
	DomainUndefineFlags(dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error
	DomainGetState(dom libvirt.Domain, flags uint32) (state int32, reason int32, err error)
	DomainGetXMLDesc(dom libvirt.Domain, flags libvirt.DomainXMLFlags) (string, error)
	DomainGetMetadata(dom libvirt.Domain, typ int32, uri libvirt.OptString, flags libvirt.DomainModificationImpact) (string, error)
	DomainInterfaceAddresses(dom libvirt.Domain, source uint32, flags uint32) ([]libvirt.DomainInterface, error)

	// Storage.
	StoragePoolLookupByName(name string) (libvirt.StoragePool, error)
	StoragePoolGetInfo(pool libvirt.StoragePool) (state uint8, capacity, allocation, available uint64, err error)
	StoragePoolRefresh(pool libvirt.StoragePool, flags uint32) error
	StoragePoolListAllVolumes(pool libvirt.StoragePool, needResults int32, flags uint32) ([]libvirt.StorageVol, uint32, error)
	StorageVolLookupByName(pool libvirt.StoragePool, name string) (libvirt.StorageVol, error)
	StorageVolCreateXML(pool libvirt.StoragePool, xml string, flags libvirt.StorageVolCreateFlags) (libvirt.StorageVol, error)
	StorageVolDelete(vol libvirt.StorageVol, flags libvirt.StorageVolDeleteFlags) error
	StorageVolGetPath(vol libvirt.StorageVol) (string, error)
	StorageVolGetInfo(vol libvirt.StorageVol) (typ int8, capacity, allocation uint64, err error)
	// StorageVolGetXMLDesc shows a volume's backing store: what decides
	// whether an image volume is still in use (see image.Cache.Prune).
	StorageVolGetXMLDesc(vol libvirt.StorageVol, flags uint32) (string, error)
	StorageVolUpload(vol libvirt.StorageVol, body io.Reader, offset, length uint64, flags libvirt.StorageVolUploadFlags) error

	// Networks (address fallback: DHCP leases).
	NetworkLookupByName(name string) (libvirt.Network, error)
	NetworkGetDhcpLeases(net libvirt.Network, mac libvirt.OptString, needResults int32, flags uint32) ([]libvirt.NetworkDhcpLease, uint32, error)

	// Events. The channel closes when ctx ends or the connection drops.
	LifecycleEvents(ctx context.Context) (<-chan libvirt.DomainEventLifecycleMsg, error)
	// SubscribeEvents streams one other event type; the provider uses it for
	// the guest agent's lifecycle (DomainEventIDAgentLifecycle, values
	// *libvirt.DomainEventCallbackAgentLifecycleMsg). The channel must be
	// drained until it closes: go-libvirt blocks on it.
	SubscribeEvents(ctx context.Context, eventID libvirt.DomainEventID, dom libvirt.OptDomain) (<-chan interface{}, error)
}

// Compile-time proof that the real client fits the seam.
var _ Client = (*libvirt.Libvirt)(nil)

// ErrorCode returns the libvirt error number carried by err, and whether err
// is a libvirt error at all (as opposed to a transport failure).
func ErrorCode(err error) (libvirt.ErrorNumber, bool) {
	var le libvirt.Error
	if errors.As(err, &le) {
		return libvirt.ErrorNumber(le.Code), true
	}
	var lep *libvirt.Error
	if errors.As(err, &lep) && lep != nil {
		return libvirt.ErrorNumber(lep.Code), true
	}
	return 0, false
}

// IsCode reports whether err is a libvirt error with one of codes.
func IsCode(err error, codes ...libvirt.ErrorNumber) bool {
	c, ok := ErrorCode(err)
	if !ok {
		return false
	}
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}

// IsNotFound reports whether err says the domain, volume, pool, network or
// metadata element does not exist.
func IsNotFound(err error) bool {
	return IsCode(err, libvirt.ErrNoDomain, libvirt.ErrNoStorageVol, libvirt.ErrNoStoragePool,
		libvirt.ErrNoNetwork, libvirt.ErrNoDomainMetadata)
}

// NewError builds a libvirt error the way the daemon reports it; the fake and
// tests use it so error handling is exercised with real codes.
func NewError(code libvirt.ErrorNumber, msg string) error {
	return libvirt.Error{Code: uint32(code), Message: msg}
}
