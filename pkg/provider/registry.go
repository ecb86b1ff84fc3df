package provider

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// ErrNotEnabled is matched by the error Registry.Get returns for a provider
// that is not enabled on this manager. It is permanent for the Proxy.
var ErrNotEnabled = errors.New("provider not enabled")

type notEnabledError struct {
	name    string
	enabled []string
}

func (e *notEnabledError) Error() string {
	return fmt.Sprintf("provider %q is not enabled on this manager (enabled: %v)", e.name, e.enabled)
}

func (e *notEnabledError) Is(target error) bool {
	return target == ErrNotEnabled || target == ErrPermanent
}

// Constructor builds a provider. It may fail (e.g. a credential Secret does
// not exist yet); the registry then retries it later.
type Constructor func(ctx context.Context) (Provider, error)

// Registry holds the enabled providers. A provider whose construction fails
// is reported and retried with backoff on later lookups; it never stops the
// manager or the other providers.
type Registry struct {
	mu      sync.Mutex
	entries map[string]*registryEntry
	now     func() time.Time
	// Backoff after the n-th consecutive construction failure.
	Backoff func(failures int) time.Duration
	// checks holds the last Check error per provider (see Checker).
	checks map[string]error
}

type registryEntry struct {
	construct Constructor
	provider  Provider
	lastErr   error
	failures  int
	nextTry   time.Time
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{
		entries: map[string]*registryEntry{},
		now:     time.Now,
		Backoff: func(n int) time.Duration {
			return min(time.Second<<min(n, 8), 5*time.Minute)
		},
	}
}

// Register enables a provider under name.
func (r *Registry) Register(name string, c Constructor) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries[name] = &registryEntry{construct: c}
}

// Add enables an already constructed provider.
func (r *Registry) Add(p Provider) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries[p.Name()] = &registryEntry{provider: p}
}

// Enabled returns the enabled provider names, sorted.
func (r *Registry) Enabled() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.entries))
}

// Get returns the provider name, constructing it if needed. Errors:
// ErrNotEnabled (permanent) for a provider that is not enabled; the
// construction error (classified; unclassified counts as transient) while it
// cannot be built.
func (r *Registry) Get(ctx context.Context, name string) (Provider, error) {
	r.mu.Lock()
	e, ok := r.entries[name]
	if !ok {
		enabled := slices.Sorted(maps.Keys(r.entries))
		r.mu.Unlock()
		return nil, &notEnabledError{name: name, enabled: enabled}
	}
	if e.provider != nil {
		r.mu.Unlock()
		return e.provider, nil
	}
	if r.now().Before(e.nextTry) {
		err := e.lastErr
		r.mu.Unlock()
		return nil, err
	}
	// Construct outside the lock: it may do I/O. A concurrent Get may
	// construct too; the first success wins.
	r.mu.Unlock()
	p, err := e.construct(ctx)

	r.mu.Lock()
	defer r.mu.Unlock()
	if e.provider != nil {
		return e.provider, nil
	}
	if err != nil {
		e.failures++
		e.nextTry = r.now().Add(r.Backoff(e.failures))
		if !HasClass(err) {
			err = Transient(err)
		}
		e.lastErr = fmt.Errorf("provider %q unavailable: %w", name, err)
		return nil, e.lastErr
	}
	e.provider, e.lastErr, e.failures = p, nil, 0
	return p, nil
}

// Constructed returns the providers built so far (for sweeps that must not
// trigger construction).
func (r *Registry) Constructed() []Provider {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Provider
	for _, n := range slices.Sorted(maps.Keys(r.entries)) {
		if p := r.entries[n].provider; p != nil {
			out = append(out, p)
		}
	}
	return out
}
