package controllers

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	clientfake "sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

// A reconcile that started from a stale read (the cache had not seen the
// last status write yet) must not overwrite the newer status: status lists
// are replaced whole by a merge patch, so an unguarded write would put back
// e.g. a host entry without its verified volume. The write is refused with a
// conflict and the reconcile runs again on a fresh read.
func TestStatusPatchFromAStaleReadIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name       string
		metaChange bool
	}{
		{name: "status only"},
		{name: "finalizer and status", metaChange: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			img := &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: "debian"}}
			c := clientfake.NewClientBuilder().WithScheme(envtestutil.Scheme()).
				WithObjects(img).WithStatusSubresource(img).Build()

			stale := &crawlv1.KVMImage{}
			if err := c.Get(ctx, client.ObjectKey{Name: "debian"}, stale); err != nil {
				t.Fatal(err)
			}
			// The newer status the stale reader has not seen.
			fresh := stale.DeepCopy()
			fresh.Status.Hosts = []crawlv1.KVMImageHostStatus{{Host: "hv1", Phase: crawlv1.ImageHostVerified, Volume: "image-x"}}
			if err := c.Status().Update(ctx, fresh); err != nil {
				t.Fatal(err)
			}

			patcher := newObjectPatcher(c, stale)
			if tc.metaChange {
				// A metadata patch from the stale read is refused already.
				controllerutil.AddFinalizer(stale, KVMImageFinalizer)
			}
			stale.Status.Hosts = []crawlv1.KVMImageHostStatus{{Host: "hv1", Phase: crawlv1.ImageHostDownloading}}
			err := patcher.Patch(ctx, stale)
			if !apierrors.IsConflict(err) {
				t.Fatalf("Patch from a stale read: err = %v, want a conflict", err)
			}
			got := &crawlv1.KVMImage{}
			if err := c.Get(ctx, client.ObjectKey{Name: "debian"}, got); err != nil {
				t.Fatal(err)
			}
			if h := got.Status.HostStatus("hv1"); h == nil || h.Phase != crawlv1.ImageHostVerified || h.Volume != "image-x" {
				t.Fatalf("status after a stale write = %+v, want the newer Verified entry kept", got.Status.Hosts)
			}
		})
	}
}

// A fresh read writes finalizers and status, in that order, and the status
// write is guarded by the version the metadata write produced.
func TestStatusPatchAfterItsOwnMetadataPatch(t *testing.T) {
	ctx := context.Background()
	img := &crawlv1.KVMImage{ObjectMeta: metav1.ObjectMeta{Name: "debian"}}
	c := clientfake.NewClientBuilder().WithScheme(envtestutil.Scheme()).
		WithObjects(img).WithStatusSubresource(img).Build()
	cur := &crawlv1.KVMImage{}
	if err := c.Get(ctx, client.ObjectKey{Name: "debian"}, cur); err != nil {
		t.Fatal(err)
	}
	patcher := newObjectPatcher(c, cur)
	controllerutil.AddFinalizer(cur, KVMImageFinalizer)
	cur.Status.ReadyHosts = 2
	if err := patcher.Patch(ctx, cur); err != nil {
		t.Fatalf("Patch from a fresh read: %v", err)
	}
	got := &crawlv1.KVMImage{}
	if err := c.Get(ctx, client.ObjectKey{Name: "debian"}, got); err != nil {
		t.Fatal(err)
	}
	if !controllerutil.ContainsFinalizer(got, KVMImageFinalizer) || got.Status.ReadyHosts != 2 {
		t.Fatalf("got finalizers %v, readyHosts %d; want both written", got.Finalizers, got.Status.ReadyHosts)
	}
}
