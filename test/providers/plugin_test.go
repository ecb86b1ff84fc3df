package providers

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/controllers"
	webhookv1 "crawl.example.com/proxy-operator/internal/webhook/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
	"crawl.example.com/proxy-operator/test/envtestutil"
	"crawl.example.com/proxy-operator/test/harness"
)

// The toy provider exists only in this file: its provider.Provider (an
// in-memory table of instances) and its plug-in, added to the registration
// list the manager hands the controllers and the webhooks. Nothing else
// in the operator knows it.

const toyName = "toy"

// toyPlugin places in zones, defaults a machine type and refuses images.
var toyPlugin = plugin.Basic{Provider: toyName, In: plugin.Zones,
	Defaults: func(s *crawlv1.ProxySpec) { s.Placement.MachineType = cmp.Or(s.Placement.MachineType, "toy-small") },
	Rules: func(p *crawlv1.Proxy, _ plugin.Policy) field.ErrorList {
		if p.Spec.Placement.Image != "" {
			return field.ErrorList{field.Forbidden(field.NewPath("spec", "placement", "image"), "the toy provider boots no image")}
		}
		return nil
	},
}

// toyProvider keeps instances by owner UID, so Get and Delete only ever
// touch the Machine's own.
type toyProvider struct {
	mu        sync.Mutex
	instances map[string]provider.Instance
	tags      map[string]string
	created   map[string]provider.Machine // the Machine each instance was created from
}

func newToyProvider() *toyProvider {
	return &toyProvider{instances: map[string]provider.Instance{}, tags: map[string]string{}, created: map[string]provider.Machine{}}
}

func (t *toyProvider) Name() string { return toyName }

func (t *toyProvider) Create(_ context.Context, m *provider.Machine) (*provider.Instance, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if inst, ok := t.instances[m.UID]; ok {
		return &inst, nil
	}
	t.put(provider.Instance{
		ProviderID: fmt.Sprintf("toy://%s/%s", cmp.Or(m.Zone, "anywhere"), m.UID), Name: m.Namespace + "." + m.Name,
		Host: m.Zone, State: provider.StateRunning, Address: fmt.Sprintf("10.99.0.%d", len(t.created)+1), AddressSource: provider.AddressSourceNIC,
		Owner: provider.Owner{Namespace: m.Namespace, Name: m.Name, UID: m.UID}, InstallID: testInstallID,
	}, m.Tag)
	t.created[m.UID] = *m
	inst := t.instances[m.UID]
	return &inst, nil
}

func (t *toyProvider) put(inst provider.Instance, tag string) {
	t.instances[inst.Owner.UID], t.tags[inst.Owner.UID] = inst, tag
}

func (t *toyProvider) Get(_ context.Context, m *provider.Machine) (*provider.Instance, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	inst, ok := t.instances[m.UID]
	if !ok {
		return nil, provider.NotFoundf("toy instance of %s/%s", m.Namespace, m.Name)
	}
	return &inst, nil
}

func (t *toyProvider) Delete(_ context.Context, m *provider.Machine) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.instances, m.UID)
	return nil
}

func (t *toyProvider) ListByTag(_ context.Context, tag string) ([]provider.Instance, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []provider.Instance
	for uid, inst := range t.instances {
		if t.tags[uid] == tag {
			out = append(out, inst)
		}
	}
	return out, nil
}

func (t *toyProvider) Check(context.Context) error { return nil }

func (t *toyProvider) has(uid types.UID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.instances[string(uid)]
	return ok
}

func (t *toyProvider) machineOf(uid types.UID) (provider.Machine, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.created[string(uid)]
	return m, ok
}

// providerEnum is the CRDs' enum of spec.provider. The API server checks
// the name before any webhook does, so a new provider also adds its name to
// crawlv1.ProviderName's enum; here the test's copy of the CRDs does.
var providerEnum = regexp.MustCompile(`(?m)^( *)- kvm\n *- kubernetes\n *- gcp\n`)

// crdsWith writes the project's CRDs, with names added to every
// spec.provider enum, into a directory and returns it.
func crdsWith(names ...string) string {
	dir := GinkgoT().TempDir()
	src := filepath.Join(envtestutil.Root(), "config", "crd", "bases")
	files, err := filepath.Glob(filepath.Join(src, "*.yaml"))
	Expect(err).NotTo(HaveOccurred())
	Expect(files).NotTo(BeEmpty())
	patched := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		Expect(err).NotTo(HaveOccurred())
		out := providerEnum.ReplaceAllFunc(b, func(m []byte) []byte {
			patched++
			indent := providerEnum.FindSubmatch(m)[1]
			out := slices.Clone(m) // m is the source's: appending to it would overwrite what follows
			for _, n := range names {
				out = fmt.Appendf(out, "%s- %s\n", indent, n)
			}
			return out
		})
		Expect(os.WriteFile(filepath.Join(dir, filepath.Base(f)), out, 0o600)).To(Succeed())
	}
	Expect(patched).To(Equal(2), "a Proxy's spec.provider and a ProxyPool's template's")
	return dir
}

var _ = Describe("a provider registered only in a test", Ordered, func() {
	var (
		c   client.Client
		toy *toyProvider
		w   *controllers.Wiring
		ns  string
	)

	BeforeAll(func() {
		// An API server of its own: this one runs the webhooks and knows
		// the toy's name ("ghost": a name it admits that no plug-in serves).
		toyEnv := harness.StartEnv(harness.EnvOptions{Webhooks: true, CRDDirs: []string{crdsWith(toyName, "ghost")}})
		DeferCleanup(toyEnv.Stop)
		c = toyEnv.Client

		// The whole registration: the manager's list and one more entry,
		// its Provider in the registry.
		plugins := append(controllers.Plugins(), toyPlugin)
		webhooks := func(m ctrl.Manager) error {
			proxyWebhook := webhookv1.ProxyWebhook{Plugins: plugins}
			if err := proxyWebhook.SetupWithManager(m); err != nil {
				return err
			}
			return (&webhookv1.ProxyPoolWebhook{Proxy: proxyWebhook}).SetupWithManager(m)
		}
		toy = newToyProvider()
		m := operator.Start(toyEnv, harness.ManagerConfig{Webhooks: webhooks}, func(ctrl.Manager) controllers.Deps {
			registry := provider.NewRegistry()
			registry.Add(toy)
			deps := suiteDeps(registry)
			deps.Plugins = plugins
			return deps
		})
		DeferCleanup(m.Stop)
		w = m.Wiring

		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "toy-"}}
		Expect(c.Create(ctx, nsObj)).To(Succeed())
		ns = nsObj.Name
	})

	toyProxy := func(name string) *crawlv1.Proxy {
		return &crawlv1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       crawlv1.ProxySpec{Provider: toyName, Access: &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.0.0.0/8"}}},
		}
	}
	toyPool := func(name string, replicas int32) *crawlv1.ProxyPool {
		return &crawlv1.ProxyPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: crawlv1.ProxyPoolSpec{
				Replicas: ptr.To(replicas),
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
				Template: crawlv1.ProxyTemplate{
					Metadata: crawlv1.ProxyTemplateMeta{Labels: map[string]string{"app": name}},
					Spec:     toyProxy(name).Spec,
				},
			},
		}
	}
	waitReady := func(key client.ObjectKey) *crawlv1.Proxy {
		p := &crawlv1.Proxy{}
		Eventually(func(g Gomega) {
			g.Expect(c.Get(ctx, key, p)).To(Succeed())
			g.Expect(p.Status.Phase).To(Equal(crawlv1.ProxyReady), describe(p))
		}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		return p
	}

	It("is validated by its own rules and the placement domain's, and named among the providers", func() {
		p := toyProxy("imaged")
		p.Spec.Placement.Image = "debian-12"
		Expect(c.Create(ctx, p)).To(MatchError(ContainSubstring("spec.placement.image: Forbidden: the toy provider boots no image")))

		p = toyProxy("hosted")
		p.Spec.Placement.Host = "hv1"
		Expect(c.Create(ctx, p)).To(MatchError(ContainSubstring("spec.placement.host: Forbidden: only the kvm provider places on a KVMHost")))

		p = toyProxy("ghostly")
		p.Spec.Provider = "ghost"
		Expect(c.Create(ctx, p)).To(MatchError(ContainSubstring(`spec.provider: Unsupported value: "ghost": supported values: "kvm", "kubernetes", "gcp", "toy"`)))

		pool := toyPool("overcommitted", 1)
		pool.Spec.Placement.CPUOvercommit = 2
		Expect(c.Create(ctx, pool)).To(MatchError(ContainSubstring("spec.placement.cpuOvercommit: Forbidden: only for kvm replicas")))
		pool = toyPool("imaged", 1)
		pool.Spec.Template.Spec.Placement.Image = "debian-12"
		Expect(c.Create(ctx, pool)).To(MatchError(ContainSubstring("spec.template.spec.placement.image: Forbidden: the toy provider boots no image")))
	})

	It("gets a Proxy defaulted, created and Ready, then deleted with its instance", func() {
		Expect(c.Create(ctx, toyProxy("single"))).To(Succeed())
		key := client.ObjectKey{Namespace: ns, Name: "single"}
		p := waitReady(key)
		Expect(p.Spec.Placement.MachineType).To(Equal("toy-small"), "the toy's own default")
		Expect(p.Spec.Port).To(BeEquivalentTo(crawlv1.DefaultProxyPort), "crawlv1's default")
		Expect(p.IsManaged()).To(BeTrue())
		Expect(p.Status.ProviderID).To(HavePrefix("toy://"))
		m, ok := toy.machineOf(p.UID)
		Expect(ok).To(BeTrue())
		Expect(m.MachineType).To(Equal("toy-small"))
		Expect(m.Squid).NotTo(BeNil(), "a managed squid's configuration reaches the provider")

		Expect(c.Delete(ctx, p)).To(Succeed())
		Eventually(func() bool { return apierrors.IsNotFound(c.Get(ctx, key, &crawlv1.Proxy{})) }).
			WithTimeout(15 * time.Second).Should(BeTrue())
		Expect(toy.has(p.UID)).To(BeFalse(), "its instance is deleted with it")
	})

	It("gets a pool's replicas spread over the pool's zones", func() {
		pool := toyPool("fleet", 3)
		pool.Spec.Placement.Zones = []string{"zone-a", "zone-b", "zone-c"}
		Expect(c.Create(ctx, pool)).To(Succeed())
		zones := map[string]string{}
		Eventually(func(g Gomega) {
			var list crawlv1.ProxyList
			g.Expect(c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{crawlv1.PoolNameLabel: "fleet"})).To(Succeed())
			g.Expect(list.Items).To(HaveLen(3))
			clear(zones)
			for _, p := range list.Items {
				g.Expect(p.Status.Phase).To(Equal(crawlv1.ProxyReady), describe(&p))
				zones[p.Spec.Placement.Zone] = p.Name
				m, ok := toy.machineOf(p.UID)
				g.Expect(ok).To(BeTrue())
				g.Expect(m.Zone).To(Equal(p.Spec.Placement.Zone))
			}
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		Expect(zones).To(HaveLen(3), "one replica per zone: %v", zones)
		Expect(zones).To(HaveKey("zone-a"))
	})

	It("gets its orphans swept, and only them", func() {
		Expect(c.Create(ctx, toyProxy("kept"))).To(Succeed())
		live := waitReady(client.ObjectKey{Namespace: ns, Name: "kept"})
		const orphanUID = "0eaf0000-0000-4000-8000-000000000001"
		toy.mu.Lock()
		toy.put(provider.Instance{ProviderID: "toy://zone-a/" + orphanUID, Name: ns + ".gone", Host: "zone-a", State: provider.StateRunning,
			Owner: provider.Owner{Namespace: ns, Name: "gone", UID: orphanUID}, InstallID: testInstallID}, testTag)
		toy.mu.Unlock()

		n, err := w.Sweep.Sweep(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(Equal(1))
		Expect(toy.has(orphanUID)).To(BeFalse())
		Expect(toy.has(live.UID)).To(BeTrue(), "a live Proxy's instance is never swept")
		Eventually(func(g Gomega) {
			var list corev1.EventList
			g.Expect(c.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			var reasons []string
			for _, e := range list.Items {
				if e.InvolvedObject.Kind == "Proxy" && e.InvolvedObject.Name == "gone" {
					reasons = append(reasons, e.Reason)
				}
			}
			g.Expect(reasons).To(ContainElement(controllers.OrphanDeletedReason))
		}).WithTimeout(10 * time.Second).Should(Succeed())
	})
})
