package v1alpha1

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func urlProxy() *crawlv1.Proxy {
	p := kvmProxy()
	p.Spec.Placement.Image, p.Spec.Placement.ImageChecksum = "http://10.0.0.1:8080/internal.qcow2", goodSum
	proxyWebhook(false).DefaultProxy(p)
	return p
}

// TestProxyImageURLsNeedTheManagerFlag: the manager fetches a URL image from
// inside the cluster, so one is admitted only with --allow-proxy-image-urls.
func TestProxyImageURLsNeedTheManagerFlag(t *testing.T) {
	gcp := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "g1", Namespace: "crawl"},
		Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderGCP, Placement: crawlv1.ProxyPlacement{Image: "projects/debian-cloud/global/images/family/debian-12"}}}
	cases := []struct {
		name    string
		w       *ProxyWebhook
		p       *crawlv1.Proxy
		wantErr string
	}{
		{"URL refused by default", proxyWebhook(false), urlProxy(), "spec.placement.image: Forbidden: image URLs are fetched by the manager from inside the cluster"},
		{"URL admitted with the flag", proxyWebhook(true), urlProxy(), ""},
		{"KVMImage name admitted", proxyWebhook(false), kvmProxy(), ""},
		{"gcp source image admitted", proxyWebhook(false), gcp, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.w.ValidateCreate(context.Background(), tc.p)
			checkErrs(t, err, tc.wantErr)
			if err != nil && (!strings.Contains(err.Error(), "KVMImage") || !strings.Contains(err.Error(), "--allow-proxy-image-urls")) {
				t.Errorf("the refusal does not point to KVMImage and the flag: %v", err)
			}
		})
	}
}

// TestStoredURLProxyStaysReleasableWithoutTheFlag: a Proxy stored with a URL
// (before the rule, or while the flag was on) can still be released and
// changed elsewhere; the URL itself is immutable.
func TestStoredURLProxyStaysReleasableWithoutTheFlag(t *testing.T) {
	w := proxyWebhook(false)
	now := metav1.Now()
	for name, mutate := range map[string]func(*crawlv1.Proxy){
		"finalizer removed": func(p *crawlv1.Proxy) { p.Finalizers = nil },
		"annotation added":  func(p *crawlv1.Proxy) { p.Annotations = map[string]string{crawlv1.SkipCleanupAnnotation: "true"} },
		"being deleted":     func(p *crawlv1.Proxy) { p.DeletionTimestamp, p.Finalizers = &now, nil },
		"resources changed": func(p *crawlv1.Proxy) { p.Spec.Resources.CPUs = 2 },
	} {
		t.Run(name, func(t *testing.T) {
			stored := urlProxy()
			stored.Finalizers = []string{crawlv1.ProxyFinalizer}
			p := stored.DeepCopy()
			mutate(p)
			ctx := updateCtx(t, stored)
			if err := w.Default(ctx, p); err != nil {
				t.Fatal(err)
			}
			if _, err := w.ValidateUpdate(ctx, stored, p); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}
}
