//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
)

// A/B of two guest images (E2E_SUITE=agent-ab test/e2e/run.sh, with
// KVM_TEST_IMAGE_B naming the other qcow2): each round boots one guest of
// each image at the same time, so both see the same load, and the
// observer records when each one's guest agent first answered and when
// it got its lease. It measured the guest-image recipe's agent start
// (test/e2e/infra/README.md); it is not part of make test-e2e.
var _ = Describe("guest boot, two images side by side", Ordered, Label("agent-ab"), func() {
	var imageB *crawlv1.KVMImage

	BeforeAll(func(ctx SpecContext) {
		pathB := os.Getenv("KVM_TEST_IMAGE_B")
		Expect(pathB).NotTo(BeEmpty(), "KVM_TEST_IMAGE_B names the image to compare with KVM_TEST_IMAGE")
		srvB, err := e2eutil.ServeImage(pathB, cfg.ImageListen, cfg.ImageHost)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(srvB.Close)
		imageB = objs.Image.DeepCopy()
		imageB.Name += "-b"
		imageB.Spec.URL, imageB.Spec.Checksum = srvB.URL, srvB.Checksum
		for _, o := range []client.Object{objs.Namespace, objs.Secret, objs.Host, objs.Image, imageB} {
			Expect(k8s.Create(ctx, o)).To(Succeed())
		}
		for _, name := range []string{objs.Image.Name, imageB.Name} {
			Eventually(func(ctx context.Context) error {
				_, err := e2eutil.ImageVerified(ctx, k8s, name, objs.Host.Name)
				return err
			}).WithContext(ctx).WithTimeout(cfg.ImageTimeout).WithPolling(2 * time.Second).Should(Succeed())
		}
		GinkgoWriter.Printf("A: %s (%s)\nB: %s (%s)\n", cfg.ImagePath, objs.Image.Spec.Checksum, pathB, imageB.Spec.Checksum)
	}, NodeTimeout(20*time.Minute))

	AfterEach(dumpOnFailure, NodeTimeout(2*time.Minute))

	It("boots a guest of each image at once, round after round, and records boot-to-agent and boot-to-lease of each", func(ctx SpecContext) {
		rounds := 2
		if v, err := strconv.Atoi(os.Getenv("E2E_AB_ROUNDS")); err == nil && v > 0 {
			rounds = v
		}
		for round := 1; round <= rounds; round++ {
			type guest struct {
				label string
				p     *crawlv1.Proxy
				obs   *e2eutil.Observer
			}
			var guests []guest
			for _, g := range []struct{ label, image string }{{"a", objs.Image.Name}, {"b", imageB.Name}} {
				p := objs.NewProxy(fmt.Sprintf("ab-%s-%d", g.label, round), 1, "1Gi")
				p.Spec.Placement.Image = g.image
				guests = append(guests, guest{label: g.label, p: p, obs: observe(p)})
			}
			if round%2 == 0 { // alternate who is created first
				guests[0], guests[1] = guests[1], guests[0]
			}
			created := map[string]time.Time{}
			for _, g := range guests {
				Expect(k8s.Create(ctx, g.p)).To(Succeed())
				created[g.label] = time.Now()
			}
			for _, g := range guests {
				Eventually(func() error {
					tl := g.obs.Timeline()
					if _, err := tl.Need(e2eutil.SigAgent, "up", created[g.label]); err != nil {
						return err
					}
					_, err := tl.Need(e2eutil.SigServing, "ok", created[g.label])
					return err
				}).WithContext(ctx).WithTimeout(cfg.ProxyReadyTimeout).WithPolling(time.Second).Should(Succeed(), "guest %s of round %d", g.p.Name, round)
			}
			for _, g := range guests {
				g.obs.Stop()
				b := recordBoot(fmt.Sprintf("ab_%s_round%d", g.label, round), g.obs, created[g.label])
				GinkgoWriter.Printf("round %d, image %s: %s\n", round, g.label, b)
			}
			for _, g := range guests {
				Expect(k8s.Delete(ctx, g.p)).To(Succeed())
			}
			for _, g := range guests {
				Eventually(func(ctx context.Context) error { return e2eutil.Gone(ctx, k8s, g.p.DeepCopy()) }).
					WithContext(ctx).WithTimeout(cfg.DeleteTimeout).WithPolling(time.Second).Should(Succeed())
			}
		}
	}, NodeTimeout(90*time.Minute))
})
