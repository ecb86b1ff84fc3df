package v1alpha1

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

var _ = Describe("admission through the API server", func() {
	It("installs the CRDs", func() {
		for _, l := range []client.ObjectList{&crawlv1.KVMHostList{}, &crawlv1.KVMImageList{}, &crawlv1.ProxyList{}} {
			Expect(k8sClient.List(ctx, l)).To(Succeed())
		}
	})

	Context("KVMHost", func() {
		It("defaults the socket path, the SSH port and the derived timeout", func() {
			h := &crawlv1.KVMHost{
				ObjectMeta: metav1.ObjectMeta{Name: "hv-default"},
				Spec:       crawlv1.KVMHostSpec{Address: "hv1.lan", CheckInterval: &metav1.Duration{Duration: 12 * time.Second}},
			}
			Expect(k8sClient.Create(ctx, h)).To(Succeed())
			got := &crawlv1.KVMHost{}
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(h), got)).To(Succeed())
			Expect(got.Spec.SocketPath).To(Equal("/var/run/libvirt/libvirt-sock"))
			Expect(got.Spec.Address).To(Equal("hv1.lan:22"))
			Expect(got.Spec.CheckTimeout.Duration).To(Equal(12 * time.Second))
			Expect(got.Spec.StoragePool).To(Equal("default"))
		})

		It("rejects a timeout longer than the interval, naming the field", func() {
			h := &crawlv1.KVMHost{
				ObjectMeta: metav1.ObjectMeta{Name: "hv-bad-timeout"},
				Spec: crawlv1.KVMHostSpec{Address: "hv1:22",
					CheckInterval: &metav1.Duration{Duration: 10 * time.Second},
					CheckTimeout:  &metav1.Duration{Duration: 20 * time.Second}},
			}
			err := k8sClient.Create(ctx, h)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.checkTimeout"))
			Expect(err.Error()).To(ContainSubstring("must not exceed checkInterval (10s)"))
		})

		It("serves the status subresource without touching the spec", func() {
			h := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: "hv-status"}, Spec: crawlv1.KVMHostSpec{Address: "hv2"}}
			Expect(k8sClient.Create(ctx, h)).To(Succeed())
			now := metav1.Now()
			h.Status.LibvirtVersion = "9.0.0"
			h.Status.LastCheckTime = &now
			h.Status.Conditions = []metav1.Condition{{Type: crawlv1.ReadyCondition, Status: metav1.ConditionFalse,
				Reason: crawlv1.HostTCPUnreachableReason, Message: "dial tcp: refused", LastTransitionTime: now}}
			h.Spec.Address = "changed-through-status:22"
			Expect(k8sClient.Status().Update(ctx, h)).To(Succeed())
			got := &crawlv1.KVMHost{}
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(h), got)).To(Succeed())
			Expect(got.Status.LibvirtVersion).To(Equal("9.0.0"))
			Expect(got.Status.Conditions).To(HaveLen(1))
			Expect(got.Spec.Address).To(Equal("hv2:22"), "a status update must not change the spec")
		})
	})

	Context("KVMImage", func() {
		It("defaults firmware to uefi and format to qcow2", func() {
			img := &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: "debian"},
				Spec: crawlv1.KVMImageSpec{URL: "https://img.example/d.qcow2", Checksum: goodSum}}
			Expect(k8sClient.Create(ctx, img)).To(Succeed())
			Expect(img.Spec.Firmware).To(Equal(crawlv1.FirmwareUEFI))
			Expect(img.Spec.Format).To(Equal(crawlv1.ImageFormatQCOW2))
		})

		DescribeTable("rejects bad input with the field's name",
			func(spec crawlv1.KVMImageSpec, want string) {
				err := k8sClient.Create(ctx, &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{GenerateName: "bad-"}, Spec: spec})
				Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
				Expect(err.Error()).To(ContainSubstring(want))
			},
			Entry("ftp URL", crawlv1.KVMImageSpec{URL: "ftp://x/y", Checksum: goodSum}, "spec.url"),
			Entry("checksum syntax", crawlv1.KVMImageSpec{URL: "https://x/y", Checksum: "sha1:abc"}, "spec.checksum"),
			Entry("firmware enum", crawlv1.KVMImageSpec{URL: "https://x/y", Checksum: goodSum, Firmware: "coreboot"}, "spec.firmware"),
			Entry("format enum", crawlv1.KVMImageSpec{URL: "https://x/y", Checksum: goodSum, Format: "vmdk"}, "spec.format"),
		)
	})

	Context("Proxy", func() {
		var ns string
		BeforeEach(func() {
			n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "wh-"}}
			Expect(k8sClient.Create(ctx, n)).To(Succeed())
			ns = n.Name
		})

		It("defaults installGuestAgent, port, resources and a URL image's firmware", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{
					Host: "hv1", Image: "https://img.example/d.qcow2", ImageChecksum: goodSum}}}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			Expect(*p.Spec.InstallGuestAgent).To(BeTrue())
			Expect(p.Spec.Port).To(Equal(int32(3128)))
			Expect(p.Spec.Placement.Firmware).To(Equal(crawlv1.FirmwareUEFI))
			Expect(p.Spec.Resources.Memory.String()).To(Equal("512Mi"))
		})

		It("rejects a kvm Proxy without host or selector", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "nohost", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Image: "debian"}}}
			err := k8sClient.Create(ctx, p)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.placement.host"))
		})

		It("keeps provider and placement immutable", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "imm", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: "hv1", Image: "debian"}}}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())

			moved := p.DeepCopy()
			moved.Spec.Placement.Host = "hv2"
			err := k8sClient.Update(ctx, moved)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("placement is immutable"))

			resized := p.DeepCopy()
			resized.Spec.Resources.CPUs = 2
			Expect(k8sClient.Update(ctx, resized)).To(Succeed())
		})
	})
})
