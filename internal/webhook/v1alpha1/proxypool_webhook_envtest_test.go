package v1alpha1

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

var _ = Describe("ProxyPool admission through the API server", func() {
	var ns string
	BeforeEach(func() {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "wh-pool-"}}
		Expect(k8sClient.Create(ctx, n)).To(Succeed())
		ns = n.Name
	})
	pool := func(name string) *crawlv1.ProxyPool {
		p := goodPool()
		p.Name, p.Namespace = name, ns
		return p
	}

	It("admits a valid pool and leaves its template as written (the template hash depends on it)", func() {
		p := pool("ok")
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		Expect(p.Spec.Template.Spec.Port).To(BeZero(), "the Proxy webhook's defaults are for replicas, not the template")
		Expect(p.Spec.Template.Spec.InstallGuestAgent).To(BeNil())
	})

	DescribeTable("rejects bad input with the field's name",
		func(change func(*crawlv1.ProxyPool), want string) {
			p := pool("bad")
			change(p)
			err := k8sClient.Create(ctx, p)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("selector not matching the template's labels", func(p *crawlv1.ProxyPool) { p.Spec.Template.Metadata.Labels = map[string]string{"pool": "b"} },
			"spec.template.metadata.labels: Invalid value"),
		Entry("a template a Proxy could not have", func(p *crawlv1.ProxyPool) { p.Spec.Template.Spec.Placement.HostSelector = nil },
			"spec.template.spec.placement.host: Required value"),
		Entry("no surge and no unavailability", func(p *crawlv1.ProxyPool) {
			p.Spec.Rollout.MaxSurge, p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(0)), ptr.To(intstr.FromInt32(0))
		}, "spec.rollout.maxUnavailable: Invalid value"),
		Entry("a malformed percentage", func(p *crawlv1.ProxyPool) { p.Spec.Remediation.MaxUnhealthy = ptr.To(intstr.FromString("many")) },
			"spec.remediation.maxUnhealthy: Invalid value"),
		Entry("a zero timeout", func(p *crawlv1.ProxyPool) { p.Spec.Remediation.StartupTimeout = dur(0) },
			"spec.remediation.startupTimeout: Invalid value"),
		Entry("distinct egress Required on kubernetes, whose pods share their node's address", func(p *crawlv1.ProxyPool) {
			p.Spec.Template.Spec.Provider = crawlv1.ProviderKubernetes
			p.Spec.Template.Spec.Placement = crawlv1.ProxyPlacement{}
			p.Spec.Egress.Distinct = crawlv1.EgressDistinctRequired
		}, "spec.egress.distinct: Invalid value"),
		Entry("an echo URL with credentials", func(p *crawlv1.ProxyPool) { p.Spec.Egress.EchoURL = "http://u:p@echo.example/ip" },
			"spec.egress.echoURL: Invalid value"),
		Entry("a quarantine out of range", func(p *crawlv1.ProxyPool) { p.Spec.Egress.Quarantine = dur(10 * time.Second) },
			"spec.egress.quarantine: Invalid value"),
		Entry("a domain ban out of range", func(p *crawlv1.ProxyPool) { p.Spec.Bans.DomainBanDuration = dur(800 * time.Hour) },
			"spec.bans.domainBanDuration: Invalid value"),
		Entry("a negative ban budget", func(p *crawlv1.ProxyPool) { p.Spec.Bans.MaxReplacementsPerHour = ptr.To(int32(-1)) },
			"spec.bans.maxReplacementsPerHour"),
	)

	DescribeTable("refuses a malformed ban report with the field's name (the CRD's schema: no webhook in a crawler's way)",
		func(spec crawlv1.ProxyBanSpec, want string) {
			b := &crawlv1.ProxyBan{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ban"}, Spec: spec}
			err := k8sClient.Create(ctx, b)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("a domain that is no DNS name", crawlv1.ProxyBanSpec{Pool: "p", Proxy: "p-x", Domain: "Example.COM/path"}, "spec.domain"),
		Entry("no domain and no replacement asked", crawlv1.ProxyBanSpec{Pool: "p", Proxy: "p-x"}, "must ask for replacement"),
		Entry("no proxy", crawlv1.ProxyBanSpec{Pool: "p", Domain: "example.com"}, "spec.proxy"),
		Entry("a reason too long", crawlv1.ProxyBanSpec{Pool: "p", Proxy: "p-x", Replace: true, Reason: strings.Repeat("x", 257)}, "spec.reason"),
	)

	It("keeps a ban report as it was made", func() {
		b := &crawlv1.ProxyBan{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ban"},
			Spec: crawlv1.ProxyBanSpec{Pool: "p", Proxy: "p-x", Domain: "example.com"}}
		Expect(k8sClient.Create(ctx, b)).To(Succeed())
		b.Spec.Domain = "other.test"
		err := k8sClient.Update(ctx, b)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("immutable"))
	})

	It("keeps the selector immutable, with and without the webhook", func() {
		p := pool("sel")
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		for _, viaCEL := range []bool{false, true} {
			moved := p.DeepCopy()
			moved.Spec.Selector.MatchLabels = map[string]string{"team": "x"}
			var err error
			if viaCEL {
				withoutWebhooks(func() { err = k8sClient.Update(ctx, moved) })
			} else {
				err = k8sClient.Update(ctx, moved)
			}
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.selector"))
			Expect(err.Error()).To(ContainSubstring("immutable"))
		}
	})

	It("scales through the scale subresource, as kubectl scale and autoscalers do", func() {
		p := pool("scale")
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		sc := &autoscalingv1.Scale{}
		Expect(k8sClient.SubResource("scale").Get(ctx, p, sc)).To(Succeed())
		Expect(sc.Spec.Replicas).To(BeEquivalentTo(3))
		sc.Spec.Replicas = 7
		Expect(k8sClient.SubResource("scale").Update(ctx, p, client.WithSubResourceBody(sc))).To(Succeed())
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
		Expect(*p.Spec.Replicas).To(BeEquivalentTo(7))
		sc.Spec.Replicas = -1
		Expect(k8sClient.SubResource("scale").Update(ctx, p, client.WithSubResourceBody(sc))).NotTo(Succeed())
	})

	It("lets a pool stored under older rules be scaled and deleted", func() {
		p := pool("old")
		p.Spec.Remediation.StartupTimeout = dur(-time.Minute)
		withoutWebhooks(func() { Expect(k8sClient.Create(ctx, p)).To(Succeed()) })
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
		p.Spec.Replicas = ptr.To(int32(4))
		Expect(k8sClient.Update(ctx, p)).To(Succeed())
		bad := p.DeepCopy()
		bad.Spec.Remediation.UnhealthyTimeout = dur(0)
		err := k8sClient.Update(ctx, bad)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("spec.remediation.unhealthyTimeout"))
		Expect(err.Error()).NotTo(ContainSubstring("startupTimeout"))
		Expect(k8sClient.Delete(ctx, p)).To(Succeed())
	})
})
