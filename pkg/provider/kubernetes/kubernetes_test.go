package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"crawl.example.com/proxy-operator/pkg/provider"
)

const uid = "0b8e4f7e-3c1a-4d2b-9a55-7e2f6c9d1a01"

func machine() *provider.Machine {
	return &provider.Machine{
		Namespace:   "crawl",
		Name:        "eu-egress",
		UID:         uid,
		Tag:         "prod",
		CPUs:        2,
		MemoryBytes: 512 << 20,
		Port:        3128,
		UserData:    []byte("ignored here"),
	}
}

func newFake(t *testing.T, objs ...client.Object) client.WithWatch {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(objs...).Build()
}

func newProvider(c client.Client) *Provider {
	return New(c, Options{SquidImage: "example.test/squid:6"}).(*Provider)
}

func wantClass(t *testing.T, err error, want provider.ErrorClass) {
	t.Helper()
	if got := provider.Class(err); got != want {
		t.Fatalf("error %v: class %q, want %q", err, got, want)
	}
}

func podKey(m *provider.Machine) types.NamespacedName {
	return types.NamespacedName{Namespace: m.Namespace, Name: ObjectName(m.Name, m.UID)}
}

var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestObjectName(t *testing.T) {
	for _, name := range []string{"a", "eu.egress.1", strings.Repeat("x", 253), "UPPER_case"} {
		n := ObjectName(name, uid)
		if len(n) > 63 || !dns1123.MatchString(n) || !strings.HasPrefix(n, "proxy-") {
			t.Errorf("ObjectName(%q) = %q: not a DNS-1123 label", name, n)
		}
	}
	long := strings.Repeat("x", 100)
	if ObjectName(long, "a") == ObjectName(long, "b") {
		t.Error("same name, different uid: collision")
	}
	// Existing pods are found by these names: they must never change.
	if got := ObjectName("Eu.Egress_1", "u1"); got != "proxy-eu-egress-1-bb82030d" {
		t.Errorf("ObjectName changed: %q", got)
	}
	if got := ObjectName(strings.Repeat("a", 52)+"-b", "u2"); got != "proxy-"+strings.Repeat("a", 48)+"-6ca202c8" {
		t.Errorf("ObjectName changed: %q", got)
	}
	if got := ObjectName("eu-egress", uid); !strings.HasPrefix(got, "proxy-eu-egress-") {
		t.Errorf("ObjectName = %q", got)
	}
}

func TestCreateBuildsObjects(t *testing.T) {
	c := newFake(t)
	p := newProvider(c)
	m := machine()
	inst, err := p.Create(context.Background(), m)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	k := podKey(m)
	if inst.ProviderID != "kubernetes://crawl/"+k.Name || inst.State != provider.StatePending {
		t.Errorf("Create = %+v", inst)
	}

	var pod corev1.Pod
	if err := c.Get(context.Background(), k, &pod); err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), k, &cm); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{&pod, &cm} {
		l := obj.GetLabels()
		want := map[string]string{
			"app.kubernetes.io/managed-by": "proxy-operator",
			"crawl.example.com/tag":        "prod",
			"crawl.example.com/proxy-uid":  uid,
			"crawl.example.com/proxy-name": "eu-egress",
		}
		for k, v := range want {
			if l[k] != v {
				t.Errorf("%T label %s = %q, want %q", obj, k, l[k], v)
			}
		}
		refs := obj.GetOwnerReferences()
		if len(refs) != 1 {
			t.Fatalf("%T owner refs = %+v", obj, refs)
		}
		r := refs[0]
		if r.APIVersion != "crawl.example.com/v1alpha1" || r.Kind != "Proxy" || r.Name != "eu-egress" ||
			r.UID != types.UID(uid) || r.Controller == nil || !*r.Controller || r.BlockOwnerDeletion == nil || !*r.BlockOwnerDeletion {
			t.Errorf("%T owner ref = %+v", obj, r)
		}
	}

	// Unmanaged: the provider's built-in policy, rendered by pkg/squid.
	conf := cm.Data["squid.conf"]
	for _, want := range []string{
		"http_port 3128\n", "cache deny all\n", "acl allowed_sources src 10.0.0.0/8 100.64.0.0/10 172.16.0.0/12 192.168.0.0/16 fc00::/7\n",
		"http_access allow allowed_sources\n", "http_access deny all\n", "pid_filename " + StateDir + "/squid.pid\n",
		"access_log stdio:/dev/stdout\n", "cache_log /dev/stderr\n", "netdb_filename none\n",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("squid.conf lacks %q:\n%s", want, conf)
		}
	}
	if strings.Contains(conf, "auth_param") {
		t.Errorf("unmanaged squid.conf asks for credentials nobody has:\n%s", conf)
	}
	if strings.Index(conf, "http_access deny denied_destinations") > strings.Index(conf, "http_access allow allowed_sources") {
		t.Error("destination deny must precede the client allow")
	}
	for _, obj := range []client.Object{&corev1.Secret{}, &networkingv1.NetworkPolicy{}} {
		if err := c.Get(context.Background(), k, obj); !apierrors.IsNotFound(err) {
			t.Errorf("unmanaged Proxy got a %T: %v", obj, err)
		}
	}

	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("containers = %d", len(pod.Spec.Containers))
	}
	ctr := pod.Spec.Containers[0]
	if ctr.Image != "example.test/squid:6" {
		t.Errorf("image = %s", ctr.Image)
	}
	if len(ctr.Ports) != 1 || ctr.Ports[0].ContainerPort != 3128 {
		t.Errorf("ports = %+v", ctr.Ports)
	}
	rp := ctr.ReadinessProbe
	if rp == nil || rp.TCPSocket == nil || rp.TCPSocket.Port.StrVal != PortName {
		t.Errorf("readiness probe = %+v, want TCP on %s", rp, PortName)
	}
	for _, rl := range []corev1.ResourceList{ctr.Resources.Requests, ctr.Resources.Limits} {
		if q := rl[corev1.ResourceCPU]; q.Cmp(resource.MustParse("2")) != 0 {
			t.Errorf("cpu = %s", q.String())
		}
		if q := rl[corev1.ResourceMemory]; q.Cmp(resource.MustParse("512Mi")) != 0 {
			t.Errorf("memory = %s", q.String())
		}
	}
	if len(ctr.VolumeMounts) != 2 || ctr.VolumeMounts[0].MountPath != ConfigPath || ctr.VolumeMounts[0].SubPath != ConfigKey ||
		!ctr.VolumeMounts[0].ReadOnly || ctr.VolumeMounts[1].MountPath != StateDir {
		t.Errorf("mounts = %+v", ctr.VolumeMounts)
	}
	if v := pod.Spec.Volumes; len(v) != 2 || v[0].ConfigMap == nil || v[0].ConfigMap.Name != k.Name || v[1].EmptyDir == nil {
		t.Errorf("volumes = %+v", v)
	}
	if strings.Join(ctr.Command, " ") != "squid -N -f "+ConfigPath || len(ctr.Args) != 0 {
		t.Errorf("command = %q args %q, want the documented squid command line", ctr.Command, ctr.Args)
	}

	if pod.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		t.Errorf("restart policy = %s", pod.Spec.RestartPolicy)
	}
	if pod.Annotations[AnnotationProxyName] != "eu-egress" {
		t.Errorf("annotations = %v", pod.Annotations)
	}
}

func TestDefaultSquidImageIsPinnedByDigest(t *testing.T) {
	if !regexp.MustCompile(`@sha256:[0-9a-f]{64}$`).MatchString(DefaultSquidImage) {
		t.Errorf("DefaultSquidImage %q is not pinned by digest", DefaultSquidImage)
	}
	pod := New(newFake(t), Options{}).(*Provider).pod(machine(), podKey(machine()), 0, false)
	if got := pod.Spec.Containers[0].Image; got != DefaultSquidImage {
		t.Errorf("image = %q", got)
	}
}

// TestPodMeetsRestrictedPodSecurity checks the rules of the restricted
// Pod Security Standard (k8s.io/pod-security-admission is not in the module
// graph, so the fields are asserted), plus a read-only root whose only
// writable mount is the state emptyDir.
func TestPodMeetsRestrictedPodSecurity(t *testing.T) {
	for _, withPassword := range []bool{false, true} {
		t.Run(fmt.Sprintf("password file %v", withPassword), func(t *testing.T) {
			m := machine()
			podMeetsRestricted(t, newProvider(newFake(t)).pod(m, podKey(m), 0, withPassword))
		})
	}
}

func podMeetsRestricted(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ps := pod.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 {
		t.Fatalf("pod security context %+v: want runAsNonRoot and a non-zero runAsUser", ps)
	}
	if ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccomp = %+v, want RuntimeDefault", ps.SeccompProfile)
	}
	if pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
		t.Error("host namespaces")
	}
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap == nil && v.EmptyDir == nil && v.Secret == nil {
			t.Errorf("volume %s is neither a ConfigMap, a Secret nor an emptyDir", v.Name)
		}
	}
	for _, c := range pod.Spec.Containers {
		sc := c.SecurityContext
		if sc == nil {
			t.Fatalf("container %s has no security context", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation must be false", c.Name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s: privileged", c.Name)
		}
		if sc.Capabilities == nil || len(sc.Capabilities.Add) != 0 || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("%s: capabilities %+v, want drop [ALL] and nothing added", c.Name, sc.Capabilities)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 || sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot {
			t.Errorf("%s: overrides the pod to root", c.Name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: root filesystem is writable", c.Name)
		}
		for _, vm := range c.VolumeMounts {
			if !vm.ReadOnly && vm.MountPath != StateDir {
				t.Errorf("%s: writable mount %s besides %s", c.Name, vm.MountPath, StateDir)
			}
		}
		for _, p := range c.Ports {
			if p.ContainerPort < 1024 {
				t.Errorf("%s: port %d needs a privilege squid does not have", c.Name, p.ContainerPort)
			}
		}
	}
}

// A pool's pods prefer distinct nodes, counted among their own group only;
// a Proxy of no pool gets no constraint.
func TestPodsOfAGroupSpreadOverNodes(t *testing.T) {
	long := strings.Repeat("pool-", 20) + "a"
	for _, tc := range []struct {
		name, group, label string
	}{
		{"no pool", "", ""},
		{"a pool", "crawl-a", "crawl-a"},
		{"a pool name longer than a label value", long, provider.DNSLabel(long, provider.UIDSuffix(long), 63)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFake(t)
			m := machine()
			m.SpreadGroup = tc.group
			if _, err := newProvider(c).Create(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			var pod corev1.Pod
			if err := c.Get(context.Background(), podKey(m), &pod); err != nil {
				t.Fatal(err)
			}
			got, ok := pod.Labels[LabelSpreadGroup]
			if tc.group == "" {
				if ok || len(pod.Spec.TopologySpreadConstraints) != 0 {
					t.Fatalf("label %q, constraints %+v; want none", got, pod.Spec.TopologySpreadConstraints)
				}
				return
			}
			if got != tc.label || len(got) > 63 {
				t.Fatalf("label %q, want %q", got, tc.label)
			}
			want := []corev1.TopologySpreadConstraint{{
				MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.ScheduleAnyway,
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy, LabelSpreadGroup: tc.label}},
			}}
			if !equality.Semantic.DeepEqual(pod.Spec.TopologySpreadConstraints, want) {
				t.Fatalf("constraints %+v\nwant %+v", pod.Spec.TopologySpreadConstraints, want)
			}
			sel, err := metav1.LabelSelectorAsSelector(want[0].LabelSelector)
			if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
				t.Fatalf("the constraint's selector does not select the pod itself: %v", err)
			}
			var cm corev1.ConfigMap
			if err := c.Get(context.Background(), configKey(m), &cm); err != nil || cm.Labels[LabelSpreadGroup] != "" {
				t.Fatalf("ConfigMap labels %v, %v: only pods spread", cm.Labels, err)
			}
		})
	}
}

func TestNoResourcesWhenUnset(t *testing.T) {
	c := newFake(t)
	m := machine()
	m.CPUs, m.MemoryBytes, m.Port = 0, 0, 0
	if _, err := newProvider(c).Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := c.Get(context.Background(), podKey(m), &pod); err != nil {
		t.Fatal(err)
	}
	ctr := pod.Spec.Containers[0]
	if len(ctr.Resources.Requests) != 0 || len(ctr.Resources.Limits) != 0 {
		t.Errorf("resources = %+v, want none", ctr.Resources)
	}
	if ctr.Ports[0].ContainerPort != DefaultPort {
		t.Errorf("port = %d, want default %d", ctr.Ports[0].ContainerPort, DefaultPort)
	}
}

func TestCreateTwiceIsIdempotent(t *testing.T) {
	c := newFake(t)
	p := newProvider(c)
	m := machine()
	a, err := p.Create(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	m.ProviderID = a.ProviderID
	b, err := p.Create(context.Background(), m)
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if a.ProviderID != b.ProviderID {
		t.Errorf("provider IDs differ: %s / %s", a.ProviderID, b.ProviderID)
	}
	var pods corev1.PodList
	var cms corev1.ConfigMapList
	if err := c.List(context.Background(), &pods); err != nil {
		t.Fatal(err)
	}
	if err := c.List(context.Background(), &cms); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || len(cms.Items) != 1 {
		t.Errorf("%d pods, %d configmaps; want 1 each", len(pods.Items), len(cms.Items))
	}
}

func TestGetPhaseMapping(t *testing.T) {
	ready := func(s corev1.ConditionStatus) []corev1.PodCondition {
		return []corev1.PodCondition{{Type: corev1.PodReady, Status: s}}
	}
	for _, tc := range []struct {
		name     string
		status   corev1.PodStatus
		deleting bool
		want     provider.State
		addr     string
		msg      string
	}{
		{name: "new", status: corev1.PodStatus{}, want: provider.StatePending, msg: "not scheduled"},
		{name: "pending", status: corev1.PodStatus{Phase: corev1.PodPending}, want: provider.StatePending},
		{name: "unschedulable", status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available: 3 Insufficient cpu.",
		}}}, want: provider.StatePending, msg: "Insufficient cpu"},
		{name: "image pull", status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "squid", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}},
		}}}, want: provider.StatePending, msg: "ImagePullBackOff"},
		{name: "running ready", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionTrue)},
			want: provider.StateRunning, addr: "10.1.2.3"},
		{name: "running ready dual-stack", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "fd00::5",
			PodIPs: []corev1.PodIP{{IP: "fd00::5"}, {IP: "10.1.2.4"}}, Conditions: ready(corev1.ConditionTrue)},
			want: provider.StateRunning, addr: "10.1.2.4"},
		{name: "running not ready", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionFalse)},
			want: provider.StatePending, msg: "readiness probe not passing"},
		{name: "crash loop", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionFalse),
			ContainerStatuses: []corev1.ContainerStatus{{Name: "squid", RestartCount: 4, State: corev1.ContainerState{
				Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}},
			want: provider.StatePending, msg: "CrashLoopBackOff"},
		{name: "crash loop after OOM kill", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionFalse),
			ContainerStatuses: []corev1.ContainerStatus{{Name: "squid", RestartCount: 3,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}},
			want: provider.StatePending, msg: "container squid: CrashLoopBackOff; 3 restarts, last exit: OOMKilled (exit code 137)"},
		{name: "restarted, not ready yet", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionFalse),
			ContainerStatuses: []corev1.ContainerStatus{{Name: "squid", RestartCount: 1,
				State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1, Message: "FATAL: Bungled squid.conf"}}}}},
			want: provider.StatePending, msg: "readiness probe not passing: container squid: 1 restarts, last exit: Error (exit code 1): FATAL: Bungled squid.conf"},
		{name: "running ready after restarts", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionTrue),
			ContainerStatuses: []corev1.ContainerStatus{{Name: "squid", RestartCount: 2, Ready: true,
				State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}},
			want: provider.StateRunning, addr: "10.1.2.3", msg: "2 restarts, last exit: OOMKilled (exit code 137)"},
		{name: "unknown", status: corev1.PodStatus{Phase: corev1.PodUnknown}, want: provider.StateUnknown},
		{name: "terminating", status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: ready(corev1.ConditionTrue), PodIP: "10.1.2.3"},
			deleting: true, want: provider.StateDeleting},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := machine()
			p0 := newProvider(newFake(t))
			pod := p0.pod(m, podKey(m), 0, false)
			pod.Status = tc.status
			if tc.deleting {
				now := metav1.Now()
				pod.DeletionTimestamp = &now
				pod.Finalizers = []string{"test/keep"}
			}
			p := newProvider(newFake(t, pod))
			inst, err := p.Get(context.Background(), m)
			if err != nil {
				t.Fatal(err)
			}
			if inst.State != tc.want || inst.Address != tc.addr || !strings.Contains(inst.Message, tc.msg) {
				t.Errorf("Get = %+v; want state %s addr %q message ~%q", inst, tc.want, tc.addr, tc.msg)
			}
			if tc.addr != "" && inst.AddressSource != provider.AddressSourcePod {
				t.Errorf("address source = %q", inst.AddressSource)
			}
			if inst.Owner != (provider.Owner{Namespace: "crawl", Name: "eu-egress", UID: uid}) {
				t.Errorf("owner = %+v", inst.Owner)
			}
		})
	}

	t.Run("missing", func(t *testing.T) {
		_, err := newProvider(newFake(t)).Get(context.Background(), machine())
		wantClass(t, err, provider.ClassNotFound)
	})
}

func notReadyNode(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown",
		}}},
	}
}

// replaced checks that the Proxy's pod was written off and replaced under a
// new name that keeps the identity rule, and that Get, Create and Delete
// agree on the replacement.
func replaced(t *testing.T, c client.Client, p *Provider, m *provider.Machine, old string) {
	t.Helper()
	ctx := context.Background()
	recorded := *m
	recorded.ProviderID = FormatProviderID(m.Namespace, old)
	_, err := p.Get(ctx, &recorded)
	wantClass(t, err, provider.ClassNotFound)

	// The controller forgets the provider ID and creates again.
	inst, err := p.Create(ctx, m)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	want := PodName(m.Name, m.UID, 1)
	if inst.Name != want || want == old || inst.State != provider.StatePending {
		t.Fatalf("Create = %+v, want a Pending pod %s", inst, want)
	}
	var pod corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: want}, &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Labels[LabelProxyUID] != m.UID || pod.Annotations[AnnotationIncarnation] != "1" ||
		pod.Spec.Volumes[0].ConfigMap.Name != ObjectName(m.Name, m.UID) {
		t.Errorf("replacement pod: labels %v annotations %v volumes %+v", pod.Labels, pod.Annotations, pod.Spec.Volumes)
	}
	if got, err := p.Get(ctx, m); err != nil || got.Name != want {
		t.Errorf("Get without provider ID = %+v, %v; want the replacement", got, err)
	}
	if again, err := p.Create(ctx, m); err != nil || again.Name != want {
		t.Errorf("second Create = %+v, %v; want the same replacement", again, err)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(m.Namespace)); err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp == nil {
			live++
		}
	}
	if live != 1 {
		t.Errorf("%d live pods, want 1", live)
	}

	byID := *m
	byID.ProviderID = inst.ProviderID
	if err := p.Delete(ctx, &byID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := c.List(ctx, &pods, client.InNamespace(m.Namespace)); err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp == nil {
			t.Errorf("pod %s left after Delete", pod.Name)
		}
	}
}

func TestEvictedPodIsReplacedUnderANewName(t *testing.T) {
	for _, phase := range []corev1.PodPhase{corev1.PodFailed, corev1.PodSucceeded} {
		t.Run(string(phase), func(t *testing.T) {
			m := machine()
			pod := newProvider(newFake(t)).pod(m, podKey(m), 0, false)
			pod.Status = corev1.PodStatus{Phase: phase, Reason: "Evicted", Message: "The node was low on resource: memory."}
			c := newFake(t, pod)
			p := newProvider(c)
			replaced(t, c, p, m, pod.Name)
			// Written off and not deleting yet: Create deleted it.
			if err := c.Get(context.Background(), podKey(m), &corev1.Pod{}); !apierrors.IsNotFound(err) {
				t.Errorf("evicted pod after replacement: %v", err)
			}
		})
	}
}

func TestPodStuckTerminatingOnNotReadyNodeIsReplaced(t *testing.T) {
	m := machine()
	pod := newProvider(newFake(t)).pod(m, podKey(m), 0, false)
	pod.Spec.NodeName = "node-a"
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	since := metav1.NewTime(time.Now().Add(-DefaultStuckDeletionAfter - time.Minute))
	pod.DeletionTimestamp, pod.Finalizers = &since, []string{"test/keep"}
	c := newFake(t, pod, notReadyNode("node-a"))
	p := newProvider(c)
	replaced(t, c, p, m, pod.Name)
	// Not force-deleted: the node may be partitioned, not dead.
	if err := c.Get(context.Background(), podKey(m), &corev1.Pod{}); err != nil {
		t.Errorf("stuck pod: %v", err)
	}
}

func TestTerminatingPodIsNotWrittenOffEarly(t *testing.T) {
	ready := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	long := metav1.NewTime(time.Now().Add(-time.Hour))
	recent := metav1.Now()
	for _, tc := range []struct {
		name  string
		since metav1.Time
		node  *corev1.Node
	}{
		{"long past, node Ready", long, ready},
		{"recent, node NotReady", recent, notReadyNode("node-a")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := machine()
			pod := newProvider(newFake(t)).pod(m, podKey(m), 0, false)
			pod.Spec.NodeName = "node-a"
			pod.DeletionTimestamp, pod.Finalizers = &tc.since, []string{"test/keep"}
			p := newProvider(newFake(t, pod, tc.node))
			inst, err := p.Get(context.Background(), m)
			if err != nil || inst.State != provider.StateDeleting {
				t.Fatalf("Get = %+v, %v; want Deleting", inst, err)
			}
			_, err = p.Create(context.Background(), m)
			wantClass(t, err, provider.ClassTransient)
		})
	}
}

func TestCreateOnTerminatingPodIsTransient(t *testing.T) {
	m := machine()
	pod := newProvider(newFake(t)).pod(m, podKey(m), 0, false)
	now := metav1.Now()
	pod.DeletionTimestamp, pod.Finalizers = &now, []string{"test/keep"}
	_, err := newProvider(newFake(t, pod)).Create(context.Background(), m)
	wantClass(t, err, provider.ClassTransient)
}

func TestDeleteIsIdempotent(t *testing.T) {
	c := newFake(t)
	p := newProvider(c)
	m := machine()
	if _, err := p.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(context.Background(), m); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	k := podKey(m)
	if err := c.Get(context.Background(), k, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod after Delete: %v", err)
	}
	if err := c.Get(context.Background(), k, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("configmap after Delete: %v", err)
	}
	if err := p.Delete(context.Background(), m); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	_, err := p.Get(context.Background(), m)
	wantClass(t, err, provider.ClassNotFound)
}

func TestForeignObjectsAreNeverDeleted(t *testing.T) {
	m := machine()
	k := podKey(m)
	foreignLabels := map[string]string{LabelProxyUID: "some-other-uid", LabelManagedBy: ManagedBy}
	for _, tc := range []struct {
		name string
		objs []client.Object
	}{
		{"pod with other uid", []client.Object{
			&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace, Labels: foreignLabels}},
		}},
		{"unlabelled pod", []client.Object{
			&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace}},
		}},
		{"configmap with other uid", []client.Object{
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace, Labels: foreignLabels}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFake(t, tc.objs...)
			p := newProvider(c)
			var ie *provider.IdentityError
			_, err := p.Create(context.Background(), m)
			if !errors.As(err, &ie) || !errors.Is(err, provider.ErrPermanent) {
				t.Fatalf("Create: %v, want permanent IdentityError", err)
			}
			if err := p.Delete(context.Background(), m); !errors.As(err, &ie) {
				t.Fatalf("Delete: %v, want IdentityError", err)
			}
			if _, isPod := tc.objs[0].(*corev1.Pod); isPod {
				if _, err := p.Get(context.Background(), m); !errors.As(err, &ie) {
					t.Fatalf("Get: %v, want IdentityError", err)
				}
			}
			for _, obj := range tc.objs {
				if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object)); err != nil {
					t.Fatalf("foreign %T was removed: %v", obj, err)
				}
			}
		})
	}
}

func TestRecordedProviderID(t *testing.T) {
	c := newFake(t)
	p := newProvider(c)
	m := machine()
	m.ProviderID = "kubernetes://crawl/legacy-pod"
	inst, err := p.Create(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Name != "legacy-pod" {
		t.Errorf("recorded pod name not used: %+v", inst)
	}
	m.ProviderID = "kubernetes://elsewhere/legacy-pod"
	_, err = p.Get(context.Background(), m)
	wantClass(t, err, provider.ClassPermanent)
	m.ProviderID = "gce://p/z/n"
	_, err = p.Get(context.Background(), m)
	wantClass(t, err, provider.ClassPermanent)
}

func TestListByTag(t *testing.T) {
	c := newFake(t)
	p := newProvider(c)
	a := machine()
	b := machine()
	b.Namespace, b.Name, b.UID = "other-ns", "b.dotted", "11111111-2222-3333-4444-555555555555"
	staging := machine()
	staging.Name, staging.UID, staging.Tag = "staging", "99999999-2222-3333-4444-555555555555", "staging"
	for _, m := range []*provider.Machine{a, b, staging} {
		if _, err := p.Create(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	untagged := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "crawl", Labels: map[string]string{"app": "x"}}}
	notOurs := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "imposter", Namespace: "crawl", Labels: map[string]string{LabelTag: "prod"}}}
	for _, o := range []client.Object{untagged, notOurs} {
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}

	got, err := p.ListByTag(context.Background(), "prod")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("ListByTag = %+v, want 2", got)
	}
	want := map[provider.Owner]bool{
		{Namespace: "crawl", Name: "eu-egress", UID: a.UID}:   true,
		{Namespace: "other-ns", Name: "b.dotted", UID: b.UID}: true,
	}
	for _, i := range got {
		if !want[i.Owner] {
			t.Errorf("unexpected owner %+v", i.Owner)
		}
	}
	_, err = p.ListByTag(context.Background(), "not a label value!")
	wantClass(t, err, provider.ClassPermanent)
}

func TestCheck(t *testing.T) {
	if err := newProvider(newFake(t)).Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("RBAC: no list"))
		},
	}).Build()
	wantClass(t, newProvider(c).Check(context.Background()), provider.ClassPermanent)
}

func TestErrorClassification(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		name string
		err  error
		want provider.ErrorClass
	}{
		{"forbidden", apierrors.NewForbidden(gr, "x", errors.New("exceeded quota")), provider.ClassPermanent},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "x", field.ErrorList{field.Required(field.NewPath("spec"), "")}), provider.ClassPermanent},
		{"bad request", apierrors.NewBadRequest("nope"), provider.ClassPermanent},
		{"unauthorized", apierrors.NewUnauthorized("who"), provider.ClassPermanent},
		{"conflict", apierrors.NewConflict(gr, "x", errors.New("changed")), provider.ClassTransient},
		{"server timeout", apierrors.NewServerTimeout(gr, "create", 1), provider.ClassTransient},
		{"timeout", apierrors.NewTimeoutError("slow", 1), provider.ClassTransient},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), provider.ClassTransient},
		{"internal", apierrors.NewInternalError(errors.New("etcd")), provider.ClassTransient},
		{"unavailable", apierrors.NewServiceUnavailable("down"), provider.ClassTransient},
		{"not found", apierrors.NewNotFound(gr, "x"), provider.ClassNotFound},
		{"network", errors.New("dial tcp: connection refused"), provider.ClassTransient},
		{"deadline", context.DeadlineExceeded, provider.ClassTransient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
				Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return tc.err },
			}).Build()
			_, err := newProvider(c).Create(context.Background(), machine())
			wantClass(t, err, tc.want)
		})
	}

	t.Run("already exists but unreadable (cache lag)", func(t *testing.T) {
		c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
			Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
				return apierrors.NewAlreadyExists(schema.GroupResource{Resource: "configmaps"}, obj.GetName())
			},
		}).Build()
		_, err := newProvider(c).Create(context.Background(), machine())
		wantClass(t, err, provider.ClassTransient)
	})

	t.Run("delete refused", func(t *testing.T) {
		m := machine()
		base := newFake(t)
		if _, err := newProvider(base).Create(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		c := interceptor.NewClient(base, interceptor.Funcs{
			Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error {
				return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "x", errors.New("uid precondition failed"))
			},
		})
		wantClass(t, newProvider(c).Delete(context.Background(), m), provider.ClassTransient)
	})
}

func TestAPIReaderUsedOnAlreadyExists(t *testing.T) {
	m := machine()
	k := podKey(m)
	// The cache (client) cannot see the foreign pod; the API reader can.
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace}}
	apiReader := newFake(t, foreign)
	cached := interceptor.NewClient(newFake(t), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Pod); ok {
				return apierrors.NewAlreadyExists(schema.GroupResource{Resource: "pods"}, obj.GetName())
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	p := New(cached, Options{APIReader: apiReader})
	_, err := p.Create(context.Background(), m)
	var ie *provider.IdentityError
	if !errors.As(err, &ie) {
		t.Fatalf("Create: %v, want IdentityError read through the API reader", err)
	}
}

func TestInvalidMachine(t *testing.T) {
	p := newProvider(newFake(t))
	for name, mut := range map[string]func(*provider.Machine){
		"no uid":    func(m *provider.Machine) { m.UID = "" },
		"bad tag":   func(m *provider.Machine) { m.Tag = "no spaces allowed" },
		"bad port":  func(m *provider.Machine) { m.Port = 70000 },
		"low port":  func(m *provider.Machine) { m.Port = 80 },
		"neg cpus":  func(m *provider.Machine) { m.CPUs = -1 },
		"no name":   func(m *provider.Machine) { m.Name = "" },
		"bad recid": func(m *provider.Machine) { m.ProviderID = "kubernetes://" },
	} {
		t.Run(name, func(t *testing.T) {
			m := machine()
			mut(m)
			_, err := p.Create(context.Background(), m)
			wantClass(t, err, provider.ClassPermanent)
		})
	}
}

// Two installs in one cluster (--install-id) list only their own pods, and
// pods made before install ids (no label) are nobody's to collect.
func TestListByTagReturnsOnlyThisInstall(t *testing.T) {
	c := newFake(t)
	mine := New(c, Options{InstallID: "install-a"}).(*Provider)
	theirs := New(c, Options{InstallID: "install-b"}).(*Provider)
	legacy := New(c, Options{}).(*Provider)
	a, b, old := machine(), machine(), machine()
	b.Name, b.UID = "b", "11111111-2222-3333-4444-555555555555"
	old.Name, old.UID = "old", "99999999-2222-3333-4444-555555555555"
	for p, m := range map[*Provider]*provider.Machine{mine: a, theirs: b, legacy: old} {
		if _, err := p.Create(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	got, err := mine.ListByTag(context.Background(), "prod")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Owner.UID != a.UID || got[0].InstallID != "install-a" {
		t.Fatalf("ListByTag = %+v, want only %s of install-a", got, a.UID)
	}
	pod := &corev1.Pod{}
	if err := c.Get(context.Background(), podKey(a), pod); err != nil || pod.Labels[LabelInstall] != "install-a" {
		t.Fatalf("pod labels %v, %v; want %s=install-a", pod.Labels, err, LabelInstall)
	}
	cm := &corev1.ConfigMap{}
	if err := c.Get(context.Background(), podKey(a), cm); err != nil || cm.Labels[LabelInstall] != "install-a" {
		t.Fatalf("configmap labels %v, %v; want %s=install-a", cm.Labels, err, LabelInstall)
	}
}
