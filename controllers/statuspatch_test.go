package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// Every status a watcher sees is one the reconciler wrote whole: Ready is
// never visible before what it announces (a Proxy's endpoint, a KVMHost's
// libvirt version and check time).
var _ = Describe("status writes", func() {
	It("never show Ready before the rest of status, to a watcher", func() {
		wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		name := uniqueName("hv")
		ns := newNamespace()

		hostW, err := wc.Watch(ctx, &crawlv1.KVMHostList{}, client.MatchingFields{"metadata.name": name})
		Expect(err).NotTo(HaveOccurred())
		defer hostW.Stop()
		proxyW, err := wc.Watch(ctx, &crawlv1.ProxyList{}, client.InNamespace(ns))
		Expect(err).NotTo(HaveOccurred())
		defer proxyW.Stop()

		image := servedImage()
		h := readyHost(name)
		readyProxy(h, ns, "p1", image, "192.0.2.31")

		// Check what was delivered up to now (the watches buffer). The
		// drain is bounded: the host's checks keep writing status, so
		// "until the watch is quiet" alone may never come, and a watch the
		// server closed delivers zero events for ever.
		hostReady, proxyReady := 0, 0
		drain := func(w watch.Interface, check func(obj any)) {
			quiet := time.NewTimer(2 * time.Second)
			defer quiet.Stop()
			deadline := time.After(30 * time.Second)
			for {
				select {
				case ev, open := <-w.ResultChan():
					if !open {
						return
					}
					if ev.Type == watch.Added || ev.Type == watch.Modified {
						check(ev.Object)
					}
					quiet.Reset(2 * time.Second)
				case <-quiet.C:
					return
				case <-deadline:
					return
				}
			}
		}
		drain(hostW, func(obj any) {
			kh := obj.(*crawlv1.KVMHost)
			if conditions.IsTrue(kh, crawlv1.ReadyCondition) {
				hostReady++
				Expect(kh.Status.LibvirtVersion).NotTo(BeEmpty(), "KVMHost Ready at resourceVersion %s without its libvirt version", kh.ResourceVersion)
				Expect(kh.Status.LastCheckTime).NotTo(BeNil(), "KVMHost Ready without its check time")
			}
		})
		drain(proxyW, func(obj any) {
			p := obj.(*crawlv1.Proxy)
			if conditions.IsTrue(p, crawlv1.ReadyCondition) {
				proxyReady++
				Expect(p.Status.Endpoint).NotTo(BeEmpty(), "Proxy Ready at resourceVersion %s without its endpoint", p.ResourceVersion)
				Expect(p.Status.Phase).To(Equal(crawlv1.ProxyReady), "Proxy Ready with phase %q", p.Status.Phase)
			}
		})
		Expect(hostReady).To(BeNumerically(">", 0), "the watch saw no Ready KVMHost")
		Expect(proxyReady).To(BeNumerically(">", 0), "the watch saw no Ready Proxy")
	})
})
