package deploy

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"crawl.example.com/proxy-operator/internal/metricsauth"
)

// TestMetricsEndpointNeedsTheMetricsReaderRole runs the manager's metrics
// server as main.go configures it against a real API server, authenticating
// and authorizing as the manager's ServiceAccount with only config/rbac's
// metrics-auth-role: no token is 401, a token without metrics-reader is 403,
// a ServiceAccount bound to config/rbac's metrics-reader reads the metrics.
func TestMetricsEndpointNeedsTheMetricsReaderRole(t *testing.T) {
	c, _ := apiServer(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(envCfg)
	if err != nil {
		t.Fatal(err)
	}

	// config/rbac's objects, for real, in a namespace of this test.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "metrics-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	rbac := kustomizeBuild(t, "config/rbac")
	for _, name := range []string{"metrics-auth-role", "metrics-reader"} {
		role := one(t, rbac, "ClusterRole", name).DeepCopy()
		role.SetName(ns.Name + "-" + name)
		if err := c.Create(ctx, role); err != nil {
			t.Fatal(err)
		}
	}
	binding := one(t, rbac, "ClusterRoleBinding", "metrics-auth-rolebinding").DeepCopy()
	binding.SetName(ns.Name + "-metrics-auth")
	sa, _, _ := unstructured.NestedSlice(binding.Object, "subjects")
	manager := sa[0].(map[string]any)["name"].(string)
	_ = unstructured.SetNestedField(binding.Object, ns.Name+"-metrics-auth-role", "roleRef", "name")
	_ = unstructured.SetNestedSlice(binding.Object, []any{map[string]any{"kind": "ServiceAccount", "name": manager, "namespace": ns.Name}}, "subjects")
	if err := c.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{manager, "scraper", "stranger"} {
		if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns.Name + "-scraper"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ns.Name + "-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: ns.Name}},
	}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		tr, err := cs.CoreV1().ServiceAccounts(ns.Name).CreateToken(ctx, sa,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}

	// The server reviews tokens as the manager's ServiceAccount would.
	asManager := rest.CopyConfig(envCfg)
	asManager.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns.Name + ":" + manager}
	hc, err := rest.HTTPClientFor(asManager)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackAddr(t)
	srv, err := metricsserver.NewServer(metricsauth.ServerOptions(addr, true, nil), asManager, hc)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()

	// A self-signed certificate: the scraper does not verify it (as the
	// ServiceMonitor), the API server verifies the token.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed test server
	get := func(bearer string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		return resp.StatusCode, nil
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := get(""); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("metrics server never answered: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, tc := range []struct {
		who, token string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a ServiceAccount without metrics-reader", token("stranger"), http.StatusForbidden},
		{"a ServiceAccount bound to metrics-reader", token("scraper"), http.StatusOK},
	} {
		if got, err := get(tc.token); err != nil || got != tc.want {
			t.Errorf("%s: status %d (%v), want %d", tc.who, got, err, tc.want)
		}
	}
	// A token the API server cannot parse comes back from the TokenReview as
	// an error, which controller-runtime's filter answers with 500: refused
	// all the same.
	if got, err := get("not-a-token"); err != nil || got == http.StatusOK {
		t.Errorf("a garbage token: status %d (%v), want a refusal", got, err)
	}

	// Plain HTTP is refused on the TLS port.
	if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP read the metrics")
		}
	}
	select {
	case err := <-done:
		t.Fatalf("metrics server stopped: %v", err)
	default:
	}
}

// freeLoopbackAddr returns a 127.0.0.1 address with a port free just now.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprintf("127.0.0.1:%d", l.Addr().(*net.TCPAddr).Port)
}
