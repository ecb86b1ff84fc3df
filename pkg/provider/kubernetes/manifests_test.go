package kubernetes

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/pkg/provider"
)

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
	if err := c.Get(context.Background(), k, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("unmanaged Proxy got a Secret: %v", err)
	}
	// Its NetworkPolicy is TestUnmanagedProxyGetsTheNetworkPolicy's.
	if err := c.Get(context.Background(), k, &networkingv1.NetworkPolicy{}); err != nil {
		t.Errorf("unmanaged Proxy has no NetworkPolicy: %v", err)
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
	// The ConfigMap as a directory: a subPath mount never follows updates.
	if len(ctr.VolumeMounts) != 2 || ctr.VolumeMounts[0].MountPath != ConfigDir || ctr.VolumeMounts[0].SubPath != "" ||
		!ctr.VolumeMounts[0].ReadOnly || ctr.VolumeMounts[1].MountPath != StateDir {
		t.Errorf("mounts = %+v", ctr.VolumeMounts)
	}
	if v := pod.Spec.Volumes; len(v) != 2 || v[0].ConfigMap == nil || v[0].ConfigMap.Name != k.Name || v[1].EmptyDir == nil {
		t.Errorf("volumes = %+v", v)
	}
	if !slices.Equal(ctr.Command, SquidCommand(ConfigDir)) || !strings.HasSuffix(ctr.Command[2], "exec squid -N -f \"$conf\"\n") || len(ctr.Args) != 0 {
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
