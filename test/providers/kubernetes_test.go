package providers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
	"crawl.example.com/proxy-operator/test/harness"
)

var _ = Describe("kubernetes provider", func() {
	It("takes a Proxy from apply to Ready through its squid pod and back to nothing", func() {
		ns := newNamespace()
		// The API server's own PodSecurity admission judges the pod: one
		// short of the restricted level would be refused at create.
		nsObj := &corev1.Namespace{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Name: ns}, nsObj)).To(Succeed())
		nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
		Expect(k8sClient.Update(ctx, nsObj)).To(Succeed())
		p := createProxy(ns, "squid", crawlv1.ProviderKubernetes)
		key := podKey(p)

		pod := waitPod(key)
		Expect(pod.Labels).To(And(
			HaveKeyWithValue(kubernetes.LabelManagedBy, kubernetes.ManagedBy),
			HaveKeyWithValue(kubernetes.LabelTag, testTag),
			HaveKeyWithValue(kubernetes.LabelInstall, testInstallID),
			HaveKeyWithValue(kubernetes.LabelProxyUID, string(p.UID)),
			HaveKeyWithValue(kubernetes.LabelProxyName, "squid"),
		))
		owner := metav1.GetControllerOf(pod)
		Expect(owner).NotTo(BeNil())
		Expect(owner.Kind).To(Equal("Proxy"))
		Expect(owner.UID).To(Equal(p.UID))
		Expect(pod.Spec.Containers).To(HaveLen(1))
		Expect(pod.Spec.Containers[0].Ports).To(ConsistOf(HaveField("ContainerPort", int32(3128))))
		cm := &corev1.ConfigMap{}
		Expect(k8sClient.Get(ctx, key, cm)).To(Succeed())
		Expect(cm.Data[kubernetes.ConfigKey]).To(ContainSubstring("http_port 3128"))
		Expect(cm.Labels).To(HaveKeyWithValue(kubernetes.LabelProxyUID, string(p.UID)))

		// Nothing scheduled it yet: provisioning, and saying why.
		p = waitProxyPhase(ns, "squid", crawlv1.ProxyProvisioning, 15*time.Second)
		Expect(p.Status.Address).To(BeEmpty())

		// Bound and running, readiness probe not passing yet: still no
		// address is published.
		schedule(key)
		kubeletRun(key, "10.244.1.7", false)
		Eventually(func(g Gomega) {
			p := getProxy(ns, "squid")
			g.Expect(conditions.GetMessage(p, crawlv1.ReadyCondition)).To(ContainSubstring("readiness probe not passing"), describe(p))
			g.Expect(p.Status.Phase).To(Equal(crawlv1.ProxyProvisioning))
			g.Expect(p.Status.Address).To(BeEmpty())
		}).WithTimeout(15 * time.Second).Should(Succeed())

		kubeletRun(key, "10.244.1.7", true)
		p = waitProxyPhase(ns, "squid", crawlv1.ProxyReady, 15*time.Second)
		Expect(p.Status.ProviderID).To(Equal("kubernetes://" + ns + "/" + key.Name))
		Expect(p.Status.Host).To(Equal(nodeName))
		Expect(p.Status.Address).To(Equal("10.244.1.7"))
		Expect(p.Status.AddressSource).To(Equal(provider.AddressSourcePod))
		Expect(p.Status.Endpoint).To(Equal("http://10.244.1.7:3128"))
		Expect(conditions.IsTrue(p, crawlv1.InstanceProvisionedCondition)).To(BeTrue())
		Expect(conditions.IsTrue(p, crawlv1.ProxyHealthyCondition)).To(BeTrue())
		Expect(controllerutil.ContainsFinalizer(p, crawlv1.ProxyFinalizer)).To(BeTrue())
		Expect(prober.Probes("10.244.1.7")).To(BeNumerically(">", 0))

		deleteProxy(ns, "squid")
		waitProxyGone(ns, "squid", 15*time.Second)
		Expect(configMapExists(key)).To(BeFalse(), "ConfigMap left behind")
		// The pod is bound, so the API server only marks it; the kubelet
		// removes it once squid stopped.
		pod = &corev1.Pod{}
		Expect(k8sClient.Get(ctx, key, pod)).To(Succeed())
		Expect(pod.DeletionTimestamp).NotTo(BeNil(), "pod not deleted")
		kubeletFinishTermination(key)
		Expect(podExists(key)).To(BeFalse())
	})

	It("asks the scheduler to spread a pool's squid pods over nodes", func() {
		ns := newNamespace()
		p := &crawlv1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pooled", Labels: map[string]string{crawlv1.PoolNameLabel: "crawl-a"}},
			Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKubernetes,
				CloudInit: crawlv1.ProxyCloudInit{UserData: "#cloud-config\n"}, Port: 3128},
		}
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		DeferCleanup(kubeletFinishTermination, podKey(p))
		DeferCleanup(removeProxy, ns, p.Name)

		// Stored by the API server as sent: the constraint is valid.
		pod := waitPod(podKey(p))
		Expect(pod.Labels).To(HaveKeyWithValue(kubernetes.LabelSpreadGroup, "crawl-a"))
		Expect(pod.Spec.TopologySpreadConstraints).To(ConsistOf(And(
			HaveField("MaxSkew", int32(1)),
			HaveField("TopologyKey", corev1.LabelHostname),
			HaveField("WhenUnsatisfiable", corev1.ScheduleAnyway),
			HaveField("LabelSelector.MatchLabels", HaveKeyWithValue(kubernetes.LabelSpreadGroup, "crawl-a")),
		)))
	})

	It("replaces an evicted squid pod under a new name and is Ready again", func() {
		ns := newNamespace()
		p := createProxy(ns, "evicted", crawlv1.ProviderKubernetes)
		first := podKey(p)
		startPod(p, "10.244.1.10")
		waitProxyPhase(ns, "evicted", crawlv1.ProxyReady, 15*time.Second)

		// The kubelet evicts it under memory pressure: phase Failed, kept
		// until pod garbage collection.
		Eventually(func() error {
			pod := &corev1.Pod{}
			if err := k8sClient.Get(ctx, first, pod); err != nil {
				return err
			}
			pod.Status.Phase, pod.Status.Reason = corev1.PodFailed, "Evicted"
			pod.Status.Message = "The node was low on resource: memory."
			pod.Status.Conditions = nil
			return k8sClient.Status().Update(ctx, pod)
		}).WithTimeout(10 * time.Second).Should(Succeed())

		next := types.NamespacedName{Namespace: ns, Name: kubernetes.PodName(p.Name, string(p.UID), 1)}
		pod := waitPod(next)
		Expect(pod.Labels).To(HaveKeyWithValue(kubernetes.LabelProxyUID, string(p.UID)))
		schedule(next)
		kubeletRun(next, "10.244.1.11", true)
		Eventually(func(g Gomega) {
			p := getProxy(ns, "evicted")
			g.Expect(p.Status.Phase).To(Equal(crawlv1.ProxyReady), describe(p))
			g.Expect(p.Status.ProviderID).To(Equal("kubernetes://" + ns + "/" + next.Name))
			g.Expect(p.Status.Address).To(Equal("10.244.1.11"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		// The evicted pod was deleted (it is bound: only marked).
		old := &corev1.Pod{}
		if err := k8sClient.Get(ctx, first, old); err == nil {
			Expect(old.DeletionTimestamp).NotTo(BeNil(), "evicted pod not deleted")
		}
		kubeletFinishTermination(first)

		deleteProxy(ns, "evicted")
		waitProxyGone(ns, "evicted", 15*time.Second)
		kubeletFinishTermination(next)
		Expect(podExists(next)).To(BeFalse())
		Expect(configMapExists(first)).To(BeFalse(), "ConfigMap left behind")
	})

	It("recreates a deleted squid pod at once, not at the Proxy's next probe or resync", func() {
		// Probes and resyncs an hour apart: only the pod's own events can
		// bring the Proxy back within the spec's seconds.
		harness.Replace(&mgr, startManager, managerConfig{slowRequeues: true})
		ns := newNamespace()
		p := createProxy(ns, "deleted", crawlv1.ProviderKubernetes)
		key := podKey(p)
		startPod(p, "10.244.1.20")
		waitProxyPhase(ns, "deleted", crawlv1.ProxyReady, 15*time.Second)
		first := waitPod(key)

		// Deleted by someone: marked (it is bound), squid stopped by its
		// kubelet, whose last status write says Succeeded (squid exits 0
		// on SIGTERM), then removed. A terminal pod on its way out is not
		// one gone for good: no replacement under a new name meanwhile.
		Expect(k8sClient.Delete(ctx, first)).To(Succeed())
		Eventually(func() error {
			pod := &corev1.Pod{}
			if err := k8sClient.Get(ctx, key, pod); err != nil {
				return err
			}
			pod.Status.Phase = corev1.PodSucceeded
			for i := range pod.Status.Conditions {
				pod.Status.Conditions[i].Status = corev1.ConditionFalse
			}
			return k8sClient.Status().Update(ctx, pod)
		}).WithTimeout(10 * time.Second).Should(Succeed())
		next := types.NamespacedName{Namespace: ns, Name: kubernetes.PodName(p.Name, string(p.UID), 1)}
		Consistently(func() bool { return podExists(next) }).WithTimeout(2*time.Second).WithPolling(100*time.Millisecond).
			Should(BeFalse(), "a pod being deleted was replaced under a new name")
		kubeletFinishTermination(key)
		Eventually(func(g Gomega) {
			pod := &corev1.Pod{}
			g.Expect(k8sClient.Get(ctx, key, pod)).To(Succeed())
			g.Expect(pod.UID).NotTo(Equal(first.UID))
		}).WithTimeout(15*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(), "the pod was not recreated under its recorded name")

		// Ready again on its replacement.
		schedule(key)
		kubeletRun(key, "10.244.1.21", true)
		Eventually(func(g Gomega) {
			p := getProxy(ns, "deleted")
			g.Expect(p.Status.Phase).To(Equal(crawlv1.ProxyReady), describe(p))
			g.Expect(p.Status.Address).To(Equal("10.244.1.21"))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		deleteProxy(ns, "deleted")
		waitProxyGone(ns, "deleted", 15*time.Second)
		kubeletFinishTermination(key)
	})

	It("releases a Proxy with skip-cleanup and leaves its pod and ConfigMap running", func() {
		ns := newNamespace()
		p := createProxy(ns, "kept", crawlv1.ProviderKubernetes)
		key := podKey(p)
		DeferCleanup(deleteConfigMap, key)
		startPod(p, "10.244.1.8")
		waitProxyPhase(ns, "kept", crawlv1.ProxyReady, 15*time.Second)

		setSkipCleanup(ns, "kept")
		deleteProxy(ns, "kept")
		waitProxyGone(ns, "kept", 15*time.Second)

		pod := &corev1.Pod{}
		Expect(k8sClient.Get(ctx, key, pod)).To(Succeed())
		Expect(pod.DeletionTimestamp).To(BeNil(), "skip-cleanup deleted the pod")
		Expect(pod.Status.Phase).To(Equal(corev1.PodRunning))
		Expect(configMapExists(key)).To(BeTrue(), "skip-cleanup deleted the ConfigMap")
		Eventually(func() []string { return eventReasons(ns, "kept") }).Should(ContainElement("CleanupSkipped"))
	})

	DescribeTable("never deletes a same-named pod of another Proxy, and keeps the Proxy until skip-cleanup",
		func(foreignLabels func(uid string) map[string]string) {
			ns := newNamespace()
			p := createProxy(ns, "contested", crawlv1.ProviderKubernetes)
			key := podKey(p)
			DeferCleanup(deleteConfigMap, key)
			DeferCleanup(deletePodNow, key)
			startPod(p, "10.244.1.9")
			waitProxyPhase(ns, "contested", crawlv1.ProxyReady, 15*time.Second)

			// Someone replaces the pod with their own under the same name.
			otherUID := string(uuid.NewUUID())
			Eventually(func() error {
				deletePodNow(key)
				return k8sClient.Create(ctx, foreignPod(key, foreignLabels(otherUID)))
			}).WithTimeout(10 * time.Second).Should(Succeed())
			foreign := &corev1.Pod{}
			Expect(k8sClient.Get(ctx, key, foreign)).To(Succeed())
			mgr.Wiring.Proxy.MarkDirty(client.ObjectKeyFromObject(p))

			p = waitPhaseReason(ns, "contested", crawlv1.ProxyFailed, crawlv1.ProxyForeignInstanceReason, 15*time.Second)
			Expect(conditions.GetMessage(p, crawlv1.ReadyCondition)).To(ContainSubstring("is not this Proxy's"))

			deleteProxy(ns, "contested")
			expectDeletionBlocked(ns, "contested", crawlv1.ProxyForeignInstanceReason)
			expectUntouched(key, foreign.UID)

			setSkipCleanup(ns, "contested")
			waitProxyGone(ns, "contested", 15*time.Second)
			expectUntouched(key, foreign.UID)
		},
		Entry("labelled as ours but for another proxy-uid", func(uid string) map[string]string {
			return map[string]string{
				kubernetes.LabelManagedBy: kubernetes.ManagedBy,
				kubernetes.LabelTag:       testTag,
				kubernetes.LabelProxyUID:  uid,
				kubernetes.LabelProxyName: "contested",
			}
		}),
		// Outside the manager's label-filtered cache: only an uncached
		// read can see it.
		//
		// Pending: pkg/provider/kubernetes Provider.deleteOne reads through
		// the cached client, which cannot see this pod, takes "not found"
		// for "already gone" and releases the Proxy (the pod itself is not
		// deleted). Make it an Entry once deleteOne reads through
		// Options.APIReader.
		Entry("carrying only its own proxy-uid label", func(uid string) map[string]string {
			return map[string]string{kubernetes.LabelProxyUID: uid}
		}),
	)

	It("sweeps tagged pods whose Proxy is gone and leaves untagged pods and live Proxies' pods alone", func() {
		ns := newNamespace()
		live := createProxy(ns, "live", crawlv1.ProviderKubernetes)
		liveKey := podKey(live)
		startPod(live, "10.244.1.10")
		waitProxyPhase(ns, "live", crawlv1.ProxyReady, 15*time.Second)

		// A Proxy deleted while the operator was down.
		orphanKey := orphanPod(ns, "ghost", string(uuid.NewUUID()), testTag, testInstallID, true)
		// The pod of an earlier Proxy of the live one's name: recreated
		// since, so its UID is not the live Proxy's.
		staleKey := orphanPod(ns, "live", string(uuid.NewUUID()), testTag, testInstallID, false)
		// Another operator install's pod (with our tag or its own), one
		// made before install ids, and one with no tag at all.
		otherInstallKey := orphanPod(ns, "ghost", string(uuid.NewUUID()), testTag, "other-install", false)
		otherTagKey := orphanPod(ns, "ghost", string(uuid.NewUUID()), "other-tag", testInstallID, false)
		noInstallKey := orphanPod(ns, "ghost", string(uuid.NewUUID()), testTag, "", false)
		untaggedKey := orphanPod(ns, "ghost", string(uuid.NewUUID()), "", testInstallID, false)

		deleted := 0
		Eventually(func(g Gomega) {
			n, err := mgr.Wiring.Sweep.Sweep(ctx)
			deleted += n
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(podExists(orphanKey)).To(BeFalse(), "orphan pod not swept")
			g.Expect(podExists(staleKey)).To(BeFalse(), "stale pod not swept")
		}).WithTimeout(15 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		Expect(deleted).To(BeNumerically(">=", 2))
		Expect(configMapExists(orphanKey)).To(BeFalse(), "orphan ConfigMap not swept with its pod")

		for _, k := range []types.NamespacedName{otherInstallKey, otherTagKey, noInstallKey, untaggedKey, liveKey} {
			pod := &corev1.Pod{}
			Expect(k8sClient.Get(ctx, k, pod)).To(Succeed(), "%s swept", k)
			Expect(pod.DeletionTimestamp).To(BeNil(), "%s swept", k)
		}
		Expect(configMapExists(liveKey)).To(BeTrue())
		Expect(getProxy(ns, "live").Status.Phase).To(Equal(crawlv1.ProxyReady))
	})
})

// expectUntouched checks the pod at key is still the one with uid, not
// being deleted.
func expectUntouched(key types.NamespacedName, uid types.UID) {
	pod := &corev1.Pod{}
	Expect(k8sClient.Get(ctx, key, pod)).To(Succeed())
	Expect(pod.UID).To(Equal(uid), "foreign pod replaced")
	Expect(pod.DeletionTimestamp).To(BeNil(), "foreign pod deleted")
}

// orphanPod creates a squid pod as the kubernetes provider labels them, for
// a Proxy named name with uid, carrying tag and install (none if empty),
// optionally with its ConfigMap. Pods left at the end are removed.
func orphanPod(ns, name, uid, tag, install string, withConfigMap bool) types.NamespacedName {
	key := types.NamespacedName{Namespace: ns, Name: kubernetes.ObjectName(name, uid)}
	labels := map[string]string{
		kubernetes.LabelManagedBy: kubernetes.ManagedBy,
		kubernetes.LabelAppName:   kubernetes.AppName,
		kubernetes.LabelProxyUID:  uid,
		kubernetes.LabelProxyName: name,
	}
	if tag != "" {
		labels[kubernetes.LabelTag] = tag
	}
	if install != "" {
		labels[kubernetes.LabelInstall] = install
	}
	meta := metav1.ObjectMeta{
		Namespace: ns, Name: key.Name, Labels: labels,
		Annotations: map[string]string{kubernetes.AnnotationProxyName: name},
	}
	pod := foreignPod(key, labels)
	pod.ObjectMeta = *meta.DeepCopy()
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	DeferCleanup(deletePodNow, key)
	if withConfigMap {
		cm := &corev1.ConfigMap{ObjectMeta: *meta.DeepCopy(), Data: map[string]string{kubernetes.ConfigKey: "http_port 3128\n"}}
		Expect(k8sClient.Create(ctx, cm)).To(Succeed())
		DeferCleanup(deleteConfigMap, key)
	}
	return key
}
