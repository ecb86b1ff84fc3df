package deploy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"crawl.example.com/proxy-operator/test/envtestutil"
)

// selfSignedDir installs without cert-manager: config/default with the
// webhook certificate from files the user generates.
const selfSignedDir = "config/certs-selfsigned"

// webhookCertFiles is what hack/webhook-cert.sh writes.
type webhookCertFiles struct{ ca, crt, key []byte }

func (w webhookCertFiles) files() map[string][]byte {
	return map[string][]byte{"ca.crt": w.ca, "tls.crt": w.crt, "tls.key": w.key}
}

var (
	certOnce  sync.Once
	certFiles webhookCertFiles
	certErr   error
)

// webhookCert runs hack/webhook-cert.sh once for the package, as a user
// does before `kubectl apply -k config/certs-selfsigned`, and returns the
// files it wrote. It needs openssl (Debian: openssl).
func webhookCert(t *testing.T) webhookCertFiles {
	t.Helper()
	certOnce.Do(func() {
		dir, err := os.MkdirTemp("", "webhook-cert-")
		if err != nil {
			certErr = err
			return
		}
		defer os.RemoveAll(dir)
		out, err := exec.Command(filepath.Join(envtestutil.Root(), "hack", "webhook-cert.sh"), dir).CombinedOutput()
		if err != nil {
			certErr = fmt.Errorf("hack/webhook-cert.sh: %w: %s", err, out)
			return
		}
		read := func(name string) []byte {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil && certErr == nil {
				certErr = err
			}
			return b
		}
		certFiles = webhookCertFiles{ca: read("ca.crt"), crt: read("tls.crt"), key: read("tls.key")}
	})
	if certErr != nil {
		t.Fatal(certErr)
	}
	return certFiles
}

// TestSelfSignedWiring: config/certs-selfsigned installs what config/default
// does, without cert-manager's objects, with the generated certificate as
// the manager's serving certificate and its CA as every webhook's caBundle,
// valid for the webhook Service's name.
func TestSelfSignedWiring(t *testing.T) {
	files := webhookCert(t)
	objs := kustomizeBuild(t, selfSignedDir)

	// Everything of config/default but cert-manager's, plus the Secret.
	ids := func(objs []*unstructured.Unstructured, skip func(*unstructured.Unstructured) bool) []string {
		var out []string
		for _, o := range objs {
			if !skip(o) {
				out = append(out, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
			}
		}
		slices.Sort(out)
		return out
	}
	isSecret := func(o *unstructured.Unstructured) bool { return o.GetKind() == "Secret" }
	isCertManager := func(o *unstructured.Unstructured) bool { return o.GroupVersionKind().Group == "cert-manager.io" }
	if got, want := ids(objs, isSecret), ids(kustomizeBuild(t, "config/default"), isCertManager); !slices.Equal(got, want) {
		t.Errorf("objects besides the Secret differ from config/default without cert-manager:\n got %v\nwant %v", got, want)
	}

	secrets := find(objs, "Secret", "")
	if len(secrets) != 1 {
		t.Fatalf("%d Secrets, want the webhook serving certificate", len(secrets))
	}
	sec := secrets[0]
	if typ, _, _ := unstructured.NestedString(sec.Object, "type"); typ != "kubernetes.io/tls" || sec.GetNamespace() != installNamespace {
		t.Errorf("Secret %s/%s of type %q, want kubernetes.io/tls in %s", sec.GetNamespace(), sec.GetName(), typ, installNamespace)
	}
	data, _, _ := unstructured.NestedStringMap(sec.Object, "data")
	for name, want := range files.files() {
		if got, err := base64.StdEncoding.DecodeString(data[name]); err != nil || !bytes.Equal(got, want) {
			t.Errorf("Secret key %s does not hold the generated %s", name, name)
		}
	}

	d := managerDeployment(t, objs)
	c := managerOf(d)
	certDir := flagValue(c.Args, "--webhook-cert-dir")
	if v := volumeMountedAt(d.Spec.Template.Spec, c, certDir); v == nil || v.Secret == nil || v.Secret.SecretName != sec.GetName() {
		t.Errorf("--webhook-cert-dir %q is not a mount of the generated Secret %s", certDir, sec.GetName())
	}
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		whc := one(t, objs, kind, "")
		if _, ok := whc.GetAnnotations()["cert-manager.io/inject-ca-from"]; ok {
			t.Errorf("%s still asks cert-manager to inject its CA", kind)
		}
		hooks, _, _ := unstructured.NestedSlice(whc.Object, "webhooks")
		for _, h := range hooks {
			b64, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "caBundle")
			if got, err := base64.StdEncoding.DecodeString(b64); err != nil || !bytes.Equal(got, files.ca) {
				t.Errorf("%s webhook %v: caBundle is not the generated CA", kind, h.(map[string]any)["name"])
			}
		}
	}

	// The certificate is what the API server will accept from the Service.
	svc := one(t, objs, "Service", namePrefix+"webhook-service")
	if problems := servingCertProblems(files, svc.GetName()+"."+installNamespace+".svc"); len(problems) > 0 {
		t.Error(strings.Join(problems, "\n"))
	}
	if len(servingCertProblems(files, "webhook-service."+installNamespace+".svc")) == 0 {
		t.Error("the check cannot fail: a name the certificate lacks verified")
	}
}

// servingCertProblems lists why files would not serve host to a client
// trusting files.ca.
func servingCertProblems(files webhookCertFiles, host string) []string {
	var problems []string
	if _, err := tls.X509KeyPair(files.crt, files.key); err != nil {
		problems = append(problems, "tls.key does not match tls.crt: "+err.Error())
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(files.ca) {
		return append(problems, "ca.crt holds no certificate")
	}
	block, _ := pem.Decode(files.crt)
	if block == nil {
		return append(problems, "tls.crt holds no PEM block")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return append(problems, "tls.crt: "+err.Error())
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		problems = append(problems, "tls.crt for "+host+": "+err.Error())
	}
	return problems
}
