package controllers

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
)

// BridgeKVMEvents turns libvirt lifecycle events into Proxy reconcile
// requests: the Proxy is marked dirty (its instance is re-read at once), a
// probe of it under way is interrupted (the reconcile would otherwise wait
// for it), and it is requeued. It runs until ctx ends.
func BridgeKVMEvents(ctx context.Context, src <-chan kvm.DomainEvent, r *ProxyReconciler) <-chan event.GenericEvent {
	out := make(chan event.GenericEvent, 256)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-src:
				key := types.NamespacedName{Namespace: ev.Namespace, Name: ev.Name}
				r.MarkDirty(key)
				r.InterruptProbe(key)
				obj := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ev.Namespace, Name: ev.Name}}
				select {
				case out <- event.GenericEvent{Object: obj}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}
