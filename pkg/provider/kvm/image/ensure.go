package image

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// DefaultStallTimeout is Cache.StallTimeout when unset.
const DefaultStallTimeout = 2 * time.Minute

// Result describes the cached image.
type Result struct {
	// VolumeName is the image volume in the pool.
	VolumeName string
	// Path is the volume's path on the host, for backing stores.
	Path string
	// Bytes is how many bytes this call uploaded; 0 when Cached.
	Bytes int64
	// Checksum is the verified "sha256:<hex>", lower case.
	Checksum string
	// Cached is true when the verified volume was already there.
	Cached bool
}

// Cache downloads images into storage pools. The zero value is ready to use
// and safe for concurrent use; use one Cache per process (it is what keeps
// two reconciles from uploading the same volume at once) and do not copy it.
type Cache struct {
	// HTTPClient fetches images when Fetch is nil. Default: a shared client
	// without an overall timeout (see Fetcher).
	HTTPClient *http.Client
	// Fetch, when set, replaces HTTP fetching (tests, other transports).
	Fetch Fetcher
	// Now is the clock for progress pacing and timing logs. Default time.Now.
	Now func() time.Time
	// StallTimeout aborts a download when the source sends nothing for this
	// long; the error is transient. Zero means DefaultStallTimeout, negative
	// disables it.
	StallTimeout time.Duration
	// ProgressInterval is the least time between two progress calls (the
	// final call is always made). Zero reports every read.
	ProgressInterval time.Duration
	// Holder is the operator install this Cache caches for (its install
	// id; empty for an install without one). Its claim on a shared volume
	// (see the naming notes) keeps other installs' Prune from deleting it.
	Holder string

	mu       sync.Mutex
	inflight map[uploadKey]chan struct{} // closed when the upload ends
}

// uploadKey names one volume on one host: pool UUIDs are random per pool,
// so they tell hosts apart where pool names ("default") do not.
type uploadKey struct {
	pool   libvirt.UUID
	name   string
	volume string
}

// spec is an image request, checked.
type spec struct {
	img    provider.Image
	digest string
	names
}

func newSpec(img provider.Image) (spec, error) {
	digest, err := ParseChecksum(img.Checksum)
	if err != nil {
		return spec{}, err
	}
	if err := checkURL(img.URL); err != nil {
		return spec{}, err
	}
	n, err := newNames(img, digest)
	if err != nil {
		return spec{}, err
	}
	return spec{img: img, digest: digest, names: n}, nil
}

func (s spec) checksum() string { return Algorithm + ":" + s.digest }

// label names the image in logs and errors.
func (s spec) label() string {
	if s.img.Name != "" {
		return s.img.Name
	}
	return provider.RedactURL(s.img.URL)
}

// Ensure makes a verified copy of img exist in pool, claimed by c.Holder,
// and returns it.
//
// When the image volume and its marker both exist and the claim does too it
// returns at once, after four RPCs (three lookups and the path); a volume
// another install holds is claimed first, and one cached before claims
// existed is served unclaimed. Otherwise it opens the source, claims the
// image, deletes whatever unverified volume or orphaned marker holds the
// names, uploads the image and verifies it; an unverified volume that backs
// an overlay is marked again instead (see remark). A failed attempt leaves
// nothing behind: its partial volume is deleted and its claim taken back
// (see unclaimFailed).
// progress, if not nil, is called with the bytes uploaded so far and the
// total (-1 when unknown), from the goroutine streaming the
// upload; it must return quickly.
//
// Errors are classified: a wrong URL, checksum mismatch, unusable image or
// missing pool are permanent; network, server and most libvirt trouble are
// transient, as is "upload in progress" when another call is already
// uploading the same volume.
func (c *Cache) Ensure(ctx context.Context, lv virt.Client, pool libvirt.StoragePool, img provider.Image, progress func(done, total int64)) (_ Result, err error) {
	s, err := newSpec(img)
	if err != nil {
		return Result{}, err
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("image", s.label(), "pool", pool.Name, "volume", s.volume)

	st, err := c.lookupHeld(lv, pool, s)
	if err != nil {
		return Result{}, err
	}
	if st.ready() {
		return cached(lv, pool, s, st)
	}

	release, ok := c.acquire(pool, s.volume)
	if !ok {
		return Result{}, provider.Transientf("image %s: upload of volume %s to pool %s is in progress", s.label(), s.volume, pool.Name)
	}
	defer release()
	// Runs before release: the slot still keeps this process's other
	// callers away from the names.
	defer func() {
		if err != nil {
			c.unclaimFailed(log, lv, pool, s)
		}
	}()
	// A call that held the slot may have finished since the lookup; its
	// fresh volume must not be taken for a stale one.
	if st, err = c.lookupHeld(lv, pool, s); err != nil {
		return Result{}, err
	}
	if st.ready() {
		return cached(lv, pool, s, st)
	}
	if st.vol != nil && st.marker == nil {
		if res, ok, err := c.remark(log, lv, pool, s, *st.vol); err != nil || ok {
			return res, err
		}
	}
	return c.fetch(ctx, log, lv, pool, s, progress)
}

// unclaimFailed takes back c.Holder's claim after an attempt that failed
// without a verified image, so a pool that keeps refusing the image (full,
// say) holds nothing of it between attempts. The claim only ever protected
// that attempt's upload; a volume another install is uploading has its own
// claim. When the image is verified after all (the failure came later) or
// the pool cannot be read, the claim stays: the next attempt or Prune
// settles it.
func (c *Cache) unclaimFailed(log logr.Logger, lv virt.Client, pool libvirt.StoragePool, s spec) {
	st, err := lookup(lv, pool, s)
	if err != nil || st.ready() {
		return
	}
	claim, err := find(lv, pool, claimName(s.volume, c.Holder))
	if err != nil || claim == nil {
		return
	}
	if err := deleteVolume(lv, *claim); err != nil {
		log.Error(err, "Taking back the claim of a failed upload failed; Prune or the next attempt removes it", "claim", claim.Name)
	}
}

// remark makes the marker of an image volume that lost it but backs an
// overlay: overlays are only made on verified images, so it lost its marker
// to another install's prune racing with this one's use (see Prune), and
// deleting it would break the overlay. ok is false when no overlay uses it.
func (c *Cache) remark(log logr.Logger, lv virt.Client, pool libvirt.StoragePool, s spec, vol libvirt.StorageVol) (res Result, ok bool, err error) {
	if err := c.claim(lv, pool, s); err != nil {
		return Result{}, false, err
	}
	inUse, err := backsOverlay(lv, pool, vol)
	if err != nil || !inUse {
		return Result{}, false, err
	}
	log.Info("Image volume without marker backs an overlay, so it was verified; marking it again")
	if err := commit(log, lv, pool, s); err != nil {
		return Result{}, false, err
	}
	res, err = cached(lv, pool, s, state{vol: &vol})
	return res, err == nil, err
}

// lookupHeld is lookup for a caller that is about to use the image: a
// verified shared volume is claimed for c.Holder unless it already is, or
// unless it has no claim at all (cached before claims existed: served as
// it is, never claimed, never pruned). The claim comes before the volume
// is looked up again, for the reason Ensure gives.
func (c *Cache) lookupHeld(lv virt.Client, pool libvirt.StoragePool, s spec) (state, error) {
	claim := claimName(s.volume, c.Holder)
	held, err := find(lv, pool, claim)
	if err != nil {
		return state{}, err
	}
	st, err := lookup(lv, pool, s)
	if err != nil || held != nil || !st.ready() {
		return st, err
	}
	holders, err := claimsOf(lv, pool, s.volume)
	if err != nil || len(holders) == 0 {
		return st, err
	}
	if err := c.claim(lv, pool, s); err != nil {
		return state{}, err
	}
	return lookup(lv, pool, s)
}

// claim creates c.Holder's claim on s's shared volume; one that exists is
// fine.
func (c *Cache) claim(lv virt.Client, pool libvirt.StoragePool, s spec) error {
	name := claimName(s.volume, c.Holder)
	xml, err := volumeXML(name, FormatRaw, 0)
	if err != nil {
		return provider.Permanentf("image %s: building claim XML: %w", s.label(), err)
	}
	if _, err := lv.StorageVolCreateXML(pool, xml, 0); err != nil && !virt.IsCode(err, libvirt.ErrStorageVolExist) {
		return virtError("creating claim", name, pool, err)
	}
	return nil
}

// claimsOf lists the installs that claim the shared volume vol.
func claimsOf(lv virt.Client, pool libvirt.StoragePool, vol string) ([]string, error) {
	vols, _, err := lv.StoragePoolListAllVolumes(pool, 1, 0)
	if err != nil {
		return nil, virtError("listing volumes of", "pool", pool, err)
	}
	var holders []string
	for _, v := range vols {
		if p, ok := parseName(v.Name); ok && p.holder != "" && p.image == vol {
			holders = append(holders, p.holder)
		}
	}
	return holders, nil
}

// backsOverlay reports whether a volume of pool names vol as its backing
// file.
func backsOverlay(lv virt.Client, pool libvirt.StoragePool, vol libvirt.StorageVol) (bool, error) {
	vols, _, err := lv.StoragePoolListAllVolumes(pool, 1, 0)
	if err != nil {
		return false, virtError("listing volumes of", "pool", pool, err)
	}
	backing, err := backingFiles(lv, pool, vols)
	if err != nil {
		return false, err
	}
	inUse, err := backing.uses(lv, vol)
	if err != nil {
		return false, virtError("getting path of volume", vol.Name, pool, err)
	}
	return inUse, nil
}

// Lookup returns the verified copy of img in pool if there is one, under the
// same commit rule as Ensure (the marker vouches for the volume) and claimed
// the same way: the shared volume, else a legacy one of img's name (see the
// naming notes); ok is false when the image still has to be uploaded. It takes no upload claim,
// so a caller can serve a cached image without queueing behind uploads.
func (c *Cache) Lookup(lv virt.Client, pool libvirt.StoragePool, img provider.Image) (res Result, ok bool, err error) {
	s, err := newSpec(img)
	if err != nil {
		return Result{}, false, err
	}
	st, err := c.lookupHeld(lv, pool, s)
	if err == nil && !st.ready() {
		// A copy cached by an earlier build, vouched for by its own
		// full-digest marker, boots while the shared one is made.
		s.volume, s.marker = s.legacyVolume, s.legacyMarker
		st, err = lookup(lv, pool, s)
	}
	if err != nil || !st.ready() {
		return Result{}, false, err
	}
	res, err = cached(lv, pool, s, st)
	return res, err == nil, err
}

// state is what the pool holds under an image's names.
type state struct {
	vol, marker *libvirt.StorageVol
}

func (st state) ready() bool { return st.vol != nil && st.marker != nil }

// lookup finds the image volume, then its marker. The order matters: a
// re-upload deletes the marker before it creates the volume, so a marker
// seen after the volume vouches for a volume that is complete.
func lookup(lv virt.Client, pool libvirt.StoragePool, s spec) (state, error) {
	vol, err := find(lv, pool, s.volume)
	if err != nil {
		return state{}, err
	}
	marker, err := find(lv, pool, s.marker)
	if err != nil {
		return state{}, err
	}
	return state{vol: vol, marker: marker}, nil
}

// find looks a volume up; nil when it does not exist.
func find(lv virt.Client, pool libvirt.StoragePool, name string) (*libvirt.StorageVol, error) {
	v, err := lv.StorageVolLookupByName(pool, name)
	switch {
	case err == nil:
		return &v, nil
	case virt.IsCode(err, libvirt.ErrNoStorageVol):
		return nil, nil
	default:
		return nil, virtError("looking up volume", name, pool, err)
	}
}

func cached(lv virt.Client, pool libvirt.StoragePool, s spec, st state) (Result, error) {
	path, err := lv.StorageVolGetPath(*st.vol)
	if err != nil {
		return Result{}, virtError("getting path of volume", s.volume, pool, err)
	}
	return Result{VolumeName: s.volume, Path: path, Checksum: s.checksum(), Cached: true}, nil
}

// acquire claims the upload of volume in pool for this process.
func (c *Cache) acquire(pool libvirt.StoragePool, volume string) (release func(), ok bool) {
	k := uploadKey{pool: pool.UUID, name: pool.Name, volume: volume}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, busy := c.inflight[k]; busy {
		return nil, false
	}
	if c.inflight == nil {
		c.inflight = make(map[uploadKey]chan struct{})
	}
	done := make(chan struct{})
	c.inflight[k] = done
	return func() {
		c.mu.Lock()
		delete(c.inflight, k)
		c.mu.Unlock()
		close(done)
	}, true
}

// Wait returns once no call of this Cache is uploading img's volume to
// pool, or when ctx ends. Images share volumes by digest, so a caller about
// to fetch one waits for the upload already under way instead of failing
// with "upload in progress" (and, in the KVM provider, before it takes an
// upload slot it would only hold waiting).
// waited says whether there was an upload to wait for.
func (c *Cache) Wait(ctx context.Context, pool libvirt.StoragePool, img provider.Image) (waited bool, err error) {
	vol, err := VolumeName(img)
	if err != nil {
		return false, err
	}
	c.mu.Lock()
	done, busy := c.inflight[uploadKey{pool: pool.UUID, name: pool.Name, volume: vol}]
	c.mu.Unlock()
	if !busy {
		return false, nil
	}
	select {
	case <-done:
		return true, nil
	case <-ctx.Done():
		return true, provider.Transient(fmt.Errorf("waiting for the upload of volume %s to pool %s: %w", vol, pool.Name, ctx.Err()))
	}
}

// busy reports whether this process is uploading volume in pool.
func (c *Cache) busy(pool libvirt.StoragePool, volume string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.inflight[uploadKey{pool: pool.UUID, name: pool.Name, volume: volume}]
	return ok
}

// fetch is the slow path; the caller holds the upload slot.
func (c *Cache) fetch(ctx context.Context, log logr.Logger, lv virt.Client, pool libvirt.StoragePool, s spec, progress func(done, total int64)) (Result, error) {
	start := c.now()

	// Open the source before touching the pool: a wrong URL costs nothing.
	src, capacity, err := c.openSniffed(ctx, s)
	if err != nil {
		return Result{}, err
	}
	defer src.close()

	// Claimed before the names are looked at again, so that another
	// install's Prune, which checks claims after deleting the marker, either
	// sees this claim or has already made the volume unusable.
	if err := c.claim(lv, pool, s); err != nil {
		return Result{}, err
	}
	st, err := lookup(lv, pool, s)
	if err != nil {
		return Result{}, err
	}
	if st.ready() {
		return cached(lv, pool, s, st)
	}
	if err := c.yieldToFirstClaimant(lv, pool, s, st); err != nil {
		return Result{}, err
	}
	if err := clearNames(log, lv, pool, s, st); err != nil {
		return Result{}, err
	}
	vol, err := createVolume(lv, pool, s, capacity)
	if err != nil {
		return Result{}, err
	}
	log.Info("Uploading image", "url", provider.RedactURL(s.img.URL), "bytes", src.size, "capacity", capacity)

	n, err := c.upload(ctx, lv, pool, s, src, vol, progress)
	if err == nil {
		err = commit(log, lv, pool, s)
	}
	if err != nil {
		discard(log, lv, vol)
		return Result{}, err
	}
	path, err := lv.StorageVolGetPath(vol)
	if err != nil {
		// Verified and marked: the next call takes the fast path.
		return Result{}, virtError("getting path of volume", s.volume, pool, err)
	}
	elapsed := c.now().Sub(start)
	log.Info("Image cached", "bytes", n, "elapsed", elapsed.Round(time.Millisecond).String(), "bytesPerSecond", rate(n, elapsed))
	return Result{VolumeName: s.volume, Path: path, Bytes: n, Checksum: s.checksum()}, nil
}

// openSniffed opens s's source and reads the image's virtual size from its
// head; the caller closes the source.
func (c *Cache) openSniffed(ctx context.Context, s spec) (*source, uint64, error) {
	src, err := c.open(ctx, s)
	if err != nil {
		return nil, 0, err
	}
	head, err := src.br.Peek(sniffLen)
	if err != nil && !errors.Is(err, io.EOF) {
		err = src.readError(ctx, s, err)
		src.close()
		return nil, 0, err
	}
	capacity, err := sniff(s.img.Format, head, src.size)
	if err != nil {
		src.close()
		return nil, 0, fmt.Errorf("image %s: %w", s.label(), err)
	}
	return src, capacity, nil
}

// yieldToFirstClaimant refuses to replace an unverified volume (an upload
// in progress or an interrupted one) that another install may be uploading
// right now: so that two installs do not delete each other's uploads in
// turn, only the first claimant (lowest holder name) replaces it and the
// others wait for it.
func (c *Cache) yieldToFirstClaimant(lv virt.Client, pool libvirt.StoragePool, s spec, st state) error {
	if st.vol == nil {
		return nil
	}
	holders, err := claimsOf(lv, pool, s.volume)
	if err != nil {
		return err
	}
	slices.Sort(holders)
	if len(holders) > 0 && holders[0] < holderName(c.Holder) {
		return provider.Transientf("image %s: volume %s in pool %s is not verified yet; install %s, which holds it too, replaces or completes it",
			s.label(), s.volume, pool.Name, holders[0])
	}
	return nil
}

// clearNames deletes what a previous attempt left under s's names. The
// marker goes first so no moment shows a marker next to a volume that is
// not complete.
func clearNames(log logr.Logger, lv virt.Client, pool libvirt.StoragePool, s spec, st state) error {
	if st.marker != nil {
		log.Info("Deleting marker whose image volume is missing")
		if err := deleteVolume(lv, *st.marker); err != nil {
			return virtError("deleting stale marker", s.marker, pool, err)
		}
	}
	if st.vol != nil {
		// Left by an interrupted or failed upload: it was never verified.
		log.Info("Deleting unverified image volume")
		if err := deleteVolume(lv, *st.vol); err != nil {
			return virtError("deleting unverified volume", s.volume, pool, err)
		}
	}
	return nil
}

// createVolume creates the empty image volume the upload fills.
func createVolume(lv virt.Client, pool libvirt.StoragePool, s spec, capacity uint64) (libvirt.StorageVol, error) {
	xml, err := volumeXML(s.volume, s.img.Format, capacity)
	if err != nil {
		return libvirt.StorageVol{}, provider.Permanentf("image %s: building volume XML: %w", s.label(), err)
	}
	vol, err := lv.StorageVolCreateXML(pool, xml, 0)
	if virt.IsCode(err, libvirt.ErrStorageVolExist) {
		// Someone outside this process created it since the lookup, so an
		// upload is under way; its outcome decides the next reconcile.
		return libvirt.StorageVol{}, provider.Transientf("image %s: volume %s in pool %s appeared meanwhile; upload in progress elsewhere", s.label(), s.volume, pool.Name)
	}
	if err != nil {
		return libvirt.StorageVol{}, virtError("creating volume", s.volume, pool, err)
	}
	return vol, nil
}

// upload streams src into vol and verifies what was sent: every byte the
// source announced, with s's digest. It returns the bytes sent; on an
// error the volume holds nothing usable.
func (c *Cache) upload(ctx context.Context, lv virt.Client, pool libvirt.StoragePool, s spec, src *source, vol libvirt.StorageVol, progress func(done, total int64)) (int64, error) {
	up := &uploadReader{
		src:      src,
		hash:     sha256.New(),
		total:    src.size,
		progress: progress,
		every:    c.ProgressInterval,
		now:      c.now,
	}
	// The length makes libvirt refuse a longer stream; 0 means "until EOF".
	upErr := lv.StorageVolUpload(vol, up, 0, uint64(max(src.size, 0)), 0)
	n, sum, readErr := up.finish()

	switch {
	case readErr != nil:
		return n, src.readError(ctx, s, readErr)
	case upErr != nil:
		return n, virtError("uploading to volume", s.volume, pool, upErr)
	case src.size >= 0 && n != src.size:
		return n, provider.Transientf("image %s: source sent %d of %d bytes", s.label(), n, src.size)
	case sum != s.digest:
		return n, provider.Permanentf("image %s: checksum mismatch: expected %s, got %s:%s (%d bytes from %s)",
			s.label(), s.checksum(), Algorithm, sum, n, provider.RedactURL(s.img.URL))
	}
	return n, nil
}

// volumeXML describes a new volume of capacity bytes, not preallocated.
//
// Why the capacity is what it is: upload writes the stream verbatim from
// offset 0, and libvirt checks it against the upload length, never against
// the declared capacity. Creating the volume only has to make a file libvirt
// knows about; for qcow2 that is a fresh qcow2 (qemu-img create) whose header
// and tables the upload overwrites. (A qcow2 image smaller than that fresh
// file, a few hundred KiB, would leave its tail behind, unreferenced by the
// uploaded header and so unused by qemu.) libvirt thus does not need the real
// virtual size to store the image. The capacity only decides what libvirt
// reports until it re-reads the file: on a pool refresh (attempted after each
// upload, skipped if a volume is being built in the pool just then) or, going
// by the declared format, on vol-info. We declare the virtual size from the
// image header so every view is right from creation on and overlays can be
// sized from it; the download size would understate it several times over.
// For raw the two are one: the Content-Length, or 0 when unknown (a
// directory pool's file grows as written).
func volumeXML(name, format string, capacity uint64) (string, error) {
	v := libvirtxml.StorageVolume{
		Name:       name,
		Capacity:   &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: capacity},
		Allocation: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: 0},
		Target:     &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: format}},
	}
	return v.Marshal()
}

// commit creates the marker for a verified image volume. Its creation is
// what counts; the content (a sha256sum line) is for people.
func commit(log logr.Logger, lv virt.Client, pool libvirt.StoragePool, s spec) error {
	content := s.digest + "  " + s.volume + "\n"
	xml, err := volumeXML(s.marker, FormatRaw, uint64(len(content)))
	if err != nil {
		return provider.Permanentf("image %s: building marker XML: %w", s.label(), err)
	}
	m, err := lv.StorageVolCreateXML(pool, xml, 0)
	if virt.IsCode(err, libvirt.ErrStorageVolExist) {
		// Another process verified the same digest under the same name.
		return nil
	}
	if err != nil {
		return virtError("creating marker", s.marker, pool, err)
	}
	if err := lv.StorageVolUpload(m, strings.NewReader(content), 0, uint64(len(content)), 0); err != nil {
		log.Error(err, "Writing marker content failed; the marker's name still records the digest", "marker", s.marker)
	}
	return nil
}

func deleteVolume(lv virt.Client, v libvirt.StorageVol) error {
	err := lv.StorageVolDelete(v, libvirt.StorageVolDeleteNormal)
	if virt.IsCode(err, libvirt.ErrNoStorageVol) {
		return nil
	}
	return err
}

// discard deletes a volume that failed verification or upload. Failing to
// is logged only: without a marker the volume is never used, and the next
// attempt deletes it.
func discard(log logr.Logger, lv virt.Client, v libvirt.StorageVol) {
	if err := deleteVolume(lv, v); err != nil {
		log.Error(err, "Deleting unverified image volume failed; the next attempt replaces it")
	}
}

// virtError classifies a libvirt failure. Only what cannot change by
// waiting is permanent: a missing pool, an unsupported operation, refused
// access, XML libvirt rejects. Everything else (connection trouble, a full
// pool, a busy volume) is worth retrying.
func virtError(op, name string, pool libvirt.StoragePool, err error) error {
	wrapped := fmt.Errorf("%s %s in pool %s: %w", op, name, pool.Name, err)
	switch {
	case virt.IsCode(err, libvirt.ErrNoStoragePool):
		return provider.Permanentf("storage pool %s not found: %w", pool.Name, err)
	case virt.IsCode(err, libvirt.ErrNoSupport, libvirt.ErrOperationUnsupported, libvirt.ErrArgumentUnsupported,
		libvirt.ErrInvalidArg, libvirt.ErrXMLError, libvirt.ErrXMLDetail, libvirt.ErrXMLInvalidSchema,
		libvirt.ErrOperationDenied, libvirt.ErrAccessDenied):
		return provider.Permanent(wrapped)
	default:
		return provider.Transient(wrapped)
	}
}

func (c *Cache) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Cache) fetcher() Fetcher {
	switch {
	case c.Fetch != nil:
		return c.Fetch
	case c.HTTPClient != nil:
		return httpFetcher(c.HTTPClient)
	default:
		return httpFetcher(defaultHTTPClient)
	}
}

func (c *Cache) stallTimeout() time.Duration {
	if c.StallTimeout == 0 {
		return DefaultStallTimeout
	}
	return c.StallTimeout
}

func rate(n int64, d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(float64(n) / d.Seconds())
}

// errStalled and errDone are the causes source cancels its fetch with.
var (
	errStalled = errors.New("source stalled")
	errDone    = errors.New("upload finished")
)

// source is an open download.
type source struct {
	body   io.ReadCloser
	size   int64
	br     *bufio.Reader
	ctx    context.Context
	cancel context.CancelCauseFunc
	stall  time.Duration
	timer  *time.Timer // nil when stall detection is off
	once   sync.Once
}

func (c *Cache) open(ctx context.Context, s spec) (*source, error) {
	fctx, cancel := context.WithCancelCause(ctx)
	body, size, err := c.fetcher()(fctx, s.img.URL)
	if err != nil {
		cancel(nil)
		if !provider.HasClass(err) {
			err = provider.Transient(err)
		}
		return nil, fmt.Errorf("image %s: %w", s.label(), err)
	}
	src := &source{body: body, size: size, ctx: fctx, cancel: cancel, stall: c.stallTimeout()}
	if src.stall > 0 {
		src.timer = time.AfterFunc(time.Hour, func() { cancel(errStalled) })
		src.timer.Stop()
	}
	src.br = bufio.NewReaderSize(watched{src}, 64<<10)
	return src, nil
}

// watched arms the stall timer for each read from the body, so only time
// spent waiting on the source counts, never time spent waiting on libvirt.
type watched struct{ s *source }

func (w watched) Read(p []byte) (int, error) {
	if w.s.timer != nil {
		w.s.timer.Reset(w.s.stall)
		defer w.s.timer.Stop()
	}
	return w.s.body.Read(p)
}

// close ends the download. Cancelling first unblocks a read still waiting
// on the network (go-libvirt may leave one running after a server-side
// error), which Close alone would wait for.
func (s *source) close() {
	s.once.Do(func() {
		s.cancel(errDone)
		_ = s.body.Close()
		if s.timer != nil {
			s.timer.Stop()
		}
	})
}

// readError classifies a failure reading the source. All are transient: the
// connection dropped, the source stalled, or ctx ended.
func (s *source) readError(ctx context.Context, sp spec, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("image %s: download interrupted: %w", sp.label(), context.Cause(ctx))
	case errors.Is(context.Cause(s.ctx), errStalled):
		return provider.Transientf("image %s: no data from %s for %s", sp.label(), provider.RedactURL(sp.img.URL), s.stall)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return provider.Transientf("image %s: download from %s ended early (expected %d bytes): %w", sp.label(), provider.RedactURL(sp.img.URL), s.size, err)
	default:
		return provider.Transientf("image %s: reading %s: %w", sp.label(), provider.RedactURL(sp.img.URL), err)
	}
}

// uploadReader is the stream handed to StorageVolUpload: it hashes and
// counts what passes and reports progress. go-libvirt reads it from its own
// goroutine and, when libvirt fails the upload, may still be reading after
// StorageVolUpload returned; the mutex and finish keep such a read from
// racing with, or reporting after, the result.
type uploadReader struct {
	src      *source
	hash     hash.Hash
	total    int64
	progress func(done, total int64)
	every    time.Duration
	now      func() time.Time

	mu       sync.Mutex
	n        int64
	err      error // first read error other than io.EOF
	finished bool
	last     time.Time // of the last progress call
	reported int64
}

var errFinished = errors.New("image upload stream already finished")

// StreamChunk is the most one Read of the upload stream returns, and so the
// largest libvirt stream message an upload sends: go-libvirt sends each Read
// as one message, up to 4 MiB. libvirtd takes a message of 4 MiB several
// times slower per byte than one of 1 MiB or less (docs/performance.md §1,
// measured on the test hypervisor); 256 KiB is what libvirt's own clients
// send (virStreamSendAll).
const StreamChunk = 256 << 10

// Read fills p up to StreamChunk bytes, reading the source as often as that
// takes: an HTTP body hands over whatever the socket holds (up to all of
// p when the download runs ahead, a few KiB on a slow link), and neither
// very large nor very small messages suit libvirtd. Each read of the source
// is accounted for (hash, count, progress) as it arrives.
func (u *uploadReader) Read(p []byte) (int, error) {
	p = p[:min(len(p), StreamChunk)]
	n := 0
	for n < len(p) {
		k, err := u.readSource(p[n:])
		n += k
		switch {
		case errors.Is(err, errFinished):
			return 0, err
		case err != nil:
			return n, err
		case k == 0:
			// A source returning nothing and no error: hand over what
			// there is rather than spin here.
			return n, nil
		}
	}
	return n, nil
}

// readSource is one read of the source.
func (u *uploadReader) readSource(p []byte) (int, error) {
	u.mu.Lock()
	finished, err := u.finished, u.err
	u.mu.Unlock()
	if finished {
		return 0, errFinished
	}
	if err != nil {
		return 0, err
	}
	// The lock is not held while waiting on the network, so finish never
	// waits for a read; it cancels the download instead.
	n, err := u.src.br.Read(p)

	u.mu.Lock()
	defer u.mu.Unlock()
	if u.finished {
		// The result is taken: these bytes and this error count for nothing.
		return 0, errFinished
	}
	if n > 0 {
		u.hash.Write(p[:n])
		u.n += int64(n)
		u.report(false)
	}
	switch {
	case err == io.EOF:
		u.report(true)
	case err != nil:
		u.err = err
	}
	return n, err
}

// report calls progress, at most every u.every unless final.
func (u *uploadReader) report(final bool) {
	if u.progress == nil || u.n == u.reported {
		return
	}
	if !final && u.every > 0 {
		now := u.now()
		if !u.last.IsZero() && now.Sub(u.last) < u.every {
			return
		}
		u.last = now
	}
	u.reported = u.n
	u.progress(u.n, u.total)
}

// finish takes the result, then stops the download. Reads still running
// (see uploadReader) end with errFinished and change nothing.
func (u *uploadReader) finish() (n int64, hexSum string, readErr error) {
	u.mu.Lock()
	u.finished = true
	n, hexSum, readErr = u.n, hex.EncodeToString(u.hash.Sum(nil)), u.err
	u.mu.Unlock()
	u.src.close()
	return n, hexSum, readErr
}
