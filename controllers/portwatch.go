package controllers

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/portwatch"
)

// newPortWatch returns the Proxy controller's port watcher and the channel
// on which it hands over each Proxy whose port opened (a raw source of the
// controller), after telling opened where it opened. Its watches end with
// ctx. It only dials address:port, the same endpoint the probe uses, so it
// serves every provider alike.
func newPortWatch(ctx context.Context, opts portwatch.Options, opened func(key types.NamespacedName, address string)) (*portwatch.Watcher[types.NamespacedName], <-chan event.GenericEvent) {
	out := make(chan event.GenericEvent, 256)
	log := logf.FromContext(ctx)
	w := portwatch.New(ctx, opts, func(key types.NamespacedName, address string) {
		log.V(1).Info("proxy port accepts, probing at once", "proxy", key, "address", address)
		opened(key, address)
		obj := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		select {
		case out <- event.GenericEvent{Object: obj}:
		case <-ctx.Done():
		}
	})
	return w, out
}
