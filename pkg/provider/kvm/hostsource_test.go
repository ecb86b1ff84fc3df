package kvm_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn/sshtest"
)

// countingReader counts Secret reads.
type countingReader struct {
	client.Reader
	secretGets int
}

func (r *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Secret); ok {
		r.secretGets++
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// hostScheme knows Secrets and KVMHosts.
func hostScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	sch := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	if err := crawlv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	return sch
}

// TestKubeHostsReadSecretsOnlyInTheirNamespace: defence in depth behind the
// webhook, for KVMHosts stored with it off.
func TestKubeHostsReadSecretsOnlyInTheirNamespace(t *testing.T) {
	sch := hostScheme(t)
	host := func(name, ns string) *crawlv1.KVMHost {
		return &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: crawlv1.KVMHostSpec{Address: "hv:22", SSHKeySecretRef: &crawlv1.SecretReference{Name: "ssh", Namespace: ns}}}
	}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(
		host("elsewhere", "tenant-a"), host("home", "proxy-operator-system"),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ssh", Namespace: "tenant-a"}, Data: map[string][]byte{"ssh-privatekey": []byte("x")}},
	).Build()
	secrets := &countingReader{Reader: c}
	k := &kvm.KubeHosts{Reader: c, SecretReader: secrets, SecretNamespace: "proxy-operator-system"}
	ctx := context.Background()

	hs, err := k.Host(ctx, "elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	_, err = hs.Material(ctx)
	if provider.Class(err) != provider.ClassPermanent || !strings.Contains(err.Error(), `spec.sshKeySecretRef.namespace "tenant-a"`) {
		t.Fatalf("material of a Secret in another namespace: %v (class %s), want a permanent error naming the field", err, provider.Class(err))
	}
	if secrets.secretGets != 0 {
		t.Fatalf("the Secret in another namespace was read (%d gets)", secrets.secretGets)
	}

	// In the manager's namespace the Secret is read (here: missing, transient).
	hs, err = k.Host(ctx, "home")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hs.Material(ctx); provider.Class(err) != provider.ClassTransient || secrets.secretGets != 1 {
		t.Fatalf("material of a missing Secret in the manager's namespace: %v (class %s, %d gets), want transient after one read", err, provider.Class(err), secrets.secretGets)
	}
}

// TestKubeHostsCheckInterval: a KVMHost's own check interval reaches the
// provider, which times its health verdicts by it; without one the
// provider's default applies (0).
func TestKubeHostsCheckInterval(t *testing.T) {
	sch := runtime.NewScheme()
	if err := crawlv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	own := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: "own"},
		Spec: crawlv1.KVMHostSpec{Address: "hv:22", CheckInterval: &metav1.Duration{Duration: 2 * time.Minute}}}
	def := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: crawlv1.KVMHostSpec{Address: "hv:22"}}
	k := &kvm.KubeHosts{Reader: fake.NewClientBuilder().WithScheme(sch).WithObjects(own, def).Build()}
	for name, want := range map[string]time.Duration{"own": 2 * time.Minute, "default": 0} {
		hs, err := k.Host(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if hs.CheckInterval != want {
			t.Errorf("%s: CheckInterval %s, want %s", name, hs.CheckInterval, want)
		}
	}
}

// TestKubeHostsShareASecretsMaterial: hosts naming one Secret share one
// parse of it (its known_hosts usually lists every host, so a parse per
// host grows with hosts²) until the Secret changes.
func TestKubeHostsShareASecretsMaterial(t *testing.T) {
	sch := hostScheme(t)
	const ns = "proxy-operator-system"
	host := func(name string) *crawlv1.KVMHost {
		return &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: crawlv1.KVMHostSpec{Address: name + ":22", SSHKeySecretRef: &crawlv1.SecretReference{Name: "ssh", Namespace: ns}}}
	}
	signer, keyPEM := sshtest.NewKey(t)
	knownHosts := func(hosts ...string) []byte {
		var b []byte
		for _, h := range hosts {
			b = append(b, h+" "+string(ssh.MarshalAuthorizedKey(signer.PublicKey()))...)
		}
		return b
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ssh", Namespace: ns},
		Data: map[string][]byte{"ssh-privatekey": keyPEM, "known_hosts": knownHosts("hv1", "hv2")}}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(host("hv1"), host("hv2"), sec).Build()
	k := &kvm.KubeHosts{Reader: c, SecretReader: c, SecretNamespace: ns}
	ctx := context.Background()
	material := func(name string) *conn.Material {
		t.Helper()
		hs, err := k.Host(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := hs.Material(ctx)
		if err != nil {
			t.Fatalf("material of %s: %v", name, err)
		}
		return m
	}

	first := material("hv1")
	if again, other := material("hv1"), material("hv2"); again != first || other != first {
		t.Fatal("the same version of a Secret was parsed more than once")
	}
	// A changed Secret is parsed afresh, and its new content is what counts.
	sec.Data["known_hosts"] = knownHosts("hv1", "hv2", "hv3")
	if err := c.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	if material("hv2") == first {
		t.Fatal("a changed Secret kept its old material")
	}
	// A deleted Secret's parsed keys are dropped at the next load.
	if err := c.Delete(ctx, sec); err != nil {
		t.Fatal(err)
	}
	hs, err := k.Host(ctx, "hv1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hs.Material(ctx); err == nil {
		t.Fatal("material of a deleted Secret")
	}
	if n := k.ParsedSecrets(); n != 0 {
		t.Fatalf("%d parsed Secrets kept after the Secret was deleted", n)
	}
}
