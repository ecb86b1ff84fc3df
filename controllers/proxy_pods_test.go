package controllers

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"crawl.example.com/proxy-operator/pkg/provider/kubernetes"
)

func TestSquidPodChanged(t *testing.T) {
	running := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "proxy-a-1234abcd", ResourceVersion: "1"},
			Status: corev1.PodStatus{
				// Dual-stack, IPv6 primary: the provider reports the IPv4.
				Phase: corev1.PodRunning, PodIP: "fd00::5", PodIPs: []corev1.PodIP{{IP: "fd00::5"}, {IP: "10.244.0.5"}},
				Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: "squid", Ready: true}},
			},
		}
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name   string
		change func(*corev1.Pod)
		want   bool
	}{
		{"kubelet's heartbeat-like write", func(p *corev1.Pod) {
			p.ResourceVersion = "2"
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue})
		}, false},
		{"labels changed", func(p *corev1.Pod) { p.Labels = map[string]string{"a": "b"} }, false},
		{"marked for deletion", func(p *corev1.Pod) { p.DeletionTimestamp = &now }, true},
		{"evicted", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }, true},
		{"address changed", func(p *corev1.Pod) { p.Status.PodIPs[1].IP = "10.244.0.6" }, true},
		{"readiness lost", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }, true},
		{"squid restarted", func(p *corev1.Pod) { p.Status.ContainerStatuses[0].RestartCount = 1 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := running()
			tc.change(cur)
			if got := squidPodChanged.Update(event.UpdateEvent{ObjectOld: running(), ObjectNew: cur}); got != tc.want {
				t.Errorf("Update = %v, want %v", got, tc.want)
			}
		})
	}
	if !squidPodChanged.Delete(event.DeleteEvent{Object: running()}) {
		t.Error("Delete = false, want true")
	}
	if squidPodChanged.Create(event.CreateEvent{Object: running()}) {
		t.Error("Create = true, want false: the controller made it")
	}
}

func TestProxyOfPod(t *testing.T) {
	yes := true
	owned := func(apiVersion, kind string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "proxy-a-1234abcd",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "a", UID: "u", Controller: &yes}}}}
	}
	key := types.NamespacedName{Namespace: "crawl", Name: "a"}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"a Proxy's squid pod", owned(kubernetes.ProxyAPIVersion, kubernetes.ProxyKind), true},
		{"a ReplicaSet's pod", owned("apps/v1", "ReplicaSet"), false},
		{"another group's Proxy", owned("other.example.com/v1", kubernetes.ProxyKind), false},
		{"no owner", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "x"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &ProxyReconciler{}
			now := time.Now()
			r.mem.markSynced(key, now)
			reqs := r.proxyOfPod(context.Background(), tc.pod)
			if got := len(reqs) == 1 && reqs[0].NamespacedName == key; got != tc.want || (!tc.want && len(reqs) != 0) {
				t.Fatalf("proxyOfPod = %v, want the Proxy's request: %v", reqs, tc.want)
			}
			// Its instance is read again at the reconcile this wakes.
			if dirty := !r.mem.readWithin(key, time.Hour, now); dirty != tc.want {
				t.Errorf("Proxy marked dirty: %v, want %v", dirty, tc.want)
			}
		})
	}
}
