package controllers

import (
	"testing"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// A pool's replicas carry the pool's name to the provider, which spreads
// them over nodes (kubernetes); a Proxy of no pool spreads with nothing.
func TestMachineSpreadGroupIsThePool(t *testing.T) {
	p := &crawlv1.Proxy{}
	p.Labels = map[string]string{crawlv1.PoolNameLabel: "crawl-a"}
	if g := baseMachine(p, "t").SpreadGroup; g != "crawl-a" {
		t.Fatalf("SpreadGroup = %q, want the pool's name", g)
	}
	if g := baseMachine(&crawlv1.Proxy{}, "t").SpreadGroup; g != "" {
		t.Fatalf("SpreadGroup of a standalone Proxy = %q", g)
	}
}
