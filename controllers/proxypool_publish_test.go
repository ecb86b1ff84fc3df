package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	poolfleet "crawl.example.com/proxy-operator/pkg/fleet"
)

// Passwords with every character URL escaping cares about; none of them,
// raw or escaped, may show up outside the published Secret.
const (
	alphaPassword   = "al:pha/p@ss%w?rd#1"
	charliePassword = "ch@rlie:secret/2"
)

// writeCounter passes everything to the API server and records each write.
type writeCounter struct {
	client.Client
	mu     sync.Mutex
	writes []string
}

func (w *writeCounter) note(verb string, obj client.Object) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, fmt.Sprintf("%s %T %s%s", verb, obj, obj.GetName(), obj.GetGenerateName()))
}

func (w *writeCounter) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	w.note("create", obj)
	return w.Client.Create(ctx, obj, opts...)
}

func (w *writeCounter) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	w.note("update", obj)
	return w.Client.Update(ctx, obj, opts...)
}

func (w *writeCounter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	w.note("patch", obj)
	return w.Client.Patch(ctx, obj, patch, opts...)
}

func (w *writeCounter) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	w.note("delete", obj)
	return w.Client.Delete(ctx, obj, opts...)
}

func (w *writeCounter) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	w.note("deleteAllOf", obj)
	return w.Client.DeleteAllOf(ctx, obj, opts...)
}

func (w *writeCounter) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.writes
	w.writes = nil
	return out
}

// secretReads counts Gets of Secrets other than the published one.
type secretReads struct {
	client.Reader
	mu   sync.Mutex
	gets []string
}

func (r *secretReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Secret); ok && !strings.HasSuffix(key.Name, crawlv1.PublishedNameSuffix) {
		r.mu.Lock()
		r.gets = append(r.gets, key.Name)
		r.mu.Unlock()
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

func (r *secretReads) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.gets
	r.gets = nil
	slices.Sort(out)
	return out
}

// newPool is a pool Publish writes for, never stored: a stored pool would
// be reconciled, and published, by the suite's pool controller at the same
// time. The published objects' owner references name its UID; envtest runs
// no garbage collector to act on the missing owner.
func newPool(ns, name string, port int32) *crawlv1.ProxyPool {
	return &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uuid.NewUUID()},
		Spec: crawlv1.ProxyPoolSpec{
			Replicas: ptr.To[int32](3),
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": name}},
			Template: crawlv1.ProxyTemplate{
				Metadata: crawlv1.ProxyTemplateMeta{Labels: map[string]string{"pool": name}},
				Spec:     crawlv1.ProxySpec{Provider: crawlv1.ProviderGCP, Port: port},
			},
		},
	}
}

// replicaSpec is what a test says about one replica.
type replicaSpec struct {
	name, address, host, egress string
	port                        int32
	// password: a Basic replica with a credential Secret; empty: auth None.
	password string
	// noSecret: status names a credential Secret that does not exist.
	noSecret bool
}

// createReplica stores a Proxy of pool with its status and, for Basic, its
// credential Secret as the operator writes it (username, password, url,
// owned by the Proxy). The Proxy controller sees a provider that is not
// enabled and leaves it Failed; Publish only reads what it is given.
func createReplica(pool *crawlv1.ProxyPool, r replicaSpec) crawlv1.Proxy {
	if r.port == 0 {
		r.port = 3128
	}
	access := &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.244.0.0/24"}}
	if r.password == "" && !r.noSecret {
		access.Auth = &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthNone}
	}
	p := &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: r.name, Labels: map[string]string{"pool": pool.Name, crawlv1.PoolNameLabel: pool.Name}},
		Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderGCP, Port: r.port, Access: access,
			Placement: crawlv1.ProxyPlacement{Zone: "europe-west1-b"}},
	}
	Expect(k8sClient.Create(ctx, p)).To(Succeed())
	before := p.DeepCopy()
	endpoint := "http://" + net.JoinHostPort(r.address, fmt.Sprint(r.port))
	p.Status = crawlv1.ProxyStatus{Phase: crawlv1.ProxyReady, Host: r.host, Address: r.address, Endpoint: endpoint, EgressAddress: r.egress}
	if r.egress != "" {
		p.Status.EgressSource = crawlv1.EgressSourceEcho
	}
	if r.password != "" || r.noSecret {
		p.Status.CredentialsSecretRef = &crawlv1.LocalObjectReference{Name: r.name + "-credentials"}
	}
	Expect(k8sClient.Status().Patch(ctx, p, client.MergeFrom(before))).To(Succeed())
	if r.password != "" {
		createCredentials(p, r.password)
	}
	return *p
}

func createCredentials(p *crawlv1.Proxy, password string) {
	user := p.Name + "-user"
	u := url.URL{Scheme: "http", User: url.UserPassword(user, password), Host: strings.TrimPrefix(p.Status.Endpoint, "http://")}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Status.CredentialsSecretRef.Name,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: crawlv1.GroupVersion.String(), Kind: "Proxy", Name: p.Name, UID: p.UID, Controller: ptr.To(true)}}},
		Data: map[string][]byte{
			crawlv1.CredentialsUsernameKey: []byte(user),
			crawlv1.CredentialsPasswordKey: []byte(password),
			crawlv1.CredentialsURLKey:      []byte(u.String()),
		},
	}
	Expect(k8sClient.Create(ctx, sec)).To(Succeed())
}

// memoryReplica is a replica as the pool controller would pass it, not
// stored: the split specs need hundreds.
func memoryReplica(ns, name, address string) crawlv1.Proxy {
	return crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.Now()},
		Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderGCP, Port: 3128,
			Access: &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.244.0.0/24"}, Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthNone}}},
		Status: crawlv1.ProxyStatus{Phase: crawlv1.ProxyReady, Address: address, Endpoint: "http://" + address + ":3128", Host: "hv1"},
	}
}

func publishedSecret(pool *crawlv1.ProxyPool) *corev1.Secret {
	s := &corev1.Secret{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: crawlv1.PublishedName(pool.Name)}, s)).To(Succeed())
	return s
}

func publishedJSON(pool *crawlv1.ProxyPool) []PublishedProxy {
	var out []PublishedProxy
	Expect(json.Unmarshal(publishedSecret(pool).Data[crawlv1.ProxiesJSONKey], &out)).To(Succeed())
	return out
}

func publishedLines(pool *crawlv1.ProxyPool) []string {
	return strings.Split(strings.TrimSuffix(string(publishedSecret(pool).Data[crawlv1.ProxiesTextKey]), "\n"), "\n")
}

func publishedService(pool *crawlv1.ProxyPool) *corev1.Service {
	s := &corev1.Service{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: crawlv1.PublishedName(pool.Name)}, s)).To(Succeed())
	return s
}

// publishedSlices lists the Service's EndpointSlices by the label
// consumers (kube-proxy, CoreDNS) use, whoever manages them.
func publishedSlices(pool *crawlv1.ProxyPool) []discoveryv1.EndpointSlice {
	var list discoveryv1.EndpointSliceList
	Expect(k8sClient.List(ctx, &list, client.InNamespace(pool.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: crawlv1.PublishedName(pool.Name)})).To(Succeed())
	return list.Items
}

// sliceEndpointNames are the replica names in all slices, sorted; a name in
// two slices appears twice.
func sliceEndpointNames(ss []discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range ss {
		for _, e := range s.Endpoints {
			out = append(out, e.TargetRef.Name)
		}
	}
	slices.Sort(out)
	return out
}

func namesOf(ps []PublishedProxy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// versions are the resourceVersions of everything published for pool.
func versions(pool *crawlv1.ProxyPool) map[string]string {
	v := map[string]string{
		"secret":  publishedSecret(pool).ResourceVersion,
		"service": publishedService(pool).ResourceVersion,
	}
	for _, s := range publishedSlices(pool) {
		v["slice "+s.Name] = s.ResourceVersion
	}
	return v
}

// expectNoCredentials: neither password, raw or URL-escaped, in the
// Service or any slice of pool.
func expectNoCredentials(pool *crawlv1.ProxyPool, passwords ...string) {
	objs := []any{publishedService(pool)}
	for _, s := range publishedSlices(pool) {
		objs = append(objs, s)
	}
	for _, o := range objs {
		b, err := json.Marshal(o)
		Expect(err).NotTo(HaveOccurred())
		for _, pw := range passwords {
			Expect(string(b)).NotTo(ContainSubstring(pw))
			Expect(string(b)).NotTo(ContainSubstring(url.UserPassword("u", pw).String()[2:]))
		}
	}
}

var _ = Describe("ProxyPool publishing", func() {
	var (
		ns        string
		pool      *crawlv1.ProxyPool
		writes    *writeCounter
		reads     *secretReads
		publisher *Publisher
	)
	BeforeEach(func() {
		ns = newNamespace()
		pool = newPool(ns, "crawl-a", 3128)
		writes = &writeCounter{Client: k8sClient}
		reads = &secretReads{Reader: k8sClient}
		publisher = &Publisher{Client: writes, Reader: reads}
	})

	It("lists exactly the replicas given, with their credentials only in the Secret", func() {
		created := time.Now().UTC().Truncate(time.Second)
		alpha := createReplica(pool, replicaSpec{name: "alpha", address: "192.0.2.11", host: "hv1", egress: "198.51.100.11", password: alphaPassword})
		bravo := createReplica(pool, replicaSpec{name: "bravo", address: "192.0.2.12", host: "hv2"})
		charlie := createReplica(pool, replicaSpec{name: "charlie", address: "192.0.2.13", host: "hv1", password: charliePassword})

		// Rotation replaces each replica between 5h and 6h after it was
		// created (its jitter); proxies.json says when.
		pool.Spec.Rotation = crawlv1.ProxyPoolRotation{MaxAge: &metav1.Duration{Duration: 6 * time.Hour}, Jitter: &metav1.Duration{Duration: time.Hour}}
		Expect(publisher.Publish(ctx, pool, []crawlv1.Proxy{alpha, bravo, charlie})).To(Succeed())

		By("the Secret: proxies.txt in the scrapy-rotating-proxies / Crawlee form")
		alphaURL := (&url.URL{Scheme: "http", User: url.UserPassword("alpha-user", alphaPassword), Host: "192.0.2.11:3128"}).String()
		charlieURL := (&url.URL{Scheme: "http", User: url.UserPassword("charlie-user", charliePassword), Host: "192.0.2.13:3128"}).String()
		Expect(publishedLines(pool)).To(Equal([]string{alphaURL, "http://192.0.2.12:3128", charlieURL}))
		u, err := url.Parse(alphaURL)
		Expect(err).NotTo(HaveOccurred())
		pw, _ := u.User.Password()
		Expect(pw).To(Equal(alphaPassword), "the line gives back the password")

		By("the Secret: proxies.json")
		entries := publishedJSON(pool)
		Expect(namesOf(entries)).To(Equal([]string{"alpha", "bravo", "charlie"}))
		alphaExpiry, _ := poolfleet.ExpiresAt(alpha.CreationTimestamp.Time, string(alpha.UID), 6*time.Hour, time.Hour)
		Expect(entries[0]).To(Equal(PublishedProxy{Name: "alpha", URL: alphaURL, Host: "hv1", EgressAddress: "198.51.100.11", EgressSource: crawlv1.EgressSourceEcho,
			CreatedAt: alpha.CreationTimestamp.UTC().Format(time.RFC3339), ExpiresAt: alphaExpiry.UTC().Format(time.RFC3339)}))
		Expect(entries[1].URL).To(Equal("http://192.0.2.12:3128"))
		for i, r := range []crawlv1.Proxy{alpha, bravo, charlie} {
			exp, err := time.Parse(time.RFC3339, entries[i].ExpiresAt)
			Expect(err).NotTo(HaveOccurred(), "expiresAt of %s", r.Name)
			Expect(exp).To(BeTemporally(">", r.CreationTimestamp.Add(5*time.Hour)), "expiresAt of %s", r.Name)
			Expect(exp).To(BeTemporally("<=", r.CreationTimestamp.Add(6*time.Hour)), "expiresAt of %s", r.Name)
		}
		Expect(time.Parse(time.RFC3339, entries[2].CreatedAt)).To(BeTemporally(">=", created))

		sec := publishedSecret(pool)
		Expect(metav1.IsControlledBy(sec, pool)).To(BeTrue())
		Expect(sec.Labels).To(HaveKeyWithValue(crawlv1.PoolNameLabel, pool.Name))

		By("the headless Service")
		svc := publishedService(pool)
		Expect(svc.Spec.ClusterIP).To(Equal(corev1.ClusterIPNone))
		Expect(svc.Spec.Selector).To(BeEmpty())
		Expect(svc.Spec.Ports).To(HaveLen(1))
		Expect(svc.Spec.Ports[0].Name).To(Equal("proxy"))
		Expect(svc.Spec.Ports[0].Port).To(Equal(int32(3128)))
		Expect(metav1.IsControlledBy(svc, pool)).To(BeTrue())

		By("one EndpointSlice, managed by the operator")
		ss := publishedSlices(pool)
		Expect(ss).To(HaveLen(1))
		s := ss[0]
		Expect(s.Labels).To(HaveKeyWithValue(discoveryv1.LabelManagedBy, EndpointSliceManagedBy))
		Expect(s.Labels).To(HaveKeyWithValue(crawlv1.PoolNameLabel, pool.Name))
		Expect(metav1.IsControlledBy(&s, pool)).To(BeTrue())
		Expect(s.AddressType).To(Equal(discoveryv1.AddressTypeIPv4))
		Expect(s.Ports).To(HaveLen(1))
		Expect(*s.Ports[0].Name).To(Equal("proxy"))
		Expect(*s.Ports[0].Port).To(Equal(int32(3128)))
		Expect(s.Endpoints).To(HaveLen(3))
		for i, want := range []struct{ name, addr, zone string }{{"alpha", "192.0.2.11", "hv1"}, {"bravo", "192.0.2.12", "hv2"}, {"charlie", "192.0.2.13", "hv1"}} {
			e := s.Endpoints[i]
			Expect(e.Addresses).To(Equal([]string{want.addr}))
			Expect(e.Hostname).To(HaveValue(Equal(want.name)))
			Expect(e.Zone).To(HaveValue(Equal(want.zone)))
			Expect(e.NodeName).To(BeNil())
			Expect(e.Conditions.Ready).To(HaveValue(BeTrue()))
			Expect(e.TargetRef.Name).To(Equal(want.name))
		}
		expectNoCredentials(pool, alphaPassword, charliePassword)
	})

	It("writes nothing when called again with the same replicas", func() {
		replicas := []crawlv1.Proxy{
			createReplica(pool, replicaSpec{name: "alpha", address: "192.0.2.11", host: "hv1", password: alphaPassword}),
			createReplica(pool, replicaSpec{name: "bravo", address: "192.0.2.12", host: "hv2"}),
		}
		Expect(publisher.Publish(ctx, pool, replicas)).To(Succeed())
		Expect(writes.take()).To(HaveLen(3), "Secret, Service and one slice created")
		before := versions(pool)

		Expect(publisher.Publish(ctx, pool, replicas)).To(Succeed())
		Expect(writes.take()).To(BeEmpty())
		Expect(versions(pool)).To(Equal(before))

		By("a fresh Publisher (a manager restart) writes nothing either")
		restarted := &Publisher{Client: writes, Reader: k8sClient}
		Expect(restarted.Publish(ctx, pool, replicas)).To(Succeed())
		Expect(writes.take()).To(BeEmpty())
		Expect(versions(pool)).To(Equal(before))
	})

	It("removes a replica from every list, and empties them", func() {
		alpha := createReplica(pool, replicaSpec{name: "alpha", address: "192.0.2.11", password: alphaPassword})
		bravo := createReplica(pool, replicaSpec{name: "bravo", address: "192.0.2.12"})
		charlie := createReplica(pool, replicaSpec{name: "charlie", address: "192.0.2.13", password: charliePassword})
		Expect(publisher.Publish(ctx, pool, []crawlv1.Proxy{alpha, bravo, charlie})).To(Succeed())
		Expect(sliceEndpointNames(publishedSlices(pool))).To(Equal([]string{"alpha", "bravo", "charlie"}))

		Expect(publisher.Publish(ctx, pool, []crawlv1.Proxy{alpha, charlie})).To(Succeed())
		Expect(namesOf(publishedJSON(pool))).To(Equal([]string{"alpha", "charlie"}))
		Expect(publishedLines(pool)).To(HaveLen(2))
		Expect(strings.Join(publishedLines(pool), "\n")).NotTo(ContainSubstring("192.0.2.12"))
		Expect(sliceEndpointNames(publishedSlices(pool))).To(Equal([]string{"alpha", "charlie"}))

		Expect(publisher.Publish(ctx, pool, nil)).To(Succeed())
		sec := publishedSecret(pool)
		Expect(string(sec.Data[crawlv1.ProxiesTextKey])).To(BeEmpty())
		Expect(string(sec.Data[crawlv1.ProxiesJSONKey])).To(Equal("[]\n"))
		Expect(publishedSlices(pool)).To(BeEmpty())
		publishedService(pool) // the Service stays, with no endpoints
	})

	It("splits more than 100 replicas over slices of at most 100, and drops emptied ones", func() {
		var replicas []crawlv1.Proxy
		var all []string
		for i := range 205 {
			name := fmt.Sprintf("r%03d", i)
			replicas = append(replicas, memoryReplica(ns, name, fmt.Sprintf("192.0.%d.%d", 2+i/200, 1+i%200)))
			all = append(all, name)
		}
		Expect(publisher.Publish(ctx, pool, replicas)).To(Succeed())
		ss := publishedSlices(pool)
		var sizes []int
		for _, s := range ss {
			sizes = append(sizes, len(s.Endpoints))
			Expect(metav1.IsControlledBy(&s, pool)).To(BeTrue())
		}
		slices.Sort(sizes)
		Expect(sizes).To(Equal([]int{5, 100, 100}))
		Expect(sliceEndpointNames(ss)).To(Equal(all))
		Expect(publishedLines(pool)).To(HaveLen(205))
		writes.take()

		By("again: no write")
		Expect(publisher.Publish(ctx, pool, replicas)).To(Succeed())
		Expect(writes.take()).To(BeEmpty())

		By("down to 90: one slice's worth, nothing empty left behind")
		Expect(publisher.Publish(ctx, pool, replicas[:90])).To(Succeed())
		ss = publishedSlices(pool)
		Expect(sliceEndpointNames(ss)).To(Equal(all[:90]))
		for _, s := range ss {
			Expect(s.Endpoints).NotTo(BeEmpty(), "slice %s", s.Name)
			Expect(len(s.Endpoints)).To(BeNumerically("<=", 100))
		}
		Expect(ss).To(HaveLen(1))
		Expect(publishedLines(pool)).To(HaveLen(90))
	})

	It("leaves out a replica whose credential Secret is missing, and adds it once the Secret is there", func() {
		alpha := createReplica(pool, replicaSpec{name: "alpha", address: "192.0.2.11", password: alphaPassword})
		delta := createReplica(pool, replicaSpec{name: "delta", address: "192.0.2.14", noSecret: true})

		err := publisher.Publish(ctx, pool, []crawlv1.Proxy{alpha, delta})
		Expect(err).To(MatchError(ErrReplicasLeftOut))
		Expect(err.Error()).To(ContainSubstring("delta"))
		Expect(err.Error()).To(ContainSubstring("delta-credentials"))
		Expect(namesOf(publishedJSON(pool))).To(Equal([]string{"alpha"}))
		Expect(publishedLines(pool)).To(HaveLen(1))
		Expect(sliceEndpointNames(publishedSlices(pool))).To(Equal([]string{"alpha"}))

		createCredentials(&delta, "delta-secret")
		Expect(publisher.Publish(ctx, pool, []crawlv1.Proxy{alpha, delta})).To(Succeed())
		Expect(namesOf(publishedJSON(pool))).To(Equal([]string{"alpha", "delta"}))
		Expect(sliceEndpointNames(publishedSlices(pool))).To(Equal([]string{"alpha", "delta"}))
	})

	It("leaves out a Basic replica without credentials yet rather than publish a URL that gets 407", func() {
		echo := createReplica(pool, replicaSpec{name: "echo", address: "192.0.2.15"})
		echo.Spec.Access.Auth = nil // Basic by default, and status names no Secret yet
		Expect(publisher.Publish(ctx, pool, []crawlv1.Proxy{echo})).To(MatchError(ErrReplicasLeftOut))
		Expect(publishedJSON(pool)).To(BeEmpty())
		Expect(publishedSlices(pool)).To(BeEmpty())
	})

	It("never logs a credential, at any verbosity", func() {
		var mu sync.Mutex
		var lines []string
		logger := funcr.NewJSON(func(obj string) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, obj)
		}, funcr.Options{Verbosity: 9})
		lctx := logr.NewContext(ctx, logger)
		alpha := createReplica(pool, replicaSpec{name: "alpha", address: "192.0.2.11", password: alphaPassword})
		delta := createReplica(pool, replicaSpec{name: "delta", address: "192.0.2.14", noSecret: true})
		foxtrot := createReplica(pool, replicaSpec{name: "foxtrot", address: "2001:db8::1", password: charliePassword})

		Expect(publisher.Publish(lctx, pool, []crawlv1.Proxy{alpha, delta, foxtrot})).To(MatchError(ErrReplicasLeftOut))
		Expect(publisher.Publish(lctx, pool, []crawlv1.Proxy{alpha})).To(Succeed())
		mu.Lock()
		defer mu.Unlock()
		all := strings.Join(lines, "\n")
		Expect(all).To(ContainSubstring("delta"), "the left-out replica is logged")
		Expect(all).To(ContainSubstring("foxtrot"), "the replica without an IPv4 endpoint is logged")
		Expect(all).To(ContainSubstring("updated published Secret"))
		for _, pw := range []string{alphaPassword, charliePassword} {
			Expect(all).NotTo(ContainSubstring(pw))
			Expect(all).NotTo(ContainSubstring(url.QueryEscape(pw)))
			Expect(all).NotTo(ContainSubstring(url.UserPassword("u", pw).String()[2:]))
		}
	})

	It("refuses to overwrite a Secret of that name it does not control", func() {
		theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: crawlv1.PublishedName(pool.Name)},
			Data: map[string][]byte{crawlv1.ProxiesTextKey: []byte("http://theirs:3128\n")}}
		Expect(k8sClient.Create(ctx, theirs)).To(Succeed())
		alpha := createReplica(pool, replicaSpec{name: "alpha", address: "192.0.2.11", password: alphaPassword})

		err := publisher.Publish(ctx, pool, []crawlv1.Proxy{alpha})
		Expect(err).To(MatchError(ContainSubstring("not controlled by ProxyPool crawl-a")))
		Expect(string(publishedSecret(pool).Data[crawlv1.ProxiesTextKey])).To(Equal("http://theirs:3128\n"))
		By("the Service and slices are published all the same")
		Expect(sliceEndpointNames(publishedSlices(pool))).To(Equal([]string{"alpha"}))
	})

	It("reads each credential Secret once while replicas stay the same", func() {
		clk := clocktesting.NewFakePassiveClock(time.Now())
		publisher.Clock = clk
		alpha := createReplica(pool, replicaSpec{name: "alpha", address: "192.0.2.11", password: alphaPassword})
		charlie := createReplica(pool, replicaSpec{name: "charlie", address: "192.0.2.13", password: charliePassword})
		replicas := []crawlv1.Proxy{alpha, charlie}

		Expect(publisher.Publish(ctx, pool, replicas)).To(Succeed())
		Expect(reads.take()).To(Equal([]string{"alpha-credentials", "charlie-credentials"}))
		Expect(publisher.Publish(ctx, pool, replicas)).To(Succeed())
		Expect(reads.take()).To(BeEmpty())

		By("a new endpoint is read again")
		moved := charlie.DeepCopy()
		moved.Status.Address, moved.Status.Endpoint = "192.0.2.23", "http://192.0.2.23:3128"
		Expect(publisher.Publish(ctx, pool, []crawlv1.Proxy{alpha, *moved})).To(Succeed())
		Expect(reads.take()).To(Equal([]string{"charlie-credentials"}))
		Expect(publishedLines(pool)[1]).To(HaveSuffix("@192.0.2.23:3128"), "the endpoint wins over the Secret's old url")

		By("after the TTL every Secret is read again")
		clk.SetTime(clk.Now().Add(defaultCredentialTTL + time.Second))
		Expect(publisher.Publish(ctx, pool, []crawlv1.Proxy{alpha, *moved})).To(Succeed())
		Expect(reads.take()).To(Equal([]string{"alpha-credentials", "charlie-credentials"}))
	})

	It("follows the template's port, and moves endpoints to slices of the new port", func() {
		alpha := createReplica(pool, replicaSpec{name: "alpha", address: "192.0.2.11", password: alphaPassword})
		Expect(publisher.Publish(ctx, pool, []crawlv1.Proxy{alpha})).To(Succeed())
		old := publishedSlices(pool)
		Expect(old).To(HaveLen(1))

		pool.Spec.Template.Spec.Port = 8080
		bravo := createReplica(pool, replicaSpec{name: "bravo", address: "192.0.2.12", port: 8080})
		Expect(publisher.Publish(ctx, pool, []crawlv1.Proxy{bravo})).To(Succeed())
		Expect(publishedService(pool).Spec.Ports[0].Port).To(Equal(int32(8080)))
		ss := publishedSlices(pool)
		Expect(ss).To(HaveLen(1))
		Expect(ss[0].Name).NotTo(Equal(old[0].Name))
		Expect(*ss[0].Ports[0].Port).To(Equal(int32(8080)))
		Expect(sliceEndpointNames(ss)).To(Equal([]string{"bravo"}))
		Expect(publishedLines(pool)).To(Equal([]string{"http://192.0.2.12:8080"}))
	})

	It("unpublishes everything, and again without error", func() {
		alpha := createReplica(pool, replicaSpec{name: "alpha", address: "192.0.2.11", password: alphaPassword})
		Expect(publisher.Publish(ctx, pool, []crawlv1.Proxy{alpha})).To(Succeed())
		Expect(publisher.Unpublish(ctx, pool)).To(Succeed())
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: crawlv1.PublishedName(pool.Name)}, &corev1.Secret{})).To(Satisfy(isNotFound))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: crawlv1.PublishedName(pool.Name)}, &corev1.Service{})).To(Satisfy(isNotFound))
		Expect(publishedSlices(pool)).To(BeEmpty())
		Expect(publisher.Unpublish(ctx, pool)).To(Succeed())
	})
})

func isNotFound(err error) bool { return err != nil && client.IgnoreNotFound(err) == nil }
