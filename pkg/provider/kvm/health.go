package kvm

import (
	"context"
	"errors"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
)

// HostHealth is what one successful probe learned about a host.
type HostHealth struct {
	LibvirtVersion string
	Hostname       string
	Pool           PoolHealth
	Capacity       CapacityHealth
}

// CapacityHealth is the host's size and what its running domains take.
type CapacityHealth struct {
	CPUs int32
	// MemoryBytes is physical memory; FreeMemoryBytes what a new VM can
	// get (free, buffers and page cache).
	MemoryBytes     uint64
	FreeMemoryBytes uint64
	// Of the running domains, whoever made them.
	RunningDomains       int32
	AllocatedVCPUs       int32
	AllocatedMemoryBytes uint64
}

// PoolHealth is the host's storage pool.
type PoolHealth struct {
	Name       string
	Capacity   uint64
	Allocation uint64
	Available  uint64
}

// Probe verdicts that are not dial failures.
var (
	// ErrProbeBusy: the previous probe of this host was abandoned and has not
	// returned yet; the host is reported Timeout at once rather than piling
	// up another blocked probe.
	ErrProbeBusy = provider.Transientf("previous health check still running")
	// ErrPoolMissing and ErrPoolInactive are pool verdicts: the link works,
	// and being classed they never make the pool drop it.
	ErrPoolMissing  = provider.Permanentf("storage pool not found")
	ErrPoolInactive = provider.Transientf("storage pool is not running")
)

// Reason maps a probe error onto the KVMHost Ready reason.
func Reason(err error) string {
	if err == nil {
		return crawlv1.HostReadyReason
	}
	if stage, ok := conn.DialStage(err); ok {
		return stage
	}
	switch {
	case errors.Is(err, ErrProbeBusy), errors.Is(err, context.DeadlineExceeded):
		return crawlv1.HostTimeoutReason
	case errors.Is(err, ErrPoolMissing):
		return crawlv1.HostPoolMissingReason
	case errors.Is(err, ErrPoolInactive):
		return crawlv1.HostPoolInactiveReason
	}
	return crawlv1.HostProbeFailedReason
}

// CachedImage is an image verified in a host's pool.
type CachedImage struct {
	Volume string
	Path   string
	// Bytes uploaded by this call; 0 when the image was cached already.
	Bytes int64
	// Allocated is the disk space the volume takes on the host (0 when the
	// host would not say).
	Allocated int64
	Checksum  string
}

// Progress reports bytes downloaded so far and the total (-1 when unknown).
type Progress func(done, total int64)
