//go:build e2e

// Package e2e is the real end-to-end suite: a Proxy becomes a squid VM on a
// real libvirt/QEMU hypervisor reached over SSH, serves a request, and goes
// away with everything it had on the host.
//
// test/e2e/run.sh (make test-e2e) builds the pieces, starts the test
// hypervisor of test/e2e/infra/hypervisor.sh and runs this suite inside the
// hypervisor's network namespace, where the guests' addresses live: the
// envtest API server and the manager binary (test/localcp) run there too,
// on its loopback. With E2E_KUBECONFIG the suite drives an operator already
// deployed in that cluster instead (test/e2e/kind/run.sh, make test-e2e-kind).
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

var (
	cfg       e2eutil.Config
	op        e2eutil.Operator
	k8s       client.Client
	hv        e2eutil.Host
	imgSrv    *e2eutil.ImageServer
	objs      *e2eutil.Objects
	artifacts string
	runID     string
	// serialLog is the guest console capture (local hypervisor only).
	serialLog string
	dumped    bool
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "proxy-operator e2e (real hypervisor)")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter)))
	var err error
	cfg, err = e2eutil.FromEnv()
	Expect(err).NotTo(HaveOccurred(), "e2e configuration; `make test-e2e` (test/e2e/run.sh) provides it")
	Expect(cfg.CheckReachability()).To(Succeed())

	artifacts = os.Getenv("E2E_ARTIFACTS")
	if artifacts == "" {
		artifacts = GinkgoT().TempDir()
	}
	Expect(os.MkdirAll(artifacts, 0o755)).To(Succeed())
	runID = e2eutil.RunID()

	imageURL, checksum := cfg.ImageURL, cfg.ImageChecksum
	if cfg.ImagePath != "" {
		imgSrv, err = e2eutil.ServeImage(cfg.ImagePath, cfg.ImageListen, cfg.ImageHost)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(imgSrv.Close)
		imageURL, checksum = imgSrv.URL, imgSrv.Checksum
		GinkgoWriter.Printf("serving %s (%d bytes, %s) at %s\n", cfg.ImagePath, imgSrv.Size, checksum, imageURL)
	}

	op, err = e2eutil.StartFromEnv(ctx, cfg, envtestutil.Root(), artifacts, "pxe2e-"+runID)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(op.Stop)
	k8s = op.Client()
	hv = e2eutil.NewHost(cfg)
	objs, err = e2eutil.NewObjects(cfg, "pxe2e-"+runID, op.SecretNamespace(), imageURL, checksum)
	Expect(err).NotTo(HaveOccurred())
	GinkgoWriter.Printf("operator up; kubeconfig %s; manager log %s\n", op.Kubeconfig(), op.LogPath())
	GinkgoWriter.Printf("hypervisor: ssh %s@%s pool=%s network=%s domainType=%s netns=%q (inside: %v)\n",
		cfg.User, cfg.Address, cfg.Pool, cfg.Network, cfg.DomainType, cfg.NetNS, cfg.InNetNS)
}, NodeTimeout(5*time.Minute))

// dumpOnFailure writes the diagnostics once, at the first failed spec, to
// the spec's output and to E2E_ARTIFACTS/failure.txt. It is registered
// inside the Ordered container, so it runs before AfterAll cleans up.
func dumpOnFailure(ctx SpecContext) {
	if !CurrentSpecReport().Failed() || dumped || op == nil {
		return
	}
	dumped = true
	path := filepath.Join(artifacts, "failure.txt")
	f, err := os.Create(path)
	if err != nil {
		e2eutil.Dump(ctx, GinkgoWriter, op, hv, objs, serialLog)
		return
	}
	e2eutil.Dump(ctx, f, op, hv, objs, serialLog)
	_ = f.Close()
	b, _ := os.ReadFile(path)
	GinkgoWriter.Printf("%s\n(diagnostics also in %s)\n", b, path)
}

// record reports a measured duration in the spec report and as a plain
// line on stdout, and appends it to E2E_ARTIFACTS/timings.txt.
func record(name string, d time.Duration, detail string) {
	AddReportEntry(name, fmt.Sprintf("%s %s", e2eutil.Seconds(d), detail))
	line := fmt.Sprintf("E2E-TIMING %s=%.1fs %s", name, d.Seconds(), detail)
	fmt.Fprintln(os.Stdout, line)
	if f, err := os.OpenFile(filepath.Join(artifacts, "timings.txt"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintln(f, line)
		_ = f.Close()
	}
}

// createHostAndImage creates the run's Namespace, SSH Secret, KVMHost and
// KVMImage, and waits until the host is Ready and the image verified on
// it: the starting point of the suites that do not measure these steps.
func createHostAndImage(ctx context.Context) {
	for _, o := range []client.Object{objs.Namespace, objs.Secret, objs.Host, objs.Image} {
		Expect(k8s.Create(ctx, o)).To(Succeed())
	}
	Eventually(func(ctx context.Context) error {
		_, err := e2eutil.HostReady(ctx, k8s, objs.Host.Name)
		return err
	}).WithContext(ctx).WithTimeout(cfg.HostReadyTimeout).WithPolling(time.Second).Should(Succeed())
	Eventually(func(ctx context.Context) error {
		_, err := e2eutil.ImageVerified(ctx, k8s, objs.Image.Name, objs.Host.Name)
		return err
	}).WithContext(ctx).WithTimeout(cfg.ImageTimeout).WithPolling(2 * time.Second).Should(Succeed())
}

// updatePool changes pool's spec through c, reading it again and retrying
// on a conflict as kubectl edit does: the operator writes the pool's
// status while a suite changes its spec.
func updatePool(ctx context.Context, c client.Client, pool *crawlv1.ProxyPool, change func(*crawlv1.ProxyPool)) {
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		Expect(c.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
		change(pool)
		return c.Update(ctx, pool)
	})).To(Succeed())
}
