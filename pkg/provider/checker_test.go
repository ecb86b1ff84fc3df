package provider

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

type checkedProvider struct {
	Provider
	mu    sync.Mutex
	err   error
	calls int
}

func (*checkedProvider) Name() string { return "gcp" }

func (p *checkedProvider) Check(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	return p.err
}

func (p *checkedProvider) set(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}

func (p *checkedProvider) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

func TestCheckerRecordsEachProvidersLastCheck(t *testing.T) {
	r := NewRegistry()
	p := &checkedProvider{err: Permanentf("gcp: no firewall rule admits tcp:3128")}
	r.Add(p)
	r.Register("broken", func(context.Context) (Provider, error) { return nil, errors.New("credentials file missing") })
	c := &Checker{Registry: r}

	if r.CheckError("gcp") != nil || (*Registry)(nil).CheckError("gcp") != nil {
		t.Fatal("an error before any check")
	}
	c.CheckAll(context.Background())
	if err := r.CheckError("gcp"); err == nil || err.Error() != "gcp: no firewall rule admits tcp:3128" {
		t.Errorf("gcp check error = %v", err)
	}
	if err := r.CheckError("broken"); err == nil {
		t.Error("a provider that cannot be built passed its check")
	}
	p.set(nil)
	c.CheckAll(context.Background())
	if err := r.CheckError("gcp"); err != nil {
		t.Errorf("passing check still reports %v", err)
	}
}

func TestCheckerRunsAtStartAndPeriodically(t *testing.T) {
	r := NewRegistry()
	p := &checkedProvider{}
	r.Add(p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Checker{Registry: r, Interval: 10 * time.Millisecond}).Start(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for p.count() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if p.count() < 3 {
		t.Errorf("%d checks, want one at start and more every interval", p.count())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return after cancel")
	}
}
