package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/test/harness"
)

// Issue 25, item 6: a manager run with --namespaces (ServeNamespaces, as
// main.go builds its cache) serves Proxies there as ever, and never sees
// those of other namespaces: no finalizer, no status, no instance, no
// Secret. That is what lets config/namespaced grant its RBAC through
// Roles in the served namespaces only.
var _ = Describe("a manager serving only some namespaces", func() {
	It("makes a served namespace's managed Proxy Ready with its credential and leaves another namespace's untouched", func() {
		served, unserved := newNamespace(), newNamespace()
		harness.Replace(&mgr, startManager, managerConfig{namespaces: []string{served}})
		image := servedImage()
		h := readyHost(uniqueName("hv"))
		for _, ns := range []string{unserved, served} {
			Expect(k8sClient.Create(ctx, managedProxy(ns, "scoped", h.name, image))).To(Succeed())
		}

		giveAddress(h, served, "scoped", "192.0.2.61")
		p := waitProxyPhase(served, "scoped", crawlv1.ProxyReady, 30*time.Second)
		Expect(p.Finalizers).To(ContainElement(crawlv1.ProxyFinalizer))
		Expect(p.Status.CredentialsSecretRef).To(Equal(&crawlv1.LocalObjectReference{Name: "scoped-proxy-credentials"}))
		Eventually(func(g Gomega) {
			sec := &corev1.Secret{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: served, Name: "scoped-proxy-credentials"}, sec)).To(Succeed())
			g.Expect(string(sec.Data["url"])).To(HavePrefix("http://scoped:"))
			g.Expect(string(sec.Data["url"])).To(HaveSuffix("@192.0.2.61:3128"))
		}).WithTimeout(10 * time.Second).Should(Succeed())

		// The other Proxy was created first and has waited as long as the
		// served one took to become Ready; a few more seconds prove it is
		// not merely late.
		Consistently(func(g Gomega) {
			other := getProxy(unserved, "scoped")
			g.Expect(other.Finalizers).To(BeEmpty())
			g.Expect(other.Status).To(Equal(crawlv1.ProxyStatus{}))
		}).WithTimeout(3 * time.Second).Should(Succeed())
		Expect(h.fake.DomainNames()).NotTo(ContainElement(unserved+".scoped"), "an instance was made for an unserved namespace")
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: unserved, Name: "scoped-proxy-credentials"}, &corev1.Secret{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a credential was made in an unserved namespace (%v)", err)

		deleteProxy(served, "scoped")
		waitProxyGone(served, "scoped", 20*time.Second)
		Expect(h.fake.DomainNames()).NotTo(ContainElement(served + ".scoped"))
		// Nothing holds the unserved one: it goes at once.
		deleteProxy(unserved, "scoped")
		waitProxyGone(unserved, "scoped", 5*time.Second)
	})
})
