package providers

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"sigs.k8s.io/cluster-api/util/conditions"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/gcp"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
	"crawl.example.com/proxy-operator/test/harness"
)

var _ = Describe("provider registry", func() {
	It("fails a Proxy naming a provider that is not enabled with ProviderNotEnabled", func() {
		ns := newNamespace()
		createProxy(ns, "elsewhere", crawlv1.ProviderKVM)
		p := waitPhaseReason(ns, "elsewhere", crawlv1.ProxyFailed, crawlv1.ProxyProviderDisabledReason, 15*time.Second)
		Expect(conditions.GetMessage(p, crawlv1.ReadyCondition)).To(And(
			ContainSubstring(`provider "kvm" is not enabled`), ContainSubstring("gcp kubernetes")))
		Expect(conditions.GetReason(p, crawlv1.InstanceProvisionedCondition)).To(Equal(crawlv1.ProxyProviderDisabledReason))

		// No provider can clean up after it: deletion waits for an
		// operator's skip-cleanup.
		deleteProxy(ns, "elsewhere")
		p = expectDeletionBlocked(ns, "elsewhere", "")
		Expect(conditions.GetMessage(p, crawlv1.DeletionBlockedCondition)).To(ContainSubstring("not enabled"))
		setSkipCleanup(ns, "elsewhere")
		waitProxyGone(ns, "elsewhere", 15*time.Second)
	})

	It("reports a gcp provider that cannot be built as transient on its Proxy, serves the other providers, and builds it once credentials appear", func() {
		tokens := newTokenServer()
		DeferCleanup(tokens.Close)
		credFile := filepath.Join(GinkgoT().TempDir(), "gcp-sa.json")

		// A manager whose gcp credentials file (a Secret not mounted yet)
		// does not exist.
		broken := harness.Replace(&mgr, startManager, managerConfig{
			registryBackoff: 100 * time.Millisecond,
			gcp: func(ctx context.Context) (provider.Provider, error) {
				return gcp.New(ctx, gcp.Options{
					Project: gcpProject, Zone: gcpZone, Endpoint: computeFake.Endpoint(),
					CredentialsFile: credFile, PollInterval: 20 * time.Millisecond,
				})
			},
		})

		ns := newNamespace()
		cloud := createProxy(ns, "cloud", crawlv1.ProviderGCP)
		local := createProxy(ns, "local", crawlv1.ProviderKubernetes)

		p := waitPhaseReason(ns, "cloud", crawlv1.ProxyPending, crawlv1.ProxyTransientErrorReason, 15*time.Second)
		Expect(conditions.GetMessage(p, crawlv1.ReadyCondition)).To(And(
			ContainSubstring(`provider "gcp" unavailable`), ContainSubstring(credFile), ContainSubstring("does not exist")))
		Consistently(func() crawlv1.ProxyPhase { return getProxy(ns, "cloud").Status.Phase }).
			WithTimeout(time.Second).WithPolling(100*time.Millisecond).Should(Equal(crawlv1.ProxyPending), "a transient failure is not Failed")

		// The other provider is unaffected.
		startPod(local, "10.244.2.5")
		waitProxyPhase(ns, "local", crawlv1.ProxyReady, 15*time.Second)
		// The sweep skips a provider that is not built, and does not fail.
		_, err := broken.Wiring.Sweep.Sweep(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(names(broken.Wiring.Registry.Constructed())).To(Equal([]string{kubernetes.Name}))

		// The Secret is mounted: a later lookup builds the provider, with
		// no restart, and the Proxy proceeds.
		writeServiceAccountKey(credFile, tokens.URL+"/token")
		bootInstance(cloud, "203.0.113.30")
		p = waitProxyPhase(ns, "cloud", crawlv1.ProxyReady, 30*time.Second)
		Expect(p.Status.Address).To(Equal("203.0.113.30"))
		Expect(tokens.issued.Load()).To(BeNumerically(">", 0), "the client never authenticated with the mounted key")
	})
})

func names(ps []provider.Provider) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name())
	}
	return out
}

// tokenServer is the OAuth2 token endpoint a service account key names:
// it grants any JWT-bearer assertion.
type tokenServer struct {
	*httptest.Server
	issued atomic.Int32
}

func newTokenServer() *tokenServer {
	t := &tokenServer{}
	t.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/token" || r.ParseForm() != nil || r.PostForm.Get("assertion") == "" {
			http.Error(w, `{"error":"invalid_request"}`, http.StatusBadRequest)
			return
		}
		t.issued.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"access_token": "ya29.envtest", "token_type": "Bearer", "expires_in": 3600,
		})
	}))
	return t
}

// writeServiceAccountKey writes a service_account credential with a fresh
// key whose tokens come from tokenURL, as a mounted Secret would appear:
// atomically.
func writeServiceAccountKey(path, tokenURL string) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	Expect(err).NotTo(HaveOccurred())
	der, err := x509.MarshalPKCS8PrivateKey(key)
	Expect(err).NotTo(HaveOccurred())
	doc, err := json.Marshal(map[string]string{
		"type":           "service_account",
		"project_id":     gcpProject,
		"private_key_id": "envtest-key-1",
		"private_key":    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":   "proxy-operator@" + gcpProject + ".iam.gserviceaccount.com",
		"client_id":      "100000000000000000001",
		"token_uri":      tokenURL,
	})
	Expect(err).NotTo(HaveOccurred())
	tmp := path + ".tmp"
	Expect(os.WriteFile(tmp, doc, 0o600)).To(Succeed())
	Expect(os.Rename(tmp, path)).To(Succeed())
}
