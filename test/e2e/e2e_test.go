//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
)

// statusSlack covers what follows a health check before the test sees its
// verdict: the status write and the test's polling.
const statusSlack = 5 * time.Second

// probeInterval is the manager's --proxy-probe-interval (e2eutil.ManagerArgs).
const probeInterval = e2eutil.ProxyProbeInterval

var _ = Describe("a Proxy on a real KVM host", Ordered, Label("e2e"), func() {
	var (
		hostCreated  time.Time
		imageCreated time.Time
		imageVolume  string
		ready        *crawlv1.Proxy
		capture      *e2eutil.SerialCapture
		// obs watches the Proxy from its creation until the spec that
		// deletes it (Ready must not flap in between).
		obs     *e2eutil.Observer
		created time.Time
	)
	proxyKey := func() client.ObjectKey { return client.ObjectKeyFromObject(objs.Proxy) }
	domain := func() string { return domxml.DomainName(objs.Proxy.Namespace, objs.Proxy.Name) }

	BeforeAll(func(ctx SpecContext) {
		for _, o := range []client.Object{objs.Namespace, objs.Secret, objs.Host} {
			Expect(k8s.Create(ctx, o)).To(Succeed())
		}
		hostCreated = time.Now()
		Expect(k8s.Create(ctx, objs.Image)).To(Succeed())
		imageCreated = time.Now()
	}, NodeTimeout(time.Minute))

	AfterEach(dumpOnFailure, NodeTimeout(2*time.Minute))

	AfterAll(func(ctx SpecContext) {
		if capture != nil {
			defer capture.Stop()
		}
		if obs != nil {
			obs.Stop()
		}
		// Leave nothing behind, on the host or in a shared cluster: the
		// Proxy first (its finalizer makes the manager delete the VM), then
		// the rest. Bounded; teardown of the hypervisor catches the rest.
		p := objs.Proxy.DeepCopy()
		if err := k8s.Get(ctx, proxyKey(), p); err == nil {
			_ = k8s.Delete(ctx, p)
			if err := e2eutil.Poll(ctx, cfg.DeleteTimeout, 2*time.Second, func(ctx context.Context) error {
				return e2eutil.Gone(ctx, k8s, objs.Proxy.DeepCopy())
			}); err != nil {
				GinkgoWriter.Printf("cleanup: %v\n", err)
			}
		}
		// The Secret is in the manager's namespace, not the test's.
		for _, o := range []client.Object{objs.Image.DeepCopy(), objs.Host.DeepCopy(), objs.Secret.DeepCopy(), objs.Namespace.DeepCopy()} {
			_ = client.IgnoreNotFound(k8s.Delete(ctx, o))
		}
		if err := e2eutil.Poll(ctx, time.Minute, time.Second, func(ctx context.Context) error {
			return e2eutil.Gone(ctx, k8s, objs.Host.DeepCopy())
		}); err != nil {
			GinkgoWriter.Printf("cleanup: %v\n", err)
		}
	}, NodeTimeout(6*time.Minute))

	It("reports the KVMHost Ready, with libvirt's version and the pool's free space", func(ctx SpecContext) {
		var h *crawlv1.KVMHost
		Eventually(func(ctx context.Context) (err error) {
			h, err = e2eutil.HostReady(ctx, k8s, objs.Host.Name)
			return err
		}).WithContext(ctx).WithTimeout(cfg.HostReadyTimeout).WithPolling(time.Second).Should(Succeed())
		Expect(h.Status.Pool.Name).To(Equal(cfg.Pool))
		record("kvmhost_ready", time.Since(hostCreated), fmt.Sprintf("(libvirt %s on %s, pool %s %s free)",
			h.Status.LibvirtVersion, h.Status.Hostname, h.Status.Pool.Name, h.Status.Pool.Available))
	}, NodeTimeout(5*time.Minute))

	It("downloads the KVMImage, verifies its sha256 and caches it in the host's pool", func(ctx SpecContext) {
		var img *crawlv1.KVMImage
		Eventually(func(ctx context.Context) (err error) {
			img, err = e2eutil.ImageVerified(ctx, k8s, objs.Image.Name, objs.Host.Name)
			return err
		}).WithContext(ctx).WithTimeout(cfg.ImageTimeout).WithPolling(2 * time.Second).Should(Succeed())
		st := img.Status.HostStatus(objs.Host.Name)
		imageVolume = st.Volume
		Expect(st.Checksum).To(Equal(objs.Image.Spec.Checksum))
		Expect(conditions.IsTrue(img, crawlv1.ReadyCondition)).To(BeTrue(), e2eutil.CondString(img, crawlv1.ReadyCondition))
		vols, err := e2eutil.Volumes(ctx, hv, cfg.Pool)
		Expect(err).NotTo(HaveOccurred())
		Expect(vols).To(ContainElement(imageVolume), "the verified image volume is in pool %s", cfg.Pool)
		detail := fmt.Sprintf("(volume %s, %d bytes)", st.Volume, st.Bytes)
		if imgSrv != nil {
			Expect(imgSrv.Requests()).To(BeNumerically(">=", 1), "the operator downloaded the image from the test's server")
			detail += fmt.Sprintf(", %d download(s), %d bytes served", imgSrv.Requests(), imgSrv.BytesServed())
		}
		record("kvmimage_verified", time.Since(imageCreated), detail)
	}, NodeTimeout(15*time.Minute))

	It("uploads an image about as fast as real OpenSSH copies it to the pool (figures only)", func(ctx SpecContext) {
		if imgSrv == nil || !cfg.Local() {
			Skip("needs the test's own image server and the local manager's metrics (make test-e2e)")
		}
		// Interleaved rounds, since the machine's load moves both: OpenSSH
		// with its default cipher (chacha20-poly1305), OpenSSH with
		// aes128-gcm (what the operator's x/crypto/ssh negotiates), then
		// the operator's upload of a variant of the image (the same bytes
		// and 4 KiB more, so a digest of its own) through a KVMImage.
		const rounds = 3
		var sshDefault, sshGCM, operator []float64 // MB/s
		var bytes int64
		for i := range rounds {
			d, err := sshCatImage(ctx)
			Expect(err).NotTo(HaveOccurred())
			sshDefault = append(sshDefault, float64(imgSrv.Size)/d.Seconds()/1e6)
			d, err = sshCatImage(ctx, "-c", "aes128-gcm@openssh.com")
			Expect(err).NotTo(HaveOccurred())
			sshGCM = append(sshGCM, float64(imgSrv.Size)/d.Seconds()/1e6)

			v, err := imgSrv.Variant(fmt.Sprintf("upload-%d", i))
			Expect(err).NotTo(HaveOccurred())
			secsBefore, bytesBefore := uploadMetrics(ctx)
			img := objs.Image.DeepCopy()
			img.ObjectMeta = metav1.ObjectMeta{Name: fmt.Sprintf("%s-upload-%d", objs.Image.Name, i)}
			img.Spec.URL, img.Spec.Checksum = v.URL, v.Checksum
			Expect(k8s.Create(ctx, img)).To(Succeed())
			Eventually(func(ctx context.Context) error {
				_, err := e2eutil.ImageVerified(ctx, k8s, img.Name, objs.Host.Name)
				return err
			}).WithContext(ctx).WithTimeout(cfg.ImageTimeout).WithPolling(500 * time.Millisecond).Should(Succeed())
			secs, up := uploadMetrics(ctx)
			Expect(up-bytesBefore).To(BeNumerically("==", v.Size), "one upload of the variant")
			operator = append(operator, float64(v.Size)/(secs-secsBefore)/1e6)
			bytes = v.Size
			Expect(k8s.Delete(ctx, img)).To(Succeed())
			Eventually(func(ctx context.Context) error { return e2eutil.Gone(ctx, k8s, img.DeepCopy()) }).
				WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		}
		opMed, defMed, gcmMed := median(operator), median(sshDefault), median(sshGCM)
		record("image_upload_vs_openssh", time.Duration(float64(bytes)/opMed/1e6*float64(time.Second)),
			fmt.Sprintf("(%d bytes, %d interleaved rounds, MB/s: operator %s; ssh 'cat > %s/x' default cipher %s, aes128-gcm %s; median ratio operator/ssh %.2f (default cipher), %.2f (aes128-gcm))",
				bytes, rounds, mbList(operator), cfg.Pool, mbList(sshDefault), mbList(sshGCM), opMed/defMed, opMed/gcmMed))
	}, NodeTimeout(15*time.Minute))

	It("boots the Proxy's VM and makes it Ready with its providerID and the guest agent's address", func(ctx SpecContext) {
		// The independent observer: the test's own view of the guest
		// (libvirt), of the proxy (requests through it) and of the status.
		// It runs on until the deletion spec.
		obs = e2eutil.Observe(context.Background(), e2eutil.ObserverConfig{
			Client: k8s, Proxy: proxyKey(), Target: cfg.ProbeURL,
			LibvirtSocket: libvirtSocket(), Domain: domain(),
		})
		// No cloud-init of its own: the operator's managed squid, with a
		// generated credential, is all the guest gets.
		Expect(objs.Proxy.Spec.CloudInit).To(BeZero())
		Expect(objs.Proxy.Spec.Access).NotTo(BeNil())
		Expect(objs.Proxy.Spec.Access.Auth).To(BeNil(), "no auth stanza: the operator generates the credential")
		Expect(k8s.Create(ctx, objs.Proxy)).To(Succeed())
		created = time.Now()
		if cfg.Local() {
			serialLog = filepath.Join(hv.LogDir(), domain()+"-serial.log")
			capture = e2eutil.CaptureSerial(context.Background(), hv, domain(), serialLog)
			GinkgoWriter.Printf("guest serial console → %s\n", serialLog)
		}
		var defined, addressed time.Duration
		lastPhase, lastReason := "", ""
		var lastFailures int32
		var lastFailuresAt time.Time
		Eventually(func(ctx context.Context) error {
			p := &crawlv1.Proxy{}
			if err := k8s.Get(ctx, proxyKey(), p); err != nil {
				return err
			}
			el := time.Since(created)
			if phase, reason := string(p.Status.Phase), conditions.GetReason(p, crawlv1.ReadyCondition); phase != lastPhase || reason != lastReason {
				lastPhase, lastReason = phase, reason
				GinkgoWriter.Printf("[+%s] Proxy %s: %s\n", e2eutil.Seconds(el), phase, e2eutil.CondString(p, crawlv1.ReadyCondition))
			}
			// How often the manager probes a booting guest (printed at
			// most every 5 s).
			if pr := p.Status.Probe; pr != nil && pr.ConsecutiveFailures > 0 && pr.ConsecutiveFailures != lastFailures && time.Since(lastFailuresAt) >= 5*time.Second {
				lastFailures, lastFailuresAt = pr.ConsecutiveFailures, time.Now()
				GinkgoWriter.Printf("[+%s] consecutive probe failures so far: %d (%s)\n", e2eutil.Seconds(el), lastFailures, pr.LastError)
			}
			if defined == 0 && p.Status.ProviderID != "" {
				defined = el
			}
			if addressed == 0 && p.Status.Address != "" {
				addressed = el
			}
			switch p.Status.Phase {
			case crawlv1.ProxyReady:
			case crawlv1.ProxyFailed:
				if r := conditions.GetReason(p, crawlv1.ReadyCondition); r == crawlv1.ProxyPermanentErrorReason || r == crawlv1.ProxyForeignInstanceReason {
					return StopTrying("the Proxy failed permanently").Wrap(errors.New(e2eutil.CondString(p, crawlv1.ReadyCondition)))
				}
				return fmt.Errorf("Proxy is Failed: %s", e2eutil.CondString(p, crawlv1.ReadyCondition))
			default:
				return fmt.Errorf("Proxy is %q: %s", p.Status.Phase, e2eutil.CondString(p, crawlv1.ReadyCondition))
			}
			if err := e2eutil.CheckReadyProxy(p, objs.Host.Name); err != nil {
				return StopTrying("the Proxy is Ready but its status is not what it must be").Wrap(err)
			}
			ready = p
			return nil
		}).WithContext(ctx).WithTimeout(cfg.ProxyReadyTimeout).WithPolling(time.Second).Should(Succeed())
		total := time.Since(created)

		// The providerID names the domain that runs on the host.
		_, uuid, err := provider.ParseKVMProviderID(ready.Status.ProviderID)
		Expect(err).NotTo(HaveOccurred())
		info, err := e2eutil.Domain(ctx, hv, domain())
		Expect(err).NotTo(HaveOccurred())
		Expect(info.UUID).To(Equal(uuid), "providerID %s names domain %s", ready.Status.ProviderID, domain())
		state, err := e2eutil.Virsh(ctx, hv, "domstate", domain())
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(state)).To(Equal("running"))

		record("proxy_time_to_ready", total, fmt.Sprintf("(domain defined +%s, address %s from %s +%s, Ready +%s; %s guest, %d vCPU, %s)",
			e2eutil.Seconds(defined), ready.Status.Address, ready.Status.AddressSource, e2eutil.Seconds(addressed), e2eutil.Seconds(total),
			cfg.DomainType, ready.Spec.Resources.CPUs, ready.Spec.Resources.Memory))

		// The observer's figures: it served through the proxy before (or
		// about when) the manager's own probe made the Proxy Ready.
		Eventually(func() error {
			_, err := obs.Timeline().Need(e2eutil.SigServing, "ok", created)
			return err
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "the test's own requests through the proxy")
		recordBoot("proxy", obs, created)
	}, NodeTimeout(20*time.Minute))

	It("boots a guest whose cloud-init finds every config it was given valid: the image's, the operator's user-data and vendor-data", func(ctx SpecContext) {
		Expect(ready).NotTo(BeNil())
		// cloud-init validates the merged config against its schema in each
		// stage and, when it fails, only logs a warning and goes on: a key
		// it ignores would go unnoticed. The squid serving means the init
		// stage (the first to validate) has run.
		const warning = "Invalid cloud-config provided"
		code, out, err := e2eutil.GuestExec(ctx, hv, domain(), "/bin/grep", "-h", "-A2", warning, "/var/log/cloud-init.log")
		Expect(err).NotTo(HaveOccurred())
		Expect(code).To(Equal(1), "grep exit %d (0: cloud-init logged %q; 2: no log):\n%s", code, warning, out)
	}, NodeTimeout(2*time.Minute))

	It("generates the Proxy's credential: a Secret it owns, with a long random password and a ready-to-use URL", func(ctx SpecContext) {
		Expect(ready).NotTo(BeNil())
		ref := ready.Status.CredentialsSecretRef
		Expect(ref).NotTo(BeNil(), "status.credentialsSecretRef of a Ready Proxy")
		sec := &corev1.Secret{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ready.Namespace, Name: ref.Name}, sec)).To(Succeed())
		Expect(metav1.IsControlledBy(sec, ready)).To(BeTrue(), "Secret %s/%s is controlled by the Proxy (owners %v)", sec.Namespace, sec.Name, sec.OwnerReferences)
		user, pass := string(sec.Data[crawlv1.CredentialsUsernameKey]), string(sec.Data[crawlv1.CredentialsPasswordKey])
		// Never print the password: only its length and where it appears.
		Expect(user).NotTo(BeEmpty())
		Expect(len(pass)).To(BeNumerically(">=", 32), "a generated password has 32+ characters")
		u, err := url.Parse(string(sec.Data[crawlv1.CredentialsURLKey]))
		Expect(err).NotTo(HaveOccurred(), "key %s is a URL", crawlv1.CredentialsURLKey)
		gotPass, _ := u.User.Password()
		Expect(u.Scheme+"://"+u.Host).To(Equal(ready.Status.Endpoint), "key %s points at the endpoint", crawlv1.CredentialsURLKey)
		Expect(u.User.Username() == user && gotPass == pass).To(BeTrue(), "key %s carries the Secret's username and password", crawlv1.CredentialsURLKey)
		// The credential is nowhere in what users see: status, conditions,
		// events, the manager's log.
		raw, err := json.Marshal(ready.Status)
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Contains(string(raw), pass)).To(BeFalse(), "the password is not in the Proxy's status")
		events := &corev1.EventList{}
		Expect(k8s.List(ctx, events, client.InNamespace(ready.Namespace))).To(Succeed())
		for _, e := range events.Items {
			Expect(strings.Contains(e.Message, pass)).To(BeFalse(), "the password is not in event %s (%s)", e.Name, e.Reason)
		}
		if path := op.LogPath(); path != "" {
			log, err := os.ReadFile(path)
			Expect(err).NotTo(HaveOccurred())
			Expect(strings.Contains(string(log), pass)).To(BeFalse(), "the password is not in the manager's log %s", path)
		}
		GinkgoWriter.Printf("credential Secret %s: username %q, password of %d characters\n", ref.Name, user, len(pass))
	})

	It("reports ProxyHealthy ProbeSucceeded: the manager's own request went through squid", func(ctx SpecContext) {
		Expect(ready).NotTo(BeNil())
		c := conditions.Get(ready, crawlv1.ProxyHealthyCondition)
		Expect(c).NotTo(BeNil())
		Expect(c.Status).To(Equal(metav1.ConditionTrue))
		Expect(c.Reason).To(Equal(crawlv1.ProxyProbeSucceededReason), c.Message)
		Expect(ready.Status.Probe).NotTo(BeNil())
		Expect(ready.Status.Probe.LastProbeTime).NotTo(BeNil())
		Expect(ready.Status.Probe.ConsecutiveFailures).To(BeZero())
		latency := "" // a manager in a cluster has no metrics the suite reads
		if m, err := op.Metrics(ctx); err == nil {
			latency = fmt.Sprintf(" (last probe latency %.0f ms)", 1000*e2eutil.CounterSum(m, "proxy_operator_proxy_probe_latency_seconds", proxyLabels(proxyKey())...))
		}
		GinkgoWriter.Printf("ProxyHealthy: %s%s\n", c.Message, latency)
	})

	It("proxies the test's own requests: GET the probe URL through ADDRESS:3128 answers 204", func(ctx SpecContext) {
		Expect(ready).NotTo(BeNil())
		var took time.Duration
		Eventually(func(ctx context.Context) (err error) {
			via, err := e2eutil.ProxyVia(ctx, k8s, ready)
			if err != nil {
				return err
			}
			took, err = e2eutil.Want204(ctx, via, cfg.ProbeURL)
			return err
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		record("request_through_proxy", took, fmt.Sprintf("(GET %s via %s → 204)", cfg.ProbeURL, ready.Status.Endpoint))

		// More requests, paced, while watching how often the manager
		// reconciles and probes the Ready Proxy.
		const n, pace = 5, 2 * time.Second
		reconcilesBefore, metricsErr := proxyReconciles(ctx)
		probeTimes := map[time.Time]bool{}
		var lat []time.Duration
		start := time.Now()
		for i := range n {
			if i > 0 {
				select {
				case <-ctx.Done():
					Fail("interrupted")
				case <-time.After(pace):
				}
			}
			via, err := e2eutil.ProxyVia(ctx, k8s, ready)
			Expect(err).NotTo(HaveOccurred())
			d, err := e2eutil.Want204(ctx, via, cfg.ProbeURL)
			Expect(err).NotTo(HaveOccurred(), "request %d of %d", i+1, n)
			lat = append(lat, d)
			p := &crawlv1.Proxy{}
			Expect(k8s.Get(ctx, proxyKey(), p)).To(Succeed())
			Expect(p.Status.Phase).To(Equal(crawlv1.ProxyReady))
			if t, ok := lastProbeAt(ctx, proxyKey()); ok {
				probeTimes[t] = true
			}
		}
		window := time.Since(start)
		slices.Sort(lat)
		ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
		detail := fmt.Sprintf("(%d requests over %s, all 204: min %s, median %s, max %s)", n, e2eutil.Seconds(window), ms(lat[0]), ms(lat[n/2]), ms(lat[n-1]))
		record("requests_through_proxy", window, detail)
		reconcilesAfter, err := proxyReconciles(ctx)
		Expect(metricsErr).NotTo(HaveOccurred())
		Expect(err).NotTo(HaveOccurred())
		due := math.Ceil(window.Seconds() / probeInterval.Seconds())
		got := reconcilesAfter - reconcilesBefore
		record("proxy_reconciles_while_ready", window, fmt.Sprintf("(%.0f Proxy reconciles, %d distinct last probe times seen (proxy_operator_proxy_last_probe_timestamp_seconds); with --proxy-probe-interval %s about %.0f were due)",
			got, len(probeTimes), probeInterval, due))
		// A Ready proxy is reconciled on its probe interval (plus the odd
		// event), never in a loop driven by its own status writes.
		Expect(got).To(BeNumerically("<=", due+3), "Proxy reconciled %.0f times in %s", got, e2eutil.Seconds(window))
	}, NodeTimeout(3*time.Minute))

	It("refuses a request without credentials, or with a wrong password, with 407, and reports Secure=True", func(ctx SpecContext) {
		Expect(ready).NotTo(BeNil())
		took, err := e2eutil.WantStatus(ctx, e2eutil.ViaEndpoint(ready.Status.Endpoint), cfg.ProbeURL, http.StatusProxyAuthRequired)
		Expect(err).NotTo(HaveOccurred(), "no credentials")
		via, err := e2eutil.ProxyVia(ctx, k8s, ready)
		Expect(err).NotTo(HaveOccurred())
		via.Credentials = url.UserPassword(via.Credentials.Username(), "not-the-password")
		_, err = e2eutil.WantStatus(ctx, via, cfg.ProbeURL, http.StatusProxyAuthRequired)
		Expect(err).NotTo(HaveOccurred(), "wrong password")
		record("request_without_credentials", took, fmt.Sprintf("(GET %s via %s without credentials → 407; wrong password → 407)", cfg.ProbeURL, ready.Status.Endpoint))

		// The manager's own check of the same (after a successful probe).
		var p *crawlv1.Proxy
		Eventually(func(ctx context.Context) error {
			p = &crawlv1.Proxy{}
			if err := k8s.Get(ctx, proxyKey(), p); err != nil {
				return err
			}
			if !conditions.IsTrue(p, crawlv1.SecureCondition) {
				return fmt.Errorf("Secure is %s", e2eutil.CondString(p, crawlv1.SecureCondition))
			}
			return nil
		}).WithContext(ctx).WithTimeout(2*probeInterval + statusSlack).WithPolling(time.Second).Should(Succeed())
		GinkgoWriter.Printf("Secure: %s\n", e2eutil.CondString(p, crawlv1.SecureCondition))
	}, NodeTimeout(2*time.Minute))

	It("refuses a client outside allowedSourceCIDRs with 403, even with the credential", func(ctx SpecContext) {
		Expect(ready).NotTo(BeNil())
		if !cfg.InNetNS {
			Skip("needs the test hypervisor's network namespace, where the test may add an address (make test-e2e)")
		}
		u, err := url.Parse(cfg.ProbeURL)
		Expect(err).NotTo(HaveOccurred())
		// The allow-list names the probe server's address (the suite's
		// own); a second address on the same interface is outside it.
		outside, remove, err := e2eutil.ExtraSource(ctx, u.Hostname())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { Expect(remove(ctx)).To(Succeed()) })
		for _, cidr := range ready.Spec.Access.AllowedSourceCIDRs {
			Expect(netip.MustParsePrefix(cidr).Contains(netip.MustParseAddr(outside))).To(BeFalse(), "%s is outside allowed %s", outside, cidr)
		}
		via, err := e2eutil.ProxyVia(ctx, k8s, ready)
		Expect(err).NotTo(HaveOccurred())
		via.Source = outside
		var took time.Duration
		// The first request may wait for ARP of the new address.
		Eventually(func(ctx context.Context) (err error) {
			took, err = e2eutil.WantStatus(ctx, via, cfg.ProbeURL, http.StatusForbidden)
			return err
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(2 * time.Second).Should(Succeed())
		via.Credentials = nil
		_, err = e2eutil.WantStatus(ctx, via, cfg.ProbeURL, http.StatusForbidden)
		Expect(err).NotTo(HaveOccurred(), "outside the list without credentials: 403, not 407")
		// The same credential from the allowed address still works.
		via.Source = ""
		via, err = e2eutil.ProxyVia(ctx, k8s, ready)
		Expect(err).NotTo(HaveOccurred())
		_, err = e2eutil.Want204(ctx, via, cfg.ProbeURL)
		Expect(err).NotTo(HaveOccurred())
		record("request_from_outside_source", took, fmt.Sprintf("(GET %s via %s from %s, allowed %v → 403 with or without the credential)",
			cfg.ProbeURL, ready.Status.Endpoint, outside, ready.Spec.Access.AllowedSourceCIDRs))
	}, NodeTimeout(2*time.Minute))

	It("records status.egressAddress: the guest's leased address, as the echo server saw it", func(ctx SpecContext) {
		Expect(ready).NotTo(BeNil())
		Expect(cfg.EchoURL).NotTo(BeEmpty(), "KVM_TEST_ECHO_URL: the manager's --proxy-probe-url must echo the caller")
		var p *crawlv1.Proxy
		Eventually(func(ctx context.Context) error {
			p = &crawlv1.Proxy{}
			if err := k8s.Get(ctx, proxyKey(), p); err != nil {
				return err
			}
			if p.Status.EgressAddress == "" {
				return errors.New("no status.egressAddress yet")
			}
			return nil
		}).WithContext(ctx).WithTimeout(2*probeInterval + statusSlack).WithPolling(time.Second).Should(Succeed())
		lease := obs.Timeline().ValueAt(e2eutil.SigLease, time.Now())
		Expect(lease).NotTo(BeEmpty(), "the observer read the guest's DHCP lease")
		Expect(p.Status.EgressAddress).To(Equal(lease), "egress address = the guest's leased address")
		Expect(p.Status.EgressAddress).To(Equal(p.Status.Address))
		// The test's own request to the echo server through the proxy.
		via, err := e2eutil.ProxyVia(ctx, k8s, p)
		Expect(err).NotTo(HaveOccurred())
		code, body, took, err := via.Fetch(ctx, cfg.EchoURL)
		Expect(err).NotTo(HaveOccurred())
		Expect(code).To(Equal(http.StatusOK))
		Expect(strings.TrimSpace(string(body))).To(Equal(p.Status.EgressAddress), "the echo server saw the proxy's requests come from the egress address")
		record("egress_address", took, fmt.Sprintf("(GET %s via %s → %s; status.egressAddress %s, lease %s)",
			cfg.EchoURL, p.Status.Endpoint, strings.TrimSpace(string(body)), p.Status.EgressAddress, lease))
	}, NodeTimeout(2*time.Minute))

	It("deletes the domain, its overlay and seed volumes and its NVRAM file with the Proxy", func(ctx SpecContext) {
		Expect(ready).NotTo(BeNil())
		uid := string(ready.UID)
		disk, seed := domxml.DiskVolumeName(uid), domxml.SeedVolumeName(uid)

		// What must go, seen while it exists.
		info, err := e2eutil.Domain(ctx, hv, domain())
		Expect(err).NotTo(HaveOccurred())
		Expect(info.NVRAM).NotTo(BeEmpty(), "a UEFI guest has an NVRAM file")
		Expect(e2eutil.FileExists(ctx, hv, info.NVRAM)).To(BeTrue(), "NVRAM %s exists while the VM does", info.NVRAM)
		vols, err := e2eutil.Volumes(ctx, hv, cfg.Pool)
		Expect(err).NotTo(HaveOccurred())
		Expect(vols).To(ContainElements(disk, seed), "overlay and seed volumes exist while the VM does")

		// From its first Ready=True until now, Ready never left True: no
		// flap while the guest finished booting (the managed squid starts
		// once, with its config), nor after.
		Expect(obs).NotTo(BeNil())
		obs.Stop()
		tl := writeTimeline("proxy", obs)
		firstReady, err := tl.Need(e2eutil.SigReady, "True", created)
		Expect(err).NotTo(HaveOccurred())
		var flaps []string
		for _, c := range tl.Left(e2eutil.SigReady, "True", firstReady) {
			flaps = append(flaps, fmt.Sprintf("%s %s (%s)", tl.Since(c.At), c.Value, c.Detail))
		}
		Expect(flaps).To(BeEmpty(), "Ready left True after %s", tl.Since(firstReady))
		held := time.Since(firstReady)
		record("proxy_ready_held", held, fmt.Sprintf("(Ready=True from %s until deletion, no flap; the test's requests through the proxy failing meanwhile: %s)",
			tl.Since(firstReady), e2eutil.Seconds(tl.Overlap(e2eutil.SigReady, "True", e2eutil.SigServing, "fail", firstReady, time.Now()))))

		Expect(k8s.Delete(ctx, ready.DeepCopy())).To(Succeed())
		start := time.Now()
		Eventually(func(ctx context.Context) error {
			return e2eutil.Gone(ctx, k8s, objs.Proxy.DeepCopy())
		}).WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(time.Second).Should(Succeed())
		took := time.Since(start)
		if capture != nil {
			capture.Stop()
		}

		// The finalizer is released only after the provider's Delete
		// returned: everything is gone by now, no waiting.
		doms, err := e2eutil.Domains(ctx, hv)
		Expect(err).NotTo(HaveOccurred())
		Expect(doms).NotTo(ContainElement(domain()), "domain %s is undefined", domain())
		vols, err = e2eutil.Volumes(ctx, hv, cfg.Pool)
		Expect(err).NotTo(HaveOccurred())
		Expect(e2eutil.Present(vols, []string{disk, seed})).To(BeEmpty(), "the Proxy's volumes are deleted")
		Expect(vols).To(ContainElement(imageVolume), "the cached image stays for the next Proxy")
		Expect(e2eutil.FileExists(ctx, hv, info.NVRAM)).To(BeFalse(), "NVRAM %s is deleted", info.NVRAM)
		if local := hv.LocalPath(info.NVRAM); local != "" {
			_, err := os.Stat(local)
			Expect(os.IsNotExist(err)).To(BeTrue(), "NVRAM file %s (the host's %s) is gone: %v", local, info.NVRAM, err)
		}
		record("proxy_deleted", took, fmt.Sprintf("(domain, %s, %s and %s removed)", disk, seed, info.NVRAM))
	}, NodeTimeout(10*time.Minute))

	It("reports the KVMHost TCPUnreachable while its sshd is down, and Ready again once it is back, without a manager restart", func(ctx SpecContext) {
		bound := cfg.CheckInterval + cfg.CheckTimeout + statusSlack
		Eventually(func(ctx context.Context) error {
			_, err := e2eutil.HostReady(ctx, k8s, objs.Host.Name)
			return err
		}).WithContext(ctx).WithTimeout(cfg.HostReadyTimeout).WithPolling(time.Second).Should(Succeed())
		Expect(op.Alive(ctx)).To(Succeed())

		Expect(hv.StopSSHD(ctx)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { _ = hv.StartSSHD(ctx) }) // if the spec fails midway
		stopped := time.Now()
		var seen []string
		var h *crawlv1.KVMHost
		Eventually(func(ctx context.Context) (err error) {
			h, err = e2eutil.HostReason(ctx, k8s, objs.Host.Name, metav1.ConditionFalse, crawlv1.HostTCPUnreachableReason)
			if h != nil {
				if r := conditions.GetReason(h, crawlv1.ReadyCondition); len(seen) == 0 || seen[len(seen)-1] != r {
					seen = append(seen, r)
				}
			}
			return err
		}).WithContext(ctx).WithTimeout(bound).WithPolling(250*time.Millisecond).Should(Succeed(),
			"a refused TCP connect is TCPUnreachable within checkInterval %s + checkTimeout %s (+%s)", cfg.CheckInterval, cfg.CheckTimeout, statusSlack)
		down := time.Since(stopped)
		msg := conditions.GetMessage(h, crawlv1.ReadyCondition)
		Expect(msg).To(ContainSubstring("connection refused"))
		record("kvmhost_unreachable_after_sshd_stop", down, fmt.Sprintf("(bound %s; reasons seen %v; %q)", bound, seen, msg))

		Expect(hv.StartSSHD(ctx)).To(Succeed())
		started := time.Now()
		Eventually(func(ctx context.Context) error {
			_, err := e2eutil.HostReady(ctx, k8s, objs.Host.Name)
			return err
		}).WithContext(ctx).WithTimeout(bound).WithPolling(250 * time.Millisecond).Should(Succeed())
		record("kvmhost_ready_after_sshd_start", time.Since(started), fmt.Sprintf("(bound %s)", bound))
		Expect(op.Alive(ctx)).To(Succeed(), "the manager healed the host without a restart")
	}, NodeTimeout(5*time.Minute))
})

// recordBoot records one boot as the observer saw it, from the moment
// `from` (the Proxy's creation, or the fault that rebooted its guest), and
// writes the observer's timeline to the artifacts: name prefixes the
// timing lines and names the file.
func recordBoot(name string, obs *e2eutil.Observer, from time.Time) e2eutil.BootTimes {
	tl := writeTimeline(name, obs)
	b := tl.Boot(from)
	GinkgoWriter.Printf("%s boot (observer): %s\n", name, b)
	rec := func(what string, d time.Duration, detail string) {
		if d != 0 {
			record(name+"_"+what, d, detail)
		}
	}
	rec("to_lease", b.Lease, "(the test read the DHCP lease from libvirt)")
	rec("to_status_address", b.Address, "(the manager published status.address)")
	rec("to_first_served", b.FirstServed, "(the test's first 204 through the proxy, when that request was sent)")
	rec("to_first_answer", b.FirstAnswer, "(when the test's first 204 came back)")
	rec("to_ready", b.Ready, "(Ready=True, seen by the test)")
	rec("ready_lag", b.Lag(), "(Ready − first served)")
	rec("ready_lag_after_answer", b.AnswerLag(), "(Ready − first answer)")
	rec("boot_to_agent", b.BootToAgent(), "(domain started → guest agent answers guest-ping)")
	if b.Ready != 0 && b.FirstServed != 0 {
		GinkgoWriter.Printf("%s: created→Ready / created→first served = %.2f\n", name, b.Ready.Seconds()/b.FirstServed.Seconds())
	}
	return b
}

// writeTimeline writes what obs saw so far to the artifacts
// (timeline-NAME.txt, replaced on each call) and returns it.
func writeTimeline(name string, obs *e2eutil.Observer) e2eutil.Timeline {
	tl := obs.Timeline()
	if f, err := os.Create(filepath.Join(artifacts, "timeline-"+name+".txt")); err == nil {
		fmt.Fprintf(f, "# observer of %s, from %s; %d requests through the proxy\n", name, tl.Start.Format(time.RFC3339Nano), obs.Requests())
		tl.Write(f)
		_ = f.Close()
	}
	return tl
}

// libvirtSocket is the test hypervisor's libvirt socket as a local path,
// for the observer's own connection; "" for a remote host.
func libvirtSocket() string {
	if !cfg.Local() {
		return ""
	}
	return hv.LocalPath(cfg.SocketPath)
}

// sshCatImage times `ssh [sshArgs] host 'cat > POOL/x' < image` and
// removes x.
func sshCatImage(ctx context.Context, sshArgs ...string) (time.Duration, error) {
	dir, err := e2eutil.PoolPath(ctx, hv, cfg.Pool)
	if err != nil {
		return 0, err
	}
	remote := dir + "/e2e-sshcat-" + runID + ".tmp"
	defer func() { _, _ = hv.Run(context.WithoutCancel(ctx), "rm", "-f", remote) }()
	return e2eutil.SSHCat(ctx, cfg, cfg.ImagePath, remote, sshArgs...)
}

// uploadMetrics reads the manager's total time spent in successful image
// uploads and the bytes it uploaded.
func uploadMetrics(ctx context.Context) (seconds float64, bytes int64) {
	m, err := op.Metrics(ctx)
	Expect(err).NotTo(HaveOccurred())
	return e2eutil.CounterSum(m, "proxy_operator_image_upload_duration_seconds_sum", `result="ok"`),
		int64(e2eutil.CounterSum(m, "proxy_operator_image_upload_bytes_total"))
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func mbList(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.1f", x)
	}
	return strings.Join(s, ", ")
}

// proxyLabels select key's series of the manager's per-Proxy metrics.
func proxyLabels(key client.ObjectKey) []string {
	return []string{`namespace="` + key.Namespace + `"`, `proxy="` + key.Name + `"`}
}

// lastProbeAt is when the manager last probed the Proxy at key, from its
// metrics (status.probe.lastProbeTime is only a coarse heartbeat); false
// when it has not probed it or the metrics cannot be read.
func lastProbeAt(ctx context.Context, key client.ObjectKey) (time.Time, bool) {
	m, err := op.Metrics(ctx)
	if err != nil {
		return time.Time{}, false
	}
	secs := e2eutil.CounterSum(m, "proxy_operator_proxy_last_probe_timestamp_seconds", proxyLabels(key)...)
	if secs == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, int64(secs*1e9)), true
}

// proxyReconciles reads the manager's count of Proxy reconciles.
func proxyReconciles(ctx context.Context) (float64, error) {
	m, err := op.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	return e2eutil.CounterSum(m, "controller_runtime_reconcile_total", `controller="proxy"`), nil
}
