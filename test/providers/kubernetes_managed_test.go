package providers

import (
	"errors"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// The managed squid's objects against a real API server, at the provider
// level: the Proxy controller does not fill Machine.Squid yet (the other
// half of issue 14), so these specs build the Machine themselves. The API
// server validates the NetworkPolicy, and its PodSecurity admission judges
// the pod with the Secret volume and fsGroup at the restricted level.
var _ = Describe("kubernetes provider with a managed squid", func() {
	const managerNamespace = "proxy-operator-system"
	var (
		ns string
		p  provider.Provider
		m  *provider.Machine
	)
	BeforeEach(func() {
		ns = newNamespace()
		nsObj := &corev1.Namespace{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Name: ns}, nsObj)).To(Succeed())
		nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
		Expect(k8sClient.Update(ctx, nsObj)).To(Succeed())
		p = kubernetes.New(k8sClient, kubernetes.Options{InstallID: testInstallID, ManagerNamespace: managerNamespace})
		m = &provider.Machine{
			Namespace: ns, Name: "managed", UID: string(uuid.NewUUID()), Tag: testTag,
			CPUs: 1, MemoryBytes: 128 << 20, Port: 3128,
			Squid: &squid.Config{
				AllowedSourceCIDRs: []string{"10.244.0.0/16", "2001:db8::/64"},
				Auth:               squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: squid.GeneratePassword()},
			},
		}
	})
	key := func() types.NamespacedName {
		return types.NamespacedName{Namespace: ns, Name: kubernetes.ObjectName(m.Name, m.UID)}
	}

	It("creates the ConfigMap, Secret, NetworkPolicy and a restricted pod, converges them, and deletes them all", func() {
		_, err := p.Create(ctx, m)
		Expect(err).NotTo(HaveOccurred())
		k := key()
		var (
			pod    corev1.Pod
			cm     corev1.ConfigMap
			secret corev1.Secret
			np     networkingv1.NetworkPolicy
		)
		for _, obj := range []client.Object{&pod, &cm, &secret, &np} {
			Expect(k8sClient.Get(ctx, k, obj)).To(Succeed())
			Expect(obj.GetLabels()).To(And(
				HaveKeyWithValue(kubernetes.LabelProxyUID, m.UID),
				HaveKeyWithValue(kubernetes.LabelTag, testTag),
				HaveKeyWithValue(kubernetes.LabelInstall, testInstallID),
			))
			Expect(metav1.GetControllerOf(obj).UID).To(Equal(types.UID(m.UID)))
		}
		Expect(cm.Data[kubernetes.ConfigKey]).To(ContainSubstring("acl allowed_sources src 10.244.0.0/16 2001:db8::/64\n"))
		Expect(squid.PasswordFileMatches(secret.Data[kubernetes.PasswordKey], m.Squid.Auth)).To(BeTrue())
		Expect(np.Spec.Ingress).To(HaveLen(1))
		Expect(np.Spec.Ingress[0].From).To(HaveLen(3))
		Expect(np.Spec.Ingress[0].From[2].NamespaceSelector.MatchLabels).To(HaveKeyWithValue(corev1.LabelMetadataName, managerNamespace))

		By("Create again changes nothing; a new password rewrites the Secret")
		rv := map[string]string{"cm": cm.ResourceVersion, "secret": secret.ResourceVersion, "np": np.ResourceVersion}
		_, err = p.Create(ctx, m)
		Expect(err).NotTo(HaveOccurred())
		for name, obj := range map[string]client.Object{"cm": &cm, "secret": &secret, "np": &np} {
			Expect(k8sClient.Get(ctx, k, obj)).To(Succeed())
			Expect(obj.GetResourceVersion()).To(Equal(rv[name]), name+" was rewritten")
		}
		m.Squid.Auth.Password = squid.GeneratePassword()
		_, err = p.Create(ctx, m)
		Expect(err).NotTo(HaveOccurred())
		Expect(k8sClient.Get(ctx, k, &secret)).To(Succeed())
		Expect(squid.PasswordFileMatches(secret.Data[kubernetes.PasswordKey], m.Squid.Auth)).To(BeTrue())

		By("Delete removes everything, twice")
		for range 2 {
			Expect(p.Delete(ctx, m)).To(Succeed())
		}
		for _, obj := range []client.Object{&corev1.Pod{}, &corev1.ConfigMap{}, &corev1.Secret{}, &networkingv1.NetworkPolicy{}} {
			err := k8sClient.Get(ctx, k, obj)
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%T: %v", obj, err)
		}
	})

	It("runs the upstream counter from its ConfigMap in a restricted pod, only while every live pod has it", func() {
		m.Squid.Stats = squid.Auth{Type: squid.AuthBasic, Username: "proxy-operator-stats", Password: squid.GeneratePassword()}
		daemon := "\nlogfile_daemon " + kubernetes.CounterPath + "\n"
		inst, err := p.Create(ctx, m)
		Expect(err).NotTo(HaveOccurred())
		m.ProviderID = inst.ProviderID
		k := key()
		var pod corev1.Pod
		var cm corev1.ConfigMap
		Expect(k8sClient.Get(ctx, k, &pod)).To(Succeed())
		Expect(k8sClient.Get(ctx, k, &cm)).To(Succeed())
		Expect(cm.Data).To(HaveKeyWithValue(kubernetes.CounterKey, string(squid.UpstreamCounter)))
		Expect(cm.Data[kubernetes.ConfigKey]).To(ContainSubstring(daemon))
		config := configVolume(&pod)
		Expect(config.Items).To(ContainElement(corev1.KeyToPath{Key: kubernetes.CounterKey, Path: kubernetes.CounterKey, Mode: ptr.To(int32(0o755))}))
		Expect(config.Items).To(ContainElement(corev1.KeyToPath{Key: kubernetes.ConfigKey, Path: kubernetes.ConfigKey}))

		By("a pod of the earlier template (the whole ConfigMap, default mode) gets a squid.conf without the counter")
		Expect(k8sClient.Delete(ctx, &pod, client.GracePeriodSeconds(0))).To(Succeed())
		Eventually(func() bool { return apierrors.IsNotFound(k8sClient.Get(ctx, k, &corev1.Pod{})) }).Should(BeTrue())
		old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Labels: pod.Labels, Annotations: pod.Annotations, OwnerReferences: pod.OwnerReferences}, Spec: *pod.Spec.DeepCopy()}
		configVolume(old).Items = nil
		Expect(k8sClient.Create(ctx, old)).To(Succeed())
		_, err = p.Create(ctx, m)
		Expect(err).NotTo(HaveOccurred())
		Expect(k8sClient.Get(ctx, k, &cm)).To(Succeed())
		Expect(cm.Data[kubernetes.ConfigKey]).NotTo(ContainSubstring("logfile_daemon"))
		Expect(cm.Data).To(HaveKey(kubernetes.CounterKey))

		By("once it is gone, the pod Create makes has the counter and squid.conf runs it")
		Expect(k8sClient.Delete(ctx, old, client.GracePeriodSeconds(0))).To(Succeed())
		Eventually(func() bool { return apierrors.IsNotFound(k8sClient.Get(ctx, k, &corev1.Pod{})) }).Should(BeTrue())
		_, err = p.Create(ctx, m)
		Expect(err).NotTo(HaveOccurred())
		Expect(k8sClient.Get(ctx, k, &cm)).To(Succeed())
		Expect(cm.Data[kubernetes.ConfigKey]).To(ContainSubstring(daemon))
		Expect(k8sClient.Get(ctx, k, &pod)).To(Succeed())
		Expect(configVolume(&pod).Items).To(ContainElement(corev1.KeyToPath{Key: kubernetes.CounterKey, Path: kubernetes.CounterKey, Mode: ptr.To(int32(0o755))}))
	})

	It("never touches a NetworkPolicy or Secret of someone else under its name", func() {
		k := key()
		meta := metav1.ObjectMeta{Name: k.Name, Namespace: ns, Labels: map[string]string{kubernetes.LabelProxyUID: "someone-else"}}
		theirs := &networkingv1.NetworkPolicy{ObjectMeta: meta, Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		Expect(k8sClient.Create(ctx, theirs)).To(Succeed())
		secret := &corev1.Secret{ObjectMeta: *meta.DeepCopy(), StringData: map[string]string{"passwd": "theirs"}}
		Expect(k8sClient.Create(ctx, secret)).To(Succeed())

		var ie *provider.IdentityError
		_, err := p.Create(ctx, m)
		Expect(errors.As(err, &ie)).To(BeTrue(), "Create: %v", err)
		err = p.Delete(ctx, m)
		Expect(errors.As(err, &ie)).To(BeTrue(), "Delete: %v", err)

		got := &networkingv1.NetworkPolicy{}
		Expect(k8sClient.Get(ctx, k, got)).To(Succeed())
		Expect(got.ResourceVersion).To(Equal(theirs.ResourceVersion))
		gotSecret := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, k, gotSecret)).To(Succeed())
		Expect(string(gotSecret.Data["passwd"])).To(Equal("theirs"))
		// The pod was never created: the Secret is checked first.
		Expect(podExists(k)).To(BeFalse())
	})
})

// configVolume is the pod's volume of its squid ConfigMap.
func configVolume(pod *corev1.Pod) *corev1.ConfigMapVolumeSource {
	for i := range pod.Spec.Volumes {
		if v := pod.Spec.Volumes[i].ConfigMap; v != nil {
			return v
		}
	}
	Fail("the pod has no ConfigMap volume")
	return nil
}
