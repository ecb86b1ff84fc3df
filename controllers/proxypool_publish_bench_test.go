package controllers

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// requestCounter counts the API requests a Publisher makes.
type requestCounter struct {
	client.Client
	reads, writes atomic.Int64
}

func (c *requestCounter) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.reads.Add(1)
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *requestCounter) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.reads.Add(1)
	return c.Client.List(ctx, list, opts...)
}

func (c *requestCounter) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.writes.Add(1)
	return c.Client.Create(ctx, obj, opts...)
}

func (c *requestCounter) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.writes.Add(1)
	return c.Client.Update(ctx, obj, opts...)
}

func (c *requestCounter) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.writes.Add(1)
	return c.Client.Delete(ctx, obj, opts...)
}

// BenchmarkPublish: what one Publish of a pool of 1000 Basic replicas costs
// against a real API server, when nothing changed (the common case: the
// pool controller calls it on every change of any replica) and when one
// replica was replaced. Reported per Publish: API reads and writes, and
// wall time (loaded machines inflate it; the request counts do not move).
//
//	KUBEBUILDER_ASSETS=... go test -run='^$' -bench=BenchmarkPublish -benchtime=20x ./controllers/
func BenchmarkPublish(b *testing.B) {
	const size = 1000
	_, _, cl := startBenchEnv(b)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "publish-bench-"}}
	benchMust(b, cl.Create(ctx, ns))
	pool := &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "bench"},
		Spec: crawlv1.ProxyPoolSpec{
			Replicas: ptr.To[int32](size),
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "bench"}},
			Template: crawlv1.ProxyTemplate{Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM}},
		},
	}
	benchMust(b, cl.Create(ctx, pool))

	replica := func(i int) crawlv1.Proxy {
		name := fmt.Sprintf("r%04d", i)
		addr := fmt.Sprintf("192.0.%d.%d", 2+i/250, 1+i%250)
		return crawlv1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.Now()},
			Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Port: 3128,
				Access: &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.244.0.0/16"}}},
			Status: crawlv1.ProxyStatus{Phase: crawlv1.ProxyReady, Address: addr, Endpoint: "http://" + addr + ":3128",
				Host: fmt.Sprintf("hv%02d", i%50), CredentialsSecretRef: &crawlv1.LocalObjectReference{Name: name + "-credentials"}},
		}
	}
	var replicas []crawlv1.Proxy
	for i := range size + 1 {
		r := replica(i)
		benchMust(b, cl.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: r.Status.CredentialsSecretRef.Name},
			Data: map[string][]byte{
				crawlv1.CredentialsUsernameKey: []byte(r.Name), crawlv1.CredentialsPasswordKey: []byte("pw-" + r.Name),
				crawlv1.CredentialsURLKey: []byte("http://" + r.Name + ":pw-" + r.Name + "@" + r.Status.Address + ":3128"),
			},
		}))
		replicas = append(replicas, r)
	}
	current, spare := replicas[:size], replicas[size]

	run := func(b *testing.B, ttl time.Duration, next func(i int) []crawlv1.Proxy) {
		counter := &requestCounter{Client: cl}
		p := &Publisher{Client: counter, CredentialTTL: ttl}
		benchMust(b, p.Publish(ctx, pool, current)) // warm: the objects and the credential memo
		counter.reads.Store(0)
		counter.writes.Store(0)
		i := 0
		for b.Loop() {
			benchMust(b, p.Publish(ctx, pool, next(i)))
			i++
		}
		b.ReportMetric(float64(counter.reads.Load())/float64(i), "reads/op")
		b.ReportMetric(float64(counter.writes.Load())/float64(i), "writes/op")
	}
	unchanged := func(int) []crawlv1.Proxy { return current }
	// Alternately r0000 and the spare: each call replaces one replica.
	withSpare := append([]crawlv1.Proxy{spare}, current[1:]...)
	oneReplaced := func(i int) []crawlv1.Proxy {
		if i%2 == 0 {
			return withSpare
		}
		return current
	}
	b.Run("unchanged", func(b *testing.B) { run(b, 0, unchanged) })
	b.Run("unchanged-no-credential-memo", func(b *testing.B) { run(b, -1, unchanged) })
	b.Run("one-replaced", func(b *testing.B) { run(b, 0, oneReplaced) })
}
