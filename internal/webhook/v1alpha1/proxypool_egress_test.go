package v1alpha1

import (
	"context"
	"strings"
	"testing"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/controllers"
)

// kubernetesPool is goodPool on the kubernetes provider.
func kubernetesPool() *crawlv1.ProxyPool {
	p := goodPool()
	p.Spec.Template.Spec.Provider = crawlv1.ProviderKubernetes
	p.Spec.Template.Spec.Placement = crawlv1.ProxyPlacement{}
	return p
}

// gcpPool is goodPool on gcp.
func gcpPool() *crawlv1.ProxyPool {
	p := goodPool()
	p.Spec.Template.Spec.Provider = crawlv1.ProviderGCP
	p.Spec.Template.Spec.Placement = crawlv1.ProxyPlacement{Zone: "europe-west1-b"}
	return p
}

// TestValidateProxyPoolEgress: Required is refused, naming
// spec.egress.distinct and why, where the provider's plug-in says its
// instances share one address; Preferred there is admitted with a
// warning; a bad echo URL names spec.egress.echoURL.
func TestValidateProxyPoolEgress(t *testing.T) {
	natGCP := &ProxyPoolWebhook{Proxy: ProxyWebhook{Plugins: controllers.PluginsFor(controllers.PluginOptions{GCPNoExternalIP: true})}}
	cases := []struct {
		name     string
		webhook  *ProxyPoolWebhook
		pool     *crawlv1.ProxyPool
		distinct crawlv1.EgressDistinctPolicy
		echoURL  string
		want     []string // in the error; none: admitted
		warning  string   // in a warning; "": none about egress
	}{
		{name: "kvm Required: hosts decide, admitted", webhook: poolWebhook(), pool: goodPool(), distinct: crawlv1.EgressDistinctRequired},
		{name: "kubernetes Required: refused", webhook: poolWebhook(), pool: kubernetesPool(), distinct: crawlv1.EgressDistinctRequired,
			want: []string{"spec.egress.distinct: Invalid value", "node's address or the cluster's NAT"}},
		{name: "kubernetes Preferred: a warning", webhook: poolWebhook(), pool: kubernetesPool(), distinct: crawlv1.EgressDistinctPreferred,
			warning: "spec.egress.distinct: kubernetes squid pods"},
		{name: "kubernetes Ignore: nothing said", webhook: poolWebhook(), pool: kubernetesPool(), distinct: crawlv1.EgressDistinctIgnore},
		{name: "gcp with external IPs Required: admitted", webhook: poolWebhook(), pool: gcpPool(), distinct: crawlv1.EgressDistinctRequired},
		{name: "gcp without external IPs Required: refused", webhook: natGCP, pool: gcpPool(), distinct: crawlv1.EgressDistinctRequired,
			want: []string{"spec.egress.distinct: Invalid value", "Cloud NAT", "--gcp-no-external-ip"}},
		{name: "echo URL with credentials", webhook: poolWebhook(), pool: goodPool(), echoURL: "http://u:p@echo.example/ip",
			want: []string{"spec.egress.echoURL: Invalid value", "credentials"}},
		{name: "echo URL without host", webhook: poolWebhook(), pool: goodPool(), echoURL: "http:///ip",
			want: []string{"spec.egress.echoURL: Invalid value", "no host"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.pool
			p.Spec.Egress.Distinct, p.Spec.Egress.EchoURL = tc.distinct, tc.echoURL
			warnings, err := tc.webhook.ValidateCreate(context.Background(), p)
			if len(tc.want) == 0 && err != nil {
				t.Fatalf("refused: %v", err)
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Fatalf("error %v, want it to contain %q", err, w)
				}
			}
			got := strings.Join(warnings, "\n")
			if tc.warning == "" && strings.Contains(got, "spec.egress") || tc.warning != "" && !strings.Contains(got, tc.warning) {
				t.Fatalf("warnings %q, want one with %q", warnings, tc.warning)
			}
		})
	}
}
