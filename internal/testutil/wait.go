// Package testutil holds the helpers unit tests of several packages share.
package testutil

import (
	"testing"
	"time"
)

// WaitTimeout is how long WaitFor polls before failing the test.
const WaitTimeout = 5 * time.Second

// WaitFor polls cond every millisecond until it holds, and fails the test
// after WaitTimeout.
func WaitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached within %s", WaitTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}
