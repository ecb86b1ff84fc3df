package providers

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// Issue 25, item 1, against a real API server: the manager's provider
// (kubernetes.NewForManager, as main.go builds it) learns the cluster's
// ranges from ServiceCIDRs and Nodes as they come and go, and brings every
// Proxy's ConfigMap and NetworkPolicy up to them, in place: the pod stays.
// The API server validates the NetworkPolicy's egress each time.
var _ = Describe("kubernetes provider and the cluster's own ranges", func() {
	It("refuses a new ServiceCIDR and a new node's ranges in place, and forgets a node that left", func() {
		ns := newNamespace()
		prov, err := mgr.Wiring.Registry.Get(ctx, kubernetes.Name)
		Expect(err).NotTo(HaveOccurred())
		m := &provider.Machine{
			Namespace: ns, Name: "ranges", UID: string(uuid.NewUUID()), Tag: testTag, Port: 3128,
			Squid: &squid.Config{
				AllowedSourceCIDRs: []string{"10.244.0.0/16"},
				Auth:               squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: squid.GeneratePassword()},
			},
		}
		_, err = prov.Create(ctx, m)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(prov.Delete(ctx, m)).To(Succeed()) })
		key := types.NamespacedName{Namespace: ns, Name: kubernetes.ObjectName(m.Name, m.UID)}
		pod := &corev1.Pod{}
		Expect(k8sClient.Get(ctx, key, pod)).To(Succeed())

		// envtest's own Service range, 10.0.0.0/24, is private: inside
		// the default list already, it adds nothing.
		Expect(clusterFile(key)).To(Equal("0.0.0.0/32"))

		By("a ServiceCIDR in global space")
		cidr := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "gke-services"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"34.118.224.0/20"}}}
		Expect(k8sClient.Create(ctx, cidr)).To(Succeed())
		DeferCleanup(func() {
			removeServiceCIDR(cidr.Name)
			// Back to envtest's ranges before the next spec, whose
			// ConfigMaps the watch would otherwise rewrite.
			Eventually(func() string { return clusterFile(key) }).WithTimeout(20 * time.Second).Should(Equal("0.0.0.0/32"))
		})
		Eventually(func() string { return clusterFile(key) }).WithTimeout(20 * time.Second).Should(ContainSubstring("34.118.224.0/20"))
		Expect(egressExcept(key)).To(ContainElement("34.118.224.0/20"))

		By("a node with global pod ranges and a public address")
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "global-" + ns}, Spec: corev1.NodeSpec{
			PodCIDR: "34.118.0.0/24", PodCIDRs: []string{"34.118.0.0/24", "2600:1900:4000:1::/64"},
		}}
		Expect(k8sClient.Create(ctx, node)).To(Succeed())
		DeferCleanup(removeNode, node.Name)
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.128.0.5"}, {Type: corev1.NodeExternalIP, Address: "35.0.0.5"}}
		Expect(k8sClient.Status().Update(ctx, node)).To(Succeed())
		Eventually(func() string { return clusterFile(key) }).WithTimeout(20 * time.Second).Should(And(
			ContainSubstring("34.118.0.0/24"), ContainSubstring("2600:1900:4000:1::/64"), ContainSubstring("35.0.0.5/32"),
			Not(ContainSubstring("10.128.0.5")), // private: refused by the default list already
		))
		Expect(egressExcept(key)).To(ContainElements("34.118.0.0/24", "2600:1900:4000:1::/64", "35.0.0.5/32", "169.254.0.0/16"))

		again := &corev1.Pod{}
		Expect(k8sClient.Get(ctx, key, again)).To(Succeed())
		Expect(again.UID).To(Equal(pod.UID), "the pod was replaced")

		By("the node leaves")
		removeNode(node.Name)
		Eventually(func() string { return clusterFile(key) }).WithTimeout(20 * time.Second).ShouldNot(ContainSubstring("34.118.0.0/24"))
		Expect(clusterFile(key)).To(ContainSubstring("34.118.224.0/20"))
	})
})

// clusterFile is the entries of the ConfigMap's cluster ranges file.
func clusterFile(key types.NamespacedName) string {
	cm := &corev1.ConfigMap{}
	Expect(k8sClient.Get(ctx, key, cm)).To(Succeed())
	var entries []string
	for _, l := range strings.Split(cm.Data[kubernetes.ClusterRangesKey], "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			entries = append(entries, l)
		}
	}
	return strings.Join(entries, " ")
}

// egressExcept is every except of the NetworkPolicy's egress ipBlocks.
func egressExcept(key types.NamespacedName) []string {
	np := &networkingv1.NetworkPolicy{}
	Expect(k8sClient.Get(ctx, key, np)).To(Succeed())
	Expect(np.Spec.PolicyTypes).To(ContainElement(networkingv1.PolicyTypeEgress))
	var out []string
	for _, rule := range np.Spec.Egress {
		for _, to := range rule.To {
			if to.IPBlock != nil {
				out = append(out, to.IPBlock.Except...)
			}
		}
	}
	return out
}

// removeNode deletes a node; nothing holds it here (no kubelet, no node
// lifecycle controller).
func removeNode(name string) {
	err := k8sClient.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	Expect(client.IgnoreNotFound(err)).To(Succeed())
}

// removeServiceCIDR deletes a ServiceCIDR and lifts its finalizer, which
// the kube-controller-manager (absent here) would once no Service used it.
func removeServiceCIDR(name string) {
	cidr := &networkingv1.ServiceCIDR{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Name: name}, cidr); apierrors.IsNotFound(err) {
		return
	}
	cidr.Finalizers = nil
	Expect(k8sClient.Update(ctx, cidr)).To(Succeed())
	Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, cidr))).To(Succeed())
}
