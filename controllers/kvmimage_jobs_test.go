package controllers

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
)

// blockingCacher downloads until its context ends, or until release is
// closed; it remembers which downloads were cancelled.
type blockingCacher struct {
	release chan struct{}

	mu        sync.Mutex
	started   map[string]int // host/checksum → downloads started
	cancelled map[string]bool
}

func (c *blockingCacher) EnsureImage(ctx context.Context, host string, img provider.Image, _ kvm.Progress) (kvm.CachedImage, error) {
	k := host + "/" + img.Checksum
	c.mu.Lock()
	c.started[k]++
	c.mu.Unlock()
	select {
	case <-ctx.Done():
		c.mu.Lock()
		c.cancelled[k] = true
		c.mu.Unlock()
		return kvm.CachedImage{}, ctx.Err()
	case <-c.release:
		return kvm.CachedImage{Volume: "vol", Bytes: 1}, nil
	}
}

func (c *blockingCacher) wasCancelled(k string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cancelled[k]
}

const (
	sumA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	sumB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func readyKVMHost(name string) *crawlv1.KVMHost {
	return &crawlv1.KVMHost{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: crawlv1.KVMHostStatus{Conditions: []metav1.Condition{{Type: crawlv1.ReadyCondition, Status: metav1.ConditionTrue,
			Reason: crawlv1.HostReadyReason, LastTransitionTime: metav1.Now()}}}}
}

func imageReconciler(t *testing.T, ctx context.Context, objs ...client.Object) (*KVMImageReconciler, *blockingCacher) {
	t.Helper()
	s := runtime.NewScheme()
	if err := crawlv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := &blockingCacher{release: make(chan struct{}), started: map[string]int{}, cancelled: map[string]bool{}}
	r := &KVMImageReconciler{
		Client: fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
			WithStatusSubresource(&crawlv1.KVMImage{}, &crawlv1.KVMHost{}).Build(),
		Cacher: c, Recorder: record.NewFakeRecorder(100), JobContext: ctx, ProgressInterval: time.Hour,
	}
	if err := r.complete(); err != nil {
		t.Fatal(err)
	}
	return r, c
}

func (r *KVMImageReconciler) jobCount() int {
	r.jobsMu.Lock()
	defer r.jobsMu.Unlock()
	return len(r.jobs)
}

func TestKVMImageJobsStopWhenNoLongerWanted(t *testing.T) {
	cases := []struct {
		name   string
		change func(t *testing.T, cl client.Client)
	}{
		{"image deleted", func(t *testing.T, cl client.Client) {
			if err := cl.Delete(context.Background(), &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: "img"}}); err != nil {
				t.Fatal(err)
			}
		}},
		{"checksum changed", func(t *testing.T, cl client.Client) {
			img := &crawlv1.KVMImage{}
			if err := cl.Get(context.Background(), client.ObjectKey{Name: "img"}, img); err != nil {
				t.Fatal(err)
			}
			img.Spec.Checksum = sumB
			if err := cl.Update(context.Background(), img); err != nil {
				t.Fatal(err)
			}
		}},
		{"host left Ready", func(t *testing.T, cl client.Client) {
			h := &crawlv1.KVMHost{}
			if err := cl.Get(context.Background(), client.ObjectKey{Name: "hv1"}, h); err != nil {
				t.Fatal(err)
			}
			h.Status.Conditions[0].Status, h.Status.Conditions[0].Reason = metav1.ConditionFalse, crawlv1.HostTCPUnreachableReason
			if err := cl.Status().Update(context.Background(), h); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			img := &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: "img"},
				Spec: crawlv1.KVMImageSpec{URL: "http://127.0.0.1:1/img.raw", Checksum: sumA, Format: crawlv1.ImageFormatRaw}}
			r, c := imageReconciler(t, ctx, img, readyKVMHost("hv1"))
			req := ctrl.Request{NamespacedName: client.ObjectKey{Name: "img"}}
			if _, err := r.Reconcile(ctx, req); err != nil {
				t.Fatal(err)
			}
			if n := r.jobCount(); n != 1 {
				t.Fatalf("%d jobs after the first reconcile, want 1", n)
			}
			tc.change(t, r.Client)
			if _, err := r.Reconcile(ctx, req); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, func() bool { return c.wasCancelled("hv1/" + sumA) })
			wantJobs := 0
			if tc.name == "checksum changed" {
				wantJobs = 1 // the download of the new checksum
			}
			if n := r.jobCount(); n != wantJobs {
				t.Fatalf("%d jobs left, want %d", n, wantJobs)
			}
		})
	}
}

func TestKVMImageFinishedJobWakesTheReconcile(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	img := &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: "img"},
		Spec: crawlv1.KVMImageSpec{URL: "http://127.0.0.1:1/img.raw", Checksum: sumA, Format: crawlv1.ImageFormatRaw}}
	r, c := imageReconciler(t, ctx, img, readyKVMHost("hv1"))
	res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: "img"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter != time.Hour {
		t.Fatalf("while downloading: RequeueAfter %v, want the progress interval", res.RequeueAfter)
	}
	close(c.release)
	select {
	case ev := <-r.finished:
		if ev.Object.GetName() != "img" {
			t.Fatalf("woke %q", ev.Object.GetName())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a finished download did not wake the reconcile")
	}
}

// A host that misses a health check is not Ready for a moment; the image's
// entry for it (verified, its volume and bytes) must survive that, and go
// only with the KVMHost itself.
func TestKVMImageKeepsTheEntryOfAHostNotReadyForNow(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	verified := crawlv1.KVMImageHostStatus{Host: "hv1", Phase: crawlv1.ImageHostVerified, Verified: true, Checksum: sumA,
		Volume: "image-sha256_aaaa.raw", Bytes: 4096, AllocatedBytes: 4096}
	img := &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: "img", Generation: 1},
		Spec:   crawlv1.KVMImageSpec{URL: "http://127.0.0.1:1/img.raw", Checksum: sumA, Format: crawlv1.ImageFormatRaw},
		Status: crawlv1.KVMImageStatus{ObservedGeneration: 1, Hosts: []crawlv1.KVMImageHostStatus{verified, {Host: "gone", Phase: crawlv1.ImageHostVerified}}}}
	notReady := readyKVMHost("hv1")
	notReady.Status.Conditions[0].Status, notReady.Status.Conditions[0].Reason = metav1.ConditionFalse, crawlv1.HostTimeoutReason
	r, _ := imageReconciler(t, ctx, img, notReady)
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: "img"}}); err != nil {
		t.Fatal(err)
	}
	got := &crawlv1.KVMImage{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: "img"}, got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Hosts) != 1 || got.Status.Hosts[0] != verified {
		t.Fatalf("hosts %+v, want only hv1's verified entry, unchanged (the KVMHost of %q is gone)", got.Status.Hosts, "gone")
	}
	if r.jobCount() != 0 {
		t.Errorf("%d jobs started for a host that is not Ready", r.jobCount())
	}
}
