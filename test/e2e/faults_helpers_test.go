//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
)

// The fault suite's row, its waits on the observer's timeline and its
// checks of the host (faults_test.go holds the faults themselves).

// eventSlack bounds how long after a domain goes down (libvirt's event
// reaches the manager at once) Ready may stay True: one Get and one status
// write, on a loaded machine.
const eventSlack = 5 * time.Second

// faultRow is the fault suite's row of faults.md: the shared row and the
// extra storage pool a fault's audit must cover.
type faultRow struct {
	e2eutil.FaultRow
	extraPool string
}

// writeFaultRow appends r to E2E_ARTIFACTS/faults.md.
func writeFaultRow(r *faultRow) error { return e2eutil.WriteFaultRow(artifacts, &r.FaultRow) }

func orGone(state string) string {
	if state == "" {
		return "gone"
	}
	return state
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// observe starts the independent observer of Proxy p and waits until its
// libvirt connection has looked once (its lifecycle events are subscribed
// by then), so no event of the domain is missed.
func observe(p *crawlv1.Proxy) *e2eutil.Observer {
	o := e2eutil.Observe(context.Background(), e2eutil.ObserverConfig{
		Client: k8s, Proxy: client.ObjectKeyFromObject(p), Target: cfg.ProbeURL,
		LibvirtSocket: libvirtSocket(), Domain: domxml.DomainName(p.Namespace, p.Name),
	})
	Eventually(func() bool { return len(o.Timeline().Series[e2eutil.SigDomain]) > 0 }).
		WithTimeout(time.Minute).WithPolling(50*time.Millisecond).Should(BeTrue(), "the observer's libvirt connection")
	return o
}

// recordTimeline writes an observer's whole timeline to the artifacts.
func recordTimeline(name string, o *e2eutil.Observer) {
	f, err := os.Create(filepath.Join(artifacts, "timeline-"+name+".txt"))
	if err != nil {
		return
	}
	defer f.Close()
	o.Timeline().Write(f)
}

// waitTimeline waits for the first change of sig accepted by pred at or
// after from, as the observer saw it.
func waitTimeline(ctx context.Context, o *e2eutil.Observer, sig string, from time.Time, timeout time.Duration, pred func(e2eutil.Change) bool) e2eutil.Change {
	var got e2eutil.Change
	Eventually(func() error {
		c, ok := o.Timeline().First(sig, from, pred)
		if !ok {
			return fmt.Errorf("observer has not seen the %s change yet (now %q)", sig, o.Timeline().ValueAt(sig, time.Now()))
		}
		got = c
		return nil
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(20 * time.Millisecond).Should(Succeed())
	return got
}

// waitEvent waits for the domain's libvirt lifecycle event (e.g.
// "defined") at or after from and returns when the observer got it.
func waitEvent(ctx context.Context, o *e2eutil.Observer, event string, from time.Time, timeout time.Duration) time.Time {
	return waitTimeline(ctx, o, e2eutil.SigEvent, from, timeout, func(c e2eutil.Change) bool { return c.Value == event }).At
}

// detectDown waits for the main domain to be seen down (its state polled,
// or its "stopped" event, whichever came first) after the fault at from,
// and then for Ready=False, which it records as the time to detect ("seen
// → Ready=False (reason)"). It notes how the time splits between libvirt's
// event delivery and the manager, and how long Ready stayed True while the
// test's requests failed (lie); beyond is how long after the stopped event
// Ready went False.
func detectDown(ctx context.Context, o *e2eutil.Observer, from time.Time, seen string, r *faultRow) (notReady e2eutil.Change, beyond, lie time.Duration) {
	GinkgoHelper()
	ev := waitEvent(ctx, o, "stopped", from, time.Minute)
	polled, ok := o.Timeline().First(e2eutil.SigDomain, from, func(c e2eutil.Change) bool { return c.Value != "running" })
	down := ev
	if ok && polled.At.Before(ev) {
		down = polled.At
	}
	notReady = waitTimeline(ctx, o, e2eutil.SigReady, from, 2*time.Minute, func(c e2eutil.Change) bool { return c.Value != "True" })
	tl := o.Timeline()
	restarted, _ := tl.FirstValue(e2eutil.SigEvent, "started", ev)
	since := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return "+" + e2eutil.Seconds(t.Sub(from))
	}
	r.Note("after the fault: domain seen down %s (polled %q at %s, stopped event %s), started again (event) %s, Ready=False %s",
		since(down), polled.Value, since(polled.At), since(ev), since(restarted), since(notReady.At))
	r.Detected(down, notReady.At, seen+" → Ready=False ("+notReady.Detail+")")
	beyond = notReady.At.Sub(ev)
	r.Note("Ready=False %s after libvirt's stopped event reached the test", e2eutil.Seconds(beyond))
	lie = o.Timeline().Overlap(e2eutil.SigReady, "True", e2eutil.SigServing, "fail", from, notReady.At)
	r.Note("Ready=True while the test's requests failed: %s", e2eutil.Seconds(lie))
	return notReady, beyond, lie
}

// recoverServing waits for the main Proxy to be Ready again (as the
// manager checks it) and for the observer to see it Ready and serving at
// once after notReady, and records the time to recover from the fault.
func recoverServing(ctx context.Context, key client.ObjectKey, o *e2eutil.Observer, fault, notReady time.Time, note string, r *faultRow) *crawlv1.Proxy {
	GinkgoHelper()
	ready := waitProxyReady(ctx, key)
	back := waitBack(ctx, o, notReady)
	r.Recovered(fault, back, note)
	return ready
}

// checkReadyFollowsServing notes how long the Proxy was Ready again before
// it served, and checks that Ready went False within eventSlack of the
// stopped event (beyond) and came back only with serving. Called last, once
// the Proxy is back, so the row has every figure.
func checkReadyFollowsServing(o *e2eutil.Observer, notReady time.Time, beyond time.Duration, r *faultRow) {
	GinkgoHelper()
	early := readyBeforeServing(o, notReady)
	r.Note("Ready=True before the proxy served again: %s", e2eutil.Seconds(early))
	Expect(beyond).To(BeNumerically("<=", eventSlack), "Ready=False within %s of the domain's stopped event; it took %s", eventSlack, beyond)
	Expect(early).To(BeNumerically("<=", servingSlack), "Ready=True only once the proxy serves again; it was Ready %s before", early)
}

// waitBack waits until the observer has seen the Proxy Ready and serving
// at once after from (its status read back Ready and its own request
// answered), and returns that moment: a Ready the proxy did not live up
// to does not count as recovered.
func waitBack(ctx context.Context, o *e2eutil.Observer, from time.Time) time.Time {
	var back time.Time
	Eventually(func() error {
		at, ok := o.Timeline().FirstBoth(e2eutil.SigReady, "True", e2eutil.SigServing, "ok", from)
		if !ok {
			return errors.New("the observer has not seen the Proxy Ready and serving at once yet")
		}
		back = at
		return nil
	}).WithContext(ctx).WithTimeout(cfg.ProxyReadyTimeout).WithPolling(250 * time.Millisecond).Should(Succeed())
	return back
}

// readyBeforeServing is how long, after from, the Proxy was Ready while
// the test's requests through it still failed, up to the first success:
// Ready must not be announced for a proxy that does not serve yet.
func readyBeforeServing(o *e2eutil.Observer, from time.Time) time.Duration {
	tl := o.Timeline()
	served, ok := tl.FirstValue(e2eutil.SigServing, "ok", from)
	if !ok {
		served = time.Now()
	}
	return tl.Overlap(e2eutil.SigReady, "True", e2eutil.SigServing, "fail", from, served)
}

// servingSlack absorbs the observer's sampling: its requests start every
// 250 ms and count from their start.
const servingSlack = time.Second

// waitServing waits until the observer's latest request through the main
// proxy succeeded, so a fault starts from a serving proxy.
func waitServing(ctx context.Context, o *e2eutil.Observer) {
	Eventually(func() string {
		return o.Timeline().ValueAt(e2eutil.SigServing, time.Now())
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(250 * time.Millisecond).Should(Equal("ok"))
}

// waitProxyReady waits for the Proxy to be Ready (as the manager checks
// it).
func waitProxyReady(ctx context.Context, key client.ObjectKey) *crawlv1.Proxy {
	var ready *crawlv1.Proxy
	Eventually(func(ctx context.Context) (err error) {
		ready, err = e2eutil.ProxyReady(ctx, k8s, key, objs.Host.Name)
		return err
	}).WithContext(ctx).WithTimeout(cfg.ProxyReadyTimeout).WithPolling(250 * time.Millisecond).Should(Succeed())
	return ready
}

// checkServedThrough notes how long, between from and to, the main proxy
// failed the test's requests and was not Ready: a fault of the host's
// management plane must cost the running proxy nothing.
func checkServedThrough(o *e2eutil.Observer, from, to time.Time, r *faultRow) {
	tl := o.Timeline()
	failing := tl.Held(e2eutil.SigServing, "fail", from, to)
	notReady := tl.Held(e2eutil.SigReady, "False", from, to)
	r.Note("running proxy during the fault: requests failing %s, Ready=False %s", e2eutil.Seconds(failing), e2eutil.Seconds(notReady))
	Expect(failing).To(BeZero(), "the running proxy kept serving")
	Expect(notReady).To(BeZero(), "the running proxy stayed Ready")
}

func getProxy(ctx context.Context, key client.ObjectKey) *crawlv1.Proxy {
	p := &crawlv1.Proxy{}
	Expect(k8s.Get(ctx, key, p)).To(Succeed())
	return p
}

// deleteAndWait deletes p and waits until it is gone (its instance
// deleted by the manager).
func deleteAndWait(ctx context.Context, p *crawlv1.Proxy) {
	Expect(client.IgnoreNotFound(k8s.Delete(ctx, p))).To(Succeed())
	Eventually(gone(k8s, p)).WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(500 * time.Millisecond).Should(Succeed())
}

// deleteAllAndWait deletes every Proxy of keys at once and waits until all
// are gone: the manager deletes them side by side, as it would a fleet.
func deleteAllAndWait(ctx context.Context, keys []client.ObjectKey) {
	GinkgoHelper()
	for _, k := range keys {
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}))).To(Succeed())
	}
	Eventually(func(ctx context.Context) error {
		for _, k := range keys {
			if err := e2eutil.Gone(ctx, k8s, &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}); err != nil {
				return err
			}
		}
		return nil
	}).WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(500 * time.Millisecond).Should(Succeed())
}

// gone polls until obj no longer exists.
func gone(c client.Client, obj client.Object) func(context.Context) error {
	return func(ctx context.Context) error { return e2eutil.Gone(ctx, c, obj.DeepCopyObject().(client.Object)) }
}

// imageVerified polls until the KVMImage is verified on host.
func imageVerified(c client.Client, image, host string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := e2eutil.ImageVerified(ctx, c, image, host)
		return err
	}
}

// instanceRecorded polls until the Proxy's status records its instance.
func instanceRecorded(key client.ObjectKey) func(context.Context) error {
	return func(ctx context.Context) error {
		got := getProxy(ctx, key)
		if got.Status.ProviderID == "" {
			return errors.New("no instance recorded yet: " + e2eutil.CondString(got, crawlv1.InstanceProvisionedCondition))
		}
		return nil
	}
}

// updateWithRetry reads the object at key afresh and changes it until the
// update goes through (the manager writes the same objects).
func updateWithRetry[T any, P interface {
	*T
	client.Object
}](ctx context.Context, key client.ObjectKey, change func(P)) {
	GinkgoHelper()
	Eventually(func(ctx context.Context) error {
		cur := P(new(T))
		if err := k8s.Get(ctx, key, cur); err != nil {
			return err
		}
		change(cur)
		return k8s.Update(ctx, cur)
	}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
}

// createImage creates a KVMImage of the run's format and firmware, named
// after the run's with suffix, downloading url.
func createImage(ctx context.Context, suffix, url, checksum string) *crawlv1.KVMImage {
	GinkgoHelper()
	img := &crawlv1.KVMImage{
		ObjectMeta: metav1.ObjectMeta{Name: objs.Image.Name + "-" + suffix},
		Spec:       crawlv1.KVMImageSpec{URL: url, Checksum: checksum, Format: crawlv1.ImageFormatQCOW2, Firmware: crawlv1.FirmwareUEFI},
	}
	Expect(k8s.Create(ctx, img)).To(Succeed())
	return img
}

// createHost creates a second KVMHost, the run's named with suffix and its
// spec changed by set. The caller deletes it (deleteHost).
func createHost(ctx context.Context, suffix string, set func(*crawlv1.KVMHostSpec)) *crawlv1.KVMHost {
	GinkgoHelper()
	h := objs.Host.DeepCopy()
	h.ObjectMeta = metav1.ObjectMeta{Name: objs.Host.Name + "-" + suffix}
	set(&h.Spec)
	Expect(k8s.Create(ctx, h)).To(Succeed())
	return h
}

// deleteHost deletes a KVMHost and waits (bounded) for it to go.
func deleteHost(ctx context.Context, name string) {
	h := &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := k8s.Delete(ctx, h); err != nil && !apierrors.IsNotFound(err) {
		GinkgoWriter.Printf("deleting KVMHost %s: %v\n", name, err)
		return
	}
	if err := e2eutil.Poll(ctx, 2*time.Minute, time.Second, func(ctx context.Context) error {
		return e2eutil.Gone(ctx, k8s, h.DeepCopy())
	}); err != nil {
		GinkgoWriter.Printf("KVMHost %s: %v\n", name, err)
	}
}

// waitHostReason waits for the KVMHost's Ready condition to satisfy pred
// and returns when the test saw it, and the condition.
func waitHostReason(ctx context.Context, name string, timeout time.Duration, pred func(*metav1.Condition) bool) (time.Time, *metav1.Condition) {
	var c *metav1.Condition
	Eventually(func(ctx context.Context) error {
		h := &crawlv1.KVMHost{}
		if err := k8s.Get(ctx, client.ObjectKey{Name: name}, h); err != nil {
			return err
		}
		c = conditions.Get(h, crawlv1.ReadyCondition)
		if c == nil || !pred(c) {
			return fmt.Errorf("KVMHost %s Ready is %s", name, e2eutil.CondString(h, crawlv1.ReadyCondition))
		}
		return nil
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(100 * time.Millisecond).Should(Succeed())
	return time.Now(), c
}

// hostFailedWith: the KVMHost is not Ready, for reason.
func hostFailedWith(reason string) func(*metav1.Condition) bool {
	return func(c *metav1.Condition) bool { return c.Status == metav1.ConditionFalse && c.Reason == reason }
}

// hostWithReason: the KVMHost's Ready condition has reason (whatever its
// status).
func hostWithReason(reason string) func(*metav1.Condition) bool {
	return func(c *metav1.Condition) bool { return c.Reason == reason }
}

func hostNotReady(c *metav1.Condition) bool { return c.Status == metav1.ConditionFalse }

func hostReady(c *metav1.Condition) bool { return c.Status == metav1.ConditionTrue }

// detectHost waits for the run's KVMHost to show the fault done at from
// (pred) and records the time to detect; it returns the condition.
func detectHost(ctx context.Context, from time.Time, timeout time.Duration, pred func(*metav1.Condition) bool, note string, r *faultRow) *metav1.Condition {
	GinkgoHelper()
	at, c := waitHostReason(ctx, objs.Host.Name, timeout, pred)
	r.Detected(from, at, note)
	return c
}

// hostHealed waits for the run's KVMHost to be Ready again after the
// repair at repaired, records the time to recover, and checks that the
// manager that saw the fault healed it (no restart).
func hostHealed(ctx context.Context, repaired time.Time, timeout time.Duration, note string, r *faultRow) {
	GinkgoHelper()
	at, _ := waitHostReason(ctx, objs.Host.Name, timeout, hostReady)
	r.Recovered(repaired, at, note)
	Expect(op.Alive(ctx)).To(Succeed(), "healed without a manager restart")
}

// readyProxies names the Proxies that are Ready now.
func readyProxies(ctx context.Context, c client.Client) []string {
	var list crawlv1.ProxyList
	if err := c.List(ctx, &list); err != nil {
		return nil
	}
	var out []string
	for _, p := range list.Items {
		if conditions.IsTrue(&p, crawlv1.ReadyCondition) {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	return out
}

// foreignIntact fails when a foreign object changed.
func foreignIntact(ctx context.Context, f e2eutil.Foreign) error {
	inv, err := e2eutil.TakeInventory(ctx, hv, cfg.Pool)
	if err != nil {
		return err
	}
	if a := inv.Audit(nil, f); len(a.ForeignTouched) > 0 {
		return fmt.Errorf("foreign objects touched: %s", a.ForeignString())
	}
	return nil
}

// inventory is what the test hypervisor's storage pool and libvirt hold
// now.
func inventory(ctx context.Context) e2eutil.Inventory {
	GinkgoHelper()
	inv, err := e2eutil.TakeInventory(ctx, hv, cfg.Pool)
	Expect(err).NotTo(HaveOccurred())
	return inv
}

// checkOneDomain checks that exactly one domain, dom, carries p's UID and
// that it is the one p's providerID names; it returns the inventory.
func checkOneDomain(ctx context.Context, p *crawlv1.Proxy, dom string) e2eutil.Inventory {
	GinkgoHelper()
	inv := inventory(ctx)
	checkOneDomainIn(inv, p, dom)
	return inv
}

// checkEachHasOneDomain is checkOneDomain for every Proxy of keys against
// one inventory (taking one costs seconds on a busy host).
func checkEachHasOneDomain(ctx context.Context, keys []client.ObjectKey) {
	GinkgoHelper()
	inv := inventory(ctx)
	for _, k := range keys {
		checkOneDomainIn(inv, getProxy(ctx, k), domxml.DomainName(k.Namespace, k.Name))
	}
}

func checkOneDomainIn(inv e2eutil.Inventory, p *crawlv1.Proxy, dom string) {
	GinkgoHelper()
	Expect(inv.DomainsOf(string(p.UID))).To(Equal([]string{dom}), "exactly one domain carries the Proxy's UID: %s", p.Name)
	_, wantUUID, err := provider.ParseKVMProviderID(p.Status.ProviderID)
	Expect(err).NotTo(HaveOccurred())
	Expect(inv.Domains[dom].UUID).To(Equal(wantUUID), "the domain %s is the one %s's providerID names", dom, p.Name)
}

// volumesOf lists pool's volumes named for uid.
func volumesOf(inv e2eutil.Inventory, pool, uid string) []string {
	var out []string
	for _, v := range inv.Volumes[pool] {
		if u, ok := domxml.VolumeOwnerUID(v); ok && u == uid {
			out = append(out, v)
		}
	}
	return out
}

// domainLists is how many times the manager listed every domain of a host
// (the orphan sweep does, per pass; so does the volume sweep).
func domainLists(ctx context.Context, o e2eutil.Operator) float64 {
	m, err := o.Metrics(ctx)
	Expect(err).NotTo(HaveOccurred())
	return e2eutil.CounterSum(m, "proxy_operator_libvirt_rpc_duration_seconds_count", `rpc="virConnectListAllDomains"`)
}

func poolPath(ctx context.Context) string {
	p, err := e2eutil.PoolPath(ctx, hv, cfg.Pool)
	Expect(err).NotTo(HaveOccurred())
	return p
}

// fileSize is the size of a local file, -1 when it does not exist.
func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return -1
	}
	return st.Size()
}

func fileSHA256(path string) string {
	f, err := os.Open(path)
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	Expect(err).NotTo(HaveOccurred())
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func mustRead(path string) []byte {
	b, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	return b
}

// fingerprint is the SHA256 fingerprint of an authorized_keys-format key.
func fingerprint(pub []byte) string {
	k, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	Expect(err).NotTo(HaveOccurred())
	return ssh.FingerprintSHA256(k)
}

// countMatches counts the lines of path from byte offset on that match the
// regular expression expr.
func countMatches(path string, offset int64, expr string) int {
	b, err := os.ReadFile(path)
	if err != nil || offset > int64(len(b)) {
		return 0
	}
	re := regexp.MustCompile(expr)
	n := 0
	for _, line := range strings.Split(string(b[max(offset, 0):]), "\n") {
		if re.MatchString(line) {
			n++
		}
	}
	return n
}

// fakeSSHPort is a loopback port the test controls, as a KVMHost address:
// refused until Answer, then a server that is not SSH (so a dial fails at
// the handshake).
type fakeSSHPort struct {
	addr string
	ln   net.Listener
}

func newFakeSSHPort() *fakeSSHPort {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	addr := ln.Addr().String()
	Expect(ln.Close()).To(Succeed())
	return &fakeSSHPort{addr: addr}
}

func (f *fakeSSHPort) Addr() string { return f.addr }

// Answer starts accepting: each connection gets a line that is not an SSH
// banner and is closed.
func (f *fakeSSHPort) Answer() error {
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	f.ln = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.0 400 not ssh\r\n\r\n"))
			_ = c.Close()
		}
	}()
	return nil
}

func (f *fakeSSHPort) Close() {
	if f.ln != nil {
		_ = f.ln.Close()
	}
}

// idleDomainXML is a domain that boots nothing and costs nothing while it
// runs (SeaBIOS finds no boot device and halts, never rebooting), carrying
// the operator's metadata for p, so the operator takes it for p's instance.
func idleDomainXML(p *crawlv1.Proxy, tag, installID string) string {
	md := domxml.Metadata{ManagedBy: domxml.ManagedBy, Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Tag: tag, InstallID: installID}
	return fmt.Sprintf(`<domain type='qemu'><name>%s</name><metadata>%s</metadata><memory unit='MiB'>32</memory><vcpu>1</vcpu>`+
		`<os><type arch='x86_64' machine='pc'>hvm</type><bios rebootTimeout='-1'/></os><devices></devices></domain>`,
		domxml.DomainName(p.Namespace, p.Name), md.XML())
}

// installID is the install id the run's manager writes on its domains (the
// UID of kube-system: no --install-id is given).
func installID(ctx context.Context) string {
	ns := &corev1.Namespace{}
	Expect(k8s.Get(ctx, client.ObjectKey{Name: "kube-system"}, ns)).To(Succeed())
	return string(ns.UID)
}

// bridgeOf names the bridge of the host's libvirt network.
func bridgeOf(ctx context.Context, network string) string {
	out, err := e2eutil.Virsh(ctx, hv, "net-info", network)
	Expect(err).NotTo(HaveOccurred())
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Bridge:"); ok {
			return strings.TrimSpace(v)
		}
	}
	Fail("no bridge in net-info " + network + ": " + out)
	return ""
}

// roundTrip is one create → instance recorded → delete → gone of a Proxy,
// timed from each API write to the manager's answer to it.
type roundTrip struct {
	Name              string
	Recorded, Deleted time.Duration
}

// roundTrips creates Proxies named prefix-N on host one after another,
// each deleted once its instance is recorded, until n are done or, with n
// 0, until until has passed.
func roundTrips(ctx context.Context, host, prefix string, n int, until time.Time) []roundTrip {
	GinkgoHelper()
	var out []roundTrip
	for i := 0; n > 0 && i < n || n == 0 && time.Now().Before(until); i++ {
		p := objs.NewProxy(fmt.Sprintf("%s-%d", prefix, i), 1, "512Mi")
		p.Spec.Placement.Host = host
		Expect(k8s.Create(ctx, p)).To(Succeed())
		created := time.Now()
		Eventually(instanceRecorded(client.ObjectKeyFromObject(p))).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(100 * time.Millisecond).Should(Succeed())
		rt := roundTrip{Name: p.Name, Recorded: time.Since(created)}
		Expect(k8s.Delete(ctx, p)).To(Succeed())
		deleted := time.Now()
		Eventually(gone(k8s, p)).WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())
		rt.Deleted = time.Since(deleted)
		GinkgoWriter.Printf("%s: instance recorded %s after creation, gone %s after deletion\n", p.Name, e2eutil.Seconds(rt.Recorded), e2eutil.Seconds(rt.Deleted))
		out = append(out, rt)
	}
	return out
}

// slowest is the longest create → recorded and delete → gone of rts.
func slowest(rts []roundTrip) (recorded, deleted time.Duration) {
	for _, rt := range rts {
		recorded, deleted = max(recorded, rt.Recorded), max(deleted, rt.Deleted)
	}
	return recorded, deleted
}

// probeTimes collects the distinct last probe times of the Proxy at key
// (the manager's proxy_operator_proxy_last_probe_timestamp_seconds),
// polled every second until ctx ends.
func probeTimes(ctx context.Context, key client.ObjectKey) func() []time.Time {
	var mu sync.Mutex
	var seen []time.Time
	go func() {
		for ctx.Err() == nil {
			if t, ok := lastProbeAt(ctx, key); ok {
				mu.Lock()
				if len(seen) == 0 || !t.Equal(seen[len(seen)-1]) {
					seen = append(seen, t)
				}
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// longestGap is the longest time between two consecutive times of ts
// (sorted) that lies in [from, to], counting from from and up to to.
func longestGap(ts []time.Time, from, to time.Time) time.Duration {
	var gap time.Duration
	last := from
	for _, t := range ts {
		if t.Before(from) || t.After(to) {
			continue
		}
		gap = max(gap, t.Sub(last))
		last = t
	}
	return max(gap, to.Sub(last))
}

// reconcileBuckets reads the Proxy controller's reconcile-time histogram:
// the cumulative count of reconciles at each bucket bound (seconds, +Inf
// included).
func reconcileBuckets(ctx context.Context) map[float64]float64 {
	m, err := op.Metrics(ctx)
	Expect(err).NotTo(HaveOccurred())
	re := regexp.MustCompile(`^controller_runtime_reconcile_time_seconds_bucket\{controller="proxy",le="([^"]+)"\} (\S+)$`)
	out := map[float64]float64{}
	for _, line := range strings.Split(m, "\n") {
		if g := re.FindStringSubmatch(line); g != nil {
			le, err1 := strconv.ParseFloat(g[1], 64)
			n, err2 := strconv.ParseFloat(g[2], 64)
			if err1 == nil && err2 == nil {
				out[le] = n
			}
		}
	}
	Expect(out).To(HaveKey(math.Inf(1)), "the manager's Proxy reconcile histogram")
	return out
}

// slowestBucket is the smallest bucket bound (seconds) every reconcile
// between the snapshots before and after fits under, and how many
// reconciles there were.
func slowestBucket(before, after map[float64]float64) (bound float64, n float64) {
	n = after[math.Inf(1)] - before[math.Inf(1)]
	bounds := slices.Sorted(maps.Keys(after))
	for _, le := range bounds {
		if after[le]-before[le] == n {
			return le, n
		}
	}
	return math.Inf(1), n
}

// sampleGauge polls a gauge of the manager's metrics every second until
// ctx ends; it returns the highest value seen so far.
func sampleGauge(ctx context.Context, name string, labels ...string) func() float64 {
	var mu sync.Mutex
	var top float64
	go func() {
		for ctx.Err() == nil {
			if m, err := op.Metrics(ctx); err == nil {
				v := e2eutil.CounterSum(m, name, labels...)
				mu.Lock()
				top = max(top, v)
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return top
	}
}

// poke changes an annotation of each Proxy, which the Proxy controller
// reconciles at once: a wave of events, as a resync or a burst of libvirt
// events makes.
func poke(ctx context.Context, keys []client.ObjectKey) {
	GinkgoHelper()
	stamp := time.Now().Format(time.RFC3339Nano)
	for _, key := range keys {
		updateWithRetry(ctx, key, func(p *crawlv1.Proxy) {
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations["e2e.crawl.example.com/poked"] = stamp
		})
	}
}
