package image

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

const poolName = "default"

type env struct {
	t     *testing.T
	host  *fakeHost
	pool  libvirt.StoragePool
	srv   *imageServer
	cache *Cache
	ctx   context.Context
}

func newEnv(t *testing.T, opts ...fake.Option) *env {
	h := newFakeHost(opts...)
	return &env{t: t, host: h, pool: h.addPool(t, poolName), srv: newImageServer(t), cache: &Cache{}, ctx: testCtx(t)}
}

func (e *env) ensure(img provider.Image) (Result, error) {
	return e.cache.Ensure(e.ctx, e.host, e.pool, img, nil)
}

// names returns img's volume and marker names.
func (e *env) names(img provider.Image) (vol, marker string) {
	e.t.Helper()
	n, err := namesOf(img)
	if err != nil {
		e.t.Fatal(err)
	}
	return n.volume, n.marker
}

func (e *env) volumes() []string {
	v := e.host.volumeNames(poolName)
	slices.Sort(v)
	return v
}

// assertCached checks that img is cached in full: the volume holds want, the
// marker exists and holds a sha256sum line for it.
func (e *env) assertCached(img provider.Image, want []byte) {
	e.t.Helper()
	vol, marker := e.names(img)
	sum, size, ok := e.host.volumeSHA256(poolName, vol)
	if !ok {
		e.t.Fatalf("volume %s missing; have %v", vol, e.volumes())
	}
	if "sha256:"+sum != checksumOf(want) || size != int64(len(want)) {
		e.t.Errorf("volume %s holds %d bytes sha256:%s, want %d bytes %s", vol, size, sum, len(want), checksumOf(want))
	}
	digest, _ := ParseChecksum(img.Checksum)
	if got, want := string(e.host.volumeContent(poolName, marker)), digest+"  "+vol+"\n"; got != want {
		e.t.Errorf("marker content = %q, want %q", got, want)
	}
}

// assertEmpty checks that a failed attempt left nothing in the pool, not
// even its claim: a full pool must be empty between attempts (fault 10).
func (e *env) assertEmpty() {
	e.t.Helper()
	if v := e.volumes(); len(v) != 0 {
		e.t.Errorf("volumes left in pool: %v", v)
	}
}

// claim returns the name of this Cache's claim on img.
func (e *env) claim(img provider.Image) string {
	vol, _ := e.names(img)
	return claimName(vol, e.cache.Holder)
}

func TestEnsureHappy(t *testing.T) {
	raw := genBytes(1, 3<<20+17)
	q := qcow2Image(2, 2<<20, 10<<30)
	for _, tc := range []struct {
		name     string
		format   string
		content  []byte
		serve    func(s *imageServer, path string, b []byte) string
		wantCap  uint64
		wantTot  int64
		imgName  string
		wantName string
	}{
		{name: "raw", format: FormatRaw, content: raw, serve: (*imageServer).bytes, wantCap: uint64(len(raw)), wantTot: int64(len(raw)), imgName: "debian-12",
			wantName: "image-sha256_" + strings.TrimPrefix(checksumOf(raw), "sha256:") + ".raw"},
		{name: "qcow2 declares virtual size", format: FormatQCOW2, content: q, serve: (*imageServer).bytes, wantCap: 10 << 30, wantTot: int64(len(q)), imgName: "ubuntu-24.04",
			wantName: "image-sha256_" + strings.TrimPrefix(checksumOf(q), "sha256:") + ".qcow2"},
		{name: "raw without content length", format: FormatRaw, content: raw, serve: (*imageServer).chunked, wantCap: 0, wantTot: -1, imgName: "chunked"},
		{name: "qcow2 without content length", format: FormatQCOW2, content: q, serve: (*imageServer).chunked, wantCap: 10 << 30, wantTot: -1, imgName: "chunked-q"},
		{name: "direct URL", format: FormatRaw, content: raw, serve: (*imageServer).bytes, wantCap: uint64(len(raw)), wantTot: int64(len(raw))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			img := provider.Image{Name: tc.imgName, URL: tc.serve(e.srv, "/img", tc.content), Checksum: checksumOf(tc.content), Format: tc.format}

			var calls [][2]int64
			res, err := e.cache.Ensure(e.ctx, e.host, e.pool, img, func(done, total int64) {
				calls = append(calls, [2]int64{done, total})
			})
			if err != nil {
				t.Fatalf("Ensure: %v", err)
			}
			vol, marker := e.names(img)
			if tc.wantName != "" && vol != tc.wantName {
				t.Errorf("volume name = %s, want %s", vol, tc.wantName)
			}
			want := Result{VolumeName: vol, Path: fake.PoolDir + "/" + poolName + "/" + vol, Bytes: int64(len(tc.content)), Checksum: checksumOf(tc.content)}
			if res != want {
				t.Errorf("Result = %+v, want %+v", res, want)
			}
			e.assertCached(img, tc.content)
			if got, want := e.volumes(), []string{vol, e.claim(img), marker}; !slices.Equal(got, want) {
				t.Errorf("volumes = %v, want %v", got, want)
			}
			if f, c := e.host.volumeDecl(poolName, vol); f != tc.format || c != tc.wantCap {
				t.Errorf("volume declared as %s capacity %d, want %s capacity %d", f, c, tc.format, tc.wantCap)
			}

			// Progress: monotonic, the right total, ending at the size.
			if len(calls) == 0 {
				t.Fatal("no progress reported")
			}
			for i, c := range calls {
				if c[1] != tc.wantTot {
					t.Fatalf("progress call %d total = %d, want %d", i, c[1], tc.wantTot)
				}
				if i > 0 && c[0] <= calls[i-1][0] {
					t.Fatalf("progress not increasing: %v", calls)
				}
			}
			if last := calls[len(calls)-1][0]; last != int64(len(tc.content)) {
				t.Errorf("last progress = %d, want %d", last, len(tc.content))
			}
		})
	}
}

func TestEnsureFastPath(t *testing.T) {
	e := newEnv(t)
	b := genBytes(3, 1<<20)
	img := provider.Image{Name: "cached", URL: e.srv.bytes("/c.img", b), Checksum: checksumOf(b), Format: FormatRaw}
	first, err := e.ensure(img)
	if err != nil {
		t.Fatal(err)
	}
	e.host.ResetCalls()

	res, err := e.ensure(img)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Cached || res.Bytes != 0 || res.Path != first.Path || res.VolumeName != first.VolumeName || res.Checksum != first.Checksum {
		t.Errorf("cached Result = %+v after %+v", res, first)
	}
	if n := e.srv.requests("/c.img"); n != 1 {
		t.Errorf("%d downloads, want 1", n)
	}
	// Three lookups (claim, volume, marker) and the path: nothing else.
	want := map[string]int{virt.RPCStorageVolLookupByName: 3, virt.RPCStorageVolGetPath: 1}
	total := 0
	for _, rpc := range virt.RPCNames {
		total += e.host.Calls(rpc)
		if got := e.host.Calls(rpc); got != want[rpc] {
			t.Errorf("%s called %d times, want %d", rpc, got, want[rpc])
		}
	}
	if total != 4 {
		t.Errorf("fast path made %d RPCs, want 4", total)
	}
}

func TestEnsureFailures(t *testing.T) {
	good := genBytes(4, 1<<20)
	other := genBytes(5, 1<<20)
	for _, tc := range []struct {
		name   string
		setup  func(e *env) provider.Image
		class  provider.ErrorClass
		errHas string
		// noFetch: the failure is found before any download or volume.
		noFetch bool
	}{
		{
			name: "checksum mismatch",
			setup: func(e *env) provider.Image {
				return provider.Image{Name: "m", URL: e.srv.bytes("/m", other), Checksum: checksumOf(good), Format: FormatRaw}
			},
			class: provider.ClassPermanent, errHas: "checksum mismatch: expected " + checksumOf(good) + ", got " + checksumOf(other),
		},
		{name: "404", setup: statusImage(404), class: provider.ClassPermanent, errHas: "404 Not Found", noFetch: true},
		{name: "403", setup: statusImage(403), class: provider.ClassPermanent, errHas: "403 Forbidden", noFetch: true},
		{name: "410", setup: statusImage(410), class: provider.ClassPermanent, errHas: "410 Gone", noFetch: true},
		{name: "500", setup: statusImage(500), class: provider.ClassTransient, errHas: "500 Internal Server Error", noFetch: true},
		{name: "503", setup: statusImage(503), class: provider.ClassTransient, errHas: "503", noFetch: true},
		{name: "429", setup: statusImage(429), class: provider.ClassTransient, errHas: "429", noFetch: true},
		{
			name: "body cut mid-stream",
			setup: func(e *env) provider.Image {
				return provider.Image{Name: "cut", URL: e.srv.cut("/cut", good, len(good)/2), Checksum: checksumOf(good), Format: FormatRaw}
			},
			class: provider.ClassTransient, errHas: "ended early",
		},
		{
			name: "connection refused",
			setup: func(e *env) provider.Image {
				return provider.Image{Name: "down", URL: "http://127.0.0.1:1/x.img", Checksum: checksumOf(good), Format: FormatRaw}
			},
			class: provider.ClassTransient, errHas: "GET http://127.0.0.1:1/x.img", noFetch: true,
		},
		{
			name: "unsupported scheme",
			setup: func(e *env) provider.Image {
				return provider.Image{Name: "ftp", URL: "ftp://example.com/x.img", Checksum: checksumOf(good), Format: FormatRaw}
			},
			class: provider.ClassPermanent, errHas: `scheme "ftp" is not supported`, noFetch: true,
		},
		{
			name: "bad checksum",
			setup: func(e *env) provider.Image {
				return provider.Image{Name: "x", URL: e.srv.bytes("/x", good), Checksum: "md5:abc", Format: FormatRaw}
			},
			class: provider.ClassPermanent, errHas: `algorithm "md5"`, noFetch: true,
		},
		{
			name: "unsupported format",
			setup: func(e *env) provider.Image {
				return provider.Image{Name: "x", URL: e.srv.bytes("/x", good), Checksum: checksumOf(good), Format: "vmdk"}
			},
			class: provider.ClassPermanent, errHas: `format "vmdk"`, noFetch: true,
		},
		{
			name: "qcow2 content declared raw",
			setup: func(e *env) provider.Image {
				q := qcow2Image(6, 1<<20, 1<<30)
				return provider.Image{Name: "x", URL: e.srv.bytes("/x", q), Checksum: checksumOf(q), Format: FormatRaw}
			},
			class: provider.ClassPermanent, errHas: "declared raw",
		},
		{
			name: "qcow2 with backing file",
			setup: func(e *env) provider.Image {
				q := append(qcow2Header(1<<30, func(h []byte) { h[qcowBackingOffsetOff+7] = 200 }), genBytes(7, 1000)...)
				return provider.Image{Name: "x", URL: e.srv.bytes("/x", q), Checksum: checksumOf(q), Format: FormatQCOW2}
			},
			class: provider.ClassPermanent, errHas: "backing file",
		},
		{
			name: "pool missing",
			setup: func(e *env) provider.Image {
				e.pool = libvirt.StoragePool{Name: "nope"}
				return provider.Image{Name: "x", URL: e.srv.bytes("/x", good), Checksum: checksumOf(good), Format: FormatRaw}
			},
			class: provider.ClassPermanent, errHas: "storage pool nope not found", noFetch: true,
		},
		{
			name: "upload fails in libvirt",
			setup: func(e *env) provider.Image {
				e.host.FailNext(virt.RPCStorageVolUpload, virt.NewError(libvirt.ErrInternalError, "internal error: no space left on device"))
				return provider.Image{Name: "x", URL: e.srv.bytes("/x", good), Checksum: checksumOf(good), Format: FormatRaw}
			},
			class: provider.ClassTransient, errHas: "no space left",
		},
		{
			name: "create refused as unsupported",
			setup: func(e *env) provider.Image {
				e.host.FailNext(virt.RPCStorageVolCreateXML, virt.NewError(libvirt.ErrNoSupport, "this function is not supported by the connection driver"))
				return provider.Image{Name: "x", URL: e.srv.bytes("/x", good), Checksum: checksumOf(good), Format: FormatRaw}
			},
			class: provider.ClassPermanent, errHas: "not supported",
		},
		{
			name: "connection lost on lookup",
			setup: func(e *env) provider.Image {
				e.host.FailNext(virt.RPCStorageVolLookupByName, libvirt.ErrInterrupted)
				return provider.Image{Name: "x", URL: e.srv.bytes("/x", good), Checksum: checksumOf(good), Format: FormatRaw}
			},
			class: provider.ClassTransient, errHas: "interrupted", noFetch: true,
		},
		{
			name: "volume created concurrently elsewhere",
			setup: func(e *env) provider.Image {
				// The claim (it may exist: fine), then the image volume.
				e.host.FailNext(virt.RPCStorageVolCreateXML, virt.NewError(libvirt.ErrStorageVolExist, "storage volume exists already"))
				e.host.FailNext(virt.RPCStorageVolCreateXML, virt.NewError(libvirt.ErrStorageVolExist, "storage volume exists already"))
				return provider.Image{Name: "x", URL: e.srv.bytes("/x", good), Checksum: checksumOf(good), Format: FormatRaw}
			},
			class: provider.ClassTransient, errHas: "upload in progress",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			img := tc.setup(e)
			_, err := e.ensure(img)
			if got := provider.Class(err); got != tc.class {
				t.Fatalf("Class(%v) = %q, want %q", err, got, tc.class)
			}
			if !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("error %q does not mention %q", err, tc.errHas)
			}
			e.assertEmpty()
			if tc.noFetch && e.host.Calls(virt.RPCStorageVolCreateXML) != 0 {
				t.Errorf("a volume was created")
			}
		})
	}
}

func statusImage(code int) func(e *env) provider.Image {
	return func(e *env) provider.Image {
		b := genBytes(9, 100)
		return provider.Image{Name: "s", URL: e.srv.status("/s", code), Checksum: checksumOf(b), Format: FormatRaw}
	}
}

func TestEnsureMismatchReportsHTTPStatusError(t *testing.T) {
	e := newEnv(t)
	img := statusImage(http.StatusNotFound)(e)
	_, err := e.ensure(img)
	var se *HTTPStatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound {
		t.Fatalf("error %v is not an HTTPStatusError 404", err)
	}
}

func TestEnsureRefetchesUnverified(t *testing.T) {
	b := genBytes(10, 2<<20)
	for _, tc := range []struct {
		name  string
		prime func(e *env, img provider.Image)
	}{
		{"marker deleted", func(e *env, img provider.Image) {
			if _, err := e.ensure(img); err != nil {
				e.t.Fatal(err)
			}
			_, marker := e.names(img)
			deleteByName(e, marker)
		}},
		{"partial volume left by a crash", func(e *env, img provider.Image) {
			vol, _ := e.names(img)
			createWith(e, vol, b[:1000])
		}},
		{"image volume deleted under its marker", func(e *env, img provider.Image) {
			if _, err := e.ensure(img); err != nil {
				e.t.Fatal(err)
			}
			vol, _ := e.names(img)
			deleteByName(e, vol)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			img := provider.Image{Name: "re", URL: e.srv.bytes("/re", b), Checksum: checksumOf(b), Format: FormatRaw}
			tc.prime(e, img)
			// Lookup follows the same commit rule: no marker and volume, no hit.
			if _, ok, err := e.cache.Lookup(e.host, e.pool, img); err != nil || ok {
				t.Fatalf("Lookup of an unverified image = %v, %v; want a miss", ok, err)
			}
			before := e.srv.requests("/re")
			res, err := e.ensure(img)
			if err != nil {
				t.Fatal(err)
			}
			if hit, ok, err := e.cache.Lookup(e.host, e.pool, img); err != nil || !ok || hit.Path != res.Path || !hit.Cached {
				t.Fatalf("Lookup after Ensure = %+v, %v, %v; want the cached volume", hit, ok, err)
			}
			if res.Cached || res.Bytes != int64(len(b)) {
				t.Errorf("Result = %+v, want a fresh upload", res)
			}
			if e.srv.requests("/re") != before+1 {
				t.Errorf("image was not downloaded again")
			}
			e.assertCached(img, b)
			if n := len(e.volumes()); n != 3 {
				t.Errorf("volumes = %v, want the image, its marker and the claim", e.volumes())
			}
		})
	}
}

func deleteByName(e *env, name string) {
	e.t.Helper()
	v, err := e.host.StorageVolLookupByName(e.pool, name)
	if err == nil {
		err = e.host.StorageVolDelete(v, 0)
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

func createWith(e *env, name string, content []byte) {
	e.t.Helper()
	xml, _ := volumeXML(name, FormatRaw, uint64(len(content)))
	v, err := e.host.StorageVolCreateXML(e.pool, xml, 0)
	if err == nil {
		err = e.host.StorageVolUpload(v, strings.NewReader(string(content)), 0, 0, 0)
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

func TestEnsureConcurrentSameVolume(t *testing.T) {
	e := newEnv(t)
	b := genBytes(13, 1<<20)
	url, started, release := e.srv.hold("/slow", b, 1000)
	defer release()
	img := provider.Image{Name: "slow", URL: url, Checksum: checksumOf(b), Format: FormatRaw}

	done := make(chan error, 1)
	go func() {
		_, err := e.ensure(img)
		done <- err
	}()
	<-started
	// The first call is mid-upload: the second must neither wait nor touch
	// the volume.
	_, err := e.ensure(img)
	if provider.Class(err) != provider.ClassTransient || !strings.Contains(err.Error(), "in progress") {
		t.Errorf("concurrent Ensure = %v, want transient upload in progress", err)
	}
	if n := e.host.Calls(virt.RPCStorageVolDelete); n != 0 {
		t.Errorf("concurrent Ensure deleted %d volumes", n)
	}
	// Prune skips the volume being uploaded too.
	if res, err := e.cache.Prune(e.ctx, e.host, e.pool, keepNone); err != nil || len(res.Deleted) != 0 {
		t.Errorf("Prune during upload = %+v, %v; want nothing deleted", res, err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("first Ensure: %v", err)
	}
	if res, err := e.ensure(img); err != nil || !res.Cached {
		t.Errorf("Ensure after upload = %+v, %v", res, err)
	}
}

func TestEnsureConcurrentDifferentImages(t *testing.T) {
	e := newEnv(t)
	const n = 8
	imgs := make([]provider.Image, n)
	contents := make([][]byte, n)
	for i := range imgs {
		contents[i] = genBytes(uint64(100+i), 512<<10+i)
		imgs[i] = provider.Image{Name: "img-" + string(rune('a'+i)), URL: e.srv.bytes("/"+string(rune('a'+i)), contents[i]), Checksum: checksumOf(contents[i]), Format: FormatRaw}
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range imgs {
		// Twice each: one of the pair may find the other mid-upload.
		for range 2 {
			wg.Go(func() {
				if _, err := e.ensure(imgs[i]); err != nil && !strings.Contains(err.Error(), "in progress") {
					errs[i] = err
				}
			})
		}
	}
	wg.Wait()
	for i := range imgs {
		if errs[i] != nil {
			t.Errorf("image %d: %v", i, errs[i])
		}
		if _, err := e.ensure(imgs[i]); err != nil {
			t.Fatal(err)
		}
		e.assertCached(imgs[i], contents[i])
	}
	if got := len(e.volumes()); got != 3*n {
		t.Errorf("%d volumes, want %d: image, marker and claim each", got, 3*n)
	}
}

func TestEnsureInterrupted(t *testing.T) {
	b := genBytes(14, 1<<20)
	t.Run("context canceled", func(t *testing.T) {
		e := newEnv(t)
		url, started, release := e.srv.hold("/h", b, 5000)
		defer release()
		ctx, cancel := context.WithCancel(e.ctx)
		go func() { <-started; cancel() }()
		_, err := e.cache.Ensure(ctx, e.host, e.pool, provider.Image{Name: "h", URL: url, Checksum: checksumOf(b), Format: FormatRaw}, nil)
		if !errors.Is(err, context.Canceled) || provider.Class(err) != provider.ClassTransient {
			t.Errorf("err = %v, want transient context.Canceled", err)
		}
		e.assertEmpty()
	})
	t.Run("source stalls", func(t *testing.T) {
		e := newEnv(t)
		e.cache.StallTimeout = 100 * time.Millisecond
		url, _, release := e.srv.hold("/h", b, 5000)
		defer release()
		start := time.Now()
		_, err := e.ensure(provider.Image{Name: "h", URL: url, Checksum: checksumOf(b), Format: FormatRaw})
		if provider.Class(err) != provider.ClassTransient || !strings.Contains(err.Error(), "no data from") {
			t.Errorf("err = %v, want transient stall", err)
		}
		if time.Since(start) > 5*time.Second {
			t.Errorf("stall detected after %s", time.Since(start))
		}
		e.assertEmpty()
	})
}

func TestEnsureProgressInterval(t *testing.T) {
	e := newEnv(t)
	b := genBytes(15, 4<<20)
	now := time.Unix(1_700_000_000, 0)
	e.cache.Now = func() time.Time { return now } // time stands still
	e.cache.ProgressInterval = time.Second
	img := provider.Image{Name: "p", URL: e.srv.bytes("/p", b), Checksum: checksumOf(b), Format: FormatRaw}
	var calls [][2]int64
	if _, err := e.cache.Ensure(e.ctx, e.host, e.pool, img, func(d, t int64) { calls = append(calls, [2]int64{d, t}) }); err != nil {
		t.Fatal(err)
	}
	// The first read, then nothing until the final report.
	if len(calls) != 2 || calls[1] != [2]int64{int64(len(b)), int64(len(b))} {
		t.Errorf("progress calls = %v, want the first read and the final total", calls)
	}
}

// A failure after the image was verified (here: its path cannot be read)
// keeps the claim: the verified volume is this install's, and another
// install's Prune must keep seeing that.
func TestEnsureFailureAfterVerificationKeepsTheClaim(t *testing.T) {
	e := newEnv(t)
	b := genBytes(20, 1<<20)
	img := provider.Image{Name: "gp", URL: e.srv.bytes("/gp", b), Checksum: checksumOf(b), Format: FormatRaw}
	e.host.FailNext(virt.RPCStorageVolGetPath, libvirt.ErrInterrupted)
	if _, err := e.ensure(img); provider.Class(err) != provider.ClassTransient {
		t.Fatalf("err = %v, want transient", err)
	}
	e.assertCached(img, b)
	vol, marker := e.names(img)
	if got, want := e.volumes(), []string{vol, e.claim(img), marker}; !slices.Equal(got, want) {
		t.Errorf("volumes = %v, want the image, its claim and its marker", got)
	}
}

func TestEnsureMarkerFailure(t *testing.T) {
	e := newEnv(t)
	b := genBytes(16, 1<<20)
	img := provider.Image{Name: "mk", URL: e.srv.bytes("/mk", b), Checksum: checksumOf(b), Format: FormatRaw}
	// The second create is the marker's.
	e.host.FailNext(virt.RPCStorageVolCreateXML, nil)
	e.host.FailNext(virt.RPCStorageVolCreateXML, libvirt.ErrInterrupted)
	_, err := e.ensure(img)
	if provider.Class(err) != provider.ClassTransient {
		t.Fatalf("err = %v, want transient", err)
	}
	e.assertEmpty()
	if _, err := e.ensure(img); err != nil {
		t.Fatal(err)
	}
	e.assertCached(img, b)
}

func TestEnsurePoolInactive(t *testing.T) {
	e := newEnv(t)
	e.host.SetPoolActive(poolName, false)
	b := genBytes(17, 1000)
	_, err := e.ensure(provider.Image{Name: "x", URL: e.srv.bytes("/x", b), Checksum: checksumOf(b), Format: FormatRaw})
	// An operator can start the pool; retrying is right.
	if provider.Class(err) != provider.ClassTransient || !strings.Contains(err.Error(), "not active") {
		t.Errorf("err = %v, want transient pool not active", err)
	}
}

// A connection that drops mid-upload leaves a partial volume that cannot be
// deleted at once; the next Ensure, on a new connection, replaces it.
func TestEnsureConnectionDropsMidUpload(t *testing.T) {
	e := newEnv(t)
	b := genBytes(18, 2<<20)
	url, _, release := e.srv.hold("/d", b, 1<<20)
	defer release()
	img := provider.Image{Name: "d", URL: url, Checksum: checksumOf(b), Format: FormatRaw}
	vol, marker := e.names(img)

	done := make(chan error, 1)
	go func() {
		_, err := e.ensure(img)
		done <- err
	}()
	for {
		if info, ok := e.host.Volume(poolName, vol); ok && info.Size > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	_ = e.host.Disconnect()
	release()
	err := <-done
	if provider.Class(err) != provider.ClassTransient {
		t.Fatalf("err = %v, want transient", err)
	}
	if _, ok := e.host.Volume(poolName, vol); !ok {
		t.Fatalf("expected the partial volume to remain after the connection dropped")
	}
	if _, ok := e.host.Volume(poolName, marker); ok {
		t.Fatalf("marker created for a partial upload")
	}

	res, err := e.cache.Ensure(e.ctx, e.host.Connect(), e.pool, img, nil)
	if err != nil || res.Cached {
		t.Fatalf("Ensure after reconnect = %+v, %v; want a fresh upload", res, err)
	}
	e.assertCached(img, b)
}

func TestEnsureCustomFetcher(t *testing.T) {
	b := genBytes(19, 100_000)
	body := func(p []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(p)) }
	for _, tc := range []struct {
		name   string
		fetch  Fetcher
		class  provider.ErrorClass
		errHas string
	}{
		{
			name:  "ok without size",
			fetch: func(context.Context, string) (io.ReadCloser, int64, error) { return body(b), -1, nil },
		},
		{
			name:   "unclassified error is transient",
			fetch:  func(context.Context, string) (io.ReadCloser, int64, error) { return nil, 0, errors.New("boom") },
			class:  provider.ClassTransient,
			errHas: "boom",
		},
		{
			name: "classified error keeps its class",
			fetch: func(context.Context, string) (io.ReadCloser, int64, error) {
				return nil, 0, provider.Permanentf("no such object")
			},
			class:  provider.ClassPermanent,
			errHas: "no such object",
		},
		{
			name: "body shorter than its size",
			fetch: func(context.Context, string) (io.ReadCloser, int64, error) {
				return body(b[:50_000]), int64(len(b)), nil
			},
			class:  provider.ClassTransient,
			errHas: "sent 50000 of 100000 bytes",
		},
		{
			// libvirt refuses bytes past the upload length.
			name:   "body longer than its size",
			fetch:  func(context.Context, string) (io.ReadCloser, int64, error) { return body(b), 50_000, nil },
			class:  provider.ClassTransient,
			errHas: "No space left",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.cache.Fetch = tc.fetch
			img := provider.Image{Name: "f", URL: "https://example.com/f.img", Checksum: checksumOf(b), Format: FormatRaw}
			_, err := e.ensure(img)
			if tc.errHas == "" {
				if err != nil {
					t.Fatal(err)
				}
				e.assertCached(img, b)
				return
			}
			if provider.Class(err) != tc.class || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("err = %v (%s), want %s mentioning %q", err, provider.Class(err), tc.class, tc.errHas)
			}
			e.assertEmpty()
		})
	}
}

// leakyHost models go-libvirt when the daemon fails an upload: the call
// returns while its sender goroutine may still be blocked reading the body.
type leakyHost struct {
	*fakeHost
	readerDone chan struct{}
}

func (h *leakyHost) StorageVolUpload(_ libvirt.StorageVol, body io.Reader, _, _ uint64, _ libvirt.StorageVolUploadFlags) error {
	buf := make([]byte, 4096)
	_, _ = body.Read(buf)
	go func() {
		defer close(h.readerDone)
		for {
			if _, err := body.Read(buf); err != nil {
				return
			}
		}
	}()
	return virt.NewError(libvirt.ErrOperationFailed, "operation failed: stream aborted by the daemon")
}

func TestEnsureUploadFailsWhileStillReading(t *testing.T) {
	e := newEnv(t)
	b := genBytes(20, 1<<20)
	url, _, release := e.srv.hold("/l", b, 64<<10)
	defer release()
	h := &leakyHost{fakeHost: e.host, readerDone: make(chan struct{})}
	var mu sync.Mutex
	calls := 0
	_, err := e.cache.Ensure(e.ctx, h, e.pool, provider.Image{Name: "l", URL: url, Checksum: checksumOf(b), Format: FormatRaw}, func(int64, int64) {
		mu.Lock()
		calls++
		mu.Unlock()
	})
	// libvirt's verdict, not the read error our own cancellation caused.
	if provider.Class(err) != provider.ClassTransient || !strings.Contains(err.Error(), "stream aborted by the daemon") {
		t.Fatalf("err = %v, want the daemon's transient error", err)
	}
	mu.Lock()
	atReturn := calls
	mu.Unlock()
	select {
	case <-h.readerDone: // Ensure's cleanup unblocked the stray read
	case <-time.After(5 * time.Second):
		t.Fatal("the stray reader is still blocked on the download")
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != atReturn {
		t.Errorf("progress called %d times after Ensure returned", calls-atReturn)
	}
	e.assertEmpty()
}

func TestURLCredentialsNeverReachErrorsOrLogs(t *testing.T) {
	good, other := genBytes(11, 64<<10), genBytes(12, 64<<10)
	withToken := func(u string) string {
		return strings.Replace(u, "http://", "http://ghp_t0ken:s3cret@", 1) + "?sig=s1gnature"
	}
	for name, url := range map[string]func(e *env) string{
		"http error":         func(e *env) string { return withToken(e.srv.status("/s", http.StatusForbidden)) },
		"connection refused": func(e *env) string { return withToken("http://127.0.0.1:1/x.img") },
		"checksum mismatch":  func(e *env) string { return withToken(e.srv.bytes("/m", other)) },
		"body cut":           func(e *env) string { return withToken(e.srv.cut("/cut", good, len(good)/2)) },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			var logs bytes.Buffer
			var mu sync.Mutex
			e.ctx = logr.NewContext(e.ctx, funcr.New(func(prefix, args string) {
				mu.Lock()
				defer mu.Unlock()
				logs.WriteString(prefix + args + "\n")
			}, funcr.Options{Verbosity: 2}))
			// No name: a Proxy's URL image is labelled by its URL.
			_, err := e.ensure(provider.Image{URL: url(e), Checksum: checksumOf(good), Format: FormatRaw})
			if err == nil {
				t.Fatal("Ensure succeeded")
			}
			mu.Lock()
			defer mu.Unlock()
			for _, secret := range []string{"ghp_t0ken", "s3cret", "s1gnature"} {
				if strings.Contains(err.Error(), secret) || strings.Contains(logs.String(), secret) {
					t.Errorf("%q leaked:\nerror: %v\nlogs:\n%s", secret, err, logs.String())
				}
			}
		})
	}
}

// streamHost reads the upload stream as go-libvirt does (one Read per
// stream message, into a buffer of 4 MiB less the header) and records each
// upload's message sizes before the fake stores the bytes.
type streamHost struct {
	*fakeHost
	uploads [][]int
}

func (h *streamHost) StorageVolUpload(v libvirt.StorageVol, body io.Reader, offset, length uint64, flags libvirt.StorageVolUploadFlags) error {
	var all bytes.Buffer
	buf := make([]byte, 4<<20-28)
	h.uploads = append(h.uploads, nil)
	messages := &h.uploads[len(h.uploads)-1]
	for {
		n, err := body.Read(buf)
		if n > 0 {
			*messages = append(*messages, n)
			all.Write(buf[:n])
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	return h.fakeHost.StorageVolUpload(v, &all, offset, length, flags)
}

// trickle hands out at most max bytes per Read, like an HTTP body on a
// slow link.
type trickle struct {
	r   io.Reader
	max int
}

func (t trickle) Read(p []byte) (int, error) { return t.r.Read(p[:min(len(p), t.max)]) }

// The upload is sent in libvirt stream messages of StreamChunk bytes (the
// last one shorter) whatever the source's reads are: a download that runs
// ahead must not make 4 MiB messages, which libvirtd takes several times
// slower, nor a slow one thousands of tiny ones.
func TestEnsureStreamsFullChunks(t *testing.T) {
	b := genBytes(21, 5*StreamChunk+12345)
	for _, tc := range []struct {
		name string
		body func() io.Reader
	}{
		{"source runs ahead", func() io.Reader { return bytes.NewReader(b) }},
		{"source trickles", func() io.Reader { return trickle{bytes.NewReader(b), 1000} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.cache.Fetch = func(context.Context, string) (io.ReadCloser, int64, error) {
				return io.NopCloser(tc.body()), int64(len(b)), nil
			}
			h := &streamHost{fakeHost: e.host}
			img := provider.Image{Name: "c", URL: "https://example.com/c.img", Checksum: checksumOf(b), Format: FormatRaw}
			var last int64
			if _, err := e.cache.Ensure(e.ctx, h, e.pool, img, func(done, _ int64) { last = done }); err != nil {
				t.Fatal(err)
			}
			e.assertCached(img, b)
			// The image's upload; the marker's content follows it.
			want := []int{StreamChunk, StreamChunk, StreamChunk, StreamChunk, StreamChunk, 12345}
			if got := h.uploads[0]; !slices.Equal(got, want) {
				t.Errorf("%d stream messages of %v bytes, want %v", len(got), got[:min(len(got), 8)], want)
			}
			if last != int64(len(b)) {
				t.Errorf("last progress %d, want %d", last, len(b))
			}
		})
	}
}
