//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
)

// The fault suite (make test-faults): faults done to the real test
// hypervisor, the manager and its inputs while Proxies run, each checked
// against its invariants by the test's own observer and an inventory of
// the host, and written down as one row of faults.md in the artifacts
// (docs/reliability.md carries the table of a real run). One guest is
// booted to Ready and reused by every fault it survives; Proxies that only
// need to exist on the host are deleted as soon as they do.
var _ = Describe("faults on a real KVM host", Ordered, ContinueOnFailure, Label("faults"), func() {
	var (
		lh      *e2eutil.LocalHost
		lop     *e2eutil.LocalOperator
		foreign e2eutil.Foreign
		// mainProxy is the one booted guest; obs watches it from its
		// creation (fault 6) to the end of the suite.
		mainProxy *crawlv1.Proxy
		obs       *e2eutil.Observer
		// row is the current fault's results row.
		row *faultRow
		// readyBefore are the Proxies Ready when the current fault began.
		readyBefore []string
		// installB is the second install of fault 12 while it runs.
		installB *e2eutil.LocalOperator
	)
	mainKey := func() client.ObjectKey { return client.ObjectKeyFromObject(mainProxy) }
	mainDomain := func() string { return domxml.DomainName(mainProxy.Namespace, mainProxy.Name) }
	foreignName := func() string { return domxml.DomainName(objs.Namespace.Name, "squid-foreign") }

	// begin opens the row of fault n and notes which Proxies are Ready.
	begin := func(ctx context.Context, n int, fault, invariant string) {
		row = &faultRow{FaultRow: e2eutil.FaultRow{N: n, Fault: fault, Invariant: invariant}}
		readyBefore = readyProxies(ctx, k8s)
	}
	// beginOnMain opens the row of a fault done to (or beside) the booted
	// guest, once it serves.
	beginOnMain := func(ctx context.Context, n int, fault, invariant string) {
		GinkgoHelper()
		Expect(mainProxy).NotTo(BeNil())
		begin(ctx, n, fault, invariant)
		waitServing(ctx, obs)
	}

	BeforeAll(func(ctx SpecContext) {
		var ok bool
		lh, ok = hv.(*e2eutil.LocalHost)
		Expect(ok).To(BeTrue(), "the fault suite drives the local test hypervisor (make test-faults), not %T", hv)
		lop, ok = op.(*e2eutil.LocalOperator)
		Expect(ok).To(BeTrue(), "the fault suite kills and restarts the manager: it needs the local one, not %T", op)
		Expect(imgSrv).NotTo(BeNil(), "the fault suite serves the image and its variants itself (KVM_TEST_IMAGE)")

		createHostAndImage(ctx)

		// Foreign objects, put on the host by hand before any fault: a
		// paused domain named like a Proxy (fault 11 creates that Proxy),
		// a volume named like a Proxy's overlay and a plain one. Every row
		// checks that none of them changed.
		xml := fmt.Sprintf(`<domain type='qemu'><name>%s</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>`+
			`<os><type arch='x86_64' machine='pc'>hvm</type></os><devices></devices></domain>`, foreignName())
		xmlPath := filepath.Join(cfg.StateDir, "run", "foreign-domain.xml")
		Expect(os.WriteFile(xmlPath, []byte(xml), 0o644)).To(Succeed())
		for _, args := range [][]string{
			{"define", xmlPath},
			{"start", "--paused", foreignName()},
			{"vol-create-as", cfg.Pool, "foreign-data.img", "1M", "--format", "raw"},
			{"vol-create-as", cfg.Pool, "proxy-" + string(uuid.NewUUID()) + "-disk.qcow2", "1M", "--format", "qcow2"},
		} {
			_, err := e2eutil.Virsh(ctx, hv, args...)
			Expect(err).NotTo(HaveOccurred())
		}
		inv := inventory(ctx)
		fd := inv.Domains[foreignName()]
		Expect(fd.State).To(Equal("paused"))
		foreign = e2eutil.Foreign{Domains: map[string]e2eutil.DomainRecord{foreignName(): fd}, Volumes: map[string][]string{}}
		for _, v := range inv.Volumes[cfg.Pool] {
			if v == "foreign-data.img" || (strings.HasPrefix(v, "proxy-") && strings.HasSuffix(v, "-disk.qcow2")) {
				foreign.Volumes[cfg.Pool] = append(foreign.Volumes[cfg.Pool], v)
			}
		}
		Expect(foreign.Volumes[cfg.Pool]).To(HaveLen(2))
		GinkgoWriter.Printf("foreign objects: domain %s (%s, %s), volumes %v\n", fd.Name, fd.UUID, fd.State, foreign.Volumes[cfg.Pool])
	}, NodeTimeout(15*time.Minute))

	AfterEach(dumpOnFailure, NodeTimeout(2*time.Minute))

	// Every fault's row: survived is the spec's verdict; the inventory is
	// taken after the fault is over (or the spec gave up), against every
	// Proxy that exists in either install and the foreign objects.
	AfterEach(func(ctx SpecContext) {
		if row == nil {
			return
		}
		r := row
		row = nil
		rep := CurrentSpecReport()
		r.Survived = !rep.Failed()
		if rep.Failed() {
			r.Notes = append(r.Notes, "FAILED: "+firstLine(rep.FailureMessage()))
		}
		actx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		after := readyProxies(actx, k8s)
		for _, n := range readyBefore {
			if !slices.Contains(after, n) {
				r.ProxiesLost = append(r.ProxiesLost, n)
			}
		}
		refs, err := e2eutil.ProxyRefs(actx, k8s)
		if err == nil && installB != nil {
			var b []e2eutil.ProxyRef
			b, err = e2eutil.ProxyRefs(actx, installB.Client())
			refs = append(refs, b...)
		}
		pools := []string{cfg.Pool}
		if r.extraPool != "" {
			pools = append(pools, r.extraPool)
		}
		var inv e2eutil.Inventory
		if err == nil {
			inv, err = e2eutil.TakeInventory(actx, hv, pools...)
		}
		if err != nil {
			r.AuditErr = err.Error()
		} else {
			r.Audit = inv.Audit(refs, foreign)
		}
		Expect(writeFaultRow(r)).To(Succeed())
		GinkgoWriter.Printf("fault row: %s\n", r.Markdown())
	}, NodeTimeout(3*time.Minute))

	AfterAll(func(ctx SpecContext) {
		if obs != nil {
			obs.Stop()
			recordTimeline("main-final", obs)
		}
		if installB != nil {
			installB.Stop()
		}
		// The test hypervisor's teardown removes every domain and volume;
		// the API objects go with the control plane.
	}, NodeTimeout(2*time.Minute))

	It("7: a corrupt image (same size, one byte flipped) fails its KVMImage with a checksum mismatch; nothing is marked verified; a Proxy using it never boots", func(ctx SpecContext) {
		begin(ctx, 7, "Corrupt image: same size, one byte flipped, served for a KVMImage whose checksum is right",
			"KVMImage Failed naming the checksum mismatch; no marker, no volume of that digest left; a Proxy on it never defined; a URL fix heals it")
		v, err := imgSrv.Variant("corrupt")
		Expect(err).NotTo(HaveOccurred())
		img := createImage(ctx, "corrupt", v.CorruptURL, v.Checksum)
		created := time.Now()
		p := objs.NewProxy("squid-corrupt", 1, "512Mi")
		p.Spec.Placement.Image = img.Name
		Expect(k8s.Create(ctx, p)).To(Succeed())

		var msg string
		Eventually(func(ctx context.Context) error {
			got := &crawlv1.KVMImage{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(img), got); err != nil {
				return err
			}
			hs := got.Status.HostStatus(objs.Host.Name)
			if hs == nil || hs.Phase != crawlv1.ImageHostFailed {
				return fmt.Errorf("not Failed yet: %+v", hs)
			}
			msg = hs.Message
			return nil
		}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		row.Detected(created, time.Now(), "KVMImage created → host entry Failed")
		Expect(msg).To(ContainSubstring("checksum mismatch"))
		Expect(msg).To(ContainSubstring(strings.TrimPrefix(v.Checksum, "sha256:")), "the reason names the expected digest")
		// The Proxy on it either waits or tries the image itself and fails
		// the same way; once it has settled, nothing of the digest is left
		// and its domain was never defined.
		pkey := client.ObjectKeyFromObject(p)
		Eventually(func(ctx context.Context) error {
			got := getProxy(ctx, pkey)
			r := conditions.GetReason(got, crawlv1.InstanceProvisionedCondition)
			if r == crawlv1.ProxyWaitingForImageReason || got.Status.Phase == crawlv1.ProxyFailed {
				return nil
			}
			return fmt.Errorf("Proxy is %s: %s", got.Status.Phase, e2eutil.CondString(got, crawlv1.InstanceProvisionedCondition))
		}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		Consistently(func(ctx context.Context) error {
			got := getProxy(ctx, pkey)
			if got.Status.ProviderID != "" || got.Status.Phase == crawlv1.ProxyReady {
				return fmt.Errorf("Proxy on a corrupt image got an instance: %s %s", got.Status.Phase, got.Status.ProviderID)
			}
			doms, err := e2eutil.Domains(ctx, hv)
			if err != nil {
				return err
			}
			if slices.Contains(doms, domxml.DomainName(p.Namespace, p.Name)) {
				return errors.New("its domain is defined")
			}
			vols, err := e2eutil.Volumes(ctx, hv, cfg.Pool)
			if err != nil {
				return err
			}
			if slices.Contains(vols, v.Volume+".sha256") {
				return errors.New("a marker vouches for the corrupt bytes")
			}
			return nil
		}).WithContext(ctx).WithTimeout(10 * time.Second).WithPolling(2 * time.Second).Should(Succeed())
		// A Failed Proxy may still try its Create once more (a second
		// PhaseFailed 15 s after the first, seen in a run): that attempt's
		// upload is in the pool until its verification fails. What must
		// hold is that it never gets a marker and goes away.
		Eventually(func(ctx context.Context) error {
			vols, err := e2eutil.Volumes(ctx, hv, cfg.Pool)
			if err != nil {
				return err
			}
			if slices.Contains(vols, v.Volume+".sha256") {
				return StopTrying("a marker vouches for the corrupt bytes")
			}
			if left := e2eutil.Present(vols, []string{v.Volume}); len(left) > 0 {
				return fmt.Errorf("volume %v still in the pool", left)
			}
			return nil
		}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Succeed(), "neither a corrupt upload nor a marker is left")
		row.Note("downloads of the corrupt image: %d (the KVMImage's, and the Proxy's own Create, which does not consult the KVMImage's verdict)", v.Requests())
		got := getProxy(ctx, client.ObjectKeyFromObject(p))
		row.Note("Proxy on it: %s, %s", got.Status.Phase, e2eutil.CondString(got, crawlv1.ReadyCondition))
		Expect(k8s.Delete(ctx, got)).To(Succeed())
		Eventually(gone(k8s, p)).WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(time.Second).Should(Succeed())

		// Heals by a spec change: the intact bytes at another URL.
		fixed := time.Now()
		updateWithRetry(ctx, client.ObjectKeyFromObject(img), func(cur *crawlv1.KVMImage) { cur.Spec.URL = v.URL })
		Eventually(imageVerified(k8s, img.Name, objs.Host.Name)).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
		row.Recovered(fixed, time.Now(), "spec.url fixed → Verified")
		vols, err := e2eutil.Volumes(ctx, hv, cfg.Pool)
		Expect(err).NotTo(HaveOccurred())
		Expect(vols).To(ContainElements(v.Volume, v.Volume+".sha256"))
		Expect(fileSHA256(lh.LocalPath(filepath.Join(poolPath(ctx), v.Volume)))).To(Equal(v.Checksum), "the verified volume holds the intact bytes")

		// Deleting the KVMImage prunes its volume (nothing uses it).
		Expect(k8s.Delete(ctx, img)).To(Succeed())
		Eventually(gone(k8s, img)).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	}, NodeTimeout(15*time.Minute))

	It("11: a foreign domain named like a Proxy is never destroyed or undefined; deletion stays blocked until skip-cleanup", func(ctx SpecContext) {
		begin(ctx, 11, "Foreign domain named like a Proxy, defined by hand on the host (paused, no operator metadata)",
			"Proxy Failed/ForeignInstance; the domain keeps its UUID and state (not even resumed); deletion DeletionBlocked until skip-cleanup, then released without touching it")
		p := objs.NewProxy("squid-foreign", 1, "512Mi")
		Expect(domxml.DomainName(p.Namespace, p.Name)).To(Equal(foreignName()))
		Expect(k8s.Create(ctx, p)).To(Succeed())
		created := time.Now()
		key := client.ObjectKeyFromObject(p)
		Eventually(func(ctx context.Context) error {
			got := getProxy(ctx, key)
			if r := conditions.GetReason(got, crawlv1.InstanceProvisionedCondition); got.Status.Phase != crawlv1.ProxyFailed || r != crawlv1.ProxyForeignInstanceReason {
				return fmt.Errorf("Proxy is %s: %s", got.Status.Phase, e2eutil.CondString(got, crawlv1.InstanceProvisionedCondition))
			}
			return nil
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		row.Detected(created, time.Now(), "Proxy created → Failed/ForeignInstance")
		got := getProxy(ctx, key)
		Expect(got.Status.ProviderID).To(BeEmpty(), "a foreign domain is never recorded as the Proxy's instance")
		Expect(conditions.GetMessage(got, crawlv1.InstanceProvisionedCondition)).To(ContainSubstring("no proxy-operator metadata"))

		Expect(k8s.Delete(ctx, got)).To(Succeed())
		deleted := time.Now()
		Eventually(func(ctx context.Context) error {
			got := getProxy(ctx, key)
			c := conditions.Get(got, crawlv1.DeletionBlockedCondition)
			if c == nil || c.Status != metav1.ConditionTrue || c.Reason != crawlv1.ProxyForeignInstanceReason {
				return fmt.Errorf("DeletionBlocked is %s", e2eutil.CondString(got, crawlv1.DeletionBlockedCondition))
			}
			return nil
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		row.Note("DeletionBlocked=True/ForeignInstance %s after delete", e2eutil.Seconds(time.Since(deleted)))
		// Blocked it stays, across orphan sweeps, and the domain is left
		// exactly as it was.
		hold := max(2*cfg.GCInterval+5*time.Second, 15*time.Second)
		Consistently(func(ctx context.Context) error {
			got := getProxy(ctx, key)
			if !conditions.IsTrue(got, crawlv1.DeletionBlockedCondition) {
				return errors.New("no longer blocked: " + e2eutil.CondString(got, crawlv1.DeletionBlockedCondition))
			}
			return foreignIntact(ctx, foreign)
		}).WithContext(ctx).WithTimeout(hold).WithPolling(3 * time.Second).Should(Succeed())
		row.Note("held blocked %s with the domain untouched", e2eutil.Seconds(hold))

		skip := time.Now()
		Eventually(func(ctx context.Context) error {
			cur := getProxy(ctx, key)
			if cur.Annotations == nil {
				cur.Annotations = map[string]string{}
			}
			cur.Annotations[crawlv1.SkipCleanupAnnotation] = "true"
			return k8s.Update(ctx, cur)
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
		Eventually(gone(k8s, p)).WithContext(ctx).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		row.Recovered(skip, time.Now(), "skip-cleanup → Proxy released")
		Expect(foreignIntact(ctx, foreign)).To(Succeed())
	}, NodeTimeout(10*time.Minute))

	It("5: sshd stopped during a Create, started again: converges to exactly one domain", func(ctx SpecContext) {
		begin(ctx, 5, "sshd and every SSH session killed during a Create, the moment its domain is defined; sshd started 10 s later",
			"exactly one domain for the Proxy, running, recorded as its providerID; exactly its overlay and seed volumes; deleted cleanly")
		p := objs.NewProxy("squid-sshd", 1, "512Mi")
		dom := domxml.DomainName(p.Namespace, p.Name)
		o := observe(p)
		defer o.Stop()
		Expect(k8s.Create(ctx, p)).To(Succeed())
		created := time.Now()
		key := client.ObjectKeyFromObject(p)

		defined := waitEvent(ctx, o, "defined", created, 5*time.Minute)
		stopping := time.Now()
		Expect(lh.CutSSH(ctx)).To(Succeed())
		stopped := time.Now()
		// Restored however the spec ends, before the row's inventory.
		defer func() { _ = hv.StartSSHD(context.WithoutCancel(ctx)) }()
		window := getProxy(ctx, key).Status.ProviderID == ""
		row.Note("every sshd SIGKILLed %s after the domain was defined (then stop-sshd, %s in all); providerID then recorded: %v",
			e2eutil.Seconds(stopping.Sub(defined)), e2eutil.Seconds(stopped.Sub(stopping)), !window)
		if !window {
			row.Note("window missed: the Create had already finished")
		}
		detectHost(ctx, stopping, 2*time.Minute, hostFailedWith(crawlv1.HostTCPUnreachableReason), "sshd killed → KVMHost TCPUnreachable", row)
		time.Sleep(time.Until(stopped.Add(10 * time.Second)))
		Expect(hv.StartSSHD(ctx)).To(Succeed())
		started := time.Now()
		Eventually(instanceRecorded(key)).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		row.Recovered(started, time.Now(), "sshd started → providerID recorded")

		got := getProxy(ctx, key)
		uid := string(got.UID)
		inv := checkOneDomain(ctx, got, dom)
		Expect(inv.Domains[dom].State).To(Equal("running"))
		Expect(volumesOf(inv, cfg.Pool, uid)).To(ConsistOf(domxml.DiskVolumeName(uid), domxml.SeedVolumeName(uid)))
		defines := 0
		for _, c := range o.Timeline().Series[e2eutil.SigEvent] {
			if c.Value == "defined" {
				defines++
			}
		}
		row.Note("libvirt saw %d define(s) of the domain", defines)
		Expect(defines).To(Equal(1), "the domain was defined once, not again after the outage")

		deleteAndWait(ctx, got)
	}, NodeTimeout(15*time.Minute))

	It("6: the manager SIGKILLed during a Create (domain defined, status not yet written), restarted: exactly one domain, the Proxy Ready", func(ctx SpecContext) {
		begin(ctx, 6, "Manager SIGKILLed during a Create, the moment the domain is defined (before status is written), then restarted",
			"exactly one domain for the Proxy, recorded as its providerID; the Proxy Ready and serving")
		mainProxy = objs.NewProxy("squid-main", 1, "1Gi")
		objs.Proxy = mainProxy // what a failure dump shows
		obs = observe(mainProxy)
		Expect(k8s.Create(ctx, mainProxy)).To(Succeed())
		created := time.Now()
		serialLog = filepath.Join(hv.LogDir(), mainDomain()+"-serial.log")
		capture := e2eutil.CaptureSerial(context.Background(), hv, mainDomain(), serialLog)
		DeferCleanup(capture.Stop)

		defined := waitEvent(ctx, obs, "defined", created, 5*time.Minute)
		killed := time.Now()
		Expect(lop.Kill()).To(Succeed())
		got := getProxy(ctx, mainKey())
		row.Note("killed %s after the domain was defined; providerID then in status: %v", e2eutil.Seconds(killed.Sub(defined)), got.Status.ProviderID != "")
		if got.Status.ProviderID != "" {
			row.Note("window missed: status was already written")
		}
		Expect(lop.Restart(ctx)).To(Succeed())
		restarted := time.Now()
		row.Note("manager restarted in %s", e2eutil.Seconds(restarted.Sub(killed)))
		ready := waitProxyReady(ctx, mainKey())
		row.Recovered(restarted, time.Now(), "manager restarted → Ready")
		mainProxy = ready

		checkOneDomain(ctx, ready, mainDomain())
		Eventually(func() error {
			_, err := obs.Timeline().Need(e2eutil.SigServing, "ok", created)
			return err
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		b := recordBoot("main", obs, created)
		row.Note("boot: %s", b)
		Expect(op.Alive(ctx)).To(Succeed())

		// The faults that follow check that the running proxy keeps
		// serving: let the guest finish booting first (cloud-init's last
		// stages still load the guest while the managed squid serves).
		settle := time.Now()
		code, out, err := e2eutil.GuestExec(ctx, hv, mainDomain(), "/usr/bin/cloud-init", "status", "--wait")
		Expect(err).NotTo(HaveOccurred())
		row.Note("cloud-init done %s after Ready (exit %d: %s)", e2eutil.Seconds(time.Since(settle)), code, lastLine(out))
		waitServing(ctx, obs)
	}, NodeTimeout(25*time.Minute))

	It("3: libvirtd wedged (SIGSTOP 60 s, sshd alive): the KVMHost goes Timeout; another host and its Proxy keep reconciling; SIGCONT heals without a restart", func(ctx SpecContext) {
		beginOnMain(ctx, 3, "libvirtd wedged: SIGSTOP for 60 s, sshd alive",
			"KVMHost Timeout within checkInterval+checkTimeout; a second KVMHost's checks and a Proxy on it reconcile during the wedge; the running Proxy stays Ready and serving; SIGCONT heals, same manager process")
		// A second host whose "sshd" is a port the test controls: refused
		// first; during the wedge it starts answering garbage, which only
		// a working KVMHost controller turns into a new reason.
		fake := newFakeSSHPort()
		defer fake.Close()
		hostB := createHost(ctx, "b", func(s *crawlv1.KVMHostSpec) { s.Address = fake.Addr() })
		defer func() { deleteHost(context.WithoutCancel(ctx), hostB.Name) }()
		waitHostReason(ctx, hostB.Name, time.Minute, hostWithReason(crawlv1.HostTCPUnreachableReason))
		probeBefore, probed := lastProbeAt(ctx, mainKey())
		Expect(probed).To(BeTrue(), "the manager's metrics have the main Proxy's last probe")

		stopped := time.Now()
		Expect(lh.Libvirtd(ctx, "stop")).To(Succeed())
		defer func() { _ = lh.Libvirtd(context.WithoutCancel(ctx), "cont") }()
		bound := cfg.CheckInterval + cfg.CheckTimeout + statusSlack
		c := detectHost(ctx, stopped, 2*bound, hostFailedWith(crawlv1.HostTimeoutReason), "SIGSTOP → KVMHost Timeout", row)
		row.Note("Timeout: %q", c.Message)
		Expect(row.Detect).To(BeNumerically("<=", bound), "within checkInterval %s + checkTimeout %s (+%s)", cfg.CheckInterval, cfg.CheckTimeout, statusSlack)

		// During the wedge: host B changes reason, a new Proxy on it is
		// reconciled, the main Proxy keeps being probed.
		Expect(fake.Answer()).To(Succeed())
		answered := time.Now()
		atB, cB := waitHostReason(ctx, hostB.Name, time.Minute, hostWithReason(crawlv1.HostSSHHandshakeFailedReason))
		row.Note("host B re-checked during the wedge: TCPUnreachable → %s in %s", cB.Reason, e2eutil.Seconds(atB.Sub(answered)))
		pB := objs.NewProxy("squid-on-b", 1, "512Mi")
		pB.Spec.Placement.Host = hostB.Name
		pB.Annotations = map[string]string{crawlv1.SkipCleanupAnnotation: "true"} // nothing will exist on B
		Expect(k8s.Create(ctx, pB)).To(Succeed())
		pbCreated := time.Now()
		Eventually(func(ctx context.Context) error {
			got := getProxy(ctx, client.ObjectKeyFromObject(pB))
			if got.Status.ObservedGeneration != got.Generation || conditions.Get(got, crawlv1.InstanceProvisionedCondition) == nil {
				return errors.New("not reconciled yet")
			}
			return nil
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		row.Note("a Proxy on host B reconciled %s after creation during the wedge (%s)", e2eutil.Seconds(time.Since(pbCreated)),
			e2eutil.CondString(getProxy(ctx, client.ObjectKeyFromObject(pB)), crawlv1.InstanceProvisionedCondition))
		deleteAndWait(ctx, getProxy(ctx, client.ObjectKeyFromObject(pB)))

		time.Sleep(time.Until(stopped.Add(60 * time.Second)))
		probeDuring, _ := lastProbeAt(ctx, mainKey())
		Expect(probeDuring.After(probeBefore)).To(BeTrue(), "the main Proxy was probed during the wedge")
		thawed := time.Now()
		Expect(lh.Libvirtd(ctx, "cont")).To(Succeed())
		hostHealed(ctx, thawed, 2*bound, "SIGCONT → KVMHost Ready", row)
		checkServedThrough(obs, stopped, thawed, row)
	}, NodeTimeout(10*time.Minute))

	It("8: the host key rotated with the old key still in known_hosts: every dial refused, both fingerprints in the reason; a Secret update heals without a restart", func(ctx SpecContext) {
		beginOnMain(ctx, 8, "Host key rotated on the hypervisor (sshd restarted, sessions cut), old key still in the Secret's known_hosts",
			"KVMHost SSHHandshakeFailed naming both fingerprints; sshd accepts no login meanwhile (never a connection with the wrong key); the running Proxy serves on; updating the Secret heals, same manager process")
		oldFP := fingerprint(mustRead(filepath.Join(cfg.StateDir, "ssh_host_ed25519_key.pub")))
		sshdLog := filepath.Join(cfg.StateDir, "logs", "sshd.log")
		offset := fileSize(sshdLog)
		rotated := time.Now()
		newPub, err := lh.RotateHostKey(ctx)
		Expect(err).NotTo(HaveOccurred())
		row.Note("rotation (new key, sshd and sessions restarted) took %s", e2eutil.Seconds(time.Since(rotated)))
		newFP := fingerprint([]byte(newPub))
		Expect(newFP).NotTo(Equal(oldFP))
		c := detectHost(ctx, rotated, 2*time.Minute, hostFailedWith(crawlv1.HostSSHHandshakeFailedReason), "rotation → KVMHost SSHHandshakeFailed", row)
		Expect(c.Message).To(And(ContainSubstring(oldFP), ContainSubstring(newFP)), "the reason names the key presented and the key expected")
		row.Note("reason: %q", c.Message)
		// Stays refused across several checks.
		Consistently(func(ctx context.Context) error {
			_, err := e2eutil.HostReason(ctx, k8s, objs.Host.Name, metav1.ConditionFalse, crawlv1.HostSSHHandshakeFailedReason)
			return err
		}).WithContext(ctx).WithTimeout(2 * cfg.CheckInterval).WithPolling(time.Second).Should(Succeed())
		logins := countMatches(sshdLog, offset, "Accepted publickey")
		Expect(logins).To(BeZero(), "no login was accepted while the operator held the wrong key")

		kh, err := e2eutil.NetNSKnownHosts(cfg.StateDir)
		Expect(err).NotTo(HaveOccurred())
		cfg.KnownHosts = kh
		objs.Secret.Data[crawlv1.KnownHostsKey] = kh
		updateWithRetry(ctx, client.ObjectKeyFromObject(objs.Secret), func(s *corev1.Secret) { s.Data[crawlv1.KnownHostsKey] = kh })
		updated := time.Now()
		row.Note("refused logins in sshd's log between rotation and the update: %d accepted", countMatches(sshdLog, offset, "Accepted publickey"))
		hostHealed(ctx, updated, 2*time.Minute, "Secret updated → KVMHost Ready", row)
		checkServedThrough(obs, rotated, time.Now(), row)
	}, NodeTimeout(10*time.Minute))

	It("9: the SSH Secret deleted, then re-created: what runs keeps running, a new dial fails naming the Secret, re-creation heals", func(ctx SpecContext) {
		beginOnMain(ctx, 9, "SSH Secret deleted; a new dial forced (sshd restarted); Secret re-created",
			"the running Proxy keeps serving; the host stays Ready on its established link or fails naming the Secret; a new dial fails SSHMaterialMissing naming the Secret; re-creating it heals, same manager process")
		s := &corev1.Secret{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(objs.Secret), s)).To(Succeed())
		Expect(k8s.Delete(ctx, s)).To(Succeed())
		deleted := time.Now()
		// The established link does not need the Secret: the host stays
		// Ready, or says clearly what is missing.
		var seen []string
		Consistently(func(ctx context.Context) error {
			h := &crawlv1.KVMHost{}
			if err := k8s.Get(ctx, client.ObjectKey{Name: objs.Host.Name}, h); err != nil {
				return err
			}
			c := conditions.Get(h, crawlv1.ReadyCondition)
			if c == nil {
				return errors.New("no Ready condition")
			}
			if len(seen) == 0 || seen[len(seen)-1] != c.Reason {
				seen = append(seen, c.Reason)
			}
			if c.Status != metav1.ConditionTrue && (c.Reason != crawlv1.HostSSHMaterialMissingReason || !strings.Contains(c.Message, objs.Secret.Name)) {
				return fmt.Errorf("the host failed without naming the Secret: %s", e2eutil.CondString(h, crawlv1.ReadyCondition))
			}
			return nil
		}).WithContext(ctx).WithTimeout(2 * cfg.CheckInterval).WithPolling(500 * time.Millisecond).Should(Succeed())
		row.Note("KVMHost over %s after the deletion, on the established link: %v", e2eutil.Seconds(2*cfg.CheckInterval), seen)

		redial := time.Now()
		Expect(hv.StopSSHD(ctx)).To(Succeed())
		Expect(hv.StartSSHD(ctx)).To(Succeed())
		c := detectHost(ctx, redial, 2*time.Minute, hostFailedWith(crawlv1.HostSSHMaterialMissingReason), "link cut (Secret gone) → KVMHost SSHMaterialMissing", row)
		Expect(c.Message).To(ContainSubstring(objs.Secret.Name), "the reason names the Secret")
		row.Note("reason: %q", c.Message)

		recreated := objs.Secret.DeepCopy()
		recreated.ResourceVersion, recreated.UID = "", ""
		Expect(k8s.Create(ctx, recreated)).To(Succeed())
		back := time.Now()
		hostHealed(ctx, back, 2*time.Minute, "Secret re-created → KVMHost Ready", row)
		checkServedThrough(obs, deleted, time.Now(), row)
	}, NodeTimeout(10*time.Minute))

	It("4: libvirtd killed during an image upload, then restarted: verified exactly once, no partial volume marked, used or left", func(ctx SpecContext) {
		beginOnMain(ctx, 4, "libvirtd SIGKILLed during an image upload (a Proxy waiting for that image), restarted 10 s later",
			"no marker while the volume is partial; in the end one volume and one marker of the digest, its bytes the image's, uploaded to completion once; the waiting Proxy's overlay backed by the verified volume only; running guests unaffected")
		v, err := imgSrv.Variant("killed")
		Expect(err).NotTo(HaveOccurred())
		v.SetRate(8 << 20) // ~35 s for the image: time to kill mid-way
		img := createImage(ctx, "killed", v.URL, v.Checksum)
		p := objs.NewProxy("squid-killed", 1, "512Mi")
		p.Spec.Placement.Image = img.Name
		Expect(k8s.Create(ctx, p)).To(Succeed())
		key := client.ObjectKeyFromObject(p)
		pool := poolPath(ctx)
		local := lh.LocalPath(filepath.Join(pool, v.Volume))
		Eventually(func() int64 { return fileSize(local) }).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(100*time.Millisecond).
			Should(BeNumerically(">=", 40<<20), "the upload is under way")
		killed := time.Now()
		Expect(lh.Libvirtd(ctx, "kill")).To(Succeed())
		defer func() { _ = lh.Libvirtd(context.WithoutCancel(ctx), "start") }()
		v.SetRate(0)
		row.Note("killed with %d of %d bytes in the pool", fileSize(local), v.Size)
		at, c := waitHostReason(ctx, objs.Host.Name, time.Minute, hostNotReady)
		row.Detected(killed, at, "SIGKILL → KVMHost "+c.Reason)
		row.Note("KVMHost: %s %q", c.Reason, c.Message)
		// While libvirtd is down: the partial file has no marker, and the
		// Proxy has no overlay (it waits for the image).
		Expect(fileSize(lh.LocalPath(filepath.Join(pool, v.Volume+".sha256")))).To(BeNumerically("<", 0), "no marker for a partial volume")
		uid := string(getProxy(ctx, key).UID)
		Expect(fileSize(lh.LocalPath(filepath.Join(pool, domxml.DiskVolumeName(uid))))).To(BeNumerically("<", 0), "no overlay on a partial image")
		time.Sleep(time.Until(killed.Add(10 * time.Second)))
		started := time.Now()
		Expect(lh.Libvirtd(ctx, "start")).To(Succeed())
		Eventually(imageVerified(k8s, img.Name, objs.Host.Name)).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		row.Recovered(started, time.Now(), "libvirtd started → image Verified")
		waitHostReason(ctx, objs.Host.Name, time.Minute, hostReady)

		vols, err := e2eutil.Volumes(ctx, hv, cfg.Pool)
		Expect(err).NotTo(HaveOccurred())
		Expect(e2eutil.Present(vols, []string{v.Volume, v.Volume + ".sha256"})).To(HaveLen(2))
		Expect(fileSHA256(local)).To(Equal(v.Checksum), "the verified volume holds the image's bytes")
		cached := countMatches(lop.LogPath(), 0, `"Image cached".*`+regexp.QuoteMeta(v.Volume))
		row.Note("downloads of the image: %d; uploads completed (\"Image cached\"): %d", v.Requests(), cached)
		Expect(cached).To(Equal(1), "verified exactly once")

		// The Proxy that waited gets an overlay on the verified volume.
		Eventually(instanceRecorded(key)).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
		backing, err := e2eutil.Virsh(ctx, hv, "vol-dumpxml", "--pool", cfg.Pool, domxml.DiskVolumeName(uid))
		Expect(err).NotTo(HaveOccurred())
		Expect(backing).To(MatchRegexp(`<backingStore>\s*<path>[^<]*` + regexp.QuoteMeta(v.Volume) + `</path>`))
		deleteAndWait(ctx, getProxy(ctx, key))
		checkServedThrough(obs, killed, time.Now(), row)
		// The KVMImage stays: a verified image no VM uses yet, as a fleet
		// pre-caches the next version (fault 12 watches it).
	}, NodeTimeout(15*time.Minute))

	It("1: a domain destroyed from outside: Ready goes False within the event latency, the domain is restarted, Ready again", func(ctx SpecContext) {
		beginOnMain(ctx, 1, "Domain destroyed from outside (virsh destroy)",
			"Ready=False as soon as the lifecycle event arrives (seconds of Ready=True while requests fail, by the test's own requests); the same domain started again; Ready and serving again")
		before := getProxy(ctx, mainKey()).Status.ProviderID
		destroyed := time.Now()
		_, err := e2eutil.Virsh(ctx, hv, "destroy", mainDomain())
		Expect(err).NotTo(HaveOccurred())
		notReady, beyond, lie := detectDown(ctx, obs, destroyed, "domain seen down", row)
		record("fault1_ready_true_while_failing", lie, "(destroy: seconds of Ready=True while requests through the proxy failed)")

		ready := recoverServing(ctx, mainKey(), obs, destroyed, notReady.At, "destroy → Ready and serving again", row)
		Expect(ready.Status.ProviderID).To(Equal(before), "the same domain, started again")
		b := recordBoot("restart-after-destroy", obs, destroyed)
		row.Note("restart: %s", b)
		checkReadyFollowsServing(obs, notReady.At, beyond, row)
	}, NodeTimeout(15*time.Minute))

	It("2: a domain undefined and destroyed from outside: rebuilt with a new UUID, the old per-VM volumes and NVRAM do not leak", func(ctx SpecContext) {
		beginOnMain(ctx, 2, "Domain undefined and destroyed from outside (virsh undefine --keep-nvram; virsh destroy)",
			"Ready=False on the event; rebuilt under a new UUID recorded as providerID; exactly one overlay, one seed and one NVRAM file for the Proxy; Ready and serving again")
		cur := getProxy(ctx, mainKey())
		_, oldUUID, _ := provider.ParseKVMProviderID(cur.Status.ProviderID)
		// Undefined first: the running domain becomes transient, and the
		// destroy then removes it for good. (The other order races the
		// operator, which restarts the destroyed domain before the
		// undefine, leaving it running as a transient domain.)
		undefined := time.Now()
		_, err := e2eutil.Virsh(ctx, hv, "undefine", "--keep-nvram", mainDomain())
		Expect(err).NotTo(HaveOccurred())
		_, err = e2eutil.Virsh(ctx, hv, "destroy", mainDomain())
		Expect(err).NotTo(HaveOccurred())
		notReady, beyond, _ := detectDown(ctx, obs, undefined, "domain seen gone", row)

		ready := recoverServing(ctx, mainKey(), obs, undefined, notReady.At, "undefine → rebuilt, Ready and serving again", row)
		_, newUUID, _ := provider.ParseKVMProviderID(ready.Status.ProviderID)
		Expect(newUUID).NotTo(Equal(oldUUID), "rebuilt: a new domain")
		mainProxy = ready
		uid := string(ready.UID)
		inv := inventory(ctx)
		Expect(inv.Domains[mainDomain()].UUID).To(Equal(newUUID))
		Expect(volumesOf(inv, cfg.Pool, uid)).To(ConsistOf(domxml.DiskVolumeName(uid), domxml.SeedVolumeName(uid)))
		Expect(inv.NVRAM).To(ContainElement(mainDomain() + "_VARS.fd"))
		row.Note("old UUID %s, new %s", oldUUID, newUUID)
		b := recordBoot("rebuild-after-undefine", obs, undefined)
		row.Note("rebuild: %s", b)
		checkReadyFollowsServing(obs, notReady.At, beyond, row)
	}, NodeTimeout(15*time.Minute))

	It("10: a full storage pool fails the Create with a reason that says so, leaks nothing, and heals when space returns", func(ctx SpecContext) {
		begin(ctx, 10, "Storage pool full: a directory pool on a 64 MiB tmpfs (in the host's private mount namespace), a KVMHost and a Proxy on it; then resized to 1200 MiB",
			"the image upload and the Create fail naming the lack of space; nothing left in the pool; after the resize the image is verified there and the domain created")
		row.extraPool = "small"
		if _, err := lh.TmpfsPool(ctx, "small", 64); err != nil {
			Fail(err.Error())
		}
		hostS := createHost(ctx, "small", func(s *crawlv1.KVMHostSpec) { s.StoragePool = "small" })
		defer func() { deleteHost(context.WithoutCancel(ctx), hostS.Name) }()
		created := time.Now()
		p := objs.NewProxy("squid-small", 1, "512Mi")
		p.Spec.Placement.Host = hostS.Name
		Expect(k8s.Create(ctx, p)).To(Succeed())
		key := client.ObjectKeyFromObject(p)
		space := regexp.MustCompile(`(?i)no space|space left|ENOSPC|not enough space|insufficient`)
		var imgMsg string
		Eventually(func(ctx context.Context) error {
			img := &crawlv1.KVMImage{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(objs.Image), img); err != nil {
				return err
			}
			hs := img.Status.HostStatus(hostS.Name)
			if hs == nil || hs.Message == "" {
				return errors.New("no attempt on the small pool yet")
			}
			imgMsg = hs.Message
			if !space.MatchString(hs.Message) {
				return fmt.Errorf("the KVMImage's reason does not say the pool is full: %s %q", hs.Phase, hs.Message)
			}
			return nil
		}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		row.Detected(created, time.Now(), "KVMHost created → KVMImage says the pool is full")
		row.Note("KVMImage on the small pool: %q", imgMsg)
		got := getProxy(ctx, key)
		row.Note("Proxy: %s, %s", got.Status.Phase, e2eutil.CondString(got, crawlv1.InstanceProvisionedCondition))
		Expect(got.Status.ProviderID).To(BeEmpty())
		// Every KVMImage tries every Ready host, each retrying every 30 s:
		// between their attempts the pool must be empty again.
		Eventually(func(ctx context.Context) ([]string, error) {
			return e2eutil.Volumes(ctx, hv, "small")
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(500*time.Millisecond).Should(BeEmpty(), "nothing is left in the full pool")

		_, err := lh.TmpfsPool(ctx, "small", 1200)
		Expect(err).NotTo(HaveOccurred())
		freed := time.Now()
		Eventually(instanceRecorded(key)).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
		row.Recovered(freed, time.Now(), "space returned → domain created")
		// Every KVMImage (fault 4's too) caches itself on the new host: once
		// all are verified no upload is left in flight for the audit to
		// take for a leak.
		Eventually(func(ctx context.Context) error {
			imgs := &crawlv1.KVMImageList{}
			if err := k8s.List(ctx, imgs); err != nil {
				return err
			}
			for _, img := range imgs.Items {
				if _, err := e2eutil.ImageVerified(ctx, k8s, img.Name, hostS.Name); err != nil {
					return err
				}
			}
			return nil
		}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
		deleteAndWait(ctx, getProxy(ctx, key))
	}, NodeTimeout(15*time.Minute))

	It("12: two installs sharing the hypervisor: over three sweep intervals neither touches the other's domains", func(ctx SpecContext) {
		Expect(mainProxy).NotTo(BeNil())
		begin(ctx, 12, "Two installs (two control planes, two managers, same instance tag and names) sharing the hypervisor",
			"over three orphan-sweep intervals of both managers no domain or volume of the other install is touched; install B's image prune (one of its KVMImages deleted) leaves install A's cached images; each install deletes only its own Proxy's domain")
		Expect(cfg.GCInterval).To(BeNumerically(">", 0), "the fault suite sets E2E_GC_INTERVAL (test/e2e/run.sh)")
		dir := filepath.Join(artifacts, "install-b")
		keyDir := filepath.Join(dir, "empty-ssh-key-dir")
		Expect(os.MkdirAll(keyDir, 0o700)).To(Succeed())
		tag := "pxe2e-" + runID
		// Install A's objects on the host before install B exists: its
		// volumes (the cached images among them) must all outlive B.
		beforeB := inventory(ctx)
		b, err := e2eutil.StartLocal(ctx, dir, lop.Bin(), e2eutil.ManagerArgs(cfg, keyDir, tag, tag))
		Expect(err).NotTo(HaveOccurred())
		installB = b
		kb := b.Client()
		objsB, err := e2eutil.NewObjects(cfg, tag, b.SecretNamespace(), imgSrv.URL, imgSrv.Checksum)
		Expect(err).NotTo(HaveOccurred())
		for _, o := range []client.Object{objsB.Namespace, objsB.Secret, objsB.Host, objsB.Image} {
			Expect(kb.Create(ctx, o)).To(Succeed())
		}
		pB := objsB.NewProxy("squid-install-b", 1, "512Mi")
		Expect(kb.Create(ctx, pB)).To(Succeed())
		domB := domxml.DomainName(pB.Namespace, pB.Name)
		Eventually(func(ctx context.Context) error {
			got := &crawlv1.Proxy{}
			if err := kb.Get(ctx, client.ObjectKeyFromObject(pB), got); err != nil {
				return err
			}
			if got.Status.ProviderID == "" {
				return errors.New("install B's Proxy has no instance yet: " + e2eutil.CondString(got, crawlv1.InstanceProvisionedCondition))
			}
			return nil
		}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())

		before := inventory(ctx)
		watched := []string{mainDomain(), domB}
		for _, d := range watched {
			Expect(before.Domains).To(HaveKey(d))
		}
		Expect(before.Domains[mainDomain()]).To(Equal(beforeB.Domains[mainDomain()]), "install A's domain as it was before install B started")
		listsA, listsB := domainLists(ctx, op), domainLists(ctx, b)
		start := time.Now()
		window := 3*cfg.GCInterval + 5*time.Second
		touched := map[string]bool{}
		for time.Since(start) < window {
			inv := inventory(ctx)
			for _, d := range watched {
				if now, was := inv.Domains[d], before.Domains[d]; now.UUID != was.UUID || now.State != was.State {
					touched[fmt.Sprintf("domain %s: %s %s, was %s %s", d, now.UUID, orGone(now.State), was.UUID, was.State)] = true
				}
			}
			for _, v := range beforeB.Volumes[cfg.Pool] {
				if !slices.Contains(inv.Volumes[cfg.Pool], v) {
					touched["install A's volume "+v+" deleted"] = true
				}
			}
			time.Sleep(2 * time.Second)
		}
		for t := range touched {
			row.Touched = append(row.Touched, t)
		}
		slices.Sort(row.Touched)
		endA, endB := domainLists(ctx, op), domainLists(ctx, b)
		sweepsA, sweepsB := endA-listsA, endB-listsB
		row.Note("over %s: install A listed all domains %.0f times (counter %.0f → %.0f, manager pid %d), install B %.0f times (%.0f → %.0f) (sweeps and health checks)",
			e2eutil.Seconds(window), sweepsA, listsA, endA, lop.PID(), sweepsB, listsB, endB)
		Expect(sweepsA).To(BeNumerically(">=", 3))
		Expect(sweepsB).To(BeNumerically(">=", 3))
		for _, l := range []string{lop.LogPath(), b.LogPath()} {
			Expect(countMatches(l, 0, "deleted orphan")).To(BeZero(), "no orphan deleted in %s", l)
		}
		Expect(row.Touched).To(BeEmpty(), "neither install touched the other's domains or volumes")
		// Each install deletes its own, and only its own.
		Expect(kb.Delete(ctx, pB)).To(Succeed())
		Eventually(gone(kb, pB)).WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(time.Second).Should(Succeed())
		after := inventory(ctx)
		Expect(after.Domains).NotTo(HaveKey(domB))
		Expect(after.Domains[mainDomain()].UUID).To(Equal(before.Domains[mainDomain()].UUID))
		Expect(e2eutil.ProxyReady(ctx, k8s, mainKey(), objs.Host.Name)).Error().NotTo(HaveOccurred())

		// Install B deletes a KVMImage of its own, so it prunes the shared
		// pool: install A's cached images must stay (A's image of fault 4
		// is verified and used by no VM, as a pre-cached next version is).
		vB, err := imgSrv.Variant("install-b")
		Expect(err).NotTo(HaveOccurred())
		imgB := objsB.Image.DeepCopy()
		imgB.ObjectMeta = metav1.ObjectMeta{Name: objsB.Image.Name + "-b-only"}
		imgB.Spec.URL, imgB.Spec.Checksum = vB.URL, vB.Checksum
		Expect(kb.Create(ctx, imgB)).To(Succeed())
		Eventually(imageVerified(kb, imgB.Name, objsB.Host.Name)).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
		cached := inventory(ctx)
		Expect(kb.Delete(ctx, imgB)).To(Succeed())
		Eventually(gone(kb, imgB)).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		pruned := inventory(ctx)
		for _, v := range beforeB.Volumes[cfg.Pool] {
			if strings.HasPrefix(v, "image-") && slices.Contains(cached.Volumes[cfg.Pool], v) && !slices.Contains(pruned.Volumes[cfg.Pool], v) {
				row.Touched = append(row.Touched, "install A's volume "+v+" deleted by install B's image prune")
			}
		}
		Expect(row.Touched).To(BeEmpty(), "install B's prune left install A's cached images alone")

		b.Stop()
		installB = nil
	}, NodeTimeout(15*time.Minute))

	It("13: libvirtd wedged for 2 minutes under 24 Proxies while a second host's Proxies are created, deleted and probed: that host keeps its latency, no worker is held, everything converges", func(ctx SpecContext) {
		const (
			onA   = 24 // more than the manager's 16 Proxy workers
			wedge = 2 * time.Minute
			// longestCall is the longest per-RPC deadline (start, resume,
			// destroy; an upload's no-progress bound): no worker may be held
			// longer. The reconcile histogram's last bound, 60 s, is below it.
			longestCall = 2 * time.Minute
		)
		begin(ctx, 13, fmt.Sprintf("libvirtd wedged (SIGSTOP for %s, sshd alive) with %d Proxies' domains on the host, every one poked at the wedge's start; host B (a second libvirtd behind the same sshd) has a serving Proxy while Proxies are created and deleted on it", wedge, onA),
			"host B's create → instance recorded and delete → gone within max(3× their slowest before the wedge, 60 s), its serving Proxy Ready, serving and probed throughout; no Proxy reconcile longer than 60 s; the wedged host's Proxies say HostNotAnswering, keep their instances and make no call once its check says Timeout; after SIGCONT each converges to its same domain, nothing lost or made twice")
		if mainProxy != nil {
			waitServing(ctx, obs)
		}

		// Host B and a serving Proxy on it.
		b, socket, err := lh.HostB(ctx)
		Expect(err).NotTo(HaveOccurred())
		bridge := bridgeOf(ctx, cfg.Network)
		hostB := createHost(ctx, "hostb", func(s *crawlv1.KVMHostSpec) {
			s.SocketPath, s.StoragePool = socket, e2eutil.HostBPool
			s.NetworkMode, s.Network = crawlv1.NetworkModeBridge, bridge
		})
		defer func() { deleteHost(context.WithoutCancel(ctx), hostB.Name) }()
		waitHostReason(ctx, hostB.Name, cfg.HostReadyTimeout, hostReady)
		Eventually(imageVerified(k8s, objs.Image.Name, hostB.Name)).WithContext(ctx).WithTimeout(cfg.ImageTimeout).WithPolling(time.Second).Should(Succeed())
		serving := objs.NewProxy("squid-b-serving", 1, "512Mi")
		serving.Spec.Placement.Host = hostB.Name
		Expect(k8s.Create(ctx, serving)).To(Succeed())
		servingKey := client.ObjectKeyFromObject(serving)
		defer func() { _ = client.IgnoreNotFound(k8s.Delete(context.WithoutCancel(ctx), serving)) }()
		// No libvirt view: host B's guests have no lease on a libvirt
		// network of its daemon, so the observer asks status.address.
		obsB := e2eutil.Observe(context.Background(), e2eutil.ObserverConfig{Client: k8s, Proxy: servingKey, Target: cfg.ProbeURL})
		defer obsB.Stop()
		// Bridged: its address is the guest agent's, not a lease of the
		// host's network (CheckReadyProxy's rule).
		Eventually(func(ctx context.Context) error {
			got := getProxy(ctx, servingKey)
			if got.Status.Phase != crawlv1.ProxyReady || !strings.HasPrefix(got.Status.ProviderID, "kvm://"+hostB.Name+"/") {
				return fmt.Errorf("Proxy on host B is %s (%s): %s", got.Status.Phase, got.Status.ProviderID, e2eutil.CondString(got, crawlv1.ReadyCondition))
			}
			return nil
		}).WithContext(ctx).WithTimeout(cfg.ProxyReadyTimeout).WithPolling(time.Second).Should(Succeed())
		waitServing(ctx, obsB)
		row.Note("host B: KVMHost %s, libvirt socket %s, pool %s, bridge %s; its serving Proxy booted in %s", hostB.Name, socket, e2eutil.HostBPool, bridge,
			e2eutil.Seconds(time.Since(obsB.Started())))

		// Host A's Proxies: idle domains the test defines with the
		// operator's metadata (its Create finds them and records them),
		// waiting for an address as booting guests do: every one is read
		// every provision poll. Their KVMImage comes last, so none is
		// created by the operator before its domain exists.
		idleImage := objs.Image.DeepCopy()
		idleImage.ObjectMeta = metav1.ObjectMeta{Name: objs.Image.Name + "-idle"}
		var keys []client.ObjectKey
		var files []string
		tag, install := "pxe2e-"+runID, installID(ctx)
		for i := range onA {
			p := objs.NewProxy(fmt.Sprintf("squid-idle-%02d", i), 1, "512Mi")
			p.Spec.Placement.Image = idleImage.Name
			Expect(k8s.Create(ctx, p)).To(Succeed())
			keys = append(keys, client.ObjectKeyFromObject(p))
			f := filepath.Join(cfg.StateDir, "run", p.Name+".xml")
			Expect(os.WriteFile(f, []byte(idleDomainXML(p, tag, install)), 0o644)).To(Succeed())
			files = append(files, f)
		}
		defer func() {
			for _, k := range keys {
				_ = client.IgnoreNotFound(k8s.Delete(context.WithoutCancel(ctx), &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}))
			}
		}()
		_, err = hv.Run(ctx, append([]string{"sh", "-c", `for f; do virsh -q -c qemu:///system define "$f" >/dev/null && virsh -q -c qemu:///system start "$(basename "$f" .xml | sed "s/^/` + objs.Namespace.Name + `./")" >/dev/null || exit 1; done`, "define"}, files...)...)
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Create(ctx, idleImage)).To(Succeed())
		defer func() { _ = client.IgnoreNotFound(k8s.Delete(context.WithoutCancel(ctx), idleImage)) }()
		instances := map[client.ObjectKey]string{}
		Eventually(func(ctx context.Context) error {
			for _, k := range keys {
				got := getProxy(ctx, k)
				if got.Status.ProviderID == "" || conditions.GetReason(got, crawlv1.InstanceProvisionedCondition) != crawlv1.ProxyWaitingForAddressReason {
					return fmt.Errorf("%s: %s", k.Name, e2eutil.CondString(got, crawlv1.InstanceProvisionedCondition))
				}
				instances[k] = got.Status.ProviderID
			}
			return nil
		}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
		checkEachHasOneDomain(ctx, keys)

		// Host B's latency before the wedge.
		base := roundTrips(ctx, hostB.Name, "squid-b-before", 2, time.Time{})
		baseRecorded, baseDeleted := slowest(base)
		row.Note("host B before the wedge: create → recorded ≤ %s, delete → gone ≤ %s (%d round trips)", e2eutil.Seconds(baseRecorded), e2eutil.Seconds(baseDeleted), len(base))

		// The wedge, and a wave of reconciles of every Proxy on the host.
		wctx, stopSampling := context.WithCancel(ctx)
		defer stopSampling()
		busiest := sampleGauge(wctx, "controller_runtime_active_workers", `controller="proxy"`)
		probed := probeTimes(wctx, servingKey)
		histBefore := reconcileBuckets(ctx)
		stopped := time.Now()
		Expect(lh.Libvirtd(ctx, "stop")).To(Succeed())
		defer func() { _ = lh.Libvirtd(context.WithoutCancel(ctx), "cont") }()
		poke(ctx, keys)
		bound := cfg.CheckInterval + cfg.CheckTimeout + statusSlack
		c := detectHost(ctx, stopped, 2*bound, hostFailedWith(crawlv1.HostTimeoutReason), "SIGSTOP → KVMHost Timeout", row)
		row.Note("host A: %q", c.Message)
		Eventually(func(ctx context.Context) error {
			for _, k := range keys {
				got := getProxy(ctx, k)
				if conditions.GetReason(got, crawlv1.HostUnavailableCondition) != crawlv1.ProxyHostNotAnsweringReason {
					return fmt.Errorf("%s: HostUnavailable is %s", k.Name, e2eutil.CondString(got, crawlv1.HostUnavailableCondition))
				}
				if got.Status.ProviderID != instances[k] {
					return StopTrying(fmt.Sprintf("%s: instance %q, was %q", k.Name, got.Status.ProviderID, instances[k]))
				}
			}
			return nil
		}).WithContext(ctx).WithTimeout(bound + time.Minute).WithPolling(time.Second).Should(Succeed())
		turnedAway := time.Now()
		row.Note("every Proxy of host A said HostNotAnswering %s after SIGSTOP", e2eutil.Seconds(turnedAway.Sub(stopped)))
		during := roundTrips(ctx, hostB.Name, "squid-b-during", 0, stopped.Add(wedge-30*time.Second))
		time.Sleep(time.Until(stopped.Add(wedge)))
		thawed := time.Now()
		Expect(lh.Libvirtd(ctx, "cont")).To(Succeed())

		// After: the host answers, its Proxies converge to what they were.
		hostHealed(ctx, thawed, 2*bound, "SIGCONT → KVMHost Ready", row)
		Eventually(func(ctx context.Context) error {
			for _, k := range keys {
				got := getProxy(ctx, k)
				// Still waiting for an address, as before (AddressTimeout
				// too, on a machine slow enough to take its 10 minutes).
				if r := conditions.GetReason(got, crawlv1.InstanceProvisionedCondition); conditions.Get(got, crawlv1.HostUnavailableCondition) != nil ||
					r != crawlv1.ProxyWaitingForAddressReason && r != crawlv1.ProxyAddressTimeoutReason {
					return fmt.Errorf("%s: %s; %s", k.Name, e2eutil.CondString(got, crawlv1.HostUnavailableCondition), e2eutil.CondString(got, crawlv1.InstanceProvisionedCondition))
				}
				if got.Status.ProviderID != instances[k] {
					return StopTrying(fmt.Sprintf("%s: instance %q, was %q", k.Name, got.Status.ProviderID, instances[k]))
				}
			}
			return nil
		}).WithContext(ctx).WithTimeout(2*bound + time.Minute).WithPolling(time.Second).Should(Succeed())
		converged := time.Now()
		row.Recovered(thawed, converged, fmt.Sprintf("SIGCONT → all %d Proxies of host A read again, same instances", onA))
		stopSampling()
		histAfter := reconcileBuckets(ctx)
		checkEachHasOneDomain(ctx, keys)

		// The figures.
		duringRecorded, duringDeleted := slowest(during)
		gap := longestGap(probed(), stopped, thawed)
		le, n := slowestBucket(histBefore, histAfter)
		workers := busiest()
		row.Note("host B during the wedge: %d round trips, slowest create → recorded %s, delete → gone %s; its serving Proxy probed at most %s apart",
			len(during), e2eutil.Seconds(duringRecorded), e2eutil.Seconds(duringDeleted), e2eutil.Seconds(gap))
		row.Note("SIGSTOP → all settled: %.0f Proxy reconciles, every one ≤ %gs; at most %.0f of 16 Proxy workers busy at once", n, le, workers)
		record("fault13_b_create_before", baseRecorded, "(slowest create → instance recorded on host B before the wedge)")
		record("fault13_b_create_during", duringRecorded, "(slowest create → instance recorded on host B during the wedge)")
		record("fault13_b_delete_before", baseDeleted, "(slowest delete → gone on host B before the wedge)")
		record("fault13_b_delete_during", duringDeleted, "(slowest delete → gone on host B during the wedge)")
		record("fault13_b_probe_gap", gap, "(longest time between two probes of host B's serving Proxy during the wedge)")
		record("fault13_a_turned_away", turnedAway.Sub(stopped), "(SIGSTOP → every Proxy of host A HostNotAnswering)")
		record("fault13_a_converged", converged.Sub(thawed), "(SIGCONT → every Proxy of host A read again)")
		Expect(len(during)).To(BeNumerically(">=", 2), "round trips on host B during the wedge")
		Expect(duringRecorded).To(BeNumerically("<=", max(3*baseRecorded, time.Minute)), "host B's creates kept their latency")
		Expect(duringDeleted).To(BeNumerically("<=", max(3*baseDeleted, time.Minute)), "host B's deletes kept their latency")
		Expect(gap).To(BeNumerically("<=", 3*e2eutil.ProxyProbeInterval), "host B's serving Proxy kept being probed")
		Expect(le).To(BeNumerically("<=", 60), "no Proxy reconcile held its worker past 60 s (the longest per-call deadline is %s)", longestCall)
		checkServedThrough(obsB, stopped, thawed, row)
		if mainProxy != nil {
			checkServedThrough(obs, stopped, thawed, row)
		}

		// Everything goes; host B keeps nothing of its Proxies.
		deleteAllAndWait(ctx, append(keys, servingKey))
		refs, err := e2eutil.ProxyRefs(ctx, k8s)
		Expect(err).NotTo(HaveOccurred())
		invB, err := e2eutil.TakeInventory(ctx, b, e2eutil.HostBPool)
		Expect(err).NotTo(HaveOccurred())
		auditB := invB.Audit(refs, e2eutil.Foreign{})
		row.Note("host B after: %s", auditB.String())
		Expect(auditB.Leaks()).To(BeZero(), "host B: %s", auditB.String())
	}, NodeTimeout(45*time.Minute))
})
