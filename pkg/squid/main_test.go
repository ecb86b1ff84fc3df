package squid

import (
	"testing"

	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// TestMain runs the package's tests in a network namespace holding only lo
// (squidtest.Main): they ask squid for private addresses and check that it
// refuses.
func TestMain(m *testing.M) { squidtest.Main(m) }

func TestRunsInIsolatedNetworkNamespace(t *testing.T) { squidtest.RequireOnlyLoopback(t) }
