package providers

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/api/compute/v1"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/gcp"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
)

var ctx = context.Background()

// --- Proxies -----------------------------------------------------------

func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "providers-"}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// createProxy creates a Proxy on provider prov and registers its removal:
// deleted, and released with skip-cleanup if its deletion is still blocked.
func createProxy(ns, name string, prov crawlv1.ProviderName) *crawlv1.Proxy {
	p := &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1.ProxySpec{
			Provider:  prov,
			CloudInit: crawlv1.ProxyCloudInit{UserData: "#cloud-config\npackages: [squid]\n"},
			Port:      3128,
		},
	}
	Expect(k8sClient.Create(ctx, p)).To(Succeed())
	if prov == crawlv1.ProviderKubernetes {
		// Registered first, so it runs after removeProxy (cleanups run
		// last-in first-out): with no kubelet, a bound pod's graceful
		// deletion never completes by itself.
		DeferCleanup(kubeletFinishTermination, podKey(p))
	}
	DeferCleanup(removeProxy, ns, name)
	return p
}

// removeProxy deletes a Proxy if it still exists and waits until it is
// gone, forcing it out with skip-cleanup if deletion stays blocked, so one
// spec's Proxies never reconcile (and consume injected faults) in the next.
func removeProxy(ns, name string) {
	key := client.ObjectKey{Namespace: ns, Name: name}
	p := &crawlv1.Proxy{}
	if err := k8sClient.Get(ctx, key, p); apierrors.IsNotFound(err) {
		return
	}
	Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, p))).To(Succeed())
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if apierrors.IsNotFound(k8sClient.Get(ctx, key, &crawlv1.Proxy{})) {
			return
		}
	}
	// Deletion blocked (a foreign instance, a provider that is off):
	// release it without cleanup.
	setSkipCleanup(ns, name)
	waitProxyGone(ns, name, 15*time.Second)
}

func getProxy(ns, name string) *crawlv1.Proxy {
	p := &crawlv1.Proxy{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
	return p
}

func deleteProxy(ns, name string) {
	Expect(k8sClient.Delete(ctx, &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
}

// setSkipCleanup annotates the Proxy so its deletion leaves the instance.
func setSkipCleanup(ns, name string) {
	Eventually(func() error {
		p := &crawlv1.Proxy{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
			return err
		}
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[crawlv1.SkipCleanupAnnotation] = "true"
		return k8sClient.Update(ctx, p)
	}).WithTimeout(10 * time.Second).Should(Succeed())
}

func describe(p *crawlv1.Proxy) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase %q", p.Status.Phase)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, "; %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
	}
	return b.String()
}

func waitProxyPhase(ns, name string, phase crawlv1.ProxyPhase, within time.Duration) *crawlv1.Proxy {
	p := &crawlv1.Proxy{}
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
		g.Expect(p.Status.Phase).To(Equal(phase), describe(p))
	}).WithTimeout(within).WithPolling(100 * time.Millisecond).Should(Succeed())
	return p
}

// waitPhaseReason waits until the Proxy is in phase with Ready for
// reason, both seen in one read: the controller patches conditions and the
// rest of the status in two requests, so either may be seen alone.
func waitPhaseReason(ns, name string, phase crawlv1.ProxyPhase, reason string, within time.Duration) *crawlv1.Proxy {
	p := &crawlv1.Proxy{}
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
		g.Expect(p.Status.Phase).To(Equal(phase), describe(p))
		g.Expect(conditions.GetReason(p, crawlv1.ReadyCondition)).To(Equal(reason), describe(p))
	}).WithTimeout(within).WithPolling(100 * time.Millisecond).Should(Succeed())
	return p
}

func waitProxyGone(ns, name string, within time.Duration) {
	Eventually(func() bool {
		return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &crawlv1.Proxy{}))
	}).WithTimeout(within).WithPolling(100*time.Millisecond).Should(BeTrue(), "Proxy %s/%s still exists", ns, name)
}

// expectDeletionBlocked checks that a deleted Proxy stays, holding its
// finalizer, with DeletionBlocked=True for reason (any if empty), and
// returns it.
func expectDeletionBlocked(ns, name, reason string) *crawlv1.Proxy {
	p := &crawlv1.Proxy{}
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
		g.Expect(conditions.IsTrue(p, crawlv1.DeletionBlockedCondition)).To(BeTrue(), describe(p))
		if reason != "" {
			g.Expect(conditions.GetReason(p, crawlv1.DeletionBlockedCondition)).To(Equal(reason), describe(p))
		}
	}).WithTimeout(15 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	Expect(conditions.GetMessage(p, crawlv1.DeletionBlockedCondition)).To(ContainSubstring(crawlv1.SkipCleanupAnnotation))
	Consistently(func(g Gomega) {
		p := getProxy(ns, name)
		g.Expect(p.DeletionTimestamp.IsZero()).To(BeFalse())
		g.Expect(controllerutil.ContainsFinalizer(p, crawlv1.ProxyFinalizer)).To(BeTrue())
	}).WithTimeout(2 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	return p
}

// eventReasons lists the reasons of the Events recorded for a Proxy.
func eventReasons(ns, name string) []string {
	var list corev1.EventList
	Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "Proxy" && e.InvolvedObject.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

// --- kubernetes: the scheduler's and the kubelet's part ----------------

const nodeName = "envtest-node-1"

func podKey(p *crawlv1.Proxy) types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: kubernetes.ObjectName(p.Name, string(p.UID))}
}

func waitPod(key types.NamespacedName) *corev1.Pod {
	pod := &corev1.Pod{}
	Eventually(func() error { return k8sClient.Get(ctx, key, pod) }).
		WithTimeout(15*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(), "pod %s never created", key)
	return pod
}

// schedule binds the pod to a node, as the scheduler would.
func schedule(key types.NamespacedName) {
	pod := waitPod(key)
	if pod.Spec.NodeName != "" {
		return
	}
	Expect(k8sClient.SubResource("binding").Create(ctx, pod, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Target:     corev1.ObjectReference{Kind: "Node", Name: nodeName},
	})).To(Succeed())
}

// kubeletRun writes the status a kubelet writes for a started squid pod:
// Running with ip, its container ready or (ready=false) running but
// failing its readiness probe.
func kubeletRun(key types.NamespacedName, ip string, ready bool) {
	Eventually(func() error {
		pod := &corev1.Pod{}
		if err := k8sClient.Get(ctx, key, pod); err != nil {
			return err
		}
		now := metav1.Now()
		readyStatus := corev1.ConditionFalse
		if ready {
			readyStatus = corev1.ConditionTrue
		}
		cond := func(t corev1.PodConditionType, s corev1.ConditionStatus) corev1.PodCondition {
			return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: now}
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.HostIP = "192.0.2.1"
		pod.Status.HostIPs = []corev1.HostIP{{IP: "192.0.2.1"}}
		pod.Status.PodIP = ip
		pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		pod.Status.StartTime = &now
		pod.Status.Conditions = []corev1.PodCondition{
			cond(corev1.PodScheduled, corev1.ConditionTrue),
			cond(corev1.PodInitialized, corev1.ConditionTrue),
			cond(corev1.ContainersReady, readyStatus),
			cond(corev1.PodReady, readyStatus),
		}
		c := pod.Spec.Containers[0]
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
			Name:         c.Name,
			Image:        c.Image,
			ImageID:      "docker.io/ubuntu/squid@sha256:" + strings.Repeat("ab", 32),
			ContainerID:  "containerd://" + strings.Repeat("cd", 32),
			Ready:        ready,
			Started:      &ready,
			State:        corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			RestartCount: 0,
		}}
		return k8sClient.Status().Update(ctx, pod)
	}).WithTimeout(10 * time.Second).Should(Succeed())
}

// startPod plays scheduler and kubelet for the Proxy's pod until it is
// ready at ip.
func startPod(p *crawlv1.Proxy, ip string) {
	key := podKey(p)
	schedule(key)
	kubeletRun(key, ip, true)
}

// kubeletFinishTermination removes a terminating pod, as the kubelet does
// once its containers stopped (a pod bound to a node is only marked for
// deletion by the API server).
func kubeletFinishTermination(key types.NamespacedName) {
	pod := &corev1.Pod{}
	if err := k8sClient.Get(ctx, key, pod); apierrors.IsNotFound(err) {
		return
	}
	Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pod, client.GracePeriodSeconds(0)))).To(Succeed())
}

// foreignPod is a squid pod someone else runs.
func foreignPod(key types.NamespacedName, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "squid", Image: "ubuntu/squid:5.2-22.04_beta",
		}}},
	}
}

func podExists(key types.NamespacedName) bool {
	err := k8sClient.Get(ctx, key, &corev1.Pod{})
	if apierrors.IsNotFound(err) {
		return false
	}
	Expect(err).NotTo(HaveOccurred())
	return true
}

func configMapExists(key types.NamespacedName) bool {
	err := k8sClient.Get(ctx, key, &corev1.ConfigMap{})
	if apierrors.IsNotFound(err) {
		return false
	}
	Expect(err).NotTo(HaveOccurred())
	return true
}

// deletePodNow removes a pod at once, whoever's it is (test cleanup).
func deletePodNow(key types.NamespacedName) {
	Expect(client.IgnoreNotFound(k8sClient.Delete(ctx,
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}},
		client.GracePeriodSeconds(0)))).To(Succeed())
}

func deleteConfigMap(key types.NamespacedName) {
	Expect(client.IgnoreNotFound(k8sClient.Delete(ctx,
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}))).To(Succeed())
}

// --- gcp: the Compute fake ---------------------------------------------

func instanceName(p *crawlv1.Proxy) string {
	return gcp.InstanceName(p.Namespace, p.Name, string(p.UID))
}

func instance(name string) (*compute.Instance, bool) {
	return computeFake.Instance(gcpProject, gcpZone, name)
}

// waitInstanceStatus waits until the fake holds the instance in status.
func waitInstanceStatus(name, status string) *compute.Instance {
	var inst *compute.Instance
	Eventually(func(g Gomega) {
		var ok bool
		inst, ok = instance(name)
		g.Expect(ok).To(BeTrue(), "instance %s never inserted", name)
		g.Expect(inst.Status).To(Equal(status))
	}).WithTimeout(15 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	return inst
}

// bootInstance lets the Proxy's instance finish booting with natIP, as
// Compute Engine does once its insert operation is done.
func bootInstance(p *crawlv1.Proxy, natIP string) {
	name := instanceName(p)
	waitInstanceStatus(name, "STAGING")
	Expect(computeFake.SetRunning(gcpProject, gcpZone, name, natIP)).To(Succeed())
}

// drainInsertFaults consumes the insert faults still queued on the fake
// (it has no way to clear them) by calling insert with an empty body until
// the answer is no longer the fault's code.
func drainInsertFaults(code int) {
	url := computeFake.URL() + "/compute/v1/projects/" + gcpProject + "/zones/" + gcpZone + "/instances"
	for range 100 {
		resp, err := computeFake.Client().Post(url, "application/json", strings.NewReader("{}"))
		Expect(err).NotTo(HaveOccurred())
		_ = resp.Body.Close()
		if resp.StatusCode != code {
			Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), "an empty insert is refused once no fault is left")
			return
		}
	}
	Fail("more than 100 insert faults queued")
}

// gcpLabels are the labels the gcp provider of this install writes on an
// instance of a Proxy.
func gcpLabels(tag, ns, name, uid string) map[string]string {
	l := map[string]string{
		gcp.LabelInstall:   testInstallID,
		gcp.LabelManagedBy: gcp.ManagedBy,
		gcp.LabelUID:       gcp.LabelValue(uid),
		gcp.LabelNamespace: gcp.LabelValue(ns),
		gcp.LabelName:      gcp.LabelValue(name),
	}
	if tag != "" {
		l[gcp.LabelTag] = gcp.LabelValue(tag)
	}
	return l
}

// putInstance stores a running instance as someone (or an earlier operator
// run) left it.
func putInstance(name string, labels map[string]string) {
	ns, pn := labels[gcp.LabelNamespace], labels[gcp.LabelName]
	computeFake.PutInstance(gcpProject, gcpZone, &compute.Instance{
		Name:        name,
		MachineType: "zones/" + gcpZone + "/machineTypes/e2-small",
		Labels:      labels,
		Metadata: &compute.Metadata{Items: []*compute.MetadataItems{
			{Key: gcp.MetadataNamespace, Value: &ns},
			{Key: gcp.MetadataName, Value: &pn},
		}},
		NetworkInterfaces: []*compute.NetworkInterface{{
			Network:       "global/networks/default",
			AccessConfigs: []*compute.AccessConfig{{Name: "External NAT", Type: "ONE_TO_ONE_NAT", NatIP: "198.51.100.7"}},
		}},
	})
}

// metadata maps an instance's metadata items by key.
func metadata(items []*compute.MetadataItems) map[string]string {
	out := map[string]string{}
	for _, it := range items {
		if it.Value != nil {
			out[it.Key] = *it.Value
		}
	}
	return out
}

// expectInstanceOf checks the instance exists, running, labelled for uid.
func expectInstanceOf(name, uid string) {
	inst, ok := instance(name)
	Expect(ok).To(BeTrue(), "instance %s deleted", name)
	Expect(inst.Labels).To(HaveKeyWithValue(gcp.LabelUID, gcp.LabelValue(uid)), "instance %s replaced", name)
	Expect(inst.Status).To(Equal("RUNNING"), "instance %s touched", name)
}

// deleteInstance removes an instance a spec left in the fake, through the
// provider's own identity-checked Delete (test cleanup).
func deleteInstance(ns, proxyName, uid, name string) {
	prov, err := fakeGCP(ctx)
	Expect(err).NotTo(HaveOccurred())
	Expect(prov.Delete(ctx, &provider.Machine{
		Namespace: ns, Name: proxyName, UID: uid,
		ProviderID: gcp.FormatProviderID(gcpProject, gcpZone, name),
	})).To(Succeed())
}
