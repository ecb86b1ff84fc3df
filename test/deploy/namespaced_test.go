package deploy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"crawl.example.com/proxy-operator/internal/testutil"
)

// grant is one thing a rule allows: a verb on a resource of an API group,
// limited to one object name or (name "") any.
type grant struct{ group, resource, verb, name string }

func (g grant) String() string {
	s := g.verb + " " + g.resource
	if g.group != "" {
		s += "." + g.group
	}
	if g.name != "" {
		s += "/" + g.name
	}
	return s
}

// grants flattens the rules of o (a Role or ClusterRole).
func grants(o *unstructured.Unstructured) map[grant]bool {
	out := map[grant]bool{}
	rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
	for _, r := range rules {
		rule := r.(map[string]any)
		groups, _, _ := unstructured.NestedStringSlice(rule, "apiGroups")
		resources, _, _ := unstructured.NestedStringSlice(rule, "resources")
		verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
		names, _, _ := unstructured.NestedStringSlice(rule, "resourceNames")
		if len(names) == 0 {
			names = []string{""}
		}
		for _, gr := range groups {
			for _, res := range resources {
				for _, v := range verbs {
					for _, n := range names {
						out[grant{gr, res, v, n}] = true
					}
				}
			}
		}
	}
	return out
}

// clusterScoped are the resources of the generated ClusterRole that no
// namespace holds.
var clusterScoped = map[string]bool{
	"namespaces": true, "nodes": true, "servicecidrs": true,
	"kvmhosts": true, "kvmhosts/status": true, "kvmhosts/finalizers": true,
	"kvmimages": true, "kvmimages/status": true, "kvmimages/finalizers": true,
}

// sameGrants reports what got grants beyond want and what it lacks.
func sameGrants(got, want map[grant]bool) (extra, missing []string) {
	for g := range got {
		if !want[g] {
			extra = append(extra, g.String())
		}
	}
	for g := range want {
		if !got[g] {
			missing = append(missing, g.String())
		}
	}
	slices.Sort(extra)
	slices.Sort(missing)
	return extra, missing
}

// TestNamespacedOverlayGrantsThroughRolesOnly: config/namespaced runs the
// manager with --namespaces and grants what the generated ClusterRole
// grants, split: cluster-scoped kinds in the ClusterRole, namespaced ones
// in a Role in each served namespace, bound to the manager. No
// ClusterRole grants anything on Secrets (so none lists or watches them);
// outside the served namespaces only the install namespace (config/rbac's
// Roles: SSH Secrets, leader election) and "default" (the kubernetes
// Service, Events about cluster-scoped kinds) hold Roles; the overlay's
// grant no more than the generated ClusterRole.
func TestNamespacedOverlayGrantsThroughRolesOnly(t *testing.T) {
	objs := kustomizeBuild(t, "config/namespaced")
	c := managerOf(managerDeployment(t, objs))
	var served []string
	for _, ns := range strings.Split(flagValue(c.Args, "--namespaces"), ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			served = append(served, ns)
		}
	}
	if len(served) == 0 {
		t.Fatalf("the manager has no --namespaces (args %v)", c.Args)
	}

	generated := grants(one(t, kustomizeBuild(t, "config/rbac"), "ClusterRole", "manager-role"))
	wantCluster, wantNamespaced := map[grant]bool{}, map[grant]bool{}
	for g := range generated {
		if clusterScoped[g.resource] {
			wantCluster[g] = true
		} else {
			wantNamespaced[g] = true
		}
	}
	if !wantNamespaced[grant{"", "secrets", "list", ""}] {
		t.Fatalf("the generated ClusterRole lists no Secrets: this test no longer checks what it is named after")
	}

	for _, cr := range find(objs, "ClusterRole", "") {
		if v := secretVerbs(cr); len(v) > 0 {
			t.Errorf("ClusterRole %s grants %v on Secrets", cr.GetName(), v)
		}
	}
	extra, missing := sameGrants(grants(one(t, objs, "ClusterRole", namePrefix+"manager-role")), wantCluster)
	if len(extra)+len(missing) > 0 {
		t.Errorf("manager ClusterRole: grants %v beyond the generated cluster-scoped rules, lacks %v", extra, missing)
	}

	sa := managerDeployment(t, objs).Spec.Template.Spec.ServiceAccountName
	for _, ns := range served {
		role := boundRole(t, objs, ns, sa)
		if role == nil {
			t.Errorf("served namespace %s: no Role bound to the manager's ServiceAccount %s", ns, sa)
			continue
		}
		extra, missing := sameGrants(grants(role), wantNamespaced)
		if len(extra)+len(missing) > 0 {
			t.Errorf("Role %s/%s: grants %v beyond the generated namespaced rules, lacks %v", ns, role.GetName(), extra, missing)
		}
	}

	allowed := map[string]bool{installNamespace: true, "default": true}
	for _, ns := range served {
		allowed[ns] = true
	}
	for _, role := range find(objs, "Role", "") {
		if !allowed[role.GetNamespace()] {
			t.Errorf("Role %s/%s is in a namespace the manager does not serve", role.GetNamespace(), role.GetName())
		}
		if role.GetNamespace() == installNamespace {
			continue // config/rbac's own: leader election, the SSH Secrets
		}
		if role.GetNamespace() == "default" && len(secretVerbs(role)) > 0 {
			t.Errorf("Role default/%s grants Secrets", role.GetName())
		}
		for g := range grants(role) {
			if !generated[g] && !generated[grant{g.group, g.resource, g.verb, ""}] {
				t.Errorf("Role %s/%s grants %v, which the generated ClusterRole does not", role.GetNamespace(), role.GetName(), g)
			}
		}
	}
}

// boundRole is the Role in ns that a RoleBinding there grants to the
// ServiceAccount sa of the install namespace, or nil.
func boundRole(t *testing.T, objs []*unstructured.Unstructured, ns, sa string) *unstructured.Unstructured {
	t.Helper()
	for _, b := range find(objs, "RoleBinding", "") {
		if b.GetNamespace() != ns {
			continue
		}
		ref, _, _ := unstructured.NestedStringMap(b.Object, "roleRef")
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		for _, s := range subjects {
			subj := s.(map[string]any)
			if subj["kind"] == "ServiceAccount" && subj["name"] == sa && subj["namespace"] == installNamespace && ref["kind"] == "Role" {
				for _, r := range find(objs, "Role", ref["name"]) {
					if r.GetNamespace() == ns {
						return r
					}
				}
			}
		}
	}
	return nil
}

// TestGrantsOfSplitRules: grants flattens rules with several groups,
// resources, verbs and names, and sameGrants names what differs.
func TestGrantsOfSplitRules(t *testing.T) {
	role := &unstructured.Unstructured{Object: map[string]any{"rules": []any{
		map[string]any{"apiGroups": []any{"", "events.k8s.io"}, "resources": []any{"events"}, "verbs": []any{"create", "patch"}},
		map[string]any{"apiGroups": []any{""}, "resources": []any{"services"}, "verbs": []any{"get"}, "resourceNames": []any{"kubernetes"}},
	}}}
	got := grants(role)
	want := map[grant]bool{
		{"", "events", "create", ""}: true, {"", "events", "patch", ""}: true,
		{"events.k8s.io", "events", "create", ""}: true, {"events.k8s.io", "events", "patch", ""}: true,
		{"", "services", "get", "kubernetes"}: true,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("grants = %v, want %v", got, want)
	}
	delete(want, grant{"", "services", "get", "kubernetes"})
	want[grant{"", "secrets", "list", ""}] = true
	extra, missing := sameGrants(got, want)
	if fmt.Sprint(extra) != "[get services/kubernetes]" || fmt.Sprint(missing) != "[list secrets]" {
		t.Errorf("sameGrants: extra %v, missing %v", extra, missing)
	}
}

// TestNamespacedInstallRBACOnAnAPIServer installs config/namespaced's
// ServiceAccount and RBAC on a real API server and asks it
// (SubjectAccessReview) what the manager may do: Secrets and Pods in the
// served namespace, SSH Secrets in its own, KVMHosts and Nodes
// cluster-wide; no Secret or Pod outside them, and no cluster-wide list or
// watch of Secrets.
func TestNamespacedInstallRBACOnAnAPIServer(t *testing.T) {
	c, _ := apiServer(t)
	ctx := t.Context()
	objs := kustomizeBuild(t, "config/namespaced")
	sa := managerDeployment(t, objs).Spec.Template.Spec.ServiceAccountName
	served := flagValue(managerOf(managerDeployment(t, objs)).Args, "--namespaces")
	for _, ns := range []string{installNamespace, served, "elsewhere"} {
		ensureNamespace(ctx, t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := c.Create(ctx, o.DeepCopy()); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
		}
	}
	allowed := func(verb, resource, group, ns, name string) bool {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + installNamespace + ":" + sa,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + installNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: verb, Resource: resource, Group: group, Namespace: ns, Name: name,
			},
		}}
		if err := c.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		return sar.Status.Allowed
	}
	type ask struct{ verb, resource, group, ns, name string }
	may := []ask{
		{"list", "secrets", "", served, ""},
		{"watch", "secrets", "", served, ""},
		{"create", "pods", "", served, ""},
		{"update", "proxies/status", "crawl.example.com", served, ""},
		{"get", "secrets", "", installNamespace, "kvm-ssh"},
		{"list", "kvmhosts", "crawl.example.com", "", ""},
		{"watch", "nodes", "", "", ""},
		{"get", "services", "", "default", "kubernetes"},
		{"create", "events", "", "default", ""},
	}
	mayNot := []ask{
		{"list", "secrets", "", "", ""},
		{"watch", "secrets", "", "", ""},
		{"get", "secrets", "", "elsewhere", "x"},
		{"list", "secrets", "", "elsewhere", ""},
		{"list", "pods", "", "", ""},
		{"list", "proxies", "crawl.example.com", "elsewhere", ""},
		{"get", "secrets", "", "default", "x"},
		{"get", "services", "", "default", "other"},
	}
	// The API server's authorizer learns of new RBAC objects by watching.
	testutil.WaitFor(t, func() bool {
		for _, a := range may {
			if !allowed(a.verb, a.resource, a.group, a.ns, a.name) {
				return false
			}
		}
		return true
	})
	for _, a := range mayNot {
		if allowed(a.verb, a.resource, a.group, a.ns, a.name) {
			t.Errorf("the manager may %s %s %q in namespace %q", a.verb, a.resource, a.name, a.ns)
		}
	}
}
