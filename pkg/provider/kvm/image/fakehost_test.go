package image

import (
	"sync"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// fakeHost is the shared fake libvirt daemon plus what these tests need on
// top: the XML each volume was created with (the fake grows raw volumes to
// fit uploads, so what Ensure declared is kept here).
type fakeHost struct {
	*fake.Fake

	mu      sync.Mutex
	created map[string]libvirtxml.StorageVolume // "pool/name"
}

var _ virt.Client = (*fakeHost)(nil)

func newFakeHost(opts ...fake.Option) *fakeHost {
	return &fakeHost{Fake: fake.New(opts...), created: map[string]libvirtxml.StorageVolume{}}
}

func (h *fakeHost) addPool(t testing.TB, name string) libvirt.StoragePool {
	t.Helper()
	h.AddPool(name, 1<<40, true)
	p, err := h.StoragePoolLookupByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (h *fakeHost) StorageVolCreateXML(pool libvirt.StoragePool, xml string, flags libvirt.StorageVolCreateFlags) (libvirt.StorageVol, error) {
	v, err := h.Fake.StorageVolCreateXML(pool, xml, flags)
	if err == nil {
		var d libvirtxml.StorageVolume
		_ = d.Unmarshal(xml)
		h.mu.Lock()
		h.created[pool.Name+"/"+v.Name] = d
		h.mu.Unlock()
	}
	return v, err
}

// volumeNames returns the volumes of pool that exist.
func (h *fakeHost) volumeNames(pool string) []string {
	p, err := h.StoragePoolLookupByName(pool)
	if err != nil {
		return nil
	}
	vols, _, _ := h.StoragePoolListAllVolumes(p, 1, 0)
	var out []string
	for _, v := range vols {
		out = append(out, v.Name)
	}
	return out
}

// volumeSHA256 returns the digest and size of a volume's content.
func (h *fakeHost) volumeSHA256(pool, name string) (string, int64, bool) {
	info, ok := h.Volume(pool, name)
	if !ok {
		return "", 0, false
	}
	sum, err := h.VolumeSHA256(pool, name)
	if err != nil {
		return "", 0, false
	}
	return sum, int64(info.Size), true
}

func (h *fakeHost) volumeContent(pool, name string) []byte {
	b, _ := h.VolumeBytes(pool, name)
	return b
}

// volumeDecl returns the format and capacity a volume was created with.
func (h *fakeHost) volumeDecl(pool, name string) (format string, capacity uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.created[pool+"/"+name]
	if !ok {
		return "", 0
	}
	if d.Target != nil && d.Target.Format != nil {
		format = d.Target.Format.Type
	}
	if d.Capacity != nil {
		capacity = d.Capacity.Value
	}
	return format, capacity
}
