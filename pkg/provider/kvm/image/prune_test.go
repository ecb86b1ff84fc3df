package image

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

func keepNone(string) bool { return false }

func keepDigests(checksums ...string) func(string) bool {
	return func(d string) bool {
		for _, c := range checksums {
			if got, _ := ParseChecksum(c); got == d {
				return true
			}
		}
		return false
	}
}

// overlay creates a qcow2 volume backed by backing (a path or a bare name).
func overlay(e *env, name, backing string) {
	e.t.Helper()
	xml := "<volume><name>" + name + "</name><target><format type='qcow2'/></target><backingStore><path>" + backing + "</path></backingStore></volume>"
	if _, err := e.host.StorageVolCreateXML(e.pool, xml, 0); err != nil {
		e.t.Fatal(err)
	}
}

// legacyCopy stores img the way builds before the shared cache did; a
// nil marker leaves it unverified.
func legacyCopy(e *env, img provider.Image, content []byte, marker bool) string {
	e.t.Helper()
	n, err := namesOf(img)
	if err != nil {
		e.t.Fatal(err)
	}
	createWith(e, n.legacyVolume, content)
	if marker {
		createWith(e, n.legacyMarker, []byte("x"))
	}
	return n.legacyVolume
}

// Every KVMImage and direct URL with one digest shares one volume: one
// download, one marker.
func TestEnsureSharesOneVolumePerDigest(t *testing.T) {
	e := newEnv(t)
	q := qcow2Image(21, 1<<20, 1<<30)
	url := e.srv.bytes("/deb.qcow2", q)
	var vols []string
	for _, img := range []provider.Image{
		{Name: "deb-a", URL: url, Checksum: checksumOf(q), Format: FormatQCOW2},
		{Name: "deb-b", URL: url, Checksum: checksumOf(q), Format: FormatQCOW2},
		{URL: url, Checksum: checksumOf(q), Format: FormatQCOW2},
	} {
		res, err := e.ensure(img)
		if err != nil {
			t.Fatal(err)
		}
		vols = append(vols, res.VolumeName)
	}
	if vols[0] != vols[1] || vols[1] != vols[2] {
		t.Errorf("volumes = %v, want one shared", vols)
	}
	if n := e.srv.requests("/deb.qcow2"); n != 1 {
		t.Errorf("downloaded %d times, want 1", n)
	}
	if got := e.volumes(); len(got) != 3 {
		t.Errorf("pool holds %v, want the image, its marker and the claim", got)
	}
}

// Upgrade: a copy cached by an earlier build serves Lookup only when its
// full-digest marker vouches for it; Ensure re-caches under the shared name.
func TestLookupServesVerifiedLegacyCopyOnly(t *testing.T) {
	raw := genBytes(22, 1<<20)
	for _, tc := range []struct {
		name   string
		marker bool
		wantOK bool
	}{
		{name: "verified legacy copy", marker: true, wantOK: true},
		{name: "unverified legacy copy", marker: false, wantOK: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			img := provider.Image{Name: "deb", URL: e.srv.bytes("/deb", raw), Checksum: checksumOf(raw), Format: FormatRaw}
			legacy := legacyCopy(e, img, raw, tc.marker)
			res, ok, err := e.cache.Lookup(e.host, e.pool, img)
			if err != nil || ok != tc.wantOK || ok && res.VolumeName != legacy {
				t.Fatalf("Lookup = %+v, %v, %v; want ok=%v on %s", res, ok, err, tc.wantOK, legacy)
			}
			res, err = e.ensure(img)
			if err != nil || res.Cached || res.VolumeName == legacy {
				t.Fatalf("Ensure = %+v, %v; want a fresh shared copy", res, err)
			}
			e.assertCached(img, raw)
			if got, ok, _ := e.cache.Lookup(e.host, e.pool, img); !ok || got.VolumeName != res.VolumeName {
				t.Errorf("Lookup after re-cache = %+v, %v; want the shared copy %s", got, ok, res.VolumeName)
			}
		})
	}
}

func TestPrune(t *testing.T) {
	e := newEnv(t)
	content := func(seed uint64) []byte { return genBytes(seed, 64<<10) }
	img := func(name string, b []byte) provider.Image {
		return provider.Image{Name: name, URL: e.srv.bytes("/"+name+checksumOf(b), b), Checksum: checksumOf(b), Format: FormatRaw}
	}
	kept, unused, backing, relative := img("kept", content(1)), img("unused", content(2)), img("backing", content(3)), img("relative", content(4))
	for _, i := range []provider.Image{kept, unused, backing, relative} {
		if _, err := e.ensure(i); err != nil {
			t.Fatal(err)
		}
	}
	sharedVol := func(i provider.Image) string { v, _ := e.names(i); return v }
	overlay(e, "proxy-1-disk.qcow2", fake.PoolDir+"/"+poolName+"/"+sharedVol(backing))
	overlay(e, "proxy-2-disk.qcow2", sharedVol(relative))
	// Cached before claims, so whose they are is unknown: legacy copies (of
	// a digest with a shared copy, of a kept digest without one, unverified,
	// in use) and a shared copy nobody claims. None is this install's to
	// delete, wanted or not.
	legacyCopy(e, img("kept", content(1)), content(1), true)
	legacyCopy(e, img("old", content(5)), content(5), true)
	legacyCopy(e, img("half", content(6)), content(6), false)
	legacyInUse := legacyCopy(e, img("booted", content(7)), content(7), true)
	overlay(e, "proxy-3-disk.qcow2", fake.PoolDir+"/"+poolName+"/"+legacyInUse)
	unclaimed := img("unclaimed", content(8))
	unclaimedVol, unclaimedMarker := e.names(unclaimed)
	createWith(e, unclaimedVol, content(8))
	createWith(e, unclaimedMarker, []byte("x"))
	// Bystanders: look-alikes and foreign volumes.
	for _, n := range []string{"image-deb-notahexdigest.qcow2", "proxy-1234-disk.qcow2", "image-deb-0123456789ab.vmdk", "image-deb.qcow2", "image-sha256_xyz.raw",
		sharedVol(kept) + ".held-by-Not_An_Install", sharedVol(kept) + ".held-by-"} {
		createWith(e, n, []byte("x"))
	}
	before := e.volumes()

	res, err := e.cache.Prune(e.ctx, e.host, e.pool, keepDigests(kept.Checksum, img("old", content(5)).Checksum))
	if err != nil {
		t.Fatal(err)
	}
	deleted := res.Deleted
	digest := func(i provider.Image) string { d, _ := ParseChecksum(i.Checksum); return d }
	if want := []string{digest(backing), digest(relative)}; !slices.Equal(slices.Sorted(slices.Values(res.InUse)), slices.Sorted(slices.Values(want))) {
		t.Errorf("Prune left in use %v, want %v", res.InUse, want)
	}
	_, unusedMarker := e.names(unused)
	// Marker, volume, claim: in that order.
	if want := []string{unusedMarker, sharedVol(unused), e.claim(unused)}; !slices.Equal(deleted, want) {
		t.Errorf("Prune deleted %v\nwant %v", deleted, want)
	}
	if got, want := e.volumes(), slices.DeleteFunc(before, func(v string) bool { return slices.Contains(deleted, v) }); !slices.Equal(got, want) {
		t.Errorf("after Prune pool = %v\nwant %v", got, want)
	}
	if res, err := e.ensure(kept); err != nil || !res.Cached {
		t.Errorf("Ensure of the kept image after Prune = %+v, %v; want cached", res, err)
	}
	// A copy cached before claims keeps working, without a download and
	// without being claimed.
	if res, ok, err := e.cache.Lookup(e.host, e.pool, unclaimed); err != nil || !ok || res.VolumeName != unclaimedVol {
		t.Errorf("Lookup of the unclaimed copy = %+v, %v, %v; want it served", res, ok, err)
	}
	if n := e.srv.requests("/unclaimed" + unclaimed.Checksum); n != 0 {
		t.Errorf("unclaimed image downloaded %d times, want 0", n)
	}
	if _, ok := e.host.Volume(poolName, e.claim(unclaimed)); ok {
		t.Errorf("Lookup claimed a copy cached before claims")
	}
}

// onDelete runs after each volume deletion: another install acting between
// two steps of a prune.
type onDelete struct {
	virt.Client
	after func(name string)
}

func (d onDelete) StorageVolDelete(v libvirt.StorageVol, flags libvirt.StorageVolDeleteFlags) error {
	err := d.Client.StorageVolDelete(v, flags)
	d.after(v.Name)
	return err
}

// Installs sharing a pool: a prune gives up only this install's claim and
// deletes an image only when no other install holds it, even one that
// claims it while the prune runs; the other install then still gets its
// image, without downloading it again when it already uses it.
func TestPruneHonoursOtherInstallsClaims(t *testing.T) {
	b := genBytes(30, 64<<10)
	for _, tc := range []struct {
		name string
		// otherBefore: the other install uses the image before the prune.
		otherBefore bool
		// raceMarker: what the other install does right when the prune
		// has deleted the marker.
		raceMarker func(e *env, other *Cache, img provider.Image)
		wantImage  bool
		wantMarker bool
		// wantDownloads by the other install, during and after the prune.
		wantDownloads int
	}{
		{name: "held by another install", otherBefore: true, wantImage: true, wantMarker: true},
		{name: "held by nobody else", wantDownloads: 1},
		{name: "claimed once the marker is gone: the claimer caches it again",
			raceMarker: func(e *env, other *Cache, img provider.Image) {
				if _, err := other.Ensure(e.ctx, e.host, e.pool, img, nil); err != nil {
					t.Fatal(err)
				}
			},
			wantImage: true, wantMarker: true, wantDownloads: 1},
		{name: "claimed and used just before the marker went: marked again, not fetched",
			raceMarker: func(e *env, other *Cache, img provider.Image) {
				vol, _ := e.names(img)
				createWith(e, claimName(vol, other.Holder), nil)
				overlay(e, "proxy-a-disk.qcow2", fake.PoolDir+"/"+poolName+"/"+vol)
			},
			wantImage: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.cache.Holder = "install-b"
			other := &Cache{Holder: "install-a"}
			img := provider.Image{Name: "debian", URL: e.srv.bytes("/debian", b), Checksum: checksumOf(b), Format: FormatRaw}
			vol, marker := e.names(img)
			if _, err := e.ensure(img); err != nil {
				t.Fatal(err)
			}
			if tc.otherBefore {
				if _, err := other.Ensure(e.ctx, e.host, e.pool, img, nil); err != nil {
					t.Fatal(err)
				}
			}
			var lv virt.Client = e.host
			if tc.raceMarker != nil {
				lv = onDelete{Client: e.host, after: func(name string) {
					if name == marker {
						tc.raceMarker(e, other, img)
					}
				}}
			}
			downloads := e.srv.requests("/debian")
			res, err := e.cache.Prune(e.ctx, lv, e.pool, keepNone)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := e.host.Volume(poolName, e.claim(img)); ok {
				t.Errorf("this install's claim survived its prune (deleted %v)", res.Deleted)
			}
			if _, ok := e.host.Volume(poolName, vol); ok != tc.wantImage {
				t.Errorf("image volume present = %v, want %v (deleted %v)", ok, tc.wantImage, res.Deleted)
			}
			if _, ok := e.host.Volume(poolName, marker); ok != tc.wantMarker {
				t.Errorf("marker present = %v, want %v (deleted %v)", ok, tc.wantMarker, res.Deleted)
			}
			// The other install gets a verified image either way.
			got, err := other.Ensure(e.ctx, e.host, e.pool, img, nil)
			if err != nil {
				t.Fatal(err)
			}
			e.assertCached(img, b)
			if _, ok := e.host.Volume(poolName, claimName(vol, "install-a")); !ok || got.VolumeName != vol {
				t.Errorf("other install's Ensure = %+v; want %s, claimed by it", got, vol)
			}
			if n := e.srv.requests("/debian") - downloads; n != tc.wantDownloads {
				t.Errorf("other install downloaded %d times, want %d", n, tc.wantDownloads)
			}
		})
	}
}

// An overlay whose XML cannot be read might be the one using an image:
// nothing is deleted.
func TestPruneDeletesNothingItCannotProveUnused(t *testing.T) {
	e := newEnv(t)
	b := genBytes(8, 64<<10)
	if _, err := e.ensure(provider.Image{Name: "x", URL: e.srv.bytes("/x", b), Checksum: checksumOf(b), Format: FormatRaw}); err != nil {
		t.Fatal(err)
	}
	before := e.volumes()
	e.host.FailNext(virt.RPCStorageVolGetXMLDesc, virt.NewError(libvirt.ErrInternalError, "boom"))
	res, err := e.cache.Prune(e.ctx, e.host, e.pool, keepNone)
	if err == nil || provider.Class(err) != provider.ClassTransient || len(res.Deleted) != 0 {
		t.Errorf("Prune = %+v, %v; want a transient error and nothing deleted", res, err)
	}
	if got := e.volumes(); !slices.Equal(got, before) {
		t.Errorf("pool = %v, want %v", got, before)
	}
}

// An unverified volume another install holds may be its upload in
// progress: only the first claimant (lowest holder name) replaces it, so
// two installs caching one image at once never delete each other's
// uploads in turn, and an interrupted upload is still replaced by someone.
func TestEnsureReplacesAnUnverifiedSharedVolumeOnlyAsFirstClaimant(t *testing.T) {
	b := genBytes(31, 64<<10)
	for _, tc := range []struct {
		holder, uploader string
		wantWait         bool
	}{
		{holder: "install-b", uploader: "install-a", wantWait: true},
		{holder: "install-a", uploader: "install-b"},
		{holder: "", uploader: "install-a"}, // "_" sorts first
	} {
		t.Run(tc.holder+" finds "+tc.uploader+"'s upload", func(t *testing.T) {
			e := newEnv(t)
			e.cache.Holder = tc.holder
			img := provider.Image{Name: "debian", URL: e.srv.bytes("/debian", b), Checksum: checksumOf(b), Format: FormatRaw}
			vol, _ := e.names(img)
			createWith(e, claimName(vol, tc.uploader), nil)
			createWith(e, vol, b[:100]) // half uploaded
			_, err := e.ensure(img)
			if tc.wantWait {
				if provider.Class(err) != provider.ClassTransient || !strings.Contains(err.Error(), tc.uploader) {
					t.Fatalf("Ensure = %v; want a transient error naming %s", err, tc.uploader)
				}
				if _, size, ok := e.host.volumeSHA256(poolName, vol); !ok || size != 100 {
					t.Fatalf("the other install's upload was replaced")
				}
				// The waiting install takes its claim back; the uploader's
				// stays with its upload.
				if got, want := e.volumes(), []string{vol, claimName(vol, tc.uploader)}; !slices.Equal(got, want) {
					t.Errorf("volumes = %v, want %v", got, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			e.assertCached(img, b)
		})
	}
}

// groupCached is what Prune decides on: each image of ours with its marker,
// this install's claim and the other holders, whatever order the pool
// lists them in; volumes not of ours are no image.
func TestGroupCached(t *testing.T) {
	const a = "0000000000000000000000000000000000000000000000000000000000000000"
	const b = "1111111111111111111111111111111111111111111111111111111111111111"
	volA, volB := "image-sha256_"+a+".qcow2", "image-sha256_"+b+".raw"
	legacy := "image-deb-" + b[:12] + ".raw"
	type want struct {
		name, vol, claim, digest string
		markers, others          []string
	}
	for _, tc := range []struct {
		name string
		vols []string
		want []want
	}{
		{"nothing of ours", []string{"proxy-x-disk.qcow2", "image-deb.raw"}, nil},
		{
			"image, marker and claims",
			[]string{volA, volA + ".sha256", claimName(volA, "me"), claimName(volA, "other"), claimName(volA, "")},
			[]want{{name: volA, vol: volA, claim: claimName(volA, "me"), digest: a, markers: []string{volA + ".sha256"}, others: []string{"other", noInstall}}},
		},
		{
			"claim and marker listed before the image; images in the order first seen",
			[]string{claimName(volB, "me"), volA + ".sha256", volB, volA},
			[]want{
				{name: volB, vol: volB, claim: claimName(volB, "me"), digest: b},
				{name: volA, vol: volA, digest: a, markers: []string{volA + ".sha256"}},
			},
		},
		{
			"legacy image has its digest from its marker",
			[]string{legacy, legacy + "." + b + ".sha256"},
			[]want{{name: legacy, vol: legacy, digest: b, markers: []string{legacy + "." + b + ".sha256"}}},
		},
		{
			"marker and claims without their image",
			[]string{volA + ".sha256", claimName(volA, "other")},
			[]want{{name: volA, digest: a, markers: []string{volA + ".sha256"}, others: []string{"other"}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vols []libvirt.StorageVol
			for _, n := range tc.vols {
				vols = append(vols, libvirt.StorageVol{Name: n, Pool: "default"})
			}
			var got []want
			for _, ci := range groupCached(vols, holderName("me")) {
				w := want{name: ci.name, digest: ci.digest, others: ci.others}
				if ci.vol != nil {
					w.vol = ci.vol.Name
				}
				if ci.claim != nil {
					w.claim = ci.claim.Name
				}
				for _, m := range ci.markers {
					w.markers = append(w.markers, m.Name)
				}
				got = append(got, w)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("groupCached =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}
