package controllers

import (
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/image"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
)

// imageVolumes lists the image cache's volumes in h's pool.
func imageVolumes(h *testHost) []string {
	pool, err := h.fake.StoragePoolLookupByName(kvmtest.PoolName)
	Expect(err).NotTo(HaveOccurred())
	vols, _, err := h.fake.StoragePoolListAllVolumes(pool, 1, 0)
	Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, v := range vols {
		if strings.HasPrefix(v.Name, "image-") {
			out = append(out, v.Name)
		}
	}
	return out
}

var _ = Describe("image cache", func() {
	It("stores KVMImages of one digest once and deletes the volume only when no KVMImage names it and no VM disk uses it", func() {
		h := readyHost(uniqueName("hv"))
		// A size no other spec uses: its digest is this spec's alone.
		srv := kvmtest.NewImageServer("shared", 96<<10+7)
		DeferCleanup(srv.Close)
		names := []string{uniqueName("shared-a"), uniqueName("shared-b"), uniqueName("shared-c")}
		for _, n := range names {
			createImage(n, srv)
		}
		for _, n := range names {
			waitImageVerified(n, h.name, srv.Image.Checksum)
		}
		vol, err := image.VolumeName(srv.Image)
		Expect(err).NotTo(HaveOccurred())
		marker, _ := image.MarkerName(srv.Image)
		claim, _ := image.ClaimName(srv.Image, testInstallID)
		ours := func() []string {
			var out []string
			for _, v := range imageVolumes(h) {
				if v == vol || v == marker || v == claim || strings.Contains(v, "shared") {
					out = append(out, v)
				}
			}
			return out
		}
		Expect(ours()).To(ConsistOf(vol, marker, claim))
		for _, n := range names {
			ki := &crawlv1.KVMImage{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Name: n}, ki)).To(Succeed())
			Expect(ki.Status.HostStatus(h.name).Volume).To(Equal(vol))
			Expect(ki.Status.HostStatus(h.name).AllocatedBytes).To(BeNumerically(">=", len(srv.Body)))
			Expect(controllerutil.ContainsFinalizer(ki, KVMImageFinalizer)).To(BeTrue())
		}

		ns := newNamespace()
		readyProxy(h, ns, "p1", names[0], "192.0.2.41")
		for _, n := range names {
			Expect(k8sClient.Delete(ctx, &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: n}})).To(Succeed())
		}
		// The Proxy's overlay backs onto the volume: it stays, and the last
		// KVMImage to go is held by its finalizer until the volume is free.
		Consistently(func(g Gomega) {
			g.Expect(ours()).To(ConsistOf(vol, marker, claim))
			left := 0
			for _, n := range names {
				if k8sClient.Get(ctx, client.ObjectKey{Name: n}, &crawlv1.KVMImage{}) == nil {
					left++
				}
			}
			g.Expect(left).To(BeNumerically(">=", 1))
		}).WithTimeout(3 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

		deleteProxy(ns, "p1")
		waitProxyGone(ns, "p1", 20*time.Second)
		Eventually(func(g Gomega) {
			g.Expect(ours()).To(BeEmpty())
			for _, n := range names {
				err := k8sClient.Get(ctx, client.ObjectKey{Name: n}, &crawlv1.KVMImage{})
				g.Expect(client.IgnoreNotFound(err)).To(Succeed())
				g.Expect(err).To(HaveOccurred(), "KVMImage %s still exists", n)
			}
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	})

	// Fault 12: a second install (its own cluster and manager, the same
	// KVMImage name) caches the same image on the same host. Deleting this
	// install's KVMImage releases only this install's claim, at once: the
	// volume is the other install's too, and goes only when it lets go.
	It("never prunes a cached volume another install on the host still holds", func() {
		h := readyHost(uniqueName("hv"))
		srv := kvmtest.NewImageServer("two-installs", 96<<10+11)
		DeferCleanup(srv.Close)
		conns, hostSource := kvmtest.NewConns(), kvmtest.NewHosts(h.name)
		conns.Add(h.name, h.fake)
		const otherInstall = "other-install"
		other := kvm.New(kvm.Options{InstallID: otherInstall, Hosts: hostSource, Pool: conns})

		// The other install's KVMImage: the same name and spec.
		name := uniqueName("debian")
		img := kvm.ImageOf(&crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: crawlv1.KVMImageSpec{
			URL: srv.Image.URL, Checksum: srv.Image.Checksum, Format: crawlv1.ImageFormatRaw, Firmware: crawlv1.FirmwareUEFI}})
		_, err := other.EnsureImage(ctx, h.name, img, nil)
		Expect(err).NotTo(HaveOccurred())
		ki := createImage(name, srv)
		Expect(kvm.ImageOf(ki)).To(Equal(img))
		waitImageVerified(name, h.name, srv.Image.Checksum)
		// Hosts of other specs may be Ready too: count uploads to h only.
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, ki)).To(Succeed())
		Expect(ki.Status.HostStatus(h.name).Bytes).To(BeZero(), "uploaded to %s again: the installs share one cached volume", h.name)

		vol, _ := image.VolumeName(img)
		marker, _ := image.MarkerName(img)
		ours, _ := image.ClaimName(img, testInstallID)
		theirs, _ := image.ClaimName(img, otherInstall)
		Expect(imageVolumes(h)).To(ContainElements(vol, marker))

		Expect(k8sClient.Delete(ctx, ki)).To(Succeed())
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Name: name}, &crawlv1.KVMImage{})
		}).WithTimeout(20*time.Second).Should(MatchError(ContainSubstring("not found")), "the deletion waited for the other install")
		Expect(imageVolumes(h)).To(ContainElements(vol, marker), "this install's prune deleted what the other install holds")
		Expect(imageVolumes(h)).To(ContainElement(theirs))
		Expect(imageVolumes(h)).NotTo(ContainElement(ours))
		// The other install still boots from it without downloading again.
		got, err := other.EnsureImage(ctx, h.name, img, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(got.Volume).To(Equal(vol))
		Expect(got.Bytes).To(BeZero(), "downloaded again")

		// Its last holder lets go: now it goes.
		_, err = other.PruneImages(ctx, h.name, func(string) bool { return false })
		Expect(err).NotTo(HaveOccurred())
		Expect(imageVolumes(h)).NotTo(ContainElements(vol, marker, theirs))
	})

	It("keeps spec.retain checksums and prunes a superseded one once no VM disk uses it", func() {
		h := readyHost(uniqueName("hv"))
		var srvs []*kvmtest.ImageServer
		for i, size := range []int{100<<10 + 3, 100<<10 + 5, 100<<10 + 9} {
			srv := kvmtest.NewImageServer(fmt.Sprintf("r%d", i), size)
			DeferCleanup(srv.Close)
			srvs = append(srvs, srv)
		}
		volOf := func(srv *kvmtest.ImageServer) string { v, _ := image.VolumeName(srv.Image); return v }
		present := func(srv *kvmtest.ImageServer) bool { return slices.Contains(imageVolumes(h), volOf(srv)) }
		name := uniqueName("rotating")
		ki := createImage(name, srvs[0])
		waitImageVerified(name, h.name, srvs[0].Image.Checksum)
		ns := newNamespace()
		readyProxy(h, ns, "old", name, "192.0.2.42") // boots from the first checksum

		setChecksum := func(srv *kvmtest.ImageServer, retain int32) {
			Eventually(func() error {
				if err := k8sClient.Get(ctx, client.ObjectKey{Name: name}, ki); err != nil {
					return err
				}
				orig := ki.DeepCopy()
				ki.Spec.URL, ki.Spec.Checksum, ki.Spec.Retain = srv.Image.URL, srv.Image.Checksum, retain
				return k8sClient.Patch(ctx, ki, client.MergeFrom(orig))
			}).Should(Succeed())
			waitImageVerified(name, h.name, srv.Image.Checksum)
		}
		setChecksum(srvs[1], 1)
		// Superseded, but the Proxy's overlay uses it.
		Consistently(func() bool { return present(srvs[0]) }).WithTimeout(2 * time.Second).Should(BeTrue())
		deleteProxy(ns, "old")
		waitProxyGone(ns, "old", 20*time.Second)
		// Freed: the next pass (due at once on the next checksum change)
		// prunes it; retain 2 keeps the second.
		setChecksum(srvs[2], 2)
		Eventually(func() bool { return present(srvs[0]) }).WithTimeout(20 * time.Second).Should(BeFalse())
		Expect(present(srvs[1])).To(BeTrue(), "retained checksum pruned")
		Expect(present(srvs[2])).To(BeTrue())
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, ki)).To(Succeed())
		Expect(ki.Status.Checksums).To(Equal([]string{srvs[2].Image.Checksum, srvs[1].Image.Checksum}))
	})
})
