package kubernetes

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	yaml "sigs.k8s.io/yaml"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
)

const managerNS = "proxy-operator-system"

// managedCluster is a managed Machine (two client ranges, Basic auth) and
// a provider that knows the manager's namespace.
func managedCluster(t *testing.T) (client.WithWatch, *Provider, *provider.Machine) {
	t.Helper()
	c := newFake(t)
	p := New(c, Options{SquidImage: "example.test/squid:6", ManagerNamespace: managerNS}).(*Provider)
	m := machine()
	m.Squid = &squid.Config{
		AllowedSourceCIDRs: []string{"10.244.0.0/16", "192.0.2.0/24"},
		Auth:               squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: squidPassword},
	}
	return c, p, m
}

func TestManagedProxyGetsSecretAndNetworkPolicy(t *testing.T) {
	c, p, m := managedCluster(t)
	if _, err := p.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	k := podKey(m)
	var (
		pod    corev1.Pod
		cm     corev1.ConfigMap
		secret corev1.Secret
		np     networkingv1.NetworkPolicy
	)
	for _, obj := range []client.Object{&pod, &cm, &secret, &np} {
		if err := c.Get(context.Background(), k, obj); err != nil {
			t.Fatalf("%T: %v", obj, err)
		}
		if obj.GetLabels()[LabelProxyUID] != uid || obj.GetLabels()[LabelManagedBy] != ManagedBy || obj.GetLabels()[LabelTag] != "prod" {
			t.Errorf("%T labels %v", obj, obj.GetLabels())
		}
		if ref := metav1.GetControllerOf(obj); ref == nil || ref.UID != types.UID(uid) || ref.Kind != ProxyKind {
			t.Errorf("%T owner %+v", obj, ref)
		}
	}

	conf := cm.Data[ConfigKey]
	for _, want := range []string{
		"auth_param basic program /usr/lib/squid/basic_ncsa_auth " + AuthDir + "/" + PasswordKey + "\n",
		"acl allowed_sources src 10.244.0.0/16 192.0.2.0/24\n",
		"http_access allow allowed_sources authenticated\n",
		"pid_filename " + StateDir + "/squid.pid\n",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("squid.conf lacks %q:\n%s", want, conf)
		}
	}
	if strings.Contains(conf, squidPassword) || strings.Contains(string(secret.Data[PasswordKey]), squidPassword) {
		t.Error("the password is stored in clear")
	}
	if !squid.PasswordFileMatches(secret.Data[PasswordKey], m.Squid.Auth) {
		t.Errorf("the Secret's password file does not admit the credential: %q", secret.Data[PasswordKey])
	}

	var authVolume *corev1.Volume
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Secret != nil {
			authVolume = &pod.Spec.Volumes[i]
		}
	}
	if authVolume == nil || authVolume.Secret.SecretName != k.Name || *authVolume.Secret.DefaultMode != 0o440 {
		t.Errorf("secret volume %+v", authVolume)
	}
	mounted := false
	for _, vm := range pod.Spec.Containers[0].VolumeMounts {
		// A directory, not a subPath: the kubelet updates it in place.
		mounted = mounted || (vm.MountPath == AuthDir && vm.ReadOnly && vm.SubPath == "" && authVolume != nil && vm.Name == authVolume.Name)
	}
	if !mounted {
		t.Errorf("password file not mounted read-only at %s: %+v", AuthDir, pod.Spec.Containers[0].VolumeMounts)
	}
	if fs := pod.Spec.SecurityContext.FSGroup; fs == nil || *fs != SquidUID {
		t.Errorf("fsGroup %v, want %d so squid's helper can read the 0440 file", fs, SquidUID)
	}

	if got := np.Spec.PodSelector.MatchLabels; len(got) != 2 || got[LabelProxyUID] != uid || got[LabelManagedBy] != ManagedBy {
		t.Errorf("NetworkPolicy selects %v, want this Proxy's pods", got)
	}
	// Egress is judged by TestNetworkPolicyEgress.
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) || len(np.Spec.Ingress) != 1 {
		t.Fatalf("NetworkPolicy %+v, want one ingress rule, and egress limited", np.Spec)
	}
	rule := np.Spec.Ingress[0]
	if len(rule.Ports) != 1 || rule.Ports[0].Port.IntValue() != 3128 || *rule.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("ports %+v, want tcp/3128 only", rule.Ports)
	}
	var cidrs []string
	var manager *networkingv1.NetworkPolicyPeer
	for i, peer := range rule.From {
		switch {
		case peer.IPBlock != nil:
			cidrs = append(cidrs, peer.IPBlock.CIDR)
		case peer.NamespaceSelector != nil:
			manager = &rule.From[i]
		}
	}
	if strings.Join(cidrs, " ") != "10.244.0.0/16 192.0.2.0/24" {
		t.Errorf("ipBlocks %v, want allowedSourceCIDRs", cidrs)
	}
	if manager == nil || manager.NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != managerNS ||
		manager.PodSelector == nil || manager.PodSelector.MatchLabels["control-plane"] != "controller-manager" {
		t.Errorf("manager peer %+v, want namespace %s and the manager's pod labels", manager, managerNS)
	}
}

// Without a manager namespace (tests, local runs) only the clients are admitted.
func TestNetworkPolicyWithoutManagerNamespace(t *testing.T) {
	c, _, m := managedCluster(t)
	p := New(c, Options{}).(*Provider)
	if _, err := p.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	var np networkingv1.NetworkPolicy
	if err := c.Get(context.Background(), podKey(m), &np); err != nil {
		t.Fatal(err)
	}
	for _, peer := range np.Spec.Ingress[0].From {
		if peer.IPBlock == nil {
			t.Errorf("peer %+v admitted without a manager namespace", peer)
		}
	}
}

// Auth None (stated explicitly): no Secret, the NetworkPolicy still.
func TestManagedProxyWithoutAuth(t *testing.T) {
	c, p, m := managedCluster(t)
	m.Squid.Auth = squid.Auth{Type: squid.AuthNone}
	m.Squid.AllowedSourceCIDRs = []string{"192.0.2.0/24"}
	if _, err := p.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(context.Background(), podKey(m), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("Secret without a password: %v", err)
	}
	if err := c.Get(context.Background(), podKey(m), &networkingv1.NetworkPolicy{}); err != nil {
		t.Errorf("NetworkPolicy: %v", err)
	}
}

// A config Validate refuses is a permanent error naming the field, and
// nothing is created.
func TestInvalidManagedConfigIsPermanent(t *testing.T) {
	c, p, m := managedCluster(t)
	m.Squid.AllowedSourceCIDRs = []string{"10.244.0.1/16"}
	_, err := p.Create(context.Background(), m)
	wantClass(t, err, provider.ClassPermanent)
	if !strings.Contains(err.Error(), "spec.access.allowedSourceCIDRs[0]") {
		t.Errorf("error does not name the field: %v", err)
	}
	var cms corev1.ConfigMapList
	if err := c.List(context.Background(), &cms); err != nil || len(cms.Items) != 0 {
		t.Errorf("created %d ConfigMaps (%v)", len(cms.Items), err)
	}
}

// Create converges what the pod runs with: a changed password rewrites the
// Secret (the mounted directory follows), an unchanged one writes nothing
// (the hash's salt differs on every render).
func TestCreateConvergesTheCredential(t *testing.T) {
	var updates []string
	base, p, m := managedCluster(t)
	c := interceptor.NewClient(base, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			updates = append(updates, kindOf(obj))
			return c.Update(ctx, obj, opts...)
		},
	})
	p.c, p.r = c, c
	ctx := context.Background()
	for range 2 {
		if _, err := p.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if len(updates) != 0 {
		t.Fatalf("unchanged Machine updated %v", updates)
	}
	m.Squid.Auth.Password = "a-new-password-after-rotation"
	m.Squid.AllowedSourceCIDRs = []string{"10.245.0.0/16"} // immutable in the API; converged anyway
	if _, err := p.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	if strings.Join(updates, ",") != "ConfigMap,Secret,NetworkPolicy" {
		t.Errorf("updates %v, want ConfigMap, Secret and NetworkPolicy", updates)
	}
	var secret corev1.Secret
	if err := c.Get(ctx, podKey(m), &secret); err != nil || !squid.PasswordFileMatches(secret.Data[PasswordKey], m.Squid.Auth) {
		t.Errorf("Secret does not admit the new password (%v)", err)
	}
}

func TestDeleteRemovesSecretAndNetworkPolicy(t *testing.T) {
	c, p, m := managedCluster(t)
	ctx := context.Background()
	if _, err := p.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := p.Delete(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, obj := range []client.Object{&corev1.Pod{}, &corev1.ConfigMap{}, &corev1.Secret{}, &networkingv1.NetworkPolicy{}} {
		if err := c.Get(ctx, podKey(m), obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T after Delete: %v", obj, err)
		}
	}
}

// A Secret or NetworkPolicy under our name that is not ours is never
// changed or deleted: Create and Delete stop with an IdentityError.
func TestForeignSecretAndNetworkPolicyAreNeverTouched(t *testing.T) {
	_, _, m := managedCluster(t)
	k := podKey(m)
	meta := metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace, Labels: map[string]string{LabelProxyUID: "someone-else"}}
	for _, foreign := range []client.Object{
		&corev1.Secret{ObjectMeta: meta, Data: map[string][]byte{PasswordKey: []byte("theirs")}},
		&networkingv1.NetworkPolicy{ObjectMeta: meta},
	} {
		t.Run(kindOf(foreign), func(t *testing.T) {
			c := newFake(t, foreign.DeepCopyObject().(client.Object))
			p := New(c, Options{ManagerNamespace: managerNS}).(*Provider)
			var ie *provider.IdentityError
			if _, err := p.Create(context.Background(), m); !errors.As(err, &ie) {
				t.Fatalf("Create: %v, want IdentityError", err)
			}
			if err := p.Delete(context.Background(), m); !errors.As(err, &ie) {
				t.Fatalf("Delete: %v, want IdentityError", err)
			}
			got := foreign.DeepCopyObject().(client.Object)
			if err := c.Get(context.Background(), k, got); err != nil {
				t.Fatalf("foreign %T removed: %v", foreign, err)
			}
			if s, ok := got.(*corev1.Secret); ok && string(s.Data[PasswordKey]) != "theirs" {
				t.Error("foreign Secret rewritten")
			}
		})
	}
}

// Secrets and NetworkPolicies are read through the API reader only: a read
// through a manager's cache would start an informer on every Secret of the
// cluster. The "cache" here refuses such reads.
func TestSecretsAreNeverReadThroughTheCache(t *testing.T) {
	base, _, m := managedCluster(t)
	cached := interceptor.NewClient(base, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if uncached(obj) {
				t.Errorf("%T %s read through the cache", obj, key)
				return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, key.Name, errors.New("no informer"))
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	p := New(cached, Options{APIReader: base, ManagerNamespace: managerNS})
	ctx := context.Background()
	for range 2 {
		if _, err := p.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// The manager's NetworkPolicy peer must select the manager's pods as
// config/manager labels them.
func TestDefaultManagerPodLabelsMatchTheManagerDeployment(t *testing.T) {
	data, err := os.ReadFile("../../../config/manager/manager.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var d struct {
			Kind string `json:"kind"`
			Spec struct {
				Template struct {
					Metadata struct {
						Labels map[string]string `json:"labels"`
					} `json:"metadata"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		if d.Kind != "Deployment" {
			continue
		}
		for k, v := range DefaultManagerPodLabels {
			if d.Spec.Template.Metadata.Labels[k] != v {
				t.Errorf("manager pod template labels %v lack %s=%s", d.Spec.Template.Metadata.Labels, k, v)
			}
		}
		return
	}
	t.Fatal("no Deployment in config/manager/manager.yaml")
}

// A Secret of ours that is being deleted is not rewritten or used, even
// when it holds the right password: Create is transient until it is gone
// and can be made anew.
func TestCreateWaitsForATerminatingSecret(t *testing.T) {
	_, _, m := managedCluster(t)
	k := podKey(m)
	now := metav1.Now()
	pw, err := squid.PasswordFile(m.Squid.Auth)
	if err != nil {
		t.Fatal(err)
	}
	terminating := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Name: k.Name, Namespace: k.Namespace, Labels: map[string]string{LabelProxyUID: uid},
		DeletionTimestamp: &now, Finalizers: []string{"example.com/hold"},
	}, Data: map[string][]byte{PasswordKey: pw}}
	c := newFake(t, terminating)
	p := New(c, Options{ManagerNamespace: managerNS})
	_, err = p.Create(context.Background(), m)
	wantClass(t, err, provider.ClassTransient)
	var got corev1.Secret
	if err := c.Get(context.Background(), k, &got); err != nil || string(got.Data[PasswordKey]) != string(pw) {
		t.Errorf("terminating Secret rewritten (%v)", err)
	}
	if err := c.Get(context.Background(), k, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod created on a Secret that is going away: %v", err)
	}
}
