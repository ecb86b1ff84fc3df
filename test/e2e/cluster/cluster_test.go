//go:build e2e

package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
)

// What config/default names (namePrefix proxy-operator-).
const (
	managerNS      = "proxy-operator-system"
	managerDeploy  = "proxy-operator-controller-manager"
	managerSA      = "proxy-operator-controller-manager"
	leaseName      = "proxy-operator.crawl.example.com"
	metricsService = "proxy-operator-controller-manager-metrics-service"
	metricsReader  = "proxy-operator-metrics-reader"
	webhookService = "proxy-operator-webhook-service"
	// testNS holds the suite's Proxies, under restricted Pod Security.
	testNS = "crawl"
)

var _ = Describe("the operator installed into a real cluster", Ordered, Label("cluster"), func() {
	var (
		install string // a copy of the checkout's config/ and the cert script, where the user's commands run
		// nodeSource is the node's own address on the pods' bridge: where
		// the suite's requests come from, as the squid pods see them.
		nodeSource string
		// outsider is a second node address, outside every allowedSourceCIDRs.
		outsider = "10.250.0.3"
	)

	AfterEach(func(ctx SpecContext) {
		if CurrentSpecReport().Failed() {
			dumpCluster(ctx)
		}
	})

	It("installs as docs/getting-started.md says: a self-signed webhook certificate, kubectl apply -k, rollout", func(ctx SpecContext) {
		install = filepath.Join(cfg.Artifacts, "install")
		Expect(os.CopyFS(filepath.Join(install, "config"), os.DirFS(filepath.Join(cfg.Repo, "config")))).To(Succeed())
		Expect(os.MkdirAll(filepath.Join(install, "hack"), 0o755)).To(Succeed())
		script, err := os.ReadFile(filepath.Join(cfg.Repo, "hack", "webhook-cert.sh"))
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(install, "hack", "webhook-cert.sh"), script, 0o755)).To(Succeed())
		Expect(os.MkdirAll(filepath.Join(install, "my-install"), 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(install, "my-install", "kustomization.yaml"), []byte(overlay()), 0o644)).To(Succeed())

		start := time.Now()
		for _, s := range [][]string{StepWebhookCert, StepApply, StepRollout} {
			_, err = step(ctx, install, s)
			Expect(err).NotTo(HaveOccurred())
		}
		record("install_to_rollout", time.Since(start))
	})

	It("runs two manager replicas, one of them leading, as its ServiceAccount under restricted Pod Security", func(ctx SpecContext) {
		d := &appsv1.Deployment{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: managerNS, Name: managerDeploy}, d)).To(Succeed())
		Expect(d.Status.ReadyReplicas).To(Equal(int32(2)), "ready replicas")

		ns := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: managerNS}, ns)).To(Succeed())
		Expect(ns.Labels).To(HaveKeyWithValue("pod-security.kubernetes.io/enforce", "restricted"))
		// The label is enforced: a pod restricted forbids is refused here.
		_, err := kubectl(ctx, install, "-n", managerNS, "run", "privileged-probe", "--dry-run=server",
			"--image="+cfg.SquidImage, "--overrides", `{"spec":{"containers":[{"name":"c","image":"`+cfg.SquidImage+`","securityContext":{"privileged":true}}]}}`)
		Expect(err).To(MatchError(ContainSubstring("violates PodSecurity \"restricted")))

		pods := managerPods(ctx)
		Expect(pods).To(HaveLen(2))
		names := map[string]bool{}
		for _, p := range pods {
			names[p.Name] = true
			Expect(p.Spec.ServiceAccountName).To(Equal(managerSA))
			Expect(p.Spec.Containers[0].Image).To(Equal(cfg.ManagerImage))
			sc := p.Spec.Containers[0].SecurityContext
			Expect(sc).NotTo(BeNil())
			Expect(sc.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
			Expect(podReady(&p)).To(BeTrue(), "pod %s Ready", p.Name)
		}
		// One leader: the Lease names one of the two pods (controller-runtime's
		// identity is <hostname>_<uuid>, and a pod's hostname is its name).
		Eventually(func(g Gomega) {
			l := &coordinationv1.Lease{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: managerNS, Name: leaseName}, l)).To(Succeed())
			g.Expect(l.Spec.HolderIdentity).NotTo(BeNil())
			holder, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
			g.Expect(names).To(HaveKey(holder), "lease holder %s", *l.Spec.HolderIdentity)
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	})

	It("admits and refuses through the webhook Service", func(ctx SpecContext) {
		for _, s := range [][]string{StepNamespace, StepRestricted} {
			_, err := step(ctx, install, s)
			Expect(err).NotTo(HaveOccurred())
		}
		// The webhook Service answers once kube-proxy has programmed it,
		// which can be a moment after the rollout: until then the API
		// server's call is refused (a server-side dry run calls the
		// webhooks and stores nothing).
		Eventually(func(ctx context.Context) error {
			return applyYAML(ctx, proxyYAML("admitted", accessYAML("10.0.0.1")), "--dry-run=server")
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		// Refused by the validating webhook (the CRD schema allows it): its
		// message, field by field.
		err := applyYAML(ctx, proxyYAML("refused", accessYAML("10.0.0.1")+`
  placement:
    image: debian-12`))
		Expect(err).To(MatchError(And(ContainSubstring(`The Proxy "refused" is invalid`),
			ContainSubstring("spec.placement.image: Forbidden: the kubernetes provider runs the manager's --kubernetes-squid-image"))))
		// Admitted and defaulted by the mutating webhook: port, auth, ports.
		Expect(applyYAML(ctx, proxyYAML("admitted", accessYAML("10.0.0.1")))).To(Succeed())
		p := &crawlv1.Proxy{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: testNS, Name: "admitted"}, p)).To(Succeed())
		Expect(p.Spec.Port).To(Equal(int32(3128)))
		Expect(p.Spec.Access.AllowedPorts).To(ConsistOf(int32(80), int32(443)))
		Expect(p.Spec.Access.Auth).NotTo(BeNil())
		Expect(p.Spec.Access.Auth.Type).To(Equal(crawlv1.ProxyAuthBasic))
		Expect(k8s.Delete(ctx, p)).To(Succeed())
		Eventually(func(ctx context.Context) error {
			return e2eutil.Gone(ctx, k8s, &crawlv1.Proxy{ObjectMeta: p.ObjectMeta})
		}).
			WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	})

	It("serves /metrics to a ServiceAccount bound to metrics-reader, and to no other", func(ctx SpecContext) {
		Expect(applyYAML(ctx, metricsRBACYAML())).To(Succeed())
		reader, err := kubectl(ctx, install, "-n", testNS, "create", "token", "metrics-scraper", "--duration=10m")
		Expect(err).NotTo(HaveOccurred())
		other, err := kubectl(ctx, install, "-n", testNS, "create", "token", "default", "--duration=10m")
		Expect(err).NotTo(HaveOccurred())
		svc := &corev1.Service{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: managerNS, Name: metricsService}, svc)).To(Succeed())
		u := "https://" + net.JoinHostPort(svc.Spec.ClusterIP, "8443") + "/metrics"

		code, body := scrape(ctx, u, strings.TrimSpace(reader))
		Expect(code).To(Equal(http.StatusOK), "metrics-reader token: %s", body)
		// Either replica may answer through the Service: both serve the
		// webhooks, only the leader runs controllers.
		Expect(body).To(ContainSubstring("controller_runtime_webhook_requests_total"))
		code, body = scrape(ctx, u, strings.TrimSpace(other))
		Expect(code).To(Equal(http.StatusForbidden), "a token without metrics-reader: %s", body)
		code, body = scrape(ctx, u, "")
		Expect(code).To(Equal(http.StatusUnauthorized), "no token: %s", body)
	})

	Describe("a kubernetes-provider Proxy", Ordered, func() {
		const name = "squid-a"
		var first *corev1.Pod

		It("becomes Ready through the operator's probe, served by a real squid pod under restricted Pod Security", func(ctx SpecContext) {
			nodeSource = bridgeAddress()
			Expect(os.WriteFile(filepath.Join(install, "squid-a.yaml"), []byte(proxyYAML(name, accessYAML(nodeSource))), 0o644)).To(Succeed())
			start := time.Now()
			for _, s := range [][]string{StepProxy, StepWaitProxyReady} {
				_, err := step(ctx, install, s)
				Expect(err).NotTo(HaveOccurred())
			}
			record("kubernetes_proxy_ready", time.Since(start))
			p := waitProxyReady(ctx, name, time.Minute)

			var err error
			first, err = proxyPod(ctx, p)
			Expect(err).NotTo(HaveOccurred())
			Expect(first.Spec.Containers[0].Image).To(Equal(cfg.SquidImage))
			Expect(first.Status.PodIP).To(Equal(p.Status.Address))
			Expect(p.Status.EgressAddress).To(Equal(first.Status.PodIP), "the probe went through squid, which connected from its pod")
			Expect(conditions.IsTrue(p, crawlv1.SecureCondition)).To(BeTrue(), e2eutil.CondString(p, crawlv1.SecureCondition))
			wantServes(ctx, p)
		})

		It("applies its NetworkPolicy, admitting the allowed sources and the manager's pods on the proxy port", func(ctx SpecContext) {
			p := getProxy(ctx, name)
			np := &networkingv1.NetworkPolicy{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: testNS, Name: kubernetes.ObjectName(p.Name, string(p.UID))}, np)).To(Succeed())
			Expect(np.Spec.PodSelector.MatchLabels).To(HaveKeyWithValue(kubernetes.LabelProxyUID, string(p.UID)))
			Expect(np.Spec.Ingress).To(HaveLen(1))
			in := np.Spec.Ingress[0]
			Expect(in.Ports).To(HaveLen(1))
			Expect(in.Ports[0].Port.IntValue()).To(Equal(3128))
			var cidrs []string
			var managerPeer *networkingv1.NetworkPolicyPeer
			for i, f := range in.From {
				if f.IPBlock != nil {
					cidrs = append(cidrs, f.IPBlock.CIDR)
				}
				if f.NamespaceSelector != nil {
					managerPeer = &in.From[i]
				}
			}
			// The Proxy's allowedSourceCIDRs and the manager's --probe-source-cidrs.
			Expect(cidrs).To(ConsistOf(nodeSource+"/32", cfg.PodCIDR))
			Expect(managerPeer).NotTo(BeNil(), "a peer for the manager's pods")
			Expect(managerPeer.NamespaceSelector.MatchLabels).To(Equal(map[string]string{corev1.LabelMetadataName: managerNS}))
			// The selector must match the manager pods as installed, or an
			// enforcing CNI would cut the operator's own probe.
			for _, mp := range managerPods(ctx) {
				for k, v := range managerPeer.PodSelector.MatchLabels {
					Expect(mp.Labels).To(HaveKeyWithValue(k, v), "manager pod %s", mp.Name)
				}
			}
			// Not enforced on this node (bridge CNI, see test/e2e/README.md):
			// squid's own ACL is what refuses a source outside the list.
			addNodeAddress(outsider)
			via, err := e2eutil.ProxyVia(ctx, k8s, p)
			Expect(err).NotTo(HaveOccurred())
			via.Source = outsider
			Expect(e2eutil.WantStatus(ctx, via, originURL("/"), http.StatusForbidden)).Error().NotTo(HaveOccurred())
		})

		It("restarts a killed squid in place: same pod, same address, Ready again", func(ctx SpecContext) {
			pid := squidPID(first)
			Expect(syscall.Kill(pid, syscall.SIGKILL)).To(Succeed())
			Eventually(func(g Gomega) {
				pod := &corev1.Pod{}
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(first), pod)).To(Succeed())
				g.Expect(pod.UID).To(Equal(first.UID))
				g.Expect(pod.Status.ContainerStatuses).To(HaveLen(1))
				g.Expect(pod.Status.ContainerStatuses[0].RestartCount).To(BeNumerically(">=", 1))
				g.Expect(podReady(pod)).To(BeTrue())
				g.Expect(pod.Status.PodIP).To(Equal(first.Status.PodIP))
			}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
			wantServes(ctx, waitProxyReady(ctx, name, 2*time.Minute))
		})

		It("recreates a deleted pod under the recorded name", func(ctx SpecContext) {
			Expect(k8s.Delete(ctx, first)).To(Succeed())
			var p *crawlv1.Proxy
			Eventually(func(g Gomega) {
				p = getProxy(ctx, name)
				pod, err := proxyPod(ctx, p)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(pod.Name).To(Equal(first.Name))
				g.Expect(pod.UID).NotTo(Equal(first.UID))
				g.Expect(conditions.IsTrue(p, crawlv1.ReadyCondition)).To(BeTrue())
				g.Expect(p.Status.Address).To(Equal(pod.Status.PodIP))
			}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
			var err error
			first, err = proxyPod(ctx, p)
			Expect(err).NotTo(HaveOccurred())
			wantServes(ctx, p)
		})

		It("replaces the pod of a lost node under a new name once the node is back", func(ctx SpecContext) {
			// The node of the squid pod lost: kubelet gone and the pod's
			// processes frozen (they answer nothing). The managers keep
			// running, as they would on another node: on this one node they
			// would be evicted too, their replacements could not be
			// scheduled, and the API server refuses an evicted pod's
			// ServiceAccount token a minute after its deletion deadline, so
			// no manager would be left to replace the squid pod. So here
			// they tolerate the node's loss.
			_, err := kubectl(ctx, install, "-n", managerNS, "patch", "deployment", managerDeploy, "--type=json", "-p", nodeLostPatch)
			Expect(err).NotTo(HaveOccurred())
			_, err = kubectl(ctx, install, "-n", managerNS, "rollout", "status", "deployment/"+managerDeploy, "--timeout=5m")
			Expect(err).NotTo(HaveOccurred())
			peerNode(ctx)
			start := time.Now()
			_, err = nodeSH(ctx, "kubelet", "stop")
			Expect(err).NotTo(HaveOccurred())
			_, err = nodeSH(ctx, "freeze", string(first.UID))
			Expect(err).NotTo(HaveOccurred())
			back := false
			comeBack := func(ctx context.Context) {
				if back {
					return
				}
				back = true
				_, err := nodeSH(ctx, "thaw", string(first.UID))
				Expect(err).NotTo(HaveOccurred())
				_, err = nodeSH(ctx, "kubelet", "start")
				Expect(err).NotTo(HaveOccurred())
			}
			DeferCleanup(comeBack)
			// NotReady, tainted, the pod evicted (tolerationSeconds 10 on this
			// node) and stuck terminating: the provider writes it off after
			// --kubernetes-stuck-deletion-after (nodeLostPatch) and creates
			// the next incarnation.
			replacement := kubernetes.PodName(name, string(getProxy(ctx, name).UID), 1)
			Eventually(func(g Gomega) {
				pod := &corev1.Pod{}
				g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: testNS, Name: replacement}, pod)).To(Succeed())
			}).WithContext(ctx).WithTimeout(6 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
			record("node_lost_to_replacement_created", time.Since(start))
			old := &corev1.Pod{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(first), old)).To(Succeed(), "the old pod stays until its node confirms it stopped")
			Expect(old.DeletionTimestamp).NotTo(BeNil())

			comeBack(ctx)
			var p *crawlv1.Proxy
			Eventually(func(g Gomega) {
				p = getProxy(ctx, name)
				g.Expect(conditions.IsTrue(p, crawlv1.ReadyCondition)).To(BeTrue(), e2eutil.CondString(p, crawlv1.ReadyCondition))
				ns, pod, err := kubernetes.ParseProviderID(p.Status.ProviderID)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(ns + "/" + pod).To(Equal(testNS + "/" + replacement))
				g.Expect(e2eutil.Gone(ctx, k8s, &corev1.Pod{ObjectMeta: first.ObjectMeta})).To(Succeed())
			}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
			record("node_lost_to_ready_again", time.Since(start))
			wantServes(ctx, p)
			// The managers tolerated the loss: both still available.
			_, err = kubectl(ctx, install, "-n", managerNS, "rollout", "status", "deployment/"+managerDeploy, "--timeout=5m")
			Expect(err).NotTo(HaveOccurred())
		})

		It("goes with everything it made when deleted", func(ctx SpecContext) {
			p := getProxy(ctx, name)
			Expect(k8s.Delete(ctx, p)).To(Succeed())
			Eventually(func(ctx context.Context) error {
				return e2eutil.Gone(ctx, k8s, &crawlv1.Proxy{ObjectMeta: p.ObjectMeta})
			}).
				WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
			wantNothingLeftOf(ctx, string(p.UID))
		})
	})

	Describe("a ProxyPool deleted with the garbage collector running", Ordered, func() {
		It("foreground: the replicas and what they made go first, then the pool", func(ctx SpecContext) {
			const pool = "fg"
			Expect(applyYAML(ctx, poolYAML(pool, accessYAML(nodeSource)))).To(Succeed())
			replica := waitPoolAvailable(ctx, pool)
			start := time.Now()
			_, err := kubectl(ctx, install, "-n", testNS, "delete", "proxypool", pool, "--cascade=foreground", "--wait=false")
			Expect(err).NotTo(HaveOccurred())
			Eventually(func(ctx context.Context) error {
				return e2eutil.Gone(ctx, k8s, &crawlv1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: pool}})
			}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
			record("pool_foreground_delete", time.Since(start))
			Expect(e2eutil.Gone(ctx, k8s, replica)).To(Succeed())
			wantNothingLeftOf(ctx, string(replica.UID))
			Expect(published(ctx, pool)).To(BeEmpty())
		})

		It("orphan: the pool goes and its replicas stay, serving, owned by nobody", func(ctx SpecContext) {
			const pool = "orphan"
			Expect(applyYAML(ctx, poolYAML(pool, accessYAML(nodeSource)))).To(Succeed())
			replica := waitPoolAvailable(ctx, pool)
			_, err := kubectl(ctx, install, "-n", testNS, "delete", "proxypool", pool, "--cascade=orphan")
			Expect(err).NotTo(HaveOccurred())
			Eventually(func(ctx context.Context) error {
				return e2eutil.Gone(ctx, k8s, &crawlv1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: pool}})
			}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
			Consistently(func(g Gomega) {
				p := getProxy(ctx, replica.Name)
				g.Expect(p.UID).To(Equal(replica.UID))
				g.Expect(p.DeletionTimestamp).To(BeNil())
				g.Expect(metav1.GetControllerOf(p)).To(BeNil())
				g.Expect(conditions.IsTrue(p, crawlv1.ReadyCondition)).To(BeTrue())
			}).WithContext(ctx).WithTimeout(15 * time.Second).WithPolling(time.Second).Should(Succeed())
			wantServes(ctx, getProxy(ctx, replica.Name))
			Expect(k8s.Delete(ctx, replica)).To(Succeed())
			Eventually(func(ctx context.Context) error { return e2eutil.Gone(ctx, k8s, replica) }).
				WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		})
	})

	It("survives losing its leader while a Proxy is being created: the other replica leads, one pod, Ready once", func(ctx SpecContext) {
		const name = "failover"
		pods := watchAll(ctx, &corev1.PodList{})
		configMaps := watchAll(ctx, &corev1.ConfigMapList{})
		proxies := watchAll(ctx, &crawlv1.ProxyList{})
		leaders := failLeader(ctx, install, "", func() {
			Expect(applyYAML(ctx, proxyYAML(name, accessYAML(nodeSource)))).To(Succeed())
		})
		start := leaders.Deleted

		p := waitProxyReady(ctx, name, 2*time.Minute)
		record("leader_deleted_to_proxy_ready", time.Since(start))
		wantServes(ctx, p)
		// Settled: nothing more is made or flaps.
		Consistently(func(g Gomega) {
			g.Expect(conditions.IsTrue(getProxy(ctx, name), crawlv1.ReadyCondition)).To(BeTrue())
		}).WithContext(ctx).WithTimeout(10 * time.Second).WithPolling(time.Second).Should(Succeed())

		uid := string(p.UID)
		Expect(madeFor(pods.seen(), uid)).To(ConsistOf(kubernetes.PodName(name, uid, 0)), "pods made, by UID")
		Expect(madeFor(configMaps.seen(), uid)).To(HaveLen(1), "ConfigMaps made, by UID")
		Expect(readyTransitions(proxies.seen(), uid)).To(Equal(1), "times the Proxy became Ready")
		// Which leader made the pod depends on the race; both must hold.
		for _, o := range pods.seen() {
			if o.GetLabels()[kubernetes.LabelProxyUID] == uid {
				AddReportEntry("pod_made_by_the_old_leader", o.GetCreationTimestamp().Time.Before(leaders.Acquired))
				break
			}
		}

		Expect(k8s.Delete(ctx, p)).To(Succeed())
		Eventually(func(ctx context.Context) error {
			return e2eutil.Gone(ctx, k8s, &crawlv1.Proxy{ObjectMeta: p.ObjectMeta})
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		wantNothingLeftOf(ctx, uid)
		_, err := kubectl(ctx, install, "-n", managerNS, "rollout", "status", "deployment/"+managerDeploy, "--timeout=5m")
		Expect(err).NotTo(HaveOccurred())
	})

	Describe("a kvm Proxy on the test hypervisor, reached from the pod network", Ordered, func() {
		var (
			objs *e2eutil.Objects
			host e2eutil.Host
		)

		AfterAll(func(ctx SpecContext) {
			if objs == nil {
				return
			}
			// The image's volume goes with its KVMImage, while the host
			// still answers; the host's finalizer needs its Secret.
			for _, o := range []client.Object{objs.Image, objs.Host, objs.Secret} {
				Expect(client.IgnoreNotFound(k8s.Delete(ctx, o))).To(Succeed())
				Eventually(func(ctx context.Context) error { return e2eutil.Gone(ctx, k8s, o) }).
					WithContext(ctx).WithTimeout(cfg.KVM.DeleteTimeout).WithPolling(time.Second).Should(Succeed())
			}
		})

		It("has its KVMHost Ready and its KVMImage verified: the manager pods reach the hypervisor's sshd, and libvirt through it", func(ctx SpecContext) {
			kc := cfg.KVM
			host = e2eutil.NewHost(kc)
			// Served on the origin's address: the manager pod downloads it,
			// checks its sha256 and uploads it into the host's pool.
			img, err := e2eutil.ServeImage(kc.ImagePath, net.JoinHostPort(originIP, "0"), "")
			Expect(err).NotTo(HaveOccurred())
			defer func() { _ = img.Close() }()
			objs, err = e2eutil.NewObjects(kc, "pxcl-"+e2eutil.RunID(), managerNS, img.URL, img.Checksum)
			Expect(err).NotTo(HaveOccurred())
			start := time.Now()
			for _, o := range []client.Object{objs.Secret, objs.Host, objs.Image} {
				Expect(k8s.Create(ctx, o)).To(Succeed())
			}
			Eventually(func(ctx context.Context) error {
				_, err := e2eutil.HostReady(ctx, k8s, objs.Host.Name)
				return err
			}).WithContext(ctx).WithTimeout(kc.HostReadyTimeout).WithPolling(time.Second).Should(Succeed())
			record("kvm_host_ready", time.Since(start))
			out, err := kubectl(ctx, install, "get", "kvmhosts")
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(MatchRegexp(`(?m)^`+objs.Host.Name+`\s+True\b`), "kubectl get kvmhosts shows it Ready")
			Eventually(func(ctx context.Context) error {
				_, err := e2eutil.ImageVerified(ctx, k8s, objs.Image.Name, objs.Host.Name)
				return err
			}).WithContext(ctx).WithTimeout(kc.ImageTimeout).WithPolling(time.Second).Should(Succeed())
			record("kvm_image_verified", time.Since(start))
			Expect(img.Requests()).To(BeNumerically(">=", 1), "the manager downloaded the image from the suite's server")
		})

		It("survives losing its leader while a kvm Proxy is being created: one VM, started once, Ready once, serving; nothing left once deleted", func(ctx SpecContext) {
			Expect(objs).NotTo(BeNil(), "the KVMHost and KVMImage of the spec before")
			proxies := watchAll(ctx, &crawlv1.ProxyList{})
			p := objs.NewProxy("kvm-failover", 1, "512Mi")
			p.Namespace = testNS
			// The suite's requests come from the node's end of the veth;
			// the manager's probe from its pod (--probe-source-cidrs).
			p.Spec.Access = &crawlv1.ProxyAccess{
				AllowedSourceCIDRs:           []string{cfg.LinkNode + "/32"},
				AllowedDestinationExceptions: []string{originIP + "/32"},
				AllowedPorts:                 []int32{80},
			}
			// The row of docs/reliability.md's fault table, written whatever
			// happens; Survived only once every check below held.
			row := &e2eutil.FaultRow{N: 14,
				Fault: "Leading manager pod deleted right after a kvm Proxy is created (config/default with two replicas on the real one-node cluster, the Proxy on the test hypervisor; `make test-e2e-cluster`)",
				Invariant: "another replica leads within the Lease's duration plus two retry periods of the old leader's last renewal; the Proxy Ready exactly once, Secure, serving with its credential and refusing without; " +
					"exactly one domain carries its UID, the one its providerID names, and qemu started it once; nothing of it left on the host after its deletion",
				AuditErr: "the spec failed before the audit"}
			DeferCleanup(func() {
				if err := e2eutil.WriteFaultRow(cfg.Artifacts, row); err != nil {
					GinkgoWriter.Printf("faults.md: %v\n", err)
				}
			})
			leaders := failLeader(ctx, install, "kvm_", func() { Expect(k8s.Create(ctx, p)).To(Succeed()) })
			start := leaders.Deleted
			row.Detected(start, leaders.Acquired, "leader pod deleted → another replica holds the Lease")
			row.Note("new leader %s after the old leader's last renewal (bound %s)", e2eutil.Seconds(leaders.Acquired.Sub(leaders.LastRenew)), e2eutil.Seconds(leaders.Bound))

			got := waitProxyReady(ctx, p.Name, cfg.KVM.ProxyReadyTimeout)
			record("kvm_leader_deleted_to_proxy_ready", time.Since(start))
			row.Recovered(start, time.Now(), "leader pod deleted → Proxy Ready, a TCG boot")
			Expect(got.Status.ProviderID).To(HavePrefix("kvm://"+objs.Host.Name+"/"), "on the test hypervisor")
			Expect(conditions.IsTrue(got, crawlv1.SecureCondition)).To(BeTrue(), e2eutil.CondString(got, crawlv1.SecureCondition))
			wantServes(ctx, got)
			Consistently(func(g Gomega) {
				g.Expect(conditions.IsTrue(getProxy(ctx, p.Name), crawlv1.ReadyCondition)).To(BeTrue())
			}).WithContext(ctx).WithTimeout(10 * time.Second).WithPolling(time.Second).Should(Succeed())
			uid := string(got.UID)
			Expect(readyTransitions(proxies.seen(), uid)).To(Equal(1), "times the Proxy became Ready")

			// The hypervisor's own account: one domain carries the Proxy's
			// UID, the one its providerID names, and qemu started it once
			// (libvirt's per-domain log has a line at every start).
			dom := domxml.DomainName(testNS, p.Name)
			inv, err := e2eutil.TakeInventory(ctx, host, cfg.KVM.Pool)
			Expect(err).NotTo(HaveOccurred())
			Expect(inv.DomainsOf(uid)).To(Equal([]string{dom}), "domains carrying the Proxy's UID")
			_, wantUUID, err := provider.ParseKVMProviderID(got.Status.ProviderID)
			Expect(err).NotTo(HaveOccurred())
			Expect(inv.Domains[dom].UUID).To(Equal(wantUUID))
			starts, err := host.Run(ctx, "grep", "-c", "starting up", "/var/log/libvirt/qemu/"+dom+".log")
			Expect(err).NotTo(HaveOccurred())
			Expect(strings.TrimSpace(starts)).To(Equal("1"), "times qemu started %s", dom)
			row.Note("Ready transitions 1, domains with its UID 1 (%s), qemu starts 1", dom)

			Expect(k8s.Delete(ctx, got)).To(Succeed())
			Eventually(func(ctx context.Context) error { return e2eutil.Gone(ctx, k8s, got) }).
				WithContext(ctx).WithTimeout(cfg.KVM.DeleteTimeout).WithPolling(time.Second).Should(Succeed())
			inv, err = e2eutil.TakeInventory(ctx, host, cfg.KVM.Pool)
			Expect(err).NotTo(HaveOccurred())
			refs, err := e2eutil.ProxyRefs(ctx, k8s)
			Expect(err).NotTo(HaveOccurred())
			audit := inv.Audit(refs, e2eutil.Foreign{})
			row.Audit, row.AuditErr = audit, ""
			Expect(audit.Leaks()).To(BeZero(), "left on the host: %s", audit)
			_, err = kubectl(ctx, install, "-n", managerNS, "rollout", "status", "deployment/"+managerDeploy, "--timeout=5m")
			Expect(err).NotTo(HaveOccurred())
			row.Survived = true
		})
	})

	It("never met an RBAC denial: the generated role covers what the manager did", func(ctx SpecContext) {
		out, err := kubectl(ctx, install, "-n", managerNS, "logs", "-l", "control-plane=controller-manager",
			"--all-containers", "--prefix", "--tail=-1")
		Expect(err).NotTo(HaveOccurred())
		var denied []string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "forbidden") {
				denied = append(denied, l)
			}
		}
		Expect(denied).To(BeEmpty())
	})
})

// watched is every object a watch of one kind in testNS delivered, in order.
type watched struct {
	mu   sync.Mutex
	objs []client.Object
}

// watchAll watches list's kind in testNS until the spec ends.
func watchAll(ctx context.Context, list client.ObjectList) *watched {
	w, err := k8s.Watch(ctx, list, client.InNamespace(testNS))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	DeferCleanup(w.Stop)
	s := &watched{}
	go func() {
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(client.Object); ok {
				s.mu.Lock()
				s.objs = append(s.objs, o)
				s.mu.Unlock()
			}
		}
	}()
	return s
}

func (s *watched) seen() []client.Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.objs)
}

// madeFor names the distinct objects (by UID) made for the Proxy with uid:
// the same name twice means it was made twice.
func madeFor(objs []client.Object, uid string) []string {
	var names []string
	uids := map[types.UID]bool{}
	for _, o := range objs {
		if o.GetLabels()[kubernetes.LabelProxyUID] != uid || uids[o.GetUID()] {
			continue
		}
		uids[o.GetUID()] = true
		names = append(names, o.GetName())
	}
	return names
}

// readyTransitions counts how often the Proxy with uid became Ready in what
// a watch saw of it.
func readyTransitions(objs []client.Object, uid string) int {
	n, ready := 0, false
	for _, o := range objs {
		p, ok := o.(*crawlv1.Proxy)
		if !ok || string(p.UID) != uid {
			continue
		}
		now := conditions.IsTrue(p, crawlv1.ReadyCondition)
		if now && !ready {
			n++
		}
		ready = now
	}
	return n
}

// peerNode keeps a second Node Ready until the spec ends, as the other
// nodes of a real cluster are when one is lost. With every Node NotReady
// the node lifecycle controller enters "master disruption mode" (it
// assumes the control plane lost the network, not the nodes), takes the
// NoExecute taints off and evicts nothing; on this one-node cluster the
// squid pod was then evicted only when the tainting pass won a race with
// that decision. The peer is a Node object whose Lease the suite renews,
// with no kubelet, no addresses and a taint no pod tolerates.
func peerNode(ctx context.Context) {
	GinkgoHelper()
	const peer = "pxnode-peer"
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: peer},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{
			Key: "crawl.example.com/e2e-peer", Effect: corev1.TaintEffectNoSchedule,
		}}},
	}
	Expect(k8s.Create(ctx, node)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, node))).To(Succeed())
	})
	// A merge patch, not an update: the node lifecycle controller writes
	// the new Node too (its taints), so an update can meet a conflict.
	base := node.DeepCopy()
	now := metav1.Now()
	node.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	Expect(k8s.Status().Patch(ctx, node, client.MergeFrom(base))).To(Succeed())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-node-lease", Name: peer},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(peer), LeaseDurationSeconds: ptr.To(int32(40)),
			RenewTime: &metav1.MicroTime{Time: time.Now()},
		},
	}
	Expect(k8s.Create(ctx, lease)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, lease))).To(Succeed())
	})
	renew, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-renew.Done():
				return
			case <-time.After(2 * time.Second):
			}
			// A conflict or a slow API server only delays this renewal to
			// the next one; the Lease lasts 40 s and the grace is 20 s.
			l := &coordinationv1.Lease{}
			if k8s.Get(renew, client.ObjectKeyFromObject(lease), l) == nil {
				l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
				_ = k8s.Update(renew, l)
			}
		}
	}()
	DeferCleanup(func() {
		stop()
		<-done
	})
}

// leaderChange is what failLeader saw: the two leaders, when the old one's
// pod was deleted, its last renewal, the new one's acquisition, and the
// bound the takeover was held to.
type leaderChange struct {
	Old, New                     string
	Deleted, LastRenew, Acquired time.Time
	Bound                        time.Duration
}

// failLeader runs create, deletes the leading manager pod right after it,
// and waits for the other replica to take the Lease. The leader does not
// release it on its way out: another replica takes it once it expires.
// client-go's candidates count the duration from when they saw the last
// renewal, and look every retry period (2 s) with jitter factor 1.2 (up to
// 4.4 s): so within the duration plus two such periods of the old leader's
// last renewal. It records the figures under prefix.
func failLeader(ctx context.Context, dir, prefix string, create func()) leaderChange {
	GinkgoHelper()
	lease := &coordinationv1.Lease{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: managerNS, Name: leaseName}, lease)).To(Succeed())
	Expect(lease.Spec.HolderIdentity).NotTo(BeNil())
	Expect(lease.Spec.LeaseDurationSeconds).NotTo(BeNil())
	Expect(lease.Spec.RenewTime).NotTo(BeNil())
	c := leaderChange{LastRenew: lease.Spec.RenewTime.Time}
	c.Old, _, _ = strings.Cut(*lease.Spec.HolderIdentity, "_")
	duration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	c.Bound = duration + 2*4400*time.Millisecond

	create()
	c.Deleted = time.Now()
	_, err := kubectl(ctx, dir, "-n", managerNS, "delete", "pod", c.Old, "--wait=false")
	Expect(err).NotTo(HaveOccurred())
	Eventually(func(g Gomega) {
		l := &coordinationv1.Lease{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(lease), l)).To(Succeed())
		g.Expect(l.Spec.HolderIdentity).NotTo(BeNil())
		c.New, _, _ = strings.Cut(*l.Spec.HolderIdentity, "_")
		if c.New == c.Old && l.Spec.RenewTime != nil {
			c.LastRenew = l.Spec.RenewTime.Time
		}
		g.Expect(c.New).NotTo(Equal(c.Old))
		g.Expect(l.Spec.AcquireTime).NotTo(BeNil())
		c.Acquired = l.Spec.AcquireTime.Time
	}).WithContext(ctx).WithTimeout(duration + time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	record(prefix+"leader_deleted_to_new_leader", time.Since(c.Deleted))
	record(prefix+"leader_last_renewal_to_new_leader", c.Acquired.Sub(c.LastRenew))
	Expect(c.Acquired.Sub(c.LastRenew)).To(BeNumerically("<=", c.Bound), "new leader %s", c.New)
	return c
}

// nodeLostPatch, for the node-lost spec (one rollout): the manager pods
// stay on a NotReady, unreachable node, without the 10 s the cluster gives
// others; and a squid pod stuck terminating there is written off 30 s past
// its deadline instead of the default 2 minutes, a wait that shows nothing
// more (TestStuckDeletionAfterFlag covers the flag).
const nodeLostPatch = `[
{"op":"add","path":"/spec/template/spec/tolerations","value":[
{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute"},
{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute"}]},
{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--kubernetes-stuck-deletion-after=30s"}]`

// overlay is my-install/kustomization.yaml: config/certs-selfsigned with
// two replicas and this cluster's flags (docs/getting-started.md shows the
// same file).
func overlay() string {
	images := ""
	if cfg.ManagerImage != "proxy-operator:dev" {
		name, tag, _ := strings.Cut(cfg.ManagerImage, ":")
		images = fmt.Sprintf("images:\n- name: proxy-operator\n  newName: %s\n  newTag: %s\n", name, tag)
	}
	return `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../config/certs-selfsigned
` + images + `replicas:
- name: ` + managerDeploy + `
  count: 2
patches:
- target:
    kind: Deployment
    name: ` + managerDeploy + `
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --kubernetes-squid-image=` + cfg.SquidImage + `
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --probe-source-cidrs=` + cfg.PodCIDR + `
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --proxy-probe-url=` + originURL("/ip") + `
`
}

// originIP is where the origin listens: an address of the node's netns
// that is not the Node's. Every squid of the kubernetes provider refuses
// the cluster's own ranges, the Nodes' addresses among them, whatever the
// Proxy's allowedDestinationExceptions say; a crawler's target is never a
// node.
const originIP = "10.250.1.1"

func originURL(path string) string { return "http://" + originIP + path }

// accessYAML admits the suite (from src) to the origin.
func accessYAML(src string) string {
	return `
  access:
    allowedSourceCIDRs: [` + src + `/32]
    allowedDestinationExceptions: [` + originIP + `/32]`
}

func proxyYAML(name, extra string) string {
	return `apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata:
  name: ` + name + `
  namespace: ` + testNS + `
spec:
  provider: kubernetes
  resources:
    cpus: 1
    memory: 128Mi` + extra + "\n"
}

func poolYAML(name, access string) string {
	return `apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata:
  name: ` + name + `
  namespace: ` + testNS + `
spec:
  replicas: 1
  selector:
    matchLabels: {pool: ` + name + `}
  template:
    metadata:
      labels: {pool: ` + name + `}
    spec:
      provider: kubernetes
      resources:
        cpus: 1
        memory: 128Mi` + strings.ReplaceAll(access, "\n  ", "\n      ") + `
  rollout: {drainSeconds: 1}
`
}

func metricsRBACYAML() string {
	return `apiVersion: v1
kind: ServiceAccount
metadata:
  name: metrics-scraper
  namespace: ` + testNS + `
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: crawl-metrics-scraper
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: ` + metricsReader + `
subjects:
- kind: ServiceAccount
  name: metrics-scraper
  namespace: ` + testNS + `
`
}

// applyYAML is `kubectl apply -f -` with doc as input, and flags.
func applyYAML(ctx context.Context, doc string, flags ...string) error {
	f, err := os.CreateTemp(cfg.Artifacts, "apply-*.yaml")
	if err != nil {
		return err
	}
	_, _ = f.WriteString(doc)
	_ = f.Close()
	_, err = kubectl(ctx, cfg.Artifacts, append([]string{"apply", "-f", f.Name()}, flags...)...)
	return err
}

func managerPods(ctx context.Context) []corev1.Pod {
	var list corev1.PodList
	ExpectWithOffset(1, k8s.List(ctx, &list, client.InNamespace(managerNS),
		client.MatchingLabels{"control-plane": "controller-manager"})).To(Succeed())
	var live []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func getProxy(ctx context.Context, name string) *crawlv1.Proxy {
	p := &crawlv1.Proxy{}
	ExpectWithOffset(1, k8s.Get(ctx, client.ObjectKey{Namespace: testNS, Name: name}, p)).To(Succeed())
	return p
}

func waitProxyReady(ctx context.Context, name string, timeout time.Duration) *crawlv1.Proxy {
	var p *crawlv1.Proxy
	EventuallyWithOffset(1, func(g Gomega) {
		p = &crawlv1.Proxy{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: testNS, Name: name}, p)).To(Succeed())
		g.Expect(conditions.IsTrue(p, crawlv1.ReadyCondition)).To(BeTrue(), e2eutil.CondString(p, crawlv1.ReadyCondition))
		g.Expect(p.Status.Address).NotTo(BeEmpty())
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(time.Second).Should(Succeed())
	return p
}

// proxyPod is the pod p's status names.
func proxyPod(ctx context.Context, p *crawlv1.Proxy) (*corev1.Pod, error) {
	ns, name, err := kubernetes.ParseProviderID(p.Status.ProviderID)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{}
	return pod, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod)
}

// wantServes: 204 through p with its credential, 407 without.
func wantServes(ctx context.Context, p *crawlv1.Proxy) {
	via, err := e2eutil.ProxyVia(ctx, k8s, p)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	ExpectWithOffset(1, via.Credentials).NotTo(BeNil(), "a managed Proxy has a credential")
	_, err = e2eutil.Want204(ctx, via, originURL("/"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "with the credential")
	_, err = e2eutil.WantStatus(ctx, e2eutil.ViaEndpoint(via.Endpoint), originURL("/"), http.StatusProxyAuthRequired)
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "without a credential")
}

// waitPoolAvailable waits for pool's one replica to be Ready and serving,
// and returns it.
func waitPoolAvailable(ctx context.Context, pool string) *crawlv1.Proxy {
	var replica *crawlv1.Proxy
	EventuallyWithOffset(1, func(g Gomega) {
		pp := &crawlv1.ProxyPool{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: testNS, Name: pool}, pp)).To(Succeed())
		g.Expect(conditions.IsTrue(pp, crawlv1.PoolAvailableCondition)).To(BeTrue(), e2eutil.CondString(pp, crawlv1.PoolAvailableCondition))
		var list crawlv1.ProxyList
		g.Expect(k8s.List(ctx, &list, client.InNamespace(testNS), client.MatchingLabels{crawlv1.PoolNameLabel: pool})).To(Succeed())
		g.Expect(list.Items).To(HaveLen(1))
		replica = &list.Items[0]
		g.Expect(conditions.IsTrue(replica, crawlv1.ReadyCondition)).To(BeTrue())
	}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
	wantServes(ctx, replica)
	ExpectWithOffset(1, published(ctx, pool)).NotTo(BeEmpty())
	return replica
}

// published lists the objects pool publishes that still exist.
func published(ctx context.Context, pool string) []string {
	var left []string
	for _, o := range []client.Object{&corev1.Secret{}, &corev1.Service{}} {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: testNS, Name: pool + "-proxies"}, o)
		if err == nil {
			left = append(left, fmt.Sprintf("%T %s", o, o.GetName()))
		} else {
			ExpectWithOffset(1, apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
		}
	}
	return left
}

// wantNothingLeftOf: once its Proxy is gone, nothing the kubernetes
// provider made for the Proxy with uid is left but pods still terminating
// (Delete returns once the deletions are accepted, docs/providers.md), and
// those go within their grace period (10 s).
func wantNothingLeftOf(ctx context.Context, uid string) {
	ExpectWithOffset(1, leftOf(ctx, uid, false)).To(BeEmpty(), "terminating pods aside")
	EventuallyWithOffset(1, func() []string { return leftOf(ctx, uid, true) }).
		WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeEmpty())
}

// leftOf lists what the kubernetes provider made for the Proxy with uid
// that still exists: pods (terminating ones only if terminating),
// ConfigMaps, Secrets, NetworkPolicies.
func leftOf(ctx context.Context, uid string, terminating bool) []string {
	var left []string
	sel := client.MatchingLabels{kubernetes.LabelProxyUID: uid}
	for _, l := range []client.ObjectList{&corev1.PodList{}, &corev1.ConfigMapList{}, &corev1.SecretList{}, &networkingv1.NetworkPolicyList{}} {
		ExpectWithOffset(1, k8s.List(ctx, l, client.InNamespace(testNS), sel)).To(Succeed())
		switch l := l.(type) {
		case *corev1.PodList:
			for _, o := range l.Items {
				if terminating || o.DeletionTimestamp == nil {
					left = append(left, "Pod "+o.Name)
				}
			}
		case *corev1.ConfigMapList:
			for _, o := range l.Items {
				left = append(left, "ConfigMap "+o.Name)
			}
		case *corev1.SecretList:
			for _, o := range l.Items {
				left = append(left, "Secret "+o.Name)
			}
		case *networkingv1.NetworkPolicyList:
			for _, o := range l.Items {
				left = append(left, "NetworkPolicy "+o.Name)
			}
		}
	}
	return left
}

// scrape GETs the metrics URL with a bearer token (none when empty). The
// manager's metrics certificate is its own self-signed one.
func scrape(ctx context.Context, u, token string) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the manager's self-signed metrics certificate
	}}
	resp, err := c.Do(req)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(b)
}

// bridgeAddress is the node's address on the pods' bridge (the CNI
// gateway): the source of the suite's requests to pods.
func bridgeAddress() string {
	ifc, err := net.InterfaceByName("cni0")
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "the pods' bridge exists once a pod runs")
	addrs, err := ifc.Addrs()
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	Fail("cni0 has no IPv4 address")
	return ""
}

// addNodeAddress adds ip/24 to the node's interface (inside the node's
// network namespace, where the suite runs).
func addNodeAddress(ip string) {
	_, err := run(context.Background(), cfg.Repo, "ip", "addr", "replace", ip+"/24", "dev", "node0")
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
}

// squidPID is the host PID of the squid master process of pod: the squid
// process in the pod's cgroup whose parent is not squid.
func squidPID(pod *corev1.Pod) int {
	uid := string(pod.UID)
	entries, err := os.ReadDir("/proc")
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	comm := func(pid string) string {
		b, _ := os.ReadFile("/proc/" + pid + "/comm")
		return strings.TrimSpace(string(b))
	}
	for _, e := range entries {
		pid := e.Name()
		if _, err := strconv.Atoi(pid); err != nil || comm(pid) != "squid" {
			continue
		}
		cg, _ := os.ReadFile("/proc/" + pid + "/cgroup")
		if !strings.Contains(string(cg), "pod"+uid) {
			continue
		}
		stat, _ := os.ReadFile("/proc/" + pid + "/stat")
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 && comm(fields[1]) != "squid" {
			n, _ := strconv.Atoi(pid)
			return n
		}
	}
	Fail("no squid process in the cgroup of pod " + pod.Name)
	return 0
}
