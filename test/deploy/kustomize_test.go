package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

const (
	installNamespace = "proxy-operator-system"
	namePrefix       = "proxy-operator-"
	managerContainer = "manager"
	kvmSSHSecret     = "kvm-ssh"
	kvmSSHDir        = "/etc/kvm-ssh" // main.go's --ssh-key-dir default
	probePort        = 8081           // main.go's --health-probe-bind-address default
	metricsPort      = 8443           // main.go's --metrics-bind-address default
)

// TestEveryKustomizationBuilds renders every kustomization under config/,
// and pins the set so that a layer cannot disappear unnoticed.
func TestEveryKustomizationBuilds(t *testing.T) {
	dirs := kustomizationDirs(t)
	for _, want := range []string{
		"config/certmanager", "config/certs-selfsigned", "config/crd", "config/default",
		"config/manager", "config/namespaced", "config/prometheus", "config/rbac",
		"config/samples", "config/webhook",
	} {
		if !slices.Contains(dirs, want) {
			t.Errorf("no kustomization in %s (found %v)", want, dirs)
		}
	}
	for _, dir := range dirs {
		t.Run(dir, func(t *testing.T) {
			if objs := kustomizeBuild(t, dir); len(objs) == 0 {
				t.Errorf("%s renders no objects", dir)
			}
		})
	}
}

// TestManagerDeployment checks the manager Deployment as config/manager
// defines it and as config/default and config/certs-selfsigned install it.
func TestManagerDeployment(t *testing.T) {
	for _, dir := range []string{"config/manager", "config/default", "config/namespaced", selfSignedDir} {
		t.Run(dir, func(t *testing.T) {
			d := managerDeployment(t, kustomizeBuild(t, dir))
			for _, p := range managerProblems(d) {
				t.Error(p)
			}
		})
	}
}

// TestManagerProblemsDetectsRegressions proves each check can fail: every
// mutation of the real Deployment must be reported.
func TestManagerProblemsDetectsRegressions(t *testing.T) {
	base := managerDeployment(t, kustomizeBuild(t, "config/default"))
	if p := managerProblems(base); len(p) != 0 {
		t.Fatalf("base Deployment already has problems: %v", p)
	}
	mutations := map[string]func(d *appsv1.Deployment){
		"runs as root": func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.SecurityContext.RunAsNonRoot = nil
			managerOf(d).SecurityContext.RunAsNonRoot = nil
		},
		"writable root filesystem": func(d *appsv1.Deployment) {
			managerOf(d).SecurityContext.ReadOnlyRootFilesystem = ptr.To(false)
		},
		"privilege escalation": func(d *appsv1.Deployment) {
			managerOf(d).SecurityContext.AllowPrivilegeEscalation = nil
		},
		"capabilities kept": func(d *appsv1.Deployment) {
			managerOf(d).SecurityContext.Capabilities.Drop = nil
		},
		"capability added": func(d *appsv1.Deployment) {
			managerOf(d).SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		},
		"no seccomp profile": func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.SecurityContext.SeccompProfile = nil
		},
		"tmp without size limit": func(d *appsv1.Deployment) {
			volume(d, "tmp").EmptyDir.SizeLimit = nil
		},
		"tmp too large": func(d *appsv1.Deployment) {
			volume(d, "tmp").EmptyDir.SizeLimit = ptr.To(resource.MustParse("1Gi"))
		},
		"tmp not mounted": func(d *appsv1.Deployment) {
			c := managerOf(d)
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/tmp" })
		},
		"kvm-ssh required": func(d *appsv1.Deployment) {
			volume(d, "kvm-ssh").Secret.Optional = ptr.To(false)
		},
		"kvm-ssh elsewhere": func(d *appsv1.Deployment) {
			for i := range managerOf(d).VolumeMounts {
				if m := &managerOf(d).VolumeMounts[i]; m.MountPath == kvmSSHDir {
					m.MountPath = "/ssh"
				}
			}
		},
		"no leader election": func(d *appsv1.Deployment) {
			c := managerOf(d)
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--leader-elect") })
		},
		"liveness on the wrong path": func(d *appsv1.Deployment) {
			managerOf(d).LivenessProbe.HTTPGet.Path = "/readyz"
		},
		"no readiness probe": func(d *appsv1.Deployment) {
			managerOf(d).ReadinessProbe = nil
		},
		"plain-HTTP metrics": func(d *appsv1.Deployment) {
			managerOf(d).Args = append(managerOf(d).Args, "--metrics-secure=false")
		},
		"metrics on another port": func(d *appsv1.Deployment) {
			c := managerOf(d)
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--metrics-bind-address") })
			c.Args = append(c.Args, "--metrics-bind-address=:8080")
		},
	}
	for name, mutate := range mutations {
		t.Run(name, func(t *testing.T) {
			d := base.DeepCopy()
			mutate(d)
			if p := managerProblems(d); len(p) == 0 {
				t.Errorf("mutation %q went unnoticed", name)
			}
		})
	}
}

// TestDefaultWiring checks how config/default ties the layers together:
// names and namespace, the webhook Service, certificate and CA injection,
// the manager's RBAC, and that the optional ServiceMonitor stays out.
func TestDefaultWiring(t *testing.T) {
	objs := kustomizeBuild(t, "config/default")

	for _, o := range objs {
		switch o.GetKind() {
		case "CustomResourceDefinition":
			if !strings.HasSuffix(o.GetName(), ".crawl.example.com") {
				t.Errorf("unexpected CRD %s", o.GetName())
			}
		case "Namespace":
			if o.GetName() != installNamespace {
				t.Errorf("Namespace %s, want %s", o.GetName(), installNamespace)
			}
		case "ServiceMonitor":
			t.Errorf("config/default includes ServiceMonitor %s; it is optional (config/prometheus)", o.GetName())
		default:
			if !strings.HasPrefix(o.GetName(), namePrefix) {
				t.Errorf("%s %s lacks the name prefix %q", o.GetKind(), o.GetName(), namePrefix)
			}
			if isNamespaced(o) && o.GetNamespace() != installNamespace {
				t.Errorf("%s %s in namespace %q, want %q", o.GetKind(), o.GetName(), o.GetNamespace(), installNamespace)
			}
		}
	}
	// Proxy, ProxyPool, ProxyBan, KVMHost, KVMImage.
	if n := len(find(objs, "CustomResourceDefinition", "")); n != 5 {
		t.Errorf("%d CRDs, want 5", n)
	}

	d := managerDeployment(t, objs)
	pod := d.Spec.Template.Spec
	c := managerOf(d)

	// Webhook Service → manager port 9443 → serving cert from cert-manager.
	svc := one(t, objs, "Service", namePrefix+"webhook-service")
	if got, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports"); len(got) != 1 ||
		fmt.Sprint(got[0].(map[string]any)["targetPort"]) != "9443" {
		t.Errorf("webhook Service ports %v, want one targeting 9443", got)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == 9443 }) {
		t.Errorf("manager does not declare the webhook port 9443: %v", c.Ports)
	}
	cert := one(t, objs, "Certificate", namePrefix+"serving-cert")
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	wantDNS := []string{
		svc.GetName() + "." + installNamespace + ".svc",
		svc.GetName() + "." + installNamespace + ".svc.cluster.local",
	}
	if !slices.Equal(dnsNames, wantDNS) {
		t.Errorf("Certificate dnsNames %v, want %v", dnsNames, wantDNS)
	}
	if ref, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name"); len(find(objs, "Issuer", ref)) != 1 {
		t.Errorf("Certificate issuerRef %q names no Issuer of the install", ref)
	}
	certSecret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	certDir := flagValue(c.Args, "--webhook-cert-dir")
	if certDir == "" {
		t.Errorf("manager has no --webhook-cert-dir (args %v)", c.Args)
	}
	if v := volumeMountedAt(pod, c, certDir); v == nil || v.Secret == nil || v.Secret.SecretName != certSecret {
		t.Errorf("--webhook-cert-dir %q is not a mount of Secret %q (the Certificate's secretName)", certDir, certSecret)
	}
	wantCA := installNamespace + "/" + cert.GetName()
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		whc := one(t, objs, kind, "")
		if got := whc.GetAnnotations()["cert-manager.io/inject-ca-from"]; got != wantCA {
			t.Errorf("%s inject-ca-from %q, want %q", kind, got, wantCA)
		}
		hooks, _, _ := unstructured.NestedSlice(whc.Object, "webhooks")
		// ProxyPool is validated, not defaulted.
		if want := map[string]int{"MutatingWebhookConfiguration": 3, "ValidatingWebhookConfiguration": 4}[kind]; len(hooks) != want {
			t.Errorf("%s has %d webhooks, want %d", kind, len(hooks), want)
		}
		for _, h := range hooks {
			ref, _, _ := unstructured.NestedStringMap(h.(map[string]any), "clientConfig", "service")
			if ref["name"] != svc.GetName() || ref["namespace"] != installNamespace {
				t.Errorf("%s webhook points at Service %s/%s, want %s/%s", kind, ref["namespace"], ref["name"], installNamespace, svc.GetName())
			}
		}
	}

	// RBAC: the manager's ServiceAccount gets the generated ClusterRole and
	// the leader-election Role.
	one(t, objs, "ServiceAccount", pod.ServiceAccountName)
	for _, b := range []struct{ kind, name, role string }{
		{"ClusterRoleBinding", namePrefix + "manager-rolebinding", namePrefix + "manager-role"},
		{"RoleBinding", namePrefix + "leader-election-rolebinding", namePrefix + "leader-election-role"},
		{"ClusterRoleBinding", namePrefix + "metrics-auth-rolebinding", namePrefix + "metrics-auth-role"},
		{"RoleBinding", namePrefix + "manager-secrets-rolebinding", namePrefix + "manager-role"},
	} {
		o := one(t, objs, b.kind, b.name)
		role, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		if role != b.role || len(subjects) != 1 ||
			subjects[0].(map[string]any)["name"] != pod.ServiceAccountName ||
			subjects[0].(map[string]any)["namespace"] != installNamespace {
			t.Errorf("%s %s binds %v to %s, want %s/%s to %s", b.kind, b.name, subjects, role, installNamespace, pod.ServiceAccountName, b.role)
		}
	}
	generated := kustomizeBuild(t, "config/rbac")
	wantRules, _, _ := unstructured.NestedSlice(one(t, generated, "ClusterRole", "manager-role").Object, "rules")
	gotRules, _, _ := unstructured.NestedSlice(one(t, objs, "ClusterRole", namePrefix+"manager-role").Object, "rules")
	if fmt.Sprint(gotRules) != fmt.Sprint(wantRules) || len(wantRules) == 0 {
		t.Errorf("installed manager ClusterRole rules differ from config/rbac/role.yaml")
	}
	if flagValue(c.Args, "--metrics-bind-address") == "" {
		t.Errorf("manager has no --metrics-bind-address (args %v)", c.Args)
	}
}

// managerProblems lists every way d falls short of what the install
// promises. It is the test's one source of truth, so that
// TestManagerProblemsDetectsRegressions can prove each check fires.
func managerProblems(d *appsv1.Deployment) []string {
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	pod := d.Spec.Template.Spec
	c := managerOf(d)
	if c == nil {
		return []string{"no manager container"}
	}
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	csc := c.SecurityContext
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}

	// Security: a container setting wins over the pod's.
	if nonRoot := firstNonNil(csc.RunAsNonRoot, psc.RunAsNonRoot); nonRoot == nil || !*nonRoot {
		bad("runAsNonRoot is not true")
	}
	if uid := firstNonNil(csc.RunAsUser, psc.RunAsUser); uid != nil && *uid == 0 {
		bad("runAsUser is 0")
	}
	if !ptr.Deref(csc.ReadOnlyRootFilesystem, false) {
		bad("readOnlyRootFilesystem is not true")
	}
	if ptr.Deref(csc.AllowPrivilegeEscalation, true) {
		bad("allowPrivilegeEscalation is not false")
	}
	if ptr.Deref(csc.Privileged, false) {
		bad("container is privileged")
	}
	if csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL") {
		bad("capabilities do not drop ALL")
	} else if len(csc.Capabilities.Add) > 0 {
		bad("capabilities added: %v", csc.Capabilities.Add)
	}
	seccomp := csc.SeccompProfile
	if seccomp == nil {
		seccomp = psc.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		bad("seccompProfile is not RuntimeDefault")
	}

	// /tmp: a 64Mi emptyDir, the only writable path.
	if v := volumeMountedAt(pod, c, "/tmp"); v == nil || v.EmptyDir == nil {
		bad("/tmp is not an emptyDir mount")
	} else {
		if v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Cmp(resource.MustParse("64Mi")) != 0 {
			bad("/tmp sizeLimit is %v, want 64Mi", v.EmptyDir.SizeLimit)
		}
		if m := v.EmptyDir.Medium; m != corev1.StorageMediumDefault && m != corev1.StorageMediumMemory {
			bad("/tmp medium %q", m)
		}
	}

	// Default SSH material: the kvm-ssh Secret, optional, where
	// --ssh-key-dir looks.
	sshDir := flagValue(c.Args, "--ssh-key-dir")
	if sshDir == "" {
		sshDir = kvmSSHDir
	}
	if v := volumeMountedAt(pod, c, sshDir); v == nil || v.Secret == nil || v.Secret.SecretName != kvmSSHSecret {
		bad("%s (--ssh-key-dir) is not a mount of Secret %s", sshDir, kvmSSHSecret)
	} else if !ptr.Deref(v.Secret.Optional, false) {
		bad("Secret %s volume is not optional: a missing Secret would keep the manager from starting", kvmSSHSecret)
	}

	if v, ok := flagSet(c.Args, "--leader-elect"); !ok || (v != "" && v != "true") {
		bad("--leader-elect is not set (args %v)", c.Args)
	}

	// Metrics: HTTPS with authn/authz, on the port the Service targets.
	if v, ok := flagSet(c.Args, "--metrics-secure"); ok && v != "" && v != "true" {
		bad("--metrics-secure=%s serves /metrics as plain HTTP to anyone", v)
	}
	if addr := flagValue(c.Args, "--metrics-bind-address"); addr != "" && addr != fmt.Sprintf(":%d", metricsPort) {
		bad("--metrics-bind-address %q, the metrics Service targets :%d", addr, metricsPort)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == metricsPort }) {
		bad("manager does not declare the metrics port %d: %v", metricsPort, c.Ports)
	}

	// Probes: the manager's health endpoints on the probe port.
	if addr := flagValue(c.Args, "--health-probe-bind-address"); addr != "" && addr != fmt.Sprintf(":%d", probePort) {
		bad("--health-probe-bind-address %q, the probes use :%d", addr, probePort)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		switch {
		case p.probe == nil || p.probe.HTTPGet == nil:
			bad("no %s httpGet probe", p.name)
		case p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.IntValue() != probePort:
			bad("%s probe is %s on port %s, want %s on %d", p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path, probePort)
		}
	}
	return problems
}

func managerDeployment(t *testing.T, objs []*unstructured.Unstructured) *appsv1.Deployment {
	t.Helper()
	deps := find(objs, "Deployment", "")
	if len(deps) != 1 {
		t.Fatalf("%d Deployments, want 1", len(deps))
	}
	d := &appsv1.Deployment{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(deps[0].Object, d); err != nil {
		t.Fatal(err)
	}
	if managerOf(d) == nil {
		t.Fatalf("Deployment %s has no %q container", d.Name, managerContainer)
	}
	return d
}

func managerOf(d *appsv1.Deployment) *corev1.Container {
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == managerContainer {
			return c
		}
	}
	return nil
}

func volume(d *appsv1.Deployment, name string) *corev1.Volume {
	for i := range d.Spec.Template.Spec.Volumes {
		if v := &d.Spec.Template.Spec.Volumes[i]; v.Name == name {
			return v
		}
	}
	return nil
}

// volumeMountedAt returns the pod volume c mounts at path, or nil.
func volumeMountedAt(pod corev1.PodSpec, c *corev1.Container, path string) *corev1.Volume {
	for _, m := range c.VolumeMounts {
		if m.MountPath != path {
			continue
		}
		for i := range pod.Volumes {
			if pod.Volumes[i].Name == m.Name {
				return &pod.Volumes[i]
			}
		}
	}
	return nil
}

// flagSet reports whether args hold the flag, and its value if given as
// --name=value.
func flagSet(args []string, name string) (string, bool) {
	for _, a := range args {
		if a == name {
			return "", true
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func flagValue(args []string, name string) string {
	v, _ := flagSet(args, name)
	return v
}

func firstNonNil[T any](ps ...*T) *T {
	for _, p := range ps {
		if p != nil {
			return p
		}
	}
	return nil
}

func one(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	got := find(objs, kind, name)
	if len(got) != 1 {
		t.Fatalf("%d %s named %q, want 1", len(got), kind, name)
	}
	return got[0]
}

func isNamespaced(o *unstructured.Unstructured) bool {
	switch o.GetKind() {
	case "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
		"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
		return false
	}
	return true
}

// TestMetricsAreAuthenticatedHTTPS checks the metrics path as kubebuilder v4
// scaffolds it: the Service on 8443 (https), the manager allowed to create
// TokenReviews and SubjectAccessReviews, a metrics-reader ClusterRole for
// scrapers, and the ServiceMonitor scraping https with its token.
func TestMetricsAreAuthenticatedHTTPS(t *testing.T) {
	objs := kustomizeBuild(t, "config/default")
	svc := one(t, objs, "Service", namePrefix+"controller-manager-metrics-service")
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if len(ports) != 1 {
		t.Fatalf("metrics Service ports %v, want one", ports)
	}
	port := ports[0].(map[string]any)
	if port["name"] != "https" || fmt.Sprint(port["port"]) != fmt.Sprint(metricsPort) || fmt.Sprint(port["targetPort"]) != fmt.Sprint(metricsPort) {
		t.Errorf("metrics Service port %v, want https %d -> %d", port, metricsPort, metricsPort)
	}

	rules := func(kind, name string) string {
		r, _, _ := unstructured.NestedSlice(one(t, objs, kind, name).Object, "rules")
		return fmt.Sprint(r)
	}
	if got, want := rules("ClusterRole", namePrefix+"metrics-reader"), "[map[nonResourceURLs:[/metrics] verbs:[get]]]"; got != want {
		t.Errorf("metrics-reader rules %s, want %s", got, want)
	}
	if got, want := rules("ClusterRole", namePrefix+"metrics-auth-role"),
		"[map[apiGroups:[authentication.k8s.io] resources:[tokenreviews] verbs:[create]] map[apiGroups:[authorization.k8s.io] resources:[subjectaccessreviews] verbs:[create]]]"; got != want {
		t.Errorf("metrics-auth-role rules %s, want %s", got, want)
	}

	mon := one(t, kustomizeBuild(t, "config/prometheus"), "ServiceMonitor", "")
	eps, _, _ := unstructured.NestedSlice(mon.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v, want one", eps)
	}
	ep := eps[0].(map[string]any)
	if ep["scheme"] != "https" || ep["port"] != port["name"] || ep["path"] != "/metrics" || ep["bearerTokenFile"] == nil {
		t.Errorf("ServiceMonitor endpoint %v, want https on port %v, /metrics, with the bearer token", ep, port["name"])
	}
}

// TestSecretsGrantedOnlyAsProxyCredentialsNeed: the one cluster-wide grant
// on Secrets is what the code calls in every Proxy namespace, never a
// wildcard: Proxy credentials get the user's spec.access.auth.secretRef,
// list and watch (the label-filtered informer), create and patch the
// operator's own credential Secret; a ProxyPool gets, creates, updates and
// deletes its published Secret; the kubernetes provider gets, creates,
// updates and deletes its password-file Secret. docs/security.md says the
// same. The SSH Secrets keep their Role in the manager's namespace.
func TestSecretsGrantedOnlyAsProxyCredentialsNeed(t *testing.T) {
	objs := kustomizeBuild(t, "config/default")
	grantsSecrets := func(o *unstructured.Unstructured) bool { return len(secretVerbs(o)) > 0 }
	for _, cr := range find(objs, "ClusterRole", "") {
		want := []string(nil)
		if cr.GetName() == namePrefix+"manager-role" {
			want = []string{"create", "delete", "get", "list", "patch", "update", "watch"}
		}
		if got := secretVerbs(cr); !slices.Equal(got, want) {
			t.Errorf("ClusterRole %s grants %v on Secrets, want %v", cr.GetName(), got, want)
		}
	}
	role := one(t, objs, "Role", namePrefix+"manager-role")
	if role.GetNamespace() != installNamespace || !grantsSecrets(role) {
		t.Errorf("Role %s/%s does not grant Secrets in the install namespace %s", role.GetNamespace(), role.GetName(), installNamespace)
	}
	b := one(t, objs, "RoleBinding", namePrefix+"manager-secrets-rolebinding")
	if kind, _, _ := unstructured.NestedString(b.Object, "roleRef", "kind"); kind != "Role" || b.GetNamespace() != installNamespace {
		t.Errorf("RoleBinding %s/%s refers to a %s, want the Role in %s", b.GetNamespace(), b.GetName(), kind, installNamespace)
	}
	d := managerDeployment(t, objs)
	if ns := podNamespaceEnv(managerOf(d)); ns != "metadata.namespace" {
		t.Errorf("manager's POD_NAMESPACE comes from %q, want the downward API metadata.namespace", ns)
	}
}

// secretVerbs are the verbs o (a Role or ClusterRole) grants on Secrets,
// sorted.
func secretVerbs(o *unstructured.Unstructured) []string {
	var verbs []string
	rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
	for _, r := range rules {
		res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
		if slices.Contains(res, "secrets") || slices.Contains(res, "*") {
			v, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "verbs")
			verbs = append(verbs, v...)
		}
	}
	slices.Sort(verbs)
	return verbs
}

// podNamespaceEnv is the fieldRef of c's POD_NAMESPACE, or "".
func podNamespaceEnv(c *corev1.Container) string {
	for _, e := range c.Env {
		if e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return e.ValueFrom.FieldRef.FieldPath
		}
	}
	return ""
}
