package controllers

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/test/harness"
)

// lockedBuffer is a log sink several goroutines write to.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var _ = Describe("credentials", func() {
	It("creates a managed Proxy with a generated credential that never reaches logs (V(2)), events or status", func() {
		// The manager of this spec logs everything up to V(2) into logs.
		logs := &lockedBuffer{}
		harness.Replace(&mgr, startManager, managerConfig{log: harness.Logger(logs, 2)})

		image := servedImage()
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		p := managedProxy(ns, "secure", h.name, image)
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		giveAddress(h, ns, "secure", "192.0.2.41")
		p = waitProxyPhase(ns, "secure", crawlv1.ProxyReady, 30*time.Second)

		Expect(p.Status.CredentialsSecretRef).To(Equal(&crawlv1.LocalObjectReference{Name: "secure-proxy-credentials"}))
		sec := &corev1.Secret{}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "secure-proxy-credentials"}, sec)).To(Succeed())
			g.Expect(sec.Data).To(HaveKey("url"))
		}).WithTimeout(10 * time.Second).Should(Succeed())
		user, pass := string(sec.Data["username"]), string(sec.Data["password"])
		Expect(user).To(Equal("secure"))
		Expect(len(pass)).To(BeNumerically(">=", 32))
		Expect(string(sec.Data["url"])).To(Equal("http://secure:" + pass + "@192.0.2.41:3128"))
		Expect(sec.OwnerReferences).To(HaveLen(1))
		Expect(sec.OwnerReferences[0].UID).To(Equal(p.UID))
		Expect(*sec.OwnerReferences[0].Controller).To(BeTrue())
		Expect(conditions.GetReason(p, crawlv1.SecureCondition)).To(Equal(crawlv1.ProxyAuthRequiredReason))

		// A few probe intervals (1s here) of steady state, then the
		// delete, all logged.
		probes := func() float64 {
			v, _ := probeMetric(GinkgoTB(), "proxy_operator_proxy_probes_total", client.ObjectKeyFromObject(p))
			return v
		}
		Eventually(probes).WithTimeout(10 * time.Second).Should(BeNumerically(">=", probes()+2))
		steady := getProxy(ns, "secure")
		deleteProxy(ns, "secure")
		waitProxyGone(ns, "secure", 20*time.Second)

		leaks := []string{pass, url.QueryEscape(pass), base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))}
		logged := logs.String()
		// The buffer must really hold this manager's verbose output, or the
		// check below proves nothing.
		Expect(logged).To(ContainSubstring("credential Secret created"))
		Expect(logged).To(ContainSubstring(ns))
		Expect(logged).To(MatchRegexp(`DEBUG`), "no V(1)+ line was logged: the logger is not verbose")
		for _, leak := range leaks {
			Expect(strings.Contains(logged, leak)).To(BeFalse(), "the logs carry the password")
		}

		// Events are sent asynchronously by the recorder; on a loaded
		// machine seconds after the fact.
		events := &corev1.EventList{}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.List(ctx, events, client.InNamespace(ns))).To(Succeed())
			g.Expect(events.Items).NotTo(BeEmpty())
		}).WithTimeout(30 * time.Second).Should(Succeed())
		for _, ev := range events.Items {
			for _, leak := range leaks {
				Expect(strings.Contains(ev.Message, leak)).To(BeFalse(), "event %s %s carries the password", ev.Reason, ev.Message)
			}
		}
		for _, seen := range []*crawlv1.Proxy{p, steady} {
			status, err := json.Marshal(seen.Status)
			Expect(err).NotTo(HaveOccurred())
			for _, leak := range leaks {
				Expect(strings.Contains(string(status), leak)).To(BeFalse(), "the status carries the password")
			}
		}
	})

	It("waits for a user's credential Secret, naming it, refuses one not made for proxies, and serves with one that is", func() {
		image := servedImage()
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		access := managedAccessFor("crawler-credential")
		p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "byo"},
			Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: h.name, Image: image}, Port: 3128, Access: access}}
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		// The credentials phase comes after placement and the image's:
		// generous for a loaded machine.
		Eventually(func(g Gomega) {
			got := getProxy(ns, "byo")
			g.Expect(conditions.GetReason(got, crawlv1.InstanceProvisionedCondition)).To(Equal(crawlv1.ProxyCredentialsMissingReason))
			g.Expect(conditions.GetMessage(got, crawlv1.ReadyCondition)).To(ContainSubstring("Secret " + ns + "/crawler-credential (spec.access.auth.secretRef) not found"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(h.fake.DomainNames()).NotTo(ContainElement(ns+".byo"), "an instance was created without a credential")

		// A Secret made for something else, with the same keys, is not
		// adopted: nothing copied, no instance, a condition naming it and
		// the type it lacks.
		const pass = "a-password-of-the-users-own-choosing"
		registry := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "crawler-credential"}, Type: corev1.SecretTypeBasicAuth,
			Data: map[string][]byte{"username": []byte("crawler"), "password": []byte(pass)}}
		Expect(k8sClient.Create(ctx, registry)).To(Succeed())
		// Polled, as the missing Secret was.
		Eventually(func(g Gomega) {
			got := getProxy(ns, "byo")
			g.Expect(conditions.GetReason(got, crawlv1.InstanceProvisionedCondition)).To(Equal(crawlv1.ProxyCredentialsNotForProxiesReason))
			msg := conditions.GetMessage(got, crawlv1.ReadyCondition)
			g.Expect(msg).To(ContainSubstring("Secret " + ns + "/crawler-credential (spec.access.auth.secretRef) has type \"kubernetes.io/basic-auth\", not " + crawlv1.CredentialsSecretType))
			g.Expect(msg).NotTo(ContainSubstring(pass))
			g.Expect(got.Status.Phase).To(Equal(crawlv1.ProxyFailed))
		}).WithTimeout(40 * time.Second).Should(Succeed())
		Expect(h.fake.DomainNames()).NotTo(ContainElement(ns+".byo"), "an instance was created with a Secret not made for proxies")
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "byo-proxy-credentials"}, &corev1.Secret{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a Secret not made for proxies was copied (%v)", err)

		// The type never changes: the user makes a Secret for proxies.
		Expect(k8sClient.Delete(ctx, registry)).To(Succeed())
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "crawler-credential"}, Type: crawlv1.CredentialsSecretType,
			Data: map[string][]byte{"username": []byte("crawler"), "password": []byte(pass)}})).To(Succeed())
		// Polled: the user's Secrets are not watched (the cache holds only the operator's).
		giveAddress(h, ns, "byo", "192.0.2.42")
		waitProxyPhase(ns, "byo", crawlv1.ProxyReady, 40*time.Second)
		sec := &corev1.Secret{}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "byo-proxy-credentials"}, sec)).To(Succeed())
			g.Expect(string(sec.Data["url"])).To(Equal("http://crawler:" + pass + "@192.0.2.42:3128"))
		}).WithTimeout(10 * time.Second).Should(Succeed())
		deleteProxy(ns, "byo")
		waitProxyGone(ns, "byo", 20*time.Second)
	})

	It("reacts at once when the operator's credential Secret is deleted, not at the next probe", func() {
		harness.Replace(&mgr, startManager, managerConfig{proxy: func(o *ProxyOptions) { o.ProbeInterval = 10 * time.Minute }})
		image := servedImage()
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		p := managedProxy(ns, "lost", h.name, image)
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		giveAddress(h, ns, "lost", "192.0.2.43")
		waitProxyPhase(ns, "lost", crawlv1.ProxyReady, 30*time.Second)
		// Quiet first: no reconcile (each probes) for two seconds, so
		// what follows the deletion is the watch's doing.
		lastProbe := func() float64 {
			v, _ := probeMetric(GinkgoTB(), "proxy_operator_proxy_last_probe_timestamp_seconds", client.ObjectKeyFromObject(p))
			return v
		}
		Eventually(func(g Gomega) {
			before := lastProbe()
			g.Consistently(lastProbe).WithTimeout(2 * time.Second).Should(Equal(before))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		Expect(k8sClient.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lost-proxy-credentials"}})).To(Succeed())
		Eventually(func(g Gomega) {
			got := getProxy(ns, "lost")
			g.Expect(conditions.GetReason(got, crawlv1.ReadyCondition)).To(Equal(crawlv1.ProxyCredentialsMissingReason))
			g.Expect(conditions.GetMessage(got, crawlv1.ReadyCondition)).To(ContainSubstring("was deleted while instance"))
		}).WithTimeout(10 * time.Second).Should(Succeed())
		deleteProxy(ns, "lost")
		waitProxyGone(ns, "lost", 20*time.Second)
	})
})

// managedAccessFor is spec.access as the webhook defaults it, with the
// user's credential Secret secretRef ("" for a generated credential).
// managedProxy is a kvm Proxy on host with a managed squid and a generated
// credential, as the webhook defaults it (this suite runs without
// webhooks).
func managedProxy(ns, name, host, image string) *crawlv1.Proxy {
	return &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: host, Image: image}, Port: 3128, Access: managedAccessFor("")}}
}

func managedAccessFor(secretRef string) *crawlv1.ProxyAccess {
	a := &crawlv1.ProxyAccess{Managed: ptr.To(true), AllowedSourceCIDRs: []string{"10.244.0.0/16"},
		Auth: &crawlv1.ProxyAuth{Type: crawlv1.ProxyAuthBasic}, AllowedPorts: []int32{80, 443}, MaxConnectionsPerClient: 256}
	if secretRef != "" {
		a.Auth.SecretRef = &crawlv1.LocalObjectReference{Name: secretRef}
	}
	return a
}
