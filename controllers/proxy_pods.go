package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
)

// The kubernetes provider's squid pods are what libvirt's domains are to
// kvm: a change the Proxy must see at once (pod deleted, evicted, going
// away, its address or readiness changed, squid restarted), not at its next
// probe or resync. Their Proxy is their controller owner.

// squidPodChanged passes the pod events that change what the provider's
// Get reports (kubernetes.InstanceChanged: deletion, phase, address,
// readiness, restarts, why it is not running), and deletions. Creations
// are the controller's own (or the cache's first list, when every Proxy is
// queued anyway); kubelet's other status writes change nothing a Proxy
// shows.
var squidPodChanged = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, okOld := e.ObjectOld.(*corev1.Pod)
		cur, okCur := e.ObjectNew.(*corev1.Pod)
		return okOld && okCur && kubernetes.InstanceChanged(old, cur)
	},
}

// proxyOfPod maps a squid pod to its Proxy, marked dirty (its instance is
// re-read at once) with any probe of it under way interrupted, as a libvirt
// lifecycle event does (BridgeKVMEvents). Pods no Proxy controls map to
// nothing.
func (r *ProxyReconciler) proxyOfPod(_ context.Context, obj client.Object) []ctrl.Request {
	owner := metav1.GetControllerOf(obj)
	if owner == nil || owner.Kind != kubernetes.ProxyKind || owner.APIVersion != kubernetes.ProxyAPIVersion {
		return nil
	}
	key := types.NamespacedName{Namespace: obj.GetNamespace(), Name: owner.Name}
	r.MarkDirty(key)
	r.InterruptProbe(key)
	return []ctrl.Request{{NamespacedName: key}}
}
