package fake

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

type pool struct {
	name     string
	uuid     libvirt.UUID
	capacity uint64
	active   bool
	vols     map[string]*volume
}

func (p *pool) path() string { return PoolDir + "/" + p.name }

func (p *pool) allocation() uint64 {
	var sum uint64
	for _, v := range p.vols {
		sum += v.allocation
	}
	return sum
}

type volume struct {
	pool       string
	name       string
	path       string
	format     string
	backing    string
	capacity   uint64
	allocation uint64
	inUse      int // running uploads; libvirt refuses to delete such a volume
	data       content
}

func (v *volume) handle() libvirt.StorageVol {
	return libvirt.StorageVol{Pool: v.pool, Name: v.name, Key: v.path}
}

// content is a volume's bytes: kept in memory up to a limit, after which
// only the size and a SHA-256 of a sequential upload remain, so benchmarks
// may push big images without holding them.
type content struct {
	buf     []byte
	spilled bool
	size    uint64
	hash    hash.Hash // spilled: hash of bytes [0, hashed)
	hashed  uint64
}

func (c *content) writeAt(p []byte, off uint64, limit int) {
	end := off + uint64(len(p))
	if !c.spilled && end <= uint64(limit) {
		if end > uint64(len(c.buf)) {
			c.buf = append(c.buf, make([]byte, int(end)-len(c.buf))...)
		}
		copy(c.buf[off:], p)
		c.size = max(c.size, end)
		return
	}
	if !c.spilled {
		c.spilled = true
		c.hash = sha256.New()
		c.hash.Write(c.buf)
		c.hashed = uint64(len(c.buf))
		c.buf = nil
	}
	if c.hash != nil && off == c.hashed {
		c.hash.Write(p)
		c.hashed = end
	} else {
		c.hash = nil // not a sequential stream: the digest is unknowable
	}
	c.size = max(c.size, end)
}

func (c *content) sha256() (string, error) {
	if !c.spilled {
		sum := sha256.Sum256(c.buf)
		return hex.EncodeToString(sum[:]), nil
	}
	if c.hash == nil || c.hashed != c.size {
		return "", errors.New("content exceeded the fake's memory limit and was not written sequentially")
	}
	return hex.EncodeToString(c.hash.Sum(nil)), nil
}

// poolByHandle resolves a pool handle the way the daemon does: by UUID.
func (f *Fake) poolByHandle(h libvirt.StoragePool) (*pool, error) {
	for _, p := range f.pools {
		if p.uuid == h.UUID {
			return p, nil
		}
	}
	return nil, lverr(libvirt.ErrNoStoragePool, "no storage pool with matching uuid '%s' (%s)", virt.FormatUUID(h.UUID), h.Name)
}

// volByHandle resolves a volume handle: pool by name, pool active, volume.
func (f *Fake) volByHandle(h libvirt.StorageVol) (*volume, error) {
	p := f.pools[h.Pool]
	if p == nil {
		return nil, lverr(libvirt.ErrNoStoragePool, "no storage pool with matching name '%s'", h.Pool)
	}
	if !p.active {
		return nil, errPoolInactive(p.name)
	}
	v := p.vols[h.Name]
	if v == nil {
		return nil, lverr(libvirt.ErrNoStorageVol, "no storage vol with matching name '%s'", h.Name)
	}
	return v, nil
}

// StoragePoolLookupByName implements virt.Client.
func (c *Conn) StoragePoolLookupByName(name string) (libvirt.StoragePool, error) {
	return do(c, virt.RPCStoragePoolLookupByName, func(f *Fake) (libvirt.StoragePool, error) {
		p := f.pools[name]
		if p == nil {
			return libvirt.StoragePool{}, lverr(libvirt.ErrNoStoragePool, "no storage pool with matching name '%s'", name)
		}
		return libvirt.StoragePool{Name: p.name, UUID: p.uuid}, nil
	})
}

// StoragePoolGetInfo implements virt.Client: state is StoragePoolRunning or
// StoragePoolInactive; allocation is the sum of the volumes' allocations.
func (c *Conn) StoragePoolGetInfo(pl libvirt.StoragePool) (uint8, uint64, uint64, uint64, error) {
	type info struct {
		state                  uint8
		capacity, alloc, avail uint64
	}
	r, err := do(c, virt.RPCStoragePoolGetInfo, func(f *Fake) (info, error) {
		p, err := f.poolByHandle(pl)
		if err != nil {
			return info{}, err
		}
		state := uint8(libvirt.StoragePoolInactive)
		if p.active {
			state = uint8(libvirt.StoragePoolRunning)
		}
		alloc := p.allocation()
		var avail uint64
		if alloc < p.capacity {
			avail = p.capacity - alloc
		}
		return info{state, p.capacity, alloc, avail}, nil
	})
	return r.state, r.capacity, r.alloc, r.avail, err
}

// StoragePoolRefresh implements virt.Client.
func (c *Conn) StoragePoolRefresh(pl libvirt.StoragePool, flags uint32) error {
	return do0(c, virt.RPCStoragePoolRefresh, func(f *Fake) error {
		p, err := f.poolByHandle(pl)
		if err != nil {
			return err
		}
		if !p.active {
			return errPoolInactive(p.name)
		}
		return nil
	})
}

// StorageVolLookupByName implements virt.Client.
func (c *Conn) StorageVolLookupByName(pl libvirt.StoragePool, name string) (libvirt.StorageVol, error) {
	return do(c, virt.RPCStorageVolLookupByName, func(f *Fake) (libvirt.StorageVol, error) {
		p, err := f.poolByHandle(pl)
		if err != nil {
			return libvirt.StorageVol{}, err
		}
		if !p.active {
			return libvirt.StorageVol{}, errPoolInactive(p.name)
		}
		v := p.vols[name]
		if v == nil {
			return libvirt.StorageVol{}, lverr(libvirt.ErrNoStorageVol, "no storage vol with matching name '%s'", name)
		}
		return v.handle(), nil
	})
}

// StorageVolCreateXML implements virt.Client. Allocation defaults as in
// libvirt: the capacity for raw volumes (fully allocated), 0 otherwise; a
// backing store in a fake pool must exist and supplies a missing capacity.
func (c *Conn) StorageVolCreateXML(pl libvirt.StoragePool, xml string, flags libvirt.StorageVolCreateFlags) (libvirt.StorageVol, error) {
	return do(c, virt.RPCStorageVolCreateXML, func(f *Fake) (libvirt.StorageVol, error) {
		p, err := f.poolByHandle(pl)
		if err != nil {
			return libvirt.StorageVol{}, err
		}
		if !p.active {
			return libvirt.StorageVol{}, errPoolInactive(p.name)
		}
		v, err := f.parseVolume(p, xml)
		if err != nil {
			return libvirt.StorageVol{}, err
		}
		p.vols[v.name] = v
		return v.handle(), nil
	})
}

func (f *Fake) parseVolume(p *pool, doc string) (*volume, error) {
	var x libvirtxml.StorageVolume
	if err := x.Unmarshal(doc); err != nil {
		return nil, lverr(libvirt.ErrXMLError, "%v", err)
	}
	if x.Name == "" {
		return nil, lverr(libvirt.ErrXMLError, "missing volume name element")
	}
	if strings.Contains(x.Name, "/") {
		return nil, lverr(libvirt.ErrInvalidArg, "volume name '%s' cannot contain '/'", x.Name)
	}
	v := &volume{pool: p.name, name: x.Name, path: p.path() + "/" + x.Name, format: "raw"}
	if x.Target != nil && x.Target.Format != nil && x.Target.Format.Type != "" {
		v.format = x.Target.Format.Type
	}
	var backing *volume
	if x.BackingStore != nil && x.BackingStore.Path != "" {
		v.backing = x.BackingStore.Path
		if backing = f.volByPath(v.backing); backing == nil && strings.HasPrefix(v.backing, PoolDir+"/") {
			return nil, lverr(libvirt.ErrSystemError, "inaccessible backing store volume %s: No such file or directory", v.backing)
		}
	}
	switch {
	case x.Capacity != nil:
		n, err := scale(x.Capacity)
		if err != nil {
			return nil, err
		}
		v.capacity = n
	case backing != nil:
		v.capacity = backing.capacity
	case v.backing == "":
		return nil, lverr(libvirt.ErrXMLError, "missing capacity element")
	}
	if _, exists := p.vols[x.Name]; exists {
		return nil, lverr(libvirt.ErrStorageVolExist, "'%s'", x.Name)
	}
	switch {
	case x.Allocation != nil:
		n, err := scale(x.Allocation)
		if err != nil {
			return nil, err
		}
		v.allocation = min(n, v.capacity)
	case v.format == "raw":
		v.allocation = v.capacity
	}
	return v, nil
}

func (f *Fake) volByPath(path string) *volume {
	for _, p := range f.pools {
		for _, v := range p.vols {
			if v.path == path {
				return v
			}
		}
	}
	return nil
}

// scale converts a <capacity unit=...> as libvirt's virScaleInteger does.
func scale(s *libvirtxml.StorageVolumeSize) (uint64, error) {
	u := strings.ToLower(s.Unit)
	if u == "" || u == "b" || u == "byte" || u == "bytes" {
		return s.Value, nil
	}
	exp := strings.IndexByte("kmgtpe", u[0]) + 1
	base := uint64(0)
	switch {
	case exp == 0:
	case len(u) == 1 || u[1:] == "ib":
		base = 1024
	case u[1:] == "b":
		base = 1000
	}
	if base == 0 {
		return 0, lverr(libvirt.ErrInvalidArg, "unknown suffix '%s'", s.Unit)
	}
	n := s.Value
	for range exp {
		if n > ^uint64(0)/base {
			return 0, lverr(libvirt.ErrOverflow, "value too large: %d%s", s.Value, s.Unit)
		}
		n *= base
	}
	return n, nil
}

// StoragePoolListAllVolumes implements virt.Client: every volume of an
// active pool, sorted by name (libvirt's order is unspecified). The
// needResults and flags arguments are ignored, as libvirt ignores flags.
func (c *Conn) StoragePoolListAllVolumes(pl libvirt.StoragePool, needResults int32, flags uint32) ([]libvirt.StorageVol, uint32, error) {
	vols, err := do(c, virt.RPCStoragePoolListAllVolumes, func(f *Fake) ([]libvirt.StorageVol, error) {
		p, err := f.poolByHandle(pl)
		if err != nil {
			return nil, err
		}
		if !p.active {
			return nil, errPoolInactive(p.name)
		}
		out := make([]libvirt.StorageVol, 0, len(p.vols))
		for _, name := range slices.Sorted(maps.Keys(p.vols)) {
			out = append(out, p.vols[name].handle())
		}
		return out, nil
	})
	return vols, uint32(len(vols)), err
}

// StorageVolGetXMLDesc implements virt.Client with what libvirt shows for a
// file volume: name, key, capacity, allocation, target path and format and,
// for an overlay, <backingStore> with the path its header names.
func (c *Conn) StorageVolGetXMLDesc(h libvirt.StorageVol, flags uint32) (string, error) {
	return do(c, virt.RPCStorageVolGetXMLDesc, func(f *Fake) (string, error) {
		v, err := f.volByHandle(h)
		if err != nil {
			return "", err
		}
		x := libvirtxml.StorageVolume{
			Type:       "file",
			Name:       v.name,
			Key:        v.path,
			Capacity:   &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: v.capacity},
			Allocation: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: v.allocation},
			Target: &libvirtxml.StorageVolumeTarget{
				Path:   v.path,
				Format: &libvirtxml.StorageVolumeTargetFormat{Type: v.format},
			},
		}
		if v.backing != "" {
			bs := &libvirtxml.StorageVolumeBackingStore{Path: v.backing}
			if b := f.volByPath(v.backing); b != nil {
				bs.Format = &libvirtxml.StorageVolumeTargetFormat{Type: b.format}
			}
			x.BackingStore = bs
		}
		return x.Marshal()
	})
}

// StorageVolDelete implements virt.Client. A volume being uploaded to is
// refused, as libvirt does (VIR_ERR_OPERATION_INVALID). Like libvirt's
// storageVolDelete it checks nothing else: a volume that is the backing
// file of another volume, or the disk of a running domain, is deleted (the
// file is unlinked under qemu). Callers must check backing chains first.
func (c *Conn) StorageVolDelete(h libvirt.StorageVol, flags libvirt.StorageVolDeleteFlags) error {
	return do0(c, virt.RPCStorageVolDelete, func(f *Fake) error {
		v, err := f.volByHandle(h)
		if err != nil {
			return err
		}
		if v.inUse > 0 {
			return lverr(libvirt.ErrOperationInvalid, "volume '%s' is still in use.", v.name)
		}
		delete(f.pools[v.pool].vols, v.name)
		return nil
	})
}

// StorageVolGetPath implements virt.Client.
func (c *Conn) StorageVolGetPath(h libvirt.StorageVol) (string, error) {
	return do(c, virt.RPCStorageVolGetPath, func(f *Fake) (string, error) {
		v, err := f.volByHandle(h)
		if err != nil {
			return "", err
		}
		return v.path, nil
	})
}

// StorageVolGetInfo implements virt.Client (type is StorageVolFile).
func (c *Conn) StorageVolGetInfo(h libvirt.StorageVol) (int8, uint64, uint64, error) {
	type info struct {
		typ             int8
		capacity, alloc uint64
	}
	r, err := do(c, virt.RPCStorageVolGetInfo, func(f *Fake) (info, error) {
		v, err := f.volByHandle(h)
		if err != nil {
			return info{}, err
		}
		return info{int8(libvirt.StorageVolFile), v.capacity, v.allocation}, nil
	})
	return r.typ, r.capacity, r.alloc, err
}

var chunkPool = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// StorageVolUpload implements virt.Client: body is read to EOF (at most
// length bytes if length > 0; more is refused with ENOSPC, as libvirt's
// stream does) and written from offset, chunk by chunk, so a body that fails
// midway leaves the volume with what arrived — the call returns the body's
// error, wrapped. Raw volumes grow to fit; allocation follows the content.
//
// Real go-libvirt may instead report the daemon's reply to the stream abort;
// either way the call fails and the volume holds a prefix. StallUploads and
// PaceUploads act before each chunk is taken.
func (c *Conn) StorageVolUpload(h libvirt.StorageVol, body io.Reader, offset, length uint64, flags libvirt.StorageVolUploadFlags) error {
	after, err := c.enter(virt.RPCStorageVolUpload)
	if err != nil {
		return err
	}
	f := c.f
	f.mu.Lock()
	v, err := f.volByHandle(h)
	if err == nil {
		v.inUse++
	}
	limit := f.maxStored
	f.mu.Unlock()
	if err != nil {
		return err
	}
	defer func() {
		f.mu.Lock()
		v.inUse--
		f.mu.Unlock()
	}()
	if a, ok := body.(interface{ uploadAccepted() }); ok {
		a.uploadAccepted() // served: libvirtd answers the call here, then takes the stream
	}

	bp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bp)
	buf := *bp
	off, written := offset, uint64(0)
	for {
		select {
		case <-c.done:
			return libvirt.ErrInterrupted
		default:
		}
		if err := c.beforeChunk(written); err != nil {
			return err
		}
		n, rerr := body.Read(buf)
		if n > 0 {
			p := buf[:n]
			full := false
			if length > 0 && written+uint64(n) > length {
				p, full = p[:length-written], true
			}
			f.mu.Lock()
			v.data.writeAt(p, off, limit)
			v.allocation = max(v.allocation, v.data.size)
			if v.format == "raw" {
				v.capacity = max(v.capacity, v.data.size)
			}
			f.mu.Unlock()
			off += uint64(len(p))
			written += uint64(len(p))
			if full {
				return lverr(libvirt.ErrSystemError, "Library call failed: No space left on device")
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return fmt.Errorf("upload to volume '%s' aborted: %w", v.name, rerr)
		}
	}
	return after
}

// Test controls and inspection for storage.

// AddPool adds a directory pool at PoolDir/name.
func (f *Fake) AddPool(name string, capacity uint64, active bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pools[name] = &pool{name: name, uuid: virt.NewUUID(), capacity: capacity, active: active, vols: map[string]*volume{}}
}

// SetPoolActive starts or stops a pool.
func (f *Fake) SetPoolActive(name string, active bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.pools[name]; p != nil {
		p.active = active
	}
}

// VolumeInfo is a snapshot of a volume for assertions.
type VolumeInfo struct {
	Pool, Name, Path, Format, BackingStore string
	Capacity, Allocation                   uint64
	// Size is the highest byte written by uploads.
	Size uint64
}

// Volume returns a snapshot of a volume.
func (f *Fake) Volume(poolName, name string) (VolumeInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.vol(poolName, name)
	if v == nil {
		return VolumeInfo{}, false
	}
	return VolumeInfo{Pool: v.pool, Name: v.name, Path: v.path, Format: v.format, BackingStore: v.backing,
		Capacity: v.capacity, Allocation: v.allocation, Size: v.data.size}, true
}

func (f *Fake) vol(poolName, name string) *volume {
	if p := f.pools[poolName]; p != nil {
		return p.vols[name]
	}
	return nil
}

// VolumeSHA256 returns the hex SHA-256 of a volume's uploaded content.
func (f *Fake) VolumeSHA256(poolName, name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.vol(poolName, name)
	if v == nil {
		return "", fmt.Errorf("no volume %s/%s", poolName, name)
	}
	return v.data.sha256()
}

// VolumeBytes returns a copy of a volume's uploaded content; it fails for
// content larger than WithMaxStoredBytes.
func (f *Fake) VolumeBytes(poolName, name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.vol(poolName, name)
	if v == nil {
		return nil, fmt.Errorf("no volume %s/%s", poolName, name)
	}
	if v.data.spilled {
		return nil, fmt.Errorf("volume %s/%s holds %d bytes, more than the fake keeps", poolName, name, v.data.size)
	}
	return append([]byte(nil), v.data.buf...), nil
}
