package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
)

func TestClass(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want ErrorClass
	}{
		{"nil", nil, ClassNone},
		{"unclassified is transient", io.EOF, ClassTransient},
		{"transient", Transientf("host busy"), ClassTransient},
		{"permanent", Permanentf("bad key"), ClassPermanent},
		{"not found", NotFoundf("no domain"), ClassNotFound},
		{"wrapped permanent", fmt.Errorf("create: %w", Permanentf("x")), ClassPermanent},
		{"identity error is permanent", &IdentityError{Kind: "domain", Name: "d", Mismatch: "uid"}, ClassPermanent},
		{"deadline", context.DeadlineExceeded, ClassTransient},
		{"unavailable is transient", fmt.Errorf("get: %w", &UnavailableError{Place: `KVM host "hv1"`, Reason: "no answer"}), ClassTransient},
		{"no capacity is transient", fmt.Errorf("insert: %w", NoCapacity(io.EOF)), ClassTransient},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Class(tc.err); got != tc.want {
				t.Errorf("Class(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

func TestClassedKeepsMessageAndCause(t *testing.T) {
	cause := io.ErrUnexpectedEOF
	err := Transient(cause)
	if err.Error() != cause.Error() {
		t.Errorf("message changed: %q", err)
	}
	if !errors.Is(err, cause) || !errors.Is(err, ErrTransient) {
		t.Errorf("errors.Is lost the cause or the sentinel")
	}
	if HasClass(io.EOF) || !HasClass(err) {
		t.Errorf("HasClass wrong")
	}
	if Transient(nil) != nil {
		t.Errorf("Transient(nil) must be nil")
	}
}

// TestUnavailableError: a refusal names the place and why, is transient
// (retried, never Failed) and is told apart from other transient errors.
func TestUnavailableError(t *testing.T) {
	err := fmt.Errorf("get: %w", &UnavailableError{Place: `KVM host "hv1"`, Reason: "no answer to its health checks since 2026-12-05T05:47:11Z"})
	if want := `get: KVM host "hv1" is not answering (no answer to its health checks since 2026-12-05T05:47:11Z); not called until it answers`; err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrTransient) || !HasClass(err) {
		t.Errorf("%v must match ErrUnavailable and ErrTransient", err)
	}
	if errors.Is(Transientf("host busy"), ErrUnavailable) {
		t.Errorf("a plain transient error must not read as unavailable")
	}
}

func TestNoCapacityKeepsMessageAndCause(t *testing.T) {
	err := NoCapacity(io.ErrUnexpectedEOF)
	if err.Error() != io.ErrUnexpectedEOF.Error() || !errors.Is(err, io.ErrUnexpectedEOF) ||
		!errors.Is(err, ErrNoCapacity) || !errors.Is(err, ErrTransient) || !HasClass(err) {
		t.Errorf("NoCapacity: %q, cause %v, no capacity %v, transient %v", err, errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, ErrNoCapacity), errors.Is(err, ErrTransient))
	}
	if errors.Is(Transientf("busy"), ErrNoCapacity) || NoCapacity(nil) != nil {
		t.Error("only NoCapacity says no capacity; NoCapacity(nil) is nil")
	}
}

func TestKVMProviderID(t *testing.T) {
	const uuid = "5f0d6a3e-2c1b-4b7e-9a3d-0c1e2f3a4b5c"
	id := FormatKVMProviderID("hv1", uuid)
	if id != "kvm://hv1/"+uuid {
		t.Fatalf("format: %q", id)
	}
	host, got, err := ParseKVMProviderID(id)
	if err != nil || host != "hv1" || got != uuid {
		t.Fatalf("round trip: %q %q %v", host, got, err)
	}
	bad := []string{
		"",
		"hv1/" + uuid,
		"kvm://",
		"kvm:///" + uuid,
		"kvm://hv1/",
		"kvm://hv1/not-a-uuid",
		"gce://p/z/" + uuid,
		"kvm://a/b/" + uuid,
		"kvm://hv1/" + uuid + "x",
	}
	for _, s := range bad {
		if _, _, err := ParseKVMProviderID(s); err == nil {
			t.Errorf("ParseKVMProviderID(%q) accepted bad input", s)
		}
	}
}

func TestParseProviderID(t *testing.T) {
	p, err := ParseProviderID("gce://proj/us-central1-a/proxy-1")
	if err != nil || p.Scheme != "gce" || p.Location != "proj/us-central1-a" || p.ID != "proxy-1" {
		t.Fatalf("got %+v %v", p, err)
	}
	if p.String() != "gce://proj/us-central1-a/proxy-1" {
		t.Errorf("String: %q", p.String())
	}
	for _, s := range []string{"://x/y", "gce://", "gce://p//z/i", "gce:///i"} {
		if _, err := ParseProviderID(s); err == nil {
			t.Errorf("ParseProviderID(%q) accepted bad input", s)
		}
	}
}
