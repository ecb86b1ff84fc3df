package fake_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

func volXML(name, capacity, format, backing string) string {
	s := "<volume><name>" + name + "</name>"
	if capacity != "" {
		s += capacity
	}
	if format != "" {
		s += "<target><format type='" + format + "'/></target>"
	}
	if backing != "" {
		s += "<backingStore><path>" + backing + "</path><format type='qcow2'/></backingStore>"
	}
	return s + "</volume>"
}

func pool(t *testing.T, f *fake.Fake, name string) libvirt.StoragePool {
	t.Helper()
	p, err := f.StoragePoolLookupByName(name)
	must(t, err)
	return p
}

func TestStoragePools(t *testing.T) {
	f := newFake(t)
	f.AddPool("off", 1<<30, false)

	_, err := f.StoragePoolLookupByName("nope")
	wantErr(t, err, libvirt.ErrNoStoragePool, "Storage pool not found: no storage pool with matching name 'nope'")

	off := pool(t, f, "off")
	state, capa, _, _, err := f.StoragePoolGetInfo(off)
	must(t, err)
	if libvirt.StoragePoolState(state) != libvirt.StoragePoolInactive || capa != 1<<30 {
		t.Errorf("inactive pool info: state %d capacity %d", state, capa)
	}
	wantErr(t, f.StoragePoolRefresh(off, 0), libvirt.ErrOperationInvalid, "storage pool 'off' is not active")
	_, err = f.StorageVolCreateXML(off, volXML("v", "<capacity>1</capacity>", "", ""), 0)
	wantErr(t, err, libvirt.ErrOperationInvalid, "not active")

	p := pool(t, f, "default")
	must(t, f.StoragePoolRefresh(p, 0))
	info := func() (alloc, avail uint64) {
		state, capa, alloc, avail, err := f.StoragePoolGetInfo(p)
		must(t, err)
		if state != uint8(libvirt.StoragePoolRunning) || capa != 100<<30 {
			t.Fatalf("pool info: state %d capacity %d", state, capa)
		}
		return alloc, avail
	}
	if alloc, avail := info(); alloc != 0 || avail != 100<<30 {
		t.Fatalf("empty pool: alloc %d avail %d", alloc, avail)
	}
	_, err = f.StorageVolCreateXML(p, volXML("raw", "<capacity unit='GiB'>2</capacity>", "raw", ""), 0)
	must(t, err)
	_, err = f.StorageVolCreateXML(p, volXML("thin", "<capacity unit='G'>10</capacity>", "qcow2", ""), 0) // G is GiB in libvirt
	must(t, err)
	if alloc, avail := info(); alloc != 2<<30 || avail != 98<<30 {
		t.Fatalf("after creates: alloc %d avail %d (raw is fully allocated, qcow2 thin)", alloc, avail)
	}
	thin, err := f.StorageVolLookupByName(p, "thin")
	must(t, err)
	must(t, f.StorageVolUpload(thin, bytes.NewReader(make([]byte, 1<<20)), 0, 0, 0))
	if alloc, avail := info(); alloc != 2<<30+1<<20 || avail != 98<<30-1<<20 {
		t.Fatalf("after upload: alloc %d avail %d", alloc, avail)
	}
	if _, capa, alloc, err := f.StorageVolGetInfo(thin); err != nil || capa != 10<<30 || alloc != 1<<20 {
		t.Fatalf("thin volume info: capacity %d allocation %d %v", capa, alloc, err)
	}
}

func TestStorageVolumes(t *testing.T) {
	base := fake.PoolDir + "/default/base.qcow2"
	tests := []struct {
		name  string
		xml   string
		code  libvirt.ErrorNumber
		msg   string
		check func(t *testing.T, v fake.VolumeInfo)
	}{
		{
			name: "exists already",
			xml:  volXML("base.qcow2", "<capacity>1</capacity>", "qcow2", ""),
			code: libvirt.ErrStorageVolExist, msg: "storage volume 'base.qcow2' exists already",
		},
		{
			name: "units",
			xml:  volXML("v", "<capacity unit='MB'>3</capacity><allocation unit='KiB'>4</allocation>", "qcow2", ""),
			check: func(t *testing.T, v fake.VolumeInfo) {
				if v.Capacity != 3_000_000 || v.Allocation != 4096 || v.Format != "qcow2" {
					t.Errorf("got %+v", v)
				}
			},
		},
		{
			name: "overlay takes capacity from its backing store",
			xml:  volXML("overlay", "", "qcow2", base),
			check: func(t *testing.T, v fake.VolumeInfo) {
				if v.Capacity != 5<<30 || v.BackingStore != base || v.Path != fake.PoolDir+"/default/overlay" {
					t.Errorf("got %+v", v)
				}
			},
		},
		{
			name: "missing backing store",
			xml:  volXML("overlay", "<capacity>1</capacity>", "qcow2", fake.PoolDir+"/default/gone.qcow2"),
			code: libvirt.ErrSystemError, msg: "inaccessible backing store volume",
		},
		{
			name: "missing capacity",
			xml:  volXML("v", "", "raw", ""),
			code: libvirt.ErrXMLError, msg: "missing capacity element",
		},
		{
			name: "missing name",
			xml:  "<volume><capacity>1</capacity></volume>",
			code: libvirt.ErrXMLError, msg: "missing volume name element",
		},
		{
			name: "bad unit",
			xml:  volXML("v", "<capacity unit='parsec'>1</capacity>", "raw", ""),
			code: libvirt.ErrInvalidArg,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			p := pool(t, f, "default")
			_, err := f.StorageVolCreateXML(p, volXML("base.qcow2", "<capacity unit='GiB'>5</capacity>", "qcow2", ""), 0)
			must(t, err)
			_, err = f.StorageVolCreateXML(p, tt.xml, 0)
			wantErr(t, err, tt.code, tt.msg)
			if tt.check != nil {
				name := tt.xml[strings.Index(tt.xml, "<name>")+len("<name>") : strings.Index(tt.xml, "</name>")]
				v, ok := f.Volume("default", name)
				if !ok {
					t.Fatal("volume not found")
				}
				tt.check(t, v)
			}
		})
	}
}

func TestStorageVolumeHandles(t *testing.T) {
	f := newFake(t)
	p := pool(t, f, "default")
	_, err := f.StorageVolLookupByName(p, "v")
	wantErr(t, err, libvirt.ErrNoStorageVol, "Storage volume not found: no storage vol with matching name 'v'")

	v, err := f.StorageVolCreateXML(p, volXML("v", "<capacity>1024</capacity>", "raw", ""), 0)
	must(t, err)
	path, err := f.StorageVolGetPath(v)
	must(t, err)
	if path != "/var/lib/libvirt/images/default/v" || v.Key != path {
		t.Errorf("path %q key %q", path, v.Key)
	}
	typ, capa, alloc, err := f.StorageVolGetInfo(v)
	must(t, err)
	if libvirt.StorageVolType(typ) != libvirt.StorageVolFile || capa != 1024 || alloc != 1024 {
		t.Errorf("info: %d %d %d", typ, capa, alloc)
	}
	must(t, f.StorageVolDelete(v, 0))
	_, _, _, err = f.StorageVolGetInfo(v)
	if !virt.IsNotFound(err) {
		t.Errorf("info after delete: %v", err)
	}
	wantErr(t, f.StorageVolDelete(v, 0), libvirt.ErrNoStorageVol, "no storage vol with matching name 'v'")
}

// errReader returns data, then err.
type errReader struct {
	data []byte
	err  error
}

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestStorageVolUpload(t *testing.T) {
	boom := errors.New("disk read failed")
	payload := bytes.Repeat([]byte("0123456789abcdef"), 40_000) // 640 kB: several chunks
	tests := []struct {
		name           string
		initial        []byte // uploaded first, at offset 0
		body           io.Reader
		offset, length uint64
		code           libvirt.ErrorNumber
		wantErrIs      error
		want           []byte
	}{
		{name: "whole body", body: bytes.NewReader(payload), want: payload},
		{name: "empty body", body: bytes.NewReader(nil), want: []byte{}},
		{name: "at offset over existing content", initial: []byte("aaaaaaaa"), body: strings.NewReader("XY"), offset: 3,
			want: []byte("aaaXYaaa")},
		{name: "offset past the end leaves a hole", body: strings.NewReader("Z"), offset: 4, want: []byte{0, 0, 0, 0, 'Z'}},
		{name: "exactly length", body: strings.NewReader("abc"), length: 3, want: []byte("abc")},
		{name: "more than length is refused", body: strings.NewReader("abcdef"), length: 4,
			code: libvirt.ErrSystemError, want: []byte("abcd")},
		{name: "failing body leaves partial content", body: &errReader{data: payload[:300_000], err: boom},
			wantErrIs: boom, want: payload[:300_000]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			p := pool(t, f, "default")
			v, err := f.StorageVolCreateXML(p, volXML("disk", "<capacity>1</capacity>", "raw", ""), 0)
			must(t, err)
			if tt.initial != nil {
				must(t, f.StorageVolUpload(v, bytes.NewReader(tt.initial), 0, 0, 0))
			}
			err = f.StorageVolUpload(v, tt.body, tt.offset, tt.length, 0)
			switch {
			case tt.wantErrIs != nil:
				if !errors.Is(err, tt.wantErrIs) {
					t.Fatalf("err = %v, want %v", err, tt.wantErrIs)
				}
			default:
				wantErr(t, err, tt.code, "")
			}
			got, err := f.VolumeBytes("default", "disk")
			must(t, err)
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("content %d bytes %.20q, want %d bytes %.20q", len(got), got, len(tt.want), tt.want)
			}
			digest, err := f.VolumeSHA256("default", "disk")
			must(t, err)
			if digest != sum(tt.want) {
				t.Errorf("sha256 mismatch")
			}
			info, _ := f.Volume("default", "disk")
			if info.Size != uint64(len(tt.want)) || info.Allocation < info.Size || info.Capacity < info.Size {
				t.Errorf("volume info %+v after %d bytes", info, len(tt.want))
			}
		})
	}
}

// Content beyond WithMaxStoredBytes is hashed, not stored.
func TestStorageVolUploadLargeKeepsDigestOnly(t *testing.T) {
	f := newFake(t, fake.WithMaxStoredBytes(1000))
	p := pool(t, f, "default")
	v, err := f.StorageVolCreateXML(p, volXML("big", "<capacity>1</capacity>", "raw", ""), 0)
	must(t, err)
	payload := bytes.Repeat([]byte{7}, 1<<20)
	must(t, f.StorageVolUpload(v, bytes.NewReader(payload), 0, 0, 0))
	digest, err := f.VolumeSHA256("default", "big")
	must(t, err)
	if digest != sum(payload) {
		t.Error("digest mismatch")
	}
	if _, err := f.VolumeBytes("default", "big"); err == nil {
		t.Error("VolumeBytes of spilled volume succeeded")
	}
	if info, _ := f.Volume("default", "big"); info.Size != 1<<20 {
		t.Errorf("size %d", info.Size)
	}
}

// slowReader hands out one byte per read until closed.
type slowReader struct{ next chan []byte }

func (r slowReader) Read(p []byte) (int, error) {
	b, ok := <-r.next
	if !ok {
		return 0, io.EOF
	}
	return copy(p, b), nil
}

func TestStorageVolDeleteDuringUploadRefused(t *testing.T) {
	f := newFake(t)
	p := pool(t, f, "default")
	v, err := f.StorageVolCreateXML(p, volXML("disk", "<capacity>1</capacity>", "raw", ""), 0)
	must(t, err)
	body := slowReader{next: make(chan []byte)}
	done := make(chan error, 1)
	go func() { done <- f.StorageVolUpload(v, body, 0, 0, 0) }()
	body.next <- []byte("a") // the upload is now under way
	wantErr(t, f.StorageVolDelete(v, 0), libvirt.ErrOperationInvalid, "volume 'disk' is still in use.")
	close(body.next)
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("upload did not finish")
	}
	must(t, f.StorageVolDelete(v, 0))
}

// Volume listing and XML show backing chains; deleting a backing file, or
// the disk of a running domain, succeeds as in libvirt, whose
// storageVolDelete refuses only volumes being uploaded or built.
func TestStorageBackingChainsAndDelete(t *testing.T) {
	f := newFake(t)
	p := pool(t, f, "default")
	img, err := f.StorageVolCreateXML(p, volXML("base.qcow2", "<capacity>1048576</capacity>", "qcow2", ""), 0)
	must(t, err)
	basePath := fake.PoolDir + "/default/base.qcow2"
	ov, err := f.StorageVolCreateXML(p, volXML("overlay.qcow2", "", "qcow2", basePath), 0)
	must(t, err)

	vols, n, err := f.StoragePoolListAllVolumes(p, 1, 0)
	must(t, err)
	if n != 2 || len(vols) != 2 || vols[0].Name != "base.qcow2" || vols[1].Name != "overlay.qcow2" {
		t.Fatalf("listed %d: %+v", n, vols)
	}
	x, err := f.StorageVolGetXMLDesc(ov, 0)
	must(t, err)
	var got libvirtxml.StorageVolume
	must(t, got.Unmarshal(x))
	if got.BackingStore == nil || got.BackingStore.Path != basePath || got.Target == nil || got.Target.Path != fake.PoolDir+"/default/overlay.qcow2" {
		t.Errorf("overlay XML lacks its backing store or path:\n%s", x)
	}
	if x, _ := f.StorageVolGetXMLDesc(img, 0); strings.Contains(x, "backingStore") {
		t.Errorf("base XML shows a backing store:\n%s", x)
	}

	d := mustDefine(t, f, dom{name: "vm"})
	must(t, f.DomainCreate(d))
	must(t, f.StorageVolDelete(img, 0)) // backing file of overlay.qcow2
	x, err = f.StorageVolGetXMLDesc(ov, 0)
	must(t, err)
	if !strings.Contains(x, basePath) {
		t.Errorf("overlay forgot its deleted backing file:\n%s", x)
	}
	must(t, f.StorageVolDelete(ov, 0)) // the running domain's disk
	_, err = f.StorageVolGetXMLDesc(ov, 0)
	wantErr(t, err, libvirt.ErrNoStorageVol, "Storage volume not found: no storage vol with matching name 'overlay.qcow2'")

	f.SetPoolActive("default", false)
	_, _, err = f.StoragePoolListAllVolumes(p, 1, 0)
	wantErr(t, err, libvirt.ErrOperationInvalid, "storage pool 'default' is not active")
}

// StallUploads holds every upload once it has taken the given bytes: no
// more is read from its stream until release, or until its connection
// drops (ErrInterrupted). PaceUploads sees each chunk before it is taken.
func TestUploadStreamFaults(t *testing.T) {
	const chunk = 256 << 10
	payload := bytes.Repeat([]byte("x"), 3*chunk)
	start := func(t *testing.T, f *fake.Fake, c virt.Client) (libvirt.StorageVol, <-chan error) {
		v, err := f.StorageVolCreateXML(pool(t, f, "default"), volXML("disk", "<capacity>1</capacity>", "raw", ""), 0)
		must(t, err)
		done := make(chan error, 1)
		go func() { done <- c.StorageVolUpload(v, bytes.NewReader(payload), 0, 0, 0) }()
		return v, done
	}
	size := func(f *fake.Fake) uint64 { info, _ := f.Volume("default", "disk"); return info.Size }
	finished := func(t *testing.T, done <-chan error) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("upload did not finish")
			return nil
		}
	}

	t.Run("stall until release", func(t *testing.T) {
		f := newFake(t)
		release := f.StallUploads(chunk)
		_, done := start(t, f, f)
		testutil.WaitFor(t, func() bool { return f.StalledUploads() == 1 })
		select {
		case err := <-done:
			t.Fatalf("stalled upload returned %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if got := size(f); got != chunk {
			t.Fatalf("%d bytes taken while stalled, want %d", got, chunk)
		}
		release()
		release() // idempotent
		must(t, finished(t, done))
		if got := size(f); got != uint64(len(payload)) {
			t.Fatalf("%d bytes after release, want %d", got, len(payload))
		}
	})

	t.Run("stalled upload interrupted by a dropped connection", func(t *testing.T) {
		f := newFake(t)
		t.Cleanup(f.StallUploads(0))
		c := f.Connect()
		_, done := start(t, f, c)
		testutil.WaitFor(t, func() bool { return f.StalledUploads() == 1 })
		must(t, c.Disconnect())
		if err := finished(t, done); !errors.Is(err, libvirt.ErrInterrupted) {
			t.Fatalf("err = %v, want ErrInterrupted", err)
		}
		if size(f) != 0 || f.StalledUploads() != 0 {
			t.Fatalf("size %d, stalled %d after the drop", size(f), f.StalledUploads())
		}
	})

	t.Run("ClearFaults releases a stall and drops the pace", func(t *testing.T) {
		f := newFake(t)
		paced := 0
		f.PaceUploads(func(uint64) { paced++ })
		f.StallUploads(0)
		_, done := start(t, f, f)
		testutil.WaitFor(t, func() bool { return f.StalledUploads() == 1 })
		f.ClearFaults()
		must(t, finished(t, done))
		if paced != 1 {
			t.Fatalf("paced %d chunks, want the one before the stall", paced)
		}
	})

	t.Run("pace sees the bytes taken before each chunk", func(t *testing.T) {
		f := newFake(t)
		var seen []uint64
		f.PaceUploads(func(written uint64) { seen = append(seen, written) })
		_, done := start(t, f, f)
		must(t, finished(t, done))
		// Three chunks, then the read that finds the end of the stream.
		if want := []uint64{0, chunk, 2 * chunk, 3 * chunk}; !slices.Equal(seen, want) {
			t.Fatalf("paced at %v, want %v", seen, want)
		}
	})
}
