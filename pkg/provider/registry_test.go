package provider

import (
	"context"
	"errors"
	"testing"
	"time"
)

type namedProvider struct{ Provider }

func (namedProvider) Name() string { return "kvm" }

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	now := time.Unix(0, 0)
	r.now = func() time.Time { return now }

	calls := 0
	fail := true
	r.Register("gcp", func(context.Context) (Provider, error) {
		calls++
		if fail {
			return nil, errors.New("secret gcp-credentials not found")
		}
		return namedProvider{}, nil
	})
	r.Add(namedProvider{})
	ctx := context.Background()

	if _, err := r.Get(ctx, "kubernetes"); !errors.Is(err, ErrNotEnabled) || Class(err) != ClassPermanent {
		t.Fatalf("unknown provider: %v (class %s)", err, Class(err))
	}
	if p, err := r.Get(ctx, "kvm"); err != nil || p == nil {
		t.Fatalf("kvm: %v", err)
	}

	_, err := r.Get(ctx, "gcp")
	if Class(err) != ClassTransient || calls != 1 {
		t.Fatalf("failed construction: %v class %s calls %d", err, Class(err), calls)
	}
	// Within the backoff the error is served from memory, no new attempt.
	if _, err2 := r.Get(ctx, "gcp"); err2 == nil || calls != 1 {
		t.Fatalf("retried inside backoff: calls %d err %v", calls, err2)
	}
	// After the backoff a Secret that appeared heals the provider.
	fail = false
	now = now.Add(r.Backoff(1))
	if p, err := r.Get(ctx, "gcp"); err != nil || p == nil || calls != 2 {
		t.Fatalf("heal: %v calls %d", err, calls)
	}
	if got := len(r.Constructed()); got != 2 {
		t.Errorf("Constructed = %d, want 2", got)
	}
	if got := r.Enabled(); len(got) != 2 || got[0] != "gcp" || got[1] != "kvm" {
		t.Errorf("Enabled = %v", got)
	}
}
