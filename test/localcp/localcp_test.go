package localcp

import (
	"errors"
	"testing"
)

// TestFreeAddrExcept: a port the manager must bind itself (the webhook
// port, free while the killed manager is gone) is never handed out for
// another of its servers, even when the kernel offers it first.
func TestFreeAddrExcept(t *testing.T) {
	offers := func(addrs ...string) func() (string, error) {
		return func() (string, error) {
			if len(addrs) == 0 {
				return "", errors.New("no more offers")
			}
			a := addrs[0]
			addrs = addrs[1:]
			return a, nil
		}
	}
	for _, tc := range []struct {
		name   string
		pick   func() (string, error)
		taken  []int
		want   string
		wantOK bool
	}{
		{"first offer free", offers("127.0.0.1:4000"), []int{38417}, "127.0.0.1:4000", true},
		{"webhook port offered first", offers("127.0.0.1:38417", "127.0.0.1:4001"), []int{38417}, "127.0.0.1:4001", true},
		{"metrics and webhook ports offered", offers("127.0.0.1:38417", "127.0.0.1:4000", "127.0.0.1:4002"), []int{38417, 4000}, "127.0.0.1:4002", true},
		{"picker fails", offers(), []int{38417}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := freeAddrExcept(tc.pick, tc.taken...)
			if (err == nil) != tc.wantOK || got != tc.want {
				t.Errorf("freeAddrExcept = %q, %v; want %q (ok %v)", got, err, tc.want, tc.wantOK)
			}
		})
	}
	always := func() (string, error) { return "127.0.0.1:38417", nil }
	if _, err := freeAddrExcept(always, 38417); err == nil {
		t.Error("a picker that only offers the taken port must end in an error")
	}
}
