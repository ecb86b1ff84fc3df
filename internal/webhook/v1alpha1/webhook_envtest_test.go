package v1alpha1

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

var _ = Describe("admission through the API server", func() {
	It("installs the CRDs", func() {
		for _, l := range []client.ObjectList{&crawlv1.KVMHostList{}, &crawlv1.KVMImageList{}, &crawlv1.ProxyList{}} {
			Expect(k8sClient.List(ctx, l)).To(Succeed())
		}
	})

	It("puts every kind in the crawl category, none in one named like a resource", func() {
		// kubectl expands a category before a resource name: a category
		// "proxies" made `kubectl get proxies` list all three kinds.
		dc, err := discovery.NewDiscoveryClientForConfig(testEnv.Config)
		Expect(err).NotTo(HaveOccurred())
		list, err := dc.ServerResourcesForGroupVersion(crawlv1.GroupVersion.String())
		Expect(err).NotTo(HaveOccurred())
		kinds := map[string][]string{}
		for _, r := range list.APIResources {
			if !strings.Contains(r.Name, "/") { // skip subresources
				kinds[r.Kind] = r.Categories
			}
		}
		Expect(kinds).To(Equal(map[string][]string{"Proxy": {"crawl"}, "ProxyPool": {"crawl"}, "ProxyBan": {"crawl"}, "KVMHost": {"crawl"}, "KVMImage": {"crawl"}}))
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

		It("refuses an SSH Secret outside the manager's namespace, naming the field", func() {
			h := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: "hv-foreign-secret"},
				Spec: crawlv1.KVMHostSpec{Address: "hv1:22", SSHKeySecretRef: &crawlv1.SecretReference{Name: "k", Namespace: "tenant-a"}}}
			err := k8sClient.Create(ctx, h)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.sshKeySecretRef.namespace"))
			Expect(err.Error()).To(ContainSubstring(managerNS))
			h.Spec.SSHKeySecretRef.Namespace = managerNS
			Expect(k8sClient.Create(ctx, h)).To(Succeed())
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

		It("keeps address and storagePool immutable, naming the field", func() {
			h := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: "hv-immutable"}, Spec: crawlv1.KVMHostSpec{Address: "hv3"}}
			Expect(k8sClient.Create(ctx, h)).To(Succeed())
			for field, mutate := range map[string]func(*crawlv1.KVMHost){
				"spec.address":     func(h *crawlv1.KVMHost) { h.Spec.Address = "hv4:22" },
				"spec.storagePool": func(h *crawlv1.KVMHost) { h.Spec.StoragePool = "fast" },
			} {
				moved := h.DeepCopy()
				mutate(moved)
				err := k8sClient.Update(ctx, moved)
				Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%s: %v", field, err)
				Expect(err.Error()).To(ContainSubstring(field))
				Expect(err.Error()).To(ContainSubstring("is immutable"))
			}
			// The CRD's CEL rules alone say the same.
			withoutWebhooks(func() {
				for field, mutate := range map[string]func(*crawlv1.KVMHost){
					"spec.address: Invalid value":     func(h *crawlv1.KVMHost) { h.Spec.Address = "hv4:22" },
					"spec.storagePool: Invalid value": func(h *crawlv1.KVMHost) { h.Spec.StoragePool = "fast" },
				} {
					moved := h.DeepCopy()
					mutate(moved)
					err := k8sClient.Update(ctx, moved)
					Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%s: %v", field, err)
					Expect(err.Error()).To(ContainSubstring(field))
					Expect(err.Error()).To(ContainSubstring("is immutable"))
				}
			})
		})

		It("releases a stored KVMHost that today's rules reject", func() {
			h := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: "hv-old", Finalizers: []string{"crawl.example.com/kvmhost"}},
				Spec: crawlv1.KVMHostSpec{Address: "hv-old", SocketPath: "relative/libvirt-sock"}}
			withoutWebhooks(func() { Expect(k8sClient.Create(ctx, h)).To(Succeed()) })
			Expect(h.Spec.Address).To(Equal("hv-old"), "created past the defaulting webhook")
			Expect(k8sClient.Delete(ctx, h)).To(Succeed())
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(h), h)).To(Succeed())
			h.Finalizers = nil
			Expect(k8sClient.Update(ctx, h)).To(Succeed())
			Eventually(func() bool {
				return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(h), &crawlv1.KVMHost{}))
			}).Should(BeTrue())
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

		It("defaults installGuestAgent, port and resources", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: "hv1", Image: "debian"}, Access: sources("10.244.0.0/16")}}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			Expect(*p.Spec.InstallGuestAgent).To(BeTrue())
			Expect(p.Spec.Port).To(Equal(int32(3128)))
			Expect(p.Spec.Resources.Memory.String()).To(Equal("512Mi"))
		})

		It("makes a new Proxy a managed squid with a generated Basic credential", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "managed", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Access: sources("10.244.0.0/16")}}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			got := &crawlv1.Proxy{}
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
			a := got.Spec.Access
			Expect(a).NotTo(BeNil())
			Expect(a.Managed).To(Equal(ptr.To(true)))
			Expect(a.Auth).To(Equal(&crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthBasic}))
			Expect(a.AllowedPorts).To(Equal([]int32{80, 443}))
			Expect(a.MaxConnectionsPerClient).To(Equal(int32(256)))
		})

		It("refuses a managed Proxy without allowedSourceCIDRs, or with one that is no CIDR, naming the field", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "nosources", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes}}
			err := k8sClient.Create(ctx, p)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.access.allowedSourceCIDRs: Required value"))

			p.Spec.Access = sources("10.0.0.0/8", "crawlers")
			err = k8sClient.Create(ctx, p)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(`spec.access.allowedSourceCIDRs[1]: Invalid value: "crawlers": must be a CIDR`))
		})

		It("admits a credential Secret that does not exist yet", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "later-secret", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Access: &crawlv1.ProxyAccess{
					AllowedSourceCIDRs: []string{"10.0.0.0/8"},
					Auth:               &crawlv1.ProxyAuth{SecretRef: &crawlv1.LocalObjectReference{Name: "created-later"}}}}}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
		})

		It("takes auth None only when stated, and then only with narrow sources", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "noauth", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Access: &crawlv1.ProxyAccess{
					AllowedSourceCIDRs: []string{"10.0.0.0/8"}, Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthNone}}}}
			err := k8sClient.Create(ctx, p)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.access.allowedSourceCIDRs[0]"))
			Expect(err.Error()).To(ContainSubstring("with auth type None"))
			p.Spec.Access.AllowedSourceCIDRs = []string{"10.1.2.0/24"}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			Expect(p.Spec.Access.Auth.Type).To(Equal(crawlv1.ProxyAuthNone))
		})

		It("admits managed: false with a warning that the proxy's safety is the user's", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "unmanaged", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: "hv1", Image: "debian"},
					Access: &crawlv1.ProxyAccess{Managed: ptr.To(false)}}}
			warnings.take()
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			Expect(warnings.take()).To(ContainElement(ContainSubstring("spec.access.managed is false")))
			Expect(p.Spec.Access.Auth).To(BeNil(), "an unmanaged squid gets no access defaults")
		})

		It("requires allowedSourceCIDRs of an unmanaged kubernetes Proxy, naming the field: its NetworkPolicy admits only them", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "unmanaged-pod", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Access: &crawlv1.ProxyAccess{Managed: ptr.To(false)}}}
			err := k8sClient.Create(ctx, p)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.access.allowedSourceCIDRs: Required value"))

			p.Spec.Access.AllowedSourceCIDRs = []string{"10.244.0.0/16"}
			warnings.take()
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			Expect(warnings.take()).To(ContainElement(ContainSubstring("spec.access.managed is false")))
			Expect(p.Spec.Access.AllowedSourceCIDRs).To(Equal([]string{"10.244.0.0/16"}))
		})

		It("keeps a Proxy stored without spec.access unmanaged through updates", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "legacy", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes}}
			withoutWebhooks(func() { Expect(k8sClient.Create(ctx, p)).To(Succeed()) })
			Expect(p.Spec.Access).To(BeNil())
			p.Spec.Resources.CPUs = 2
			Expect(k8sClient.Update(ctx, p)).To(Succeed())
			got := &crawlv1.Proxy{}
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
			Expect(got.Spec.Access).To(BeNil())
			Expect(got.IsManaged()).To(BeFalse())
		})

		It("keeps access immutable", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "access-imm", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes, Access: sources("10.0.0.0/8")}}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			// Re-sending the same access as written (defaults omitted) is no change.
			same := p.DeepCopy()
			same.Spec.Access = sources("10.0.0.0/8")
			same.Spec.Resources.CPUs = 2
			Expect(k8sClient.Update(ctx, same)).To(Succeed())
			widened := same.DeepCopy()
			widened.Spec.Access.AllowedSourceCIDRs = []string{"0.0.0.0/0"}
			err := k8sClient.Update(ctx, widened)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.access"))
			Expect(err.Error()).To(ContainSubstring("access is immutable"))
		})

		It("refuses an image URL without --allow-proxy-image-urls, pointing to KVMImage", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "url", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{
					Host: "hv1", Image: "http://10.96.0.1/x.qcow2", ImageChecksum: goodSum}, Access: sources("10.0.0.0/8")}}
			err := k8sClient.Create(ctx, p)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.placement.image: Forbidden"))
			Expect(err.Error()).To(ContainSubstring("KVMImage"))
			Expect(err.Error()).To(ContainSubstring("--allow-proxy-image-urls"))
		})

		It("rejects a kvm Proxy without host or selector", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "nohost", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Image: "debian"}}}
			err := k8sClient.Create(ctx, p)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.placement.host"))
		})

		It("releases a stored Proxy that today's rules reject", func() {
			// Stored with the webhooks off: no defaults, a name that is no
			// DNS label, memory below the minimum.
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "old.p1", Namespace: ns, Finalizers: []string{crawlv1.ProxyFinalizer}},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{
					Host: "hv1", Image: "https://img.example/d.qcow2", ImageChecksum: goodSum},
					Resources: crawlv1.ProxyResources{Memory: ptr.To(resource.MustParse("64Mi"))}}}
			withoutWebhooks(func() { Expect(k8sClient.Create(ctx, p)).To(Succeed()) })
			Expect(p.Spec.Placement.Firmware).To(BeEmpty(), "created past the defaulting webhook")

			// A real change is still validated for what it changes (the URL
			// image, refused today, is ratcheted like the memory).
			ok := p.DeepCopy()
			ok.Spec.Resources.CPUs = 2
			Expect(k8sClient.Update(ctx, ok)).To(Succeed())
			p = ok
			bad := p.DeepCopy()
			bad.Spec.Resources.Memory = ptr.To(resource.MustParse("100Mi"))
			err := k8sClient.Update(ctx, bad)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.resources.memory"))

			p.Annotations = map[string]string{crawlv1.SkipCleanupAnnotation: "true"}
			Expect(k8sClient.Update(ctx, p)).To(Succeed())
			Expect(k8sClient.Delete(ctx, p)).To(Succeed())
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
			p.Finalizers = nil
			Expect(k8sClient.Update(ctx, p)).To(Succeed())
			Eventually(func() bool {
				return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), &crawlv1.Proxy{}))
			}).Should(BeTrue())
		})

		It("keeps provider and placement immutable", func() {
			p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "imm", Namespace: ns},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: "hv1", Image: "debian"}, Access: sources("10.0.0.0/8")}}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())

			moved := p.DeepCopy()
			moved.Spec.Placement.Host = "hv2"
			err := k8sClient.Update(ctx, moved)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("placement is immutable"))

			for _, viaCEL := range []bool{false, true} {
				reported := p.DeepCopy()
				reported.Spec.Port = 8080
				update := func() error { return k8sClient.Update(ctx, reported) }
				var err error
				if viaCEL {
					withoutWebhooks(func() { err = update() })
				} else {
					err = update()
				}
				Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
				Expect(err.Error()).To(ContainSubstring("spec.port"))
				Expect(err.Error()).To(ContainSubstring("port is immutable"))
			}

			resized := p.DeepCopy()
			resized.Spec.Resources.CPUs = 2
			Expect(k8sClient.Update(ctx, resized)).To(Succeed())
		})
	})
})

// sources is a managed spec.access admitting cidrs, the rest defaulted.
func sources(cidrs ...string) *crawlv1.ProxyAccess {
	return &crawlv1.ProxyAccess{AllowedSourceCIDRs: cidrs}
}

// withoutWebhooks runs fn while the API server calls none of the project's
// webhooks, as when objects were stored before a rule existed or with the
// webhooks off, and reinstalls them afterwards.
func withoutWebhooks(fn func()) {
	GinkgoHelper()
	mut := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	val := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
	Expect(k8sClient.List(ctx, mut)).To(Succeed())
	Expect(k8sClient.List(ctx, val)).To(Succeed())
	Expect(mut.Items).NotTo(BeEmpty())
	Expect(val.Items).NotTo(BeEmpty())
	for i := range mut.Items {
		Expect(k8sClient.Delete(ctx, &mut.Items[i])).To(Succeed())
	}
	for i := range val.Items {
		Expect(k8sClient.Delete(ctx, &val.Items[i])).To(Succeed())
	}
	// The API server notices configuration changes asynchronously: wait
	// until an object only the webhook rejects is accepted (dry run).
	probe := func() error {
		return k8sClient.Create(ctx, &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"},
			Spec: crawlv1.KVMImageSpec{URL: "https://", Checksum: goodSum}}, client.DryRunAll)
	}
	Eventually(probe).Should(Succeed())
	defer func() {
		for i := range mut.Items {
			c := mut.Items[i].DeepCopy()
			c.ResourceVersion, c.UID, c.ManagedFields = "", "", nil
			Expect(k8sClient.Create(ctx, c)).To(Succeed())
		}
		for i := range val.Items {
			c := val.Items[i].DeepCopy()
			c.ResourceVersion, c.UID, c.ManagedFields = "", "", nil
			Expect(k8sClient.Create(ctx, c)).To(Succeed())
		}
		Eventually(probe).ShouldNot(Succeed())
	}()
	fn()
}
