package controllers

import (
	"testing"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func TestHumanBytesIsCoarse(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{0, "0Mi"},
		{123456789, "117Mi"},
		{512 << 20, "512Mi"},
		{1<<30 - 1, "1023Mi"},
		{1 << 30, "1.0Gi"},
		{37*(1<<30) + 230<<20, "37.2Gi"},
	} {
		if got := humanBytes(tc.n); got != tc.want {
			t.Errorf("humanBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

// A check writes the status only when something a reader acts on changed:
// free memory moving within its rounding is not a change, a domain
// starting (its vCPUs and memory) is.
func TestStatusChangedByCapacity(t *testing.T) {
	base := func() *crawlv1.KVMHostStatus {
		return &crawlv1.KVMHostStatus{Capacity: &crawlv1.HostCapacity{
			CPUs: 8, MemoryBytes: 16 << 30, FreeMemoryBytes: 10 << 30, FreeMemory: "10.0Gi",
			RunningDomains: 2, AllocatedVCPUs: 3, AllocatedMemoryBytes: 3 << 30,
		}}
	}
	for _, tc := range []struct {
		name    string
		mutate  func(c *crawlv1.HostCapacity)
		changed bool
	}{
		{"same", func(*crawlv1.HostCapacity) {}, false},
		{"free memory moved within its rounding", func(c *crawlv1.HostCapacity) { c.FreeMemoryBytes += 20 << 20 }, false},
		{"free memory moved past its rounding", func(c *crawlv1.HostCapacity) {
			c.FreeMemoryBytes -= 200 << 20
			c.FreeMemory = humanBytes(uint64(c.FreeMemoryBytes))
		}, true},
		{"a domain started", func(c *crawlv1.HostCapacity) {
			c.RunningDomains++
			c.AllocatedVCPUs++
			c.AllocatedMemoryBytes += 512 << 20
		}, true},
		{"CPUs changed", func(c *crawlv1.HostCapacity) { c.CPUs = 16 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			after := base()
			tc.mutate(after.Capacity)
			if got := statusChanged(base(), after); got != tc.changed {
				t.Fatalf("statusChanged = %v, want %v", got, tc.changed)
			}
		})
	}
	if !statusChanged(&crawlv1.KVMHostStatus{}, base()) {
		t.Fatal("capacity appearing is a change")
	}
}
