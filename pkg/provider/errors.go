// Package provider defines the contract every Proxy backend (kvm, kubernetes,
// gcp) implements, and the error taxonomy the controllers act on.
package provider

import (
	"context"
	"errors"
	"fmt"
)

// Sentinels classify every error a provider returns. The class decides what
// the Proxy controller does: retry with backoff, fail without hot-looping, or
// rebuild.
var (
	// ErrTransient: the operation may succeed later (network, host busy).
	ErrTransient = errors.New("transient")
	// ErrPermanent: retrying the same input cannot help (bad spec, foreign
	// domain in the way, unparsable key).
	ErrPermanent = errors.New("permanent")
	// ErrNotFound: the instance does not exist.
	ErrNotFound = errors.New("not found")
	// ErrUnavailable: the place the instance lives in (a KVM host, a zone)
	// is known not to answer now, so the provider did not call it. It is
	// transient and says nothing about the instance. UnavailableError
	// carries the place and why.
	ErrUnavailable = errors.New("unavailable")
	// ErrBusy: the provider turned the call away because the place the
	// instance lives in (a KVM host) has all the calls in flight it
	// allows, and wakes the Proxy with an event when one ends. Flow
	// control, not a failure: transient, and it says nothing about the
	// instance.
	ErrBusy = errors.New("busy")
)

// ErrorClass is the outcome of Class.
type ErrorClass string

const (
	ClassNone      ErrorClass = ""
	ClassTransient ErrorClass = "Transient"
	ClassPermanent ErrorClass = "Permanent"
	ClassNotFound  ErrorClass = "NotFound"
)

// Class reports how err must be handled. An error that carries no sentinel is
// treated as transient: retrying an unknown failure with backoff is safe,
// declaring it permanent is not.
func Class(err error) ErrorClass {
	switch {
	case err == nil:
		return ClassNone
	case errors.Is(err, ErrNotFound):
		return ClassNotFound
	case errors.Is(err, ErrPermanent):
		return ClassPermanent
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ClassTransient
	default:
		return ClassTransient
	}
}

// HasClass reports whether err already carries one of the sentinels, i.e. it
// is a verdict of our own code rather than a raw transport error.
func HasClass(err error) bool {
	return errors.Is(err, ErrTransient) || errors.Is(err, ErrPermanent) || errors.Is(err, ErrNotFound)
}

// Transient wraps err (or a message) as ErrTransient.
func Transient(err error) error { return classed(ErrTransient, err) }

// Permanent wraps err as ErrPermanent.
func Permanent(err error) error { return classed(ErrPermanent, err) }

// NotFound wraps err as ErrNotFound.
func NotFound(err error) error { return classed(ErrNotFound, err) }

// Transientf, Permanentf and NotFoundf build a classified error from a format.
func Transientf(format string, a ...any) error { return Transient(fmt.Errorf(format, a...)) }
func Permanentf(format string, a ...any) error { return Permanent(fmt.Errorf(format, a...)) }
func NotFoundf(format string, a ...any) error  { return NotFound(fmt.Errorf(format, a...)) }

func classed(sentinel, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sentinel) {
		return err
	}
	return &classedError{sentinel: sentinel, err: err}
}

// classedError keeps the cause's message untouched (no "transient: " prefix
// in user-facing conditions) while matching its sentinel with errors.Is.
type classedError struct {
	sentinel error
	err      error
}

func (e *classedError) Error() string   { return e.err.Error() }
func (e *classedError) Unwrap() []error { return []error{e.sentinel, e.err} }

// ErrNoCapacity marks a transient error that says the place the instance
// was to go (a Compute Engine zone) has no room for it now: a pool places
// its next replicas elsewhere first.
var ErrNoCapacity = errors.New("no capacity")

// NoCapacity wraps err as transient and ErrNoCapacity, its message
// untouched.
func NoCapacity(err error) error {
	if err == nil {
		return nil
	}
	return &noCapacityError{err: err}
}

type noCapacityError struct{ err error }

func (e *noCapacityError) Error() string   { return e.err.Error() }
func (e *noCapacityError) Unwrap() []error { return []error{ErrNoCapacity, ErrTransient, e.err} }

// IdentityError is returned when an object with the expected name exists but
// is not ours or not the right one. It is permanent: nothing is destroyed and
// an operator must resolve it (or set the skip-cleanup annotation).
type IdentityError struct {
	// Kind is what was found, e.g. "domain", "volume", "pod", "instance".
	Kind string
	// Name of the object found.
	Name string
	// Mismatch says what did not match, e.g. "uuid 1234 != recorded 5678".
	Mismatch string
}

func (e *IdentityError) Error() string {
	return fmt.Sprintf("%s %q is not this Proxy's: %s; refusing to touch it", e.Kind, e.Name, e.Mismatch)
}

func (e *IdentityError) Is(target error) bool { return target == ErrPermanent }

// UnavailableError is a provider's verdict that the place an instance lives
// in does not answer (its health checks time out): the call failed at once,
// without asking it, rather than spending a deadline on it. The Proxy keeps
// its last known state and is retried when the place answers again. It
// matches ErrUnavailable and ErrTransient.
type UnavailableError struct {
	// Place names it, e.g. `KVM host "hv1"`.
	Place string
	// Reason says what the provider knows, e.g. "no answer to its health
	// checks since 2026-12-05T05:47:11Z". Stable while the outage lasts, so
	// a condition carrying it is not rewritten at every retry.
	Reason string
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%s is not answering (%s); not called until it answers", e.Place, e.Reason)
}

func (e *UnavailableError) Is(target error) bool {
	return target == ErrUnavailable || target == ErrTransient
}
