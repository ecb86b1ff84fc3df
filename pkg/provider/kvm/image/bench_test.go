package image

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-logr/logr"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// BenchmarkEnsureUpload measures the slow path end to end: HTTP download,
// hashing, and the upload into a pool that keeps only a hash. Every
// iteration starts from an empty pool. b.SetBytes makes "MB/s" the image
// throughput; the transport under StorageVolUpload (the SSH link to a real
// host) is the part to add later.
func BenchmarkEnsureUpload(b *testing.B) {
	for _, size := range []int64{16 << 20, 128 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			srv := newImageServer(b)
			img := provider.Image{Name: "bench", URL: srv.generated("/bench", 7, size), Checksum: "sha256:" + sumOf(gen(7, size)), Format: FormatRaw}
			ctx := logr.NewContext(context.Background(), logr.Discard())
			var c Cache
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				h := newFakeHost(fake.WithMaxStoredBytes(0))
				pool := h.addPool(b, poolName)
				b.StartTimer()
				if _, err := c.Ensure(ctx, h, pool, img, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
