package controllers

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
)

var ctx = context.Background()

// createSecret stores the SSH material for h.
func createSecret(h *testHost) {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: h.name + "-ssh", Namespace: secretNamespace}, Data: hosts.secretData(h)}
	Expect(k8sClient.Create(ctx, sec)).To(Succeed())
}

// testCheckTimeout bounds each test host's health check: long enough that
// a loaded CI machine does not turn a live fake host into Timeout (700 ms
// did). A spec about the Timeout verdict sets its own, shorter one.
const testCheckTimeout = 3 * time.Second

// createKVMHost registers a KVMHost at addr (h's SSH server unless given).
func createKVMHost(name, addr string, labels map[string]string, tune ...func(*crawlv1.KVMHostSpec)) {
	kh := &crawlv1.KVMHost{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: crawlv1.KVMHostSpec{
			Address:         addr,
			User:            "root",
			SSHKeySecretRef: &crawlv1.SecretReference{Name: name + "-ssh", Namespace: secretNamespace},
			StoragePool:     kvmtest.PoolName,
			Network:         kvmtest.NetworkName,
			CheckInterval:   &metav1.Duration{Duration: time.Second},
			CheckTimeout:    &metav1.Duration{Duration: testCheckTimeout},
		},
	}
	for _, f := range tune {
		f(&kh.Spec)
	}
	Expect(k8sClient.Create(ctx, kh)).To(Succeed())
	// A KVMHost is health-checked every second for as long as it exists.
	// Left to the end of the suite, the fifty made by earlier specs (and a
	// blackholed one timing out) loaded every later spec until live hosts
	// missed their checks: the spec, or Ordered container, that made it
	// deletes it. One that still has Proxies waits without being checked.
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: name}}))).To(Succeed())
	})
}

// readyHost starts a test host with its Secret and KVMHost, and waits Ready.
func readyHost(name string) *testHost {
	h := hosts.add(name)
	createSecret(h)
	createKVMHost(name, h.ssh.Addr(), nil)
	waitHostReason(name, crawlv1.HostReadyReason, 20*time.Second)
	return h
}

func waitHostReason(name, reason string, within time.Duration) *crawlv1.KVMHost {
	kh := &crawlv1.KVMHost{}
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, kh)).To(Succeed())
		g.Expect(conditions.GetReason(kh, crawlv1.ReadyCondition)).To(Equal(reason), "message: %s", conditions.GetMessage(kh, crawlv1.ReadyCondition))
	}).WithTimeout(within).WithPolling(100 * time.Millisecond).Should(Succeed())
	return kh
}

func createImage(name string, srv *kvmtest.ImageServer) *crawlv1.KVMImage {
	img := &crawlv1.KVMImage{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: crawlv1.KVMImageSpec{URL: srv.Image.URL, Checksum: srv.Image.Checksum,
			Format: crawlv1.ImageFormatRaw, Firmware: crawlv1.FirmwareUEFI},
	}
	Expect(k8sClient.Create(ctx, img)).To(Succeed())
	return img
}

// servedImage serves a small image for the spec (until its cleanup) and
// creates a KVMImage of it; it returns the KVMImage's name.
func servedImage() string {
	srv := kvmtest.NewImageServer("debian", 64<<10)
	DeferCleanup(srv.Close)
	name := uniqueName("debian")
	createImage(name, srv)
	return name
}

func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "crawl-"}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

func createProxy(ns, name, host, image string) {
	p := &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1.ProxySpec{
			Provider:          crawlv1.ProviderKVM,
			Placement:         crawlv1.ProxyPlacement{Host: host, Image: image},
			CloudInit:         crawlv1.ProxyCloudInit{UserData: "#cloud-config\n"},
			InstallGuestAgent: ptr.To(true),
			Port:              3128,
		},
	}
	Expect(k8sClient.Create(ctx, p)).To(Succeed())
}

// giveAddress makes the guest agent of the Proxy's domain report ip once
// the domain exists, as a booted guest would. The wait covers one
// dependency poll (a Proxy waiting on a user's Secret looks again after
// 15 s) plus the image import under CI load.
func giveAddress(h *testHost, ns, name, ip string) {
	dom := ns + "." + name
	Eventually(func() bool { _, ok := h.fake.Domain(dom); return ok }).WithTimeout(dependencyPoll+30*time.Second).Should(BeTrue(), "domain %s never defined", dom)
	h.fake.SetAgentAddresses(dom, []libvirt.DomainInterface{{Name: "eth0", Addrs: []libvirt.DomainIPAddr{
		{Type: int32(libvirt.IPAddrTypeIpv4), Addr: ip, Prefix: 24}}}})
}

// readyProxy creates a Proxy on h, boots it with address ip and waits Ready.
func readyProxy(h *testHost, ns, name, image, ip string) *crawlv1.Proxy {
	createProxy(ns, name, h.name, image)
	giveAddress(h, ns, name, ip)
	return waitProxyPhase(ns, name, crawlv1.ProxyReady, 30*time.Second)
}

// setSkipCleanup annotates the Proxy so its deletion leaves the provider alone.
func setSkipCleanup(ns, name string) {
	Eventually(func() error {
		p := getProxy(ns, name)
		orig := p.DeepCopy()
		p.Annotations = map[string]string{crawlv1.SkipCleanupAnnotation: "true"}
		return k8sClient.Patch(ctx, p, client.MergeFrom(orig))
	}).Should(Succeed())
}

func getProxy(ns, name string) *crawlv1.Proxy {
	p := &crawlv1.Proxy{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
	return p
}

func waitProxyPhase(ns, name string, phase crawlv1.ProxyPhase, within time.Duration) *crawlv1.Proxy {
	p := &crawlv1.Proxy{}
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
		g.Expect(p.Status.Phase).To(Equal(phase), "Ready: %s %s", conditions.GetReason(p, crawlv1.ReadyCondition), conditions.GetMessage(p, crawlv1.ReadyCondition))
	}).WithTimeout(within).WithPolling(100 * time.Millisecond).Should(Succeed())
	return p
}

func waitProxyGone(ns, name string, within time.Duration) {
	Eventually(func() bool {
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &crawlv1.Proxy{})
		return err != nil && client.IgnoreNotFound(err) == nil
	}).WithTimeout(within).WithPolling(100*time.Millisecond).Should(BeTrue(), "Proxy %s/%s still exists", ns, name)
}

func deleteProxy(ns, name string) {
	Expect(k8sClient.Delete(ctx, &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
}

// blackhole accepts TCP connections and never answers: a host that is on
// the network but whose sshd (or whole stack) hangs.
func blackhole() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(l.Close)
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return l.Addr().String()
}

func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1_000_000_000)
}

func domainNames(h *testHost, prefix string) []string {
	var out []string
	for _, n := range h.fake.DomainNames() {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}
