package v1alpha1

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

var _ = Describe("an IPAM pool reference through the API server", func() {
	var ns string
	BeforeEach(func() {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "wh-net-"}}
		Expect(k8sClient.Create(ctx, n)).To(Succeed())
		ns = n.Name
	})
	proxy := func(name string, provider crawlv1.ProviderName, ref ipamv1.IPPoolReference) *crawlv1.Proxy {
		p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: crawlv1.ProxySpec{Provider: provider, Access: sources("10.0.0.0/8"),
				Network: &crawlv1.ProxyNetwork{AddressesFromPools: []ipamv1.IPPoolReference{ref}}}}
		if provider == crawlv1.ProviderKVM {
			p.Spec.Placement = crawlv1.ProxyPlacement{Host: "hv1", Image: "debian"}
		}
		return p
	}

	It("refuses a pool on a provider that takes no static address, and a kind no known IPAM provider serves, naming the field", func() {
		err := k8sClient.Create(ctx, proxy("gcp", crawlv1.ProviderGCP, inClusterPool("routed")))
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("spec.network.addressesFromPools: Forbidden: provider gcp"))

		err = k8sClient.Create(ctx, proxy("kind", crawlv1.ProviderKVM, ipamv1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "IPPool", Name: "x"}))
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(`spec.network.addressesFromPools[0].kind: Unsupported value: "IPPool"`))
	})

	It("keeps network immutable, through the webhook and through the schema", func() {
		p := proxy("imm", crawlv1.ProviderKVM, inClusterPool("a"))
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		for _, viaCEL := range []bool{false, true} {
			moved := p.DeepCopy()
			moved.Spec.Network.AddressesFromPools[0].Name = "b"
			var err error
			if viaCEL {
				withoutWebhooks(func() { err = k8sClient.Update(ctx, moved) })
			} else {
				err = k8sClient.Update(ctx, moved)
			}
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.network"))
			Expect(err.Error()).To(ContainSubstring("network is immutable"))
		}
	})
})
