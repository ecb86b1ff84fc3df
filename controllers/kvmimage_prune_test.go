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
		ours := func() []string {
			var out []string
			for _, v := range imageVolumes(h) {
				if v == vol || v == marker || strings.Contains(v, "shared") {
					out = append(out, v)
				}
			}
			return out
		}
		Expect(ours()).To(ConsistOf(vol, marker))
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
			g.Expect(ours()).To(ConsistOf(vol, marker))
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
