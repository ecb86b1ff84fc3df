package controllers

import (
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
})
