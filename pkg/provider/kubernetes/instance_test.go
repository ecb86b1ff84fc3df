package kubernetes

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"crawl.example.com/proxy-operator/pkg/provider"
)

func TestGetPhaseMapping(t *testing.T) {
	ready := func(s corev1.ConditionStatus) []corev1.PodCondition {
		return []corev1.PodCondition{{Type: corev1.PodReady, Status: s}}
	}
	for _, tc := range []struct {
		name     string
		status   corev1.PodStatus
		deleting bool
		want     provider.State
		addr     string
		msg      string
	}{
		{name: "new", status: corev1.PodStatus{}, want: provider.StatePending, msg: "not scheduled"},
		{name: "pending", status: corev1.PodStatus{Phase: corev1.PodPending}, want: provider.StatePending},
		{name: "unschedulable", status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available: 3 Insufficient cpu.",
		}}}, want: provider.StatePending, msg: "Insufficient cpu"},
		{name: "image pull", status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "squid", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}},
		}}}, want: provider.StatePending, msg: "ImagePullBackOff"},
		{name: "running ready", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionTrue)},
			want: provider.StateRunning, addr: "10.1.2.3"},
		{name: "running ready dual-stack", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "fd00::5",
			PodIPs: []corev1.PodIP{{IP: "fd00::5"}, {IP: "10.1.2.4"}}, Conditions: ready(corev1.ConditionTrue)},
			want: provider.StateRunning, addr: "10.1.2.4"},
		{name: "running not ready", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionFalse)},
			want: provider.StatePending, msg: "readiness probe not passing"},
		{name: "crash loop", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionFalse),
			ContainerStatuses: []corev1.ContainerStatus{{Name: "squid", RestartCount: 4, State: corev1.ContainerState{
				Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}},
			want: provider.StatePending, msg: "CrashLoopBackOff"},
		{name: "crash loop after OOM kill", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionFalse),
			ContainerStatuses: []corev1.ContainerStatus{{Name: "squid", RestartCount: 3,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}},
			want: provider.StatePending, msg: "container squid: CrashLoopBackOff; 3 restarts, last exit: OOMKilled (exit code 137)"},
		{name: "restarted, not ready yet", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionFalse),
			ContainerStatuses: []corev1.ContainerStatus{{Name: "squid", RestartCount: 1,
				State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1, Message: "FATAL: Bungled squid.conf"}}}}},
			want: provider.StatePending, msg: "readiness probe not passing: container squid: 1 restarts, last exit: Error (exit code 1): FATAL: Bungled squid.conf"},
		{name: "running ready after restarts", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionTrue),
			ContainerStatuses: []corev1.ContainerStatus{{Name: "squid", RestartCount: 2, Ready: true,
				State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}},
			want: provider.StateRunning, addr: "10.1.2.3", msg: "2 restarts, last exit: OOMKilled (exit code 137)"},
		{name: "unknown", status: corev1.PodStatus{Phase: corev1.PodUnknown}, want: provider.StateUnknown},
		{name: "terminating", status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: ready(corev1.ConditionTrue), PodIP: "10.1.2.3"},
			deleting: true, want: provider.StateDeleting},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := machine()
			p0 := newProvider(newFake(t))
			pod := p0.pod(m, podKey(m), 0, false)
			pod.Status = tc.status
			if tc.deleting {
				now := metav1.Now()
				pod.DeletionTimestamp = &now
				pod.Finalizers = []string{"test/keep"}
			}
			p := newProvider(newFake(t, pod))
			inst, err := p.Get(context.Background(), m)
			if err != nil {
				t.Fatal(err)
			}
			if inst.State != tc.want || inst.Address != tc.addr || !strings.Contains(inst.Message, tc.msg) {
				t.Errorf("Get = %+v; want state %s addr %q message ~%q", inst, tc.want, tc.addr, tc.msg)
			}
			if tc.addr != "" && inst.AddressSource != provider.AddressSourcePod {
				t.Errorf("address source = %q", inst.AddressSource)
			}
			if inst.Owner != (provider.Owner{Namespace: "crawl", Name: "eu-egress", UID: uid}) {
				t.Errorf("owner = %+v", inst.Owner)
			}
		})
	}

	t.Run("missing", func(t *testing.T) {
		_, err := newProvider(newFake(t)).Get(context.Background(), machine())
		wantClass(t, err, provider.ClassNotFound)
	})
}
