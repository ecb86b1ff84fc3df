package controllers

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// STUB: the publishing work replaces this file (Secret <pool>-proxies with
// proxies.txt and proxies.json, a headless Service and its EndpointSlices).
// Keep the signatures.

// Publisher writes what a pool publishes for crawlers.
type Publisher struct{ Client client.Client }

// Publish makes the pool's published objects list exactly replicas: the
// pool's Ready replicas that are not draining, sorted by name. The pool
// controller calls it whenever that list or a published field of its
// replicas changes (and at least every few minutes); replicas are read-only
// (shared with the informer cache).
func (p *Publisher) Publish(_ context.Context, _ *crawlv1.ProxyPool, _ []crawlv1.Proxy) error {
	return nil
}
