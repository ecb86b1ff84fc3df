package e2eutil

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// secretReader serves one Secret; after the first Get, each Get waits for
// its context to end (a read Stop cuts short), or fails with fail when set.
type secretReader struct {
	client.Reader
	gets atomic.Int32
	fail error
}

func (r *secretReader) Get(ctx context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	if r.gets.Add(1) == 1 {
		sec := obj.(*corev1.Secret)
		sec.ResourceVersion = "1"
		sec.Data = map[string][]byte{crawlv1.ProxiesTextKey: []byte("http://u:p@192.0.2.1:3128\n")}
		return nil
	}
	if r.fail != nil {
		return r.fail
	}
	<-ctx.Done()
	return ctx.Err()
}

// A read that Stop cuts short is not a failed read; a read the API server
// fails is, and its error is kept.
func TestListMirrorCountsOnlyFailedReads(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fail       error
		wantErrors bool
	}{
		{name: "stopped during a read"},
		{name: "the API server fails a read", fail: errors.New("etcdserver: request timed out"), wantErrors: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &secretReader{fail: tc.fail}
			m := &ListMirror{Client: r, Namespace: "ns", Pool: "crawl", Dir: t.TempDir(), Interval: 10 * time.Millisecond,
				Origin: &Origin{egress: map[string]bool{}}}
			if err := m.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			for r.gets.Load() < 2 {
				time.Sleep(5 * time.Millisecond)
			}
			st := m.Stop()
			if got := st.ReadErrors > 0; got != tc.wantErrors {
				t.Fatalf("ReadErrors = %d (first %v), want failed reads: %v", st.ReadErrors, st.FirstReadError, tc.wantErrors)
			}
			if tc.wantErrors && !errors.Is(st.FirstReadError, tc.fail) {
				t.Fatalf("FirstReadError = %v, want %v", st.FirstReadError, tc.fail)
			}
		})
	}
}
