package image

import (
	"runtime"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// TestEnsureStreams proves the upload path holds no O(size) memory: a
// 256 MiB image goes from an HTTP server through Ensure into a pool that
// keeps only a hash, and the bytes allocated by the whole process meanwhile
// (server, client, Ensure, pool) stay a small fraction of the image. Any
// copy of the image in memory would allocate at least its size;
// TotalAlloc counts every allocation whether or not GC has reclaimed it.
func TestEnsureStreams(t *testing.T) {
	size := int64(256 << 20)
	if testing.Short() {
		size = 32 << 20
	}
	const budget = 16 << 20
	e := newEnv(t, fake.WithMaxStoredBytes(0)) // the pool keeps a running hash only
	img := provider.Image{Name: "big", URL: e.srv.generated("/big", 42, size), Checksum: "sha256:" + sumOf(gen(42, size)), Format: FormatRaw}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res, err := e.ensure(img)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes != size {
		t.Fatalf("uploaded %d bytes, want %d", res.Bytes, size)
	}
	if sum, n, _ := e.host.volumeSHA256(poolName, res.VolumeName); "sha256:"+sum != img.Checksum || n != size {
		t.Fatalf("volume holds %d bytes sha256:%s, want %s", n, sum, img.Checksum)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("uploaded %d MiB, allocated %.2f MiB in total", size>>20, float64(alloc)/(1<<20))
	if alloc > budget {
		t.Errorf("allocated %d bytes for a %d-byte image, budget %d", alloc, size, budget)
	}
}
