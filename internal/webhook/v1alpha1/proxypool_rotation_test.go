package v1alpha1

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// TestProxyPoolRotationWarnings: rotation limits that cannot replace the
// pool within one maxAge are admitted with a warning naming them, on
// create and update; limits that keep up, or no rotation, draw none.
func TestProxyPoolRotationWarnings(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(p *crawlv1.ProxyPool)
		want   []string // substrings of the one warning; nil: none
	}{
		{name: "3 replicas, one start per 5 minutes", change: func(*crawlv1.ProxyPool) {}},
		{name: "1,000 replicas, one start per 5 minutes: 72 per 6h", change: func(p *crawlv1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(1000)) },
			want: []string{"spec.rotation: the limits replace at most 72 of 1000 replicas per maxAge 6h0m0s", "rotation.minInterval 5m0s", "RotationBehind"}},
		{name: "1,000 replicas, the defaults within maxSurge 1", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Replicas, p.Spec.Rotation.MinInterval = ptr.To(int32(1000)), nil
		}, want: []string{"at most 144 of 1000", "rotation.maxConcurrent 1, rollout.maxSurge 1"}},
		{name: "1,000 replicas, the defaults within maxSurge 5%", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Replicas, p.Spec.Rotation.MinInterval = ptr.To(int32(1000)), nil
			p.Spec.Rollout.MaxSurge = ptr.To(intstr.FromString("5%"))
		}},
		{name: "a user's maxConcurrent too low for them", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Replicas, p.Spec.Rotation.MinInterval, p.Spec.Rotation.MaxConcurrent = ptr.To(int32(1000)), nil, 2
			p.Spec.Rollout.MaxSurge = ptr.To(intstr.FromString("5%"))
		}, want: []string{"at most 288 of 1000", "rotation.maxConcurrent 2, rollout.maxSurge 50"}},
		{name: "no rotation", change: func(p *crawlv1.ProxyPool) {
			p.Spec.Replicas, p.Spec.Rotation = ptr.To(int32(1000)), crawlv1.ProxyPoolRotation{}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goodPool()
			tc.change(p)
			created, err := poolWebhook().ValidateCreate(context.Background(), p)
			checkErrs(t, err, "")
			old := goodPool()
			old.Spec.Rotation.MaxAge = dur(12 * time.Hour)
			updated, err := poolWebhook().ValidateUpdate(context.Background(), old, p)
			checkErrs(t, err, "")
			for _, warnings := range [][]string{created, updated} {
				var rotation []string
				for _, w := range warnings {
					if strings.HasPrefix(w, "spec.rotation") {
						rotation = append(rotation, w)
					}
				}
				if tc.want == nil {
					if len(rotation) != 0 {
						t.Errorf("warnings %q, want none of rotation", rotation)
					}
					continue
				}
				if len(rotation) != 1 {
					t.Fatalf("warnings %q, want one of rotation", warnings)
				}
				for _, s := range tc.want {
					if !strings.Contains(rotation[0], s) {
						t.Errorf("warning %q does not say %q", rotation[0], s)
					}
				}
			}
		})
	}
}
