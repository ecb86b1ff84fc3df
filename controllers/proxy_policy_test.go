package controllers

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/test/harness"
)

// TestStoredProxyPastTheManagersRulesIsRefused: a Proxy stored past the
// webhook (or before the rule) with an exception for the metadata address,
// or with cloud-init where the installation refuses it, is refused
// permanently by the controller with the function admission uses: no
// provider call, no credential Secret, a condition naming the field and
// the flag. With the grant (or user-data allowed) it is created.
func TestStoredProxyPastTheManagersRulesIsRefused(t *testing.T) {
	metadata := func() *crawlv1.Proxy {
		a := managedAccess()
		a.AllowedDestinationExceptions = []string{"169.254.169.254/32"}
		return secureProxy(a)
	}
	userData := func() *crawlv1.Proxy {
		p := secureProxy(managedAccess())
		p.Spec.CloudInit.UserData = "#cloud-config\nruncmd: [nc -l 3128]\n"
		return p
	}
	grant, err := proxyaccess.ParseGrants("169.254.169.254/32")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		proxy   *crawlv1.Proxy
		policy  func(r *ProxyReconciler)
		refused []string // in the condition's message; none: created
	}{
		{"metadata exception, no grant", metadata(), func(*ProxyReconciler) {},
			[]string{"spec.access.allowedDestinationExceptions[0]", "--allow-destination-exceptions"}},
		{"metadata exception, granted", metadata(), func(r *ProxyReconciler) { r.DestinationExceptionGrants = grant }, nil},
		{"user-data refused", userData(), func(r *ProxyReconciler) { r.RefuseUserData = true },
			[]string{"spec.cloudInit.userData", "--allow-proxy-user-data=false"}},
		{"user-data allowed", userData(), func(*ProxyReconciler) {}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSecureEnv(t, tc.proxy, nil)
			tc.policy(e.r)
			p, res := e.reconcile()
			if len(tc.refused) == 0 {
				if len(e.prov.created) != 1 || p.Status.Phase != crawlv1.ProxyReady {
					t.Fatalf("created %d instances, phase %s; want one, Ready", len(e.prov.created), p.Status.Phase)
				}
				return
			}
			if calls := e.prov.Calls(); len(calls) != 0 {
				t.Errorf("provider calls %v, want none", calls)
			}
			var secrets corev1.SecretList
			if err := e.r.Client.List(t.Context(), &secrets); err != nil || len(secrets.Items) != 0 {
				t.Errorf("Secrets %v (%v), want none: nothing is made for a refused Proxy", secrets.Items, err)
			}
			c := conditions.Get(p, crawlv1.InstanceProvisionedCondition)
			if c == nil || c.Reason != crawlv1.ProxySpecRefusedReason || p.Status.Phase != crawlv1.ProxyFailed {
				t.Fatalf("condition %+v, phase %s; want InstanceProvisioned %s, Failed", c, p.Status.Phase, crawlv1.ProxySpecRefusedReason)
			}
			for _, want := range tc.refused {
				if !strings.Contains(c.Message, want) {
					t.Errorf("message %q does not name %q", c.Message, want)
				}
			}
			if strings.Contains(c.Message, "nc -l") {
				t.Errorf("message %q carries the user-data", c.Message)
			}
			if res.RequeueAfter != e.r.ResyncInterval {
				t.Errorf("requeue %v, want the resync interval %v (permanent, no hot loop)", res.RequeueAfter, e.r.ResyncInterval)
			}
		})
	}
}

var _ = Describe("the manager's admission rules, for Proxies stored past them", func() {
	It("refuses a stored Proxy excepting the metadata address until the manager grants it", func() {
		image := servedImage()
		h := readyHost(uniqueName("hv"))
		ns := newNamespace()
		a := managedAccessFor("")
		a.AllowedDestinationExceptions = []string{"169.254.169.254/32"}
		// This suite runs without webhooks: the Proxy is stored as if
		// past them, or before the rule.
		Expect(k8sClient.Create(ctx, &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "metadata"},
			Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Host: h.name, Image: image}, Port: 3128, Access: a}})).To(Succeed())
		Eventually(func(g Gomega) {
			got := getProxy(ns, "metadata")
			g.Expect(got.Status.Phase).To(Equal(crawlv1.ProxyFailed))
			g.Expect(conditions.GetReason(got, crawlv1.InstanceProvisionedCondition)).To(Equal(crawlv1.ProxySpecRefusedReason))
			msg := conditions.GetMessage(got, crawlv1.InstanceProvisionedCondition)
			g.Expect(msg).To(ContainSubstring("spec.access.allowedDestinationExceptions[0]"))
			g.Expect(msg).To(ContainSubstring(proxyaccess.GrantFlag))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(h.fake.DomainNames()).NotTo(ContainElement(ns+".metadata"), "an instance was created for a refused Proxy")
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "metadata-proxy-credentials"}, &corev1.Secret{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a credential was generated for a refused Proxy (%v)", err)

		// The grant reaches the controller through Setup.
		grant, err := proxyaccess.ParseGrants("169.254.169.254/32")
		Expect(err).NotTo(HaveOccurred())
		harness.Replace(&mgr, startManager, managerConfig{proxy: func(o *ProxyOptions) { o.DestinationExceptionGrants = grant }})
		giveAddress(h, ns, "metadata", "192.0.2.44")
		waitProxyPhase(ns, "metadata", crawlv1.ProxyReady, 40*time.Second)
		deleteProxy(ns, "metadata")
		waitProxyGone(ns, "metadata", 20*time.Second)
	})
})
