package v1alpha1

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// goodPool is a pool every rule admits.
func goodPool() *crawlv1.ProxyPool {
	return &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Name: "crawl-a", Namespace: "crawl"},
		Spec: crawlv1.ProxyPoolSpec{
			Replicas: ptr.To(int32(3)),
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "crawl-a"}},
			Template: crawlv1.ProxyTemplate{
				Metadata: crawlv1.ProxyTemplateMeta{Labels: map[string]string{"pool": "crawl-a", "team": "x"}},
				Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{HostSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "r1"}}, Image: "debian-12"},
					Access: &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.20.0.0/16"}}},
			},
			Rotation:    crawlv1.ProxyPoolRotation{MaxAge: dur(6 * time.Hour), Jitter: dur(time.Hour), MinInterval: dur(5 * time.Minute)},
			Remediation: crawlv1.ProxyPoolRemediation{MaxUnhealthy: ptr.To(intstr.FromString("40%"))},
		},
	}
}

func TestValidateProxyPool(t *testing.T) {
	pct := func(s string) *intstr.IntOrString { return ptr.To(intstr.FromString(s)) }
	num := func(n int32) *intstr.IntOrString { return ptr.To(intstr.FromInt32(n)) }
	cases := []struct {
		name   string
		change func(p *crawlv1.ProxyPool)
		// want: each must appear in the error; none: the pool is valid.
		want []string
	}{
		{name: "valid", change: func(*crawlv1.ProxyPool) {}},
		{name: "quarantine under a minute", change: func(p *crawlv1.ProxyPool) { p.Spec.Egress.Quarantine = dur(30 * time.Second) },
			want: []string{"spec.egress.quarantine: Invalid", "from 1m0s to 720h0m0s"}},
		{name: "quarantine over 30 days", change: func(p *crawlv1.ProxyPool) { p.Spec.Egress.Quarantine = dur(721 * time.Hour) },
			want: []string{"spec.egress.quarantine: Invalid"}},
		{name: "quarantine at its bounds", change: func(p *crawlv1.ProxyPool) { p.Spec.Egress.Quarantine = dur(720 * time.Hour) }},
		{name: "domain ban of no time", change: func(p *crawlv1.ProxyPool) { p.Spec.Bans.DomainBanDuration = dur(0) },
			want: []string{"spec.bans.domainBanDuration: Invalid"}},
		{name: "negative ban budget", change: func(p *crawlv1.ProxyPool) { p.Spec.Bans.MaxReplacementsPerHour = ptr.To(int32(-1)) },
			want: []string{"spec.bans.maxReplacementsPerHour: Invalid"}},
		{name: "no ban replacement at all", change: func(p *crawlv1.ProxyPool) { p.Spec.Bans.MaxReplacementsPerHour = ptr.To(int32(0)) }},
		{name: "negative replaceAfterDomains", change: func(p *crawlv1.ProxyPool) { p.Spec.Bans.ReplaceAfterDomains = -2 },
			want: []string{"spec.bans.replaceAfterDomains: Invalid"}},
		{name: "maxBanned not a percentage", change: func(p *crawlv1.ProxyPool) { p.Spec.Bans.MaxBanned = pct("half") },
			want: []string{"spec.bans.maxBanned: Invalid"}},
		{name: "maxBanned over 100%", change: func(p *crawlv1.ProxyPool) { p.Spec.Bans.MaxBanned = pct("150%") },
			want: []string{"spec.bans.maxBanned: Invalid", "100%"}},
		{name: "name too long for its replicas' names", change: func(p *crawlv1.ProxyPool) { p.Name = strings.Repeat("a", 58) },
			want: []string{"metadata.name: Too long", "55"}},
		// <pool>-proxies is a Service name: a DNS-1035 label of at most 63.
		{name: "name too long for the published Service", change: func(p *crawlv1.ProxyPool) { p.Name = strings.Repeat("a", 56) },
			want: []string{"metadata.name: Too long", "55"}},
		{name: "name at the published Service's limit", change: func(p *crawlv1.ProxyPool) { p.Name = strings.Repeat("a", 55) }},
		{name: "name with a leading digit: no Service can be named after it", change: func(p *crawlv1.ProxyPool) { p.Name = "7fleet" },
			want: []string{"metadata.name: Invalid", "alphabetic character"}},
		{name: "name not a DNS label", change: func(p *crawlv1.ProxyPool) { p.Name = "Crawl.A" }, want: []string{"metadata.name: Invalid"}},
		{name: "selector does not match the template's labels", change: func(p *crawlv1.ProxyPool) { p.Spec.Selector.MatchLabels["pool"] = "other" },
			want: []string{"spec.template.metadata.labels: Invalid", "do not match spec.selector (pool=other)"}},
		{name: "empty selector", change: func(p *crawlv1.ProxyPool) { p.Spec.Selector = metav1.LabelSelector{} },
			want: []string{"spec.selector: Required"}},
		{name: "malformed selector", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Selector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "pool", Operator: "Near"}}
		}, want: []string{"spec.selector.matchExpressions[0].operator"}},
		{name: "the pool's own label in the template", change: func(p *crawlv1.ProxyPool) { p.Spec.Template.Metadata.Labels[crawlv1.TemplateHashLabel] = "x" },
			want: []string{"spec.template.metadata.labels[crawl.example.com/template-hash]: Forbidden"}},
		{name: "delete-proxy in the template would replace every replica forever", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Template.Metadata.Annotations = map[string]string{crawlv1.DeleteProxyAnnotation: ""}
		}, want: []string{"spec.template.metadata.annotations[crawl.example.com/delete-proxy]: Forbidden"}},
		{name: "template spec errors carry the template's path", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Template.Spec.Placement.Image = ""
			p.Spec.Template.Spec.Resources.CPUs = 99
		}, want: []string{"spec.template.spec.placement.image: Required", "spec.template.spec.resources.cpus: Invalid"}},
		{name: "the template is judged after the Proxy webhook's defaults", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Template.Spec.Port = 0
		}},
		{name: "a template whose replicas would have no allow-list", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Template.Spec.Access = nil
		}, want: []string{"spec.template.spec.access.allowedSourceCIDRs: Required"}},
		{name: "an image URL is refused as for a Proxy", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Template.Spec.Placement.Image = "https://img.example/d.qcow2"
			p.Spec.Template.Spec.Placement.ImageChecksum = goodSum
		}, want: []string{"spec.template.spec.placement.image: Forbidden", "--allow-proxy-image-urls"}},
		{name: "the pool's hostSelector places replicas of a template without one", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Placement.HostSelector = p.Spec.Template.Spec.Placement.HostSelector
			p.Spec.Template.Spec.Placement.HostSelector = nil
		}},
		{name: "hostSelector in both pool and template", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Placement.HostSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
		}, want: []string{"spec.template.spec.placement.host: Forbidden"}},
		{name: "zones for kvm", change: func(p *crawlv1.ProxyPool) { p.Spec.Placement.Zones = []string{"europe-west1-b"} },
			want: []string{"spec.placement.zones: Forbidden"}},
		{name: "duplicate zone", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Template.Spec = crawlv1.ProxySpec{Provider: crawlv1.ProviderGCP}
			p.Spec.Placement.Zones = []string{"europe-west1-b", "europe-west1-b"}
		}, want: []string{"spec.placement.zones[1]: Duplicate"}},
		{name: "maxSurge and maxUnavailable both 0", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Rollout.MaxSurge, p.Spec.Rollout.MaxUnavailable = num(0), pct("0%")
		}, want: []string{"spec.rollout.maxUnavailable: Invalid", "may not be 0 when maxSurge is 0"}},
		{name: "maxSurge 0 alone is fine", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Rollout.MaxSurge, p.Spec.Rollout.MaxUnavailable = num(0), pct("10%")
		}},
		{name: "malformed percentages", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Rollout.MaxSurge = pct("ten%")
			p.Spec.Remediation.MaxUnhealthy = pct("40")
		}, want: []string{"spec.rollout.maxSurge: Invalid", "spec.remediation.maxUnhealthy: Invalid"}},
		{name: "maxUnavailable over 100%", change: func(p *crawlv1.ProxyPool) { p.Spec.Rollout.MaxUnavailable = pct("150%") },
			want: []string{"spec.rollout.maxUnavailable: Invalid", "100%"}},
		{name: "negative count", change: func(p *crawlv1.ProxyPool) { p.Spec.Rollout.MaxSurge = num(-1) },
			want: []string{"spec.rollout.maxSurge: Invalid"}},
		{name: "durations must be positive", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Rotation.MaxAge = dur(0)
			p.Spec.Remediation.StartupTimeout = dur(-time.Second)
			p.Spec.Remediation.UnhealthyTimeout = dur(0)
			p.Spec.Remediation.StartupBackoff = dur(0)
			p.Spec.Remediation.DeletionTimeout = dur(-time.Second)
			p.Spec.Rotation.MinInterval = dur(-time.Second)
		}, want: []string{"spec.rotation.maxAge: Invalid", "spec.remediation.startupTimeout: Invalid", "spec.remediation.unhealthyTimeout: Invalid",
			"spec.remediation.startupBackoff: Invalid", "spec.remediation.deletionTimeout: Invalid", "spec.rotation.minInterval: Invalid"}},
		{name: "jitter not below maxAge", change: func(p *crawlv1.ProxyPool) { p.Spec.Rotation.Jitter = dur(6 * time.Hour) },
			want: []string{"spec.rotation.jitter: Invalid", "less than maxAge"}},
		{name: "create limits must be positive", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Placement.MaxConcurrentCreates = -1
			p.Spec.Remediation.MaxCreatesPerMinute = -1
		}, want: []string{"spec.placement.maxConcurrentCreates: Invalid", "spec.remediation.maxCreatesPerMinute: Invalid"}},
		{name: "rotation settings without maxAge", change: func(p *crawlv1.ProxyPool) { p.Spec.Rotation.MaxAge = nil },
			want: []string{"spec.rotation.jitter: Forbidden", "spec.rotation.minInterval: Forbidden"}},
	}
	w := poolWebhook()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := goodPool()
			tc.change(p)
			_, err := w.ValidateCreate(context.Background(), p)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("admitted, want %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestValidateProxyPoolUpdateIsRatcheted(t *testing.T) {
	w := poolWebhook()
	ctx := context.Background()
	// Stored before today's rules: a template without an image.
	old := goodPool()
	old.Spec.Template.Spec.Placement.Image = ""
	scaled := old.DeepCopy()
	scaled.Spec.Replicas = ptr.To(int32(5))
	if _, err := w.ValidateUpdate(ctx, old, scaled); err != nil {
		t.Errorf("scaling a stored pool refused for what it already had: %v", err)
	}
	worse := scaled.DeepCopy()
	worse.Spec.Rollout.MaxSurge = ptr.To(intstr.FromInt32(-2))
	if _, err := w.ValidateUpdate(ctx, old, worse); err == nil || !strings.Contains(err.Error(), "spec.rollout.maxSurge") {
		t.Errorf("a new error admitted: %v", err)
	}
	moved := goodPool()
	moved.Spec.Selector.MatchLabels["team"] = "x"
	if _, err := w.ValidateUpdate(ctx, goodPool(), moved); err == nil || !strings.Contains(err.Error(), "spec.selector: Forbidden") {
		t.Errorf("a selector change admitted: %v", err)
	}
	deleting := old.DeepCopy()
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	deleting.Spec.Rollout.MaxSurge = ptr.To(intstr.FromInt32(-2))
	if _, err := w.ValidateUpdate(ctx, old, deleting); err != nil {
		t.Errorf("a pool being deleted refused: %v", err)
	}
}

func TestTheShippedSamplePoolIsAdmitted(t *testing.T) {
	y, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "samples", "crawl_v1alpha1_proxypool.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p := &crawlv1.ProxyPool{}
	if err := yaml.UnmarshalStrict(y, p); err != nil {
		t.Fatalf("sample: %v", err)
	}
	if _, err := poolWebhook().ValidateCreate(context.Background(), p); err != nil {
		t.Errorf("the shipped sample is refused: %v", err)
	}
}
