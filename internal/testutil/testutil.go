// Package testutil holds the helpers unit tests of several packages share.
package testutil

import (
	"net"
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

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for
// a server the test starts itself (squid, which cannot be handed a
// listener).
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// AcceptAndClose closes every connection l accepts, until l is closed: a
// port that is open and nothing more, as squid's is the moment it starts.
func AcceptAndClose(l net.Listener) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
}
