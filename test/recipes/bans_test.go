package recipes

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

// banAPI is a real API server (envtest) with the project's CRDs and a
// namespace where a ServiceAccount is bound to the shipped
// crawl-ban-reporter-role, as docs/pools.md tells a crawler team to do.
type banAPI struct {
	c    client.Client
	host string
	ns   string
	// reporter is a service-account directory (token, ca.crt, namespace)
	// of the bound account, stranger one of an account bound to nothing.
	reporter, stranger string
}

func startBanAPI(t *testing.T) *banAPI {
	t.Helper()
	env, err := envtestutil.New(false)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := &banAPI{c: c, host: cfg.Host, ns: "crawl"}
	role := &rbacv1.ClusterRole{}
	data, err := os.ReadFile(filepath.Join(envtestutil.Root(), "config", "rbac", "proxyban_reporter_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, role); err != nil {
		t.Fatal(err)
	}
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: a.ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "crawler", Namespace: a.ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "stranger", Namespace: a.ns}},
		role,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "crawler-reports-bans", Namespace: a.ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "crawler", Namespace: a.ns}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	accountDir := func(sa string) string {
		tr, err := cs.CoreV1().ServiceAccounts(a.ns).CreateToken(ctx, sa,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		for name, content := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": cfg.CAData, "namespace": []byte(a.ns)} {
			if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	a.reporter, a.stranger = accountDir("crawler"), accountDir("stranger")
	return a
}

func (a *banAPI) bans(t *testing.T) []crawlv1.ProxyBan {
	t.Helper()
	list := &crawlv1.ProxyBanList{}
	if err := a.c.List(context.Background(), list, client.InNamespace(a.ns)); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// The Scrapy, requests and Crawlee recipes report a ban as docs/pools.md says: a
// proxy that got the threshold's 403s from a domain is reported once as a
// ProxyBan (pool, the proxy's name, the domain, "HTTP 403 x3"), created
// with the service account bound to crawl-ban-reporter-role; a domain with
// fewer is not reported; the token never shows. An account without the
// role gets the API's refusal logged, and the crawl goes on.
func TestRecipesReportBans(t *testing.T) {
	api := startBanAPI(t)
	recipes := []recipe{scrapyRecipe, requestsRecipe, crawleeRecipe}
	records := map[string][]string{}
	for _, r := range recipes {
		for _, host := range []string{r.name + ".bans.test", r.name + "-few.bans.test", r.name + "-stranger.bans.test"} {
			records[host] = []string{originAddr}
		}
	}
	squidtest.ServeDNS(t, records)
	o := newOrigin(t)
	a := startProxy(t, "crawl-a-aaaaa", egressA, o.port)
	token, err := os.ReadFile(filepath.Join(api.reporter, "token"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recipes {
		t.Run(r.name, func(t *testing.T) {
			d := newSecretDir(t)
			d.publish(t, a.entry())
			s := defaults(d.path("proxies.json"))
			s.Concurrency = 1
			s.Bans = &banReports{Pool: "crawl-a", API: api.host, AccountDir: api.reporter, Threshold: 3}
			banned, few := r.name+".bans.test", r.name+"-few.bans.test"
			urls := append(o.urls(banned, "/forbidden/"+r.name+"/", 4), o.urls(few, "/forbidden/"+r.name+"-few/", 2)...)
			p := startProcess(t, r.command(t, s, urls))
			if code := p.wait(t, runLimit); code != 0 {
				t.Errorf("exit code %d:\n%s", code, p.output())
			}
			out := p.output()
			requireThrough(t, o, "/forbidden/"+r.name, urls, egressA)
			var got []crawlv1.ProxyBanSpec
			for _, b := range api.bans(t) {
				if strings.HasPrefix(b.Spec.Domain, r.name) {
					got = append(got, b.Spec)
					if !strings.HasPrefix(b.Name, "crawl-a-ban-") {
						t.Errorf("ProxyBan %s: want a name generated from crawl-a-ban-", b.Name)
					}
				}
			}
			want := crawlv1.ProxyBanSpec{Pool: "crawl-a", Proxy: a.Name, Domain: banned, Reason: "HTTP 403 x3"}
			if len(got) != 1 || got[0] != want {
				t.Errorf("ProxyBans %+v, want exactly %+v:\n%s", got, want, out)
			}
			if !strings.Contains(out, "reported proxy "+a.Name+" banned on "+banned) {
				t.Errorf("output does not say the ban was reported:\n%s", out)
			}
			if strings.Contains(out, strings.TrimSpace(string(token))) {
				t.Errorf("the service account's token is in the output")
			}
		})
		t.Run(r.name+" without the role", func(t *testing.T) {
			d := newSecretDir(t)
			d.publish(t, a.entry())
			s := defaults(d.path("proxies.json"))
			s.Concurrency = 1
			s.Bans = &banReports{Pool: "crawl-a", API: api.host, AccountDir: api.stranger, Threshold: 3}
			host := r.name + "-stranger.bans.test"
			urls := append(o.urls(host, "/forbidden/"+r.name+"-stranger/", 3), o.urls("", "/after-refusal/"+r.name+"/", 2)...)
			p := startProcess(t, r.command(t, s, urls))
			if code := p.wait(t, runLimit); code != 0 {
				t.Errorf("exit code %d:\n%s", code, p.output())
			}
			out := p.output()
			if !strings.Contains(out, "the API refused it (403)") || !strings.Contains(out, "cannot create resource \"proxybans\"") {
				t.Errorf("output does not carry the API's refusal:\n%s", out)
			}
			for _, b := range api.bans(t) {
				if b.Spec.Domain == host {
					t.Errorf("a ProxyBan %s was created without the role", b.Name)
				}
			}
			requireThrough(t, o, "/after-refusal/"+r.name+"/", urls[3:], egressA)
		})
	}
}
