package kubernetes

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// instance maps a pod to the provider-neutral view.
func instance(pod *corev1.Pod) *provider.Instance {
	out := &provider.Instance{
		ProviderID: FormatProviderID(pod.Namespace, pod.Name),
		Name:       pod.Name,
		Host:       pod.Spec.NodeName,
		Owner: provider.Owner{
			Namespace: pod.Namespace,
			Name:      pod.Annotations[AnnotationProxyName],
			UID:       pod.Labels[LabelProxyUID],
		},
		InstallID: pod.Labels[LabelInstall],
	}
	if out.Owner.Name == "" {
		out.Owner.Name = pod.Labels[LabelProxyName]
	}
	if pod.DeletionTimestamp != nil {
		out.State, out.Message = provider.StateDeleting, "pod is terminating"
		return out
	}
	switch pod.Status.Phase {
	case corev1.PodPending, "":
		out.State, out.Message = provider.StatePending, pendingReason(pod)
	case corev1.PodRunning:
		if !podReady(pod) {
			// Running but refusing connections is not usable: report
			// Pending so no address is published before squid listens.
			out.State = provider.StatePending
			out.Message = "readiness probe not passing"
			if r := containerReason(pod); r != "" {
				out.Message += ": " + r
			}
			return out
		}
		out.State = provider.StateRunning
		if ip := podIPv4(pod); ip != "" {
			out.Address, out.AddressSource = ip, provider.AddressSourcePod
			out.Message = containerReason(pod)
		} else {
			out.Message = "pod has no IP yet"
		}
	case corev1.PodSucceeded, corev1.PodFailed:
		// Get and Create replace such a pod; ListByTag still sees it.
		out.State = provider.StateFailed
		out.Message = terminated(pod)
	default:
		out.State = provider.StateUnknown
		out.Message = fmt.Sprintf("pod phase %q", pod.Status.Phase)
	}
	return out
}

// InstanceChanged says whether an update of a pod changes the instance the
// provider reports for it (state, address, node, message: deletion, phase,
// readiness, restarts, why it is not running): the updates its Proxy must
// see at once, decided by the same mapping Get uses.
func InstanceChanged(old, cur *corev1.Pod) bool {
	return *instance(old) != *instance(cur)
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podIPv4 is the first IPv4 pod IP, else the primary one (IPv6-only).
func podIPv4(pod *corev1.Pod) string {
	for _, ip := range pod.Status.PodIPs {
		if strings.Contains(ip.IP, ".") {
			return ip.IP
		}
	}
	return pod.Status.PodIP
}

// pendingReason says why a pod is not running yet, from what the scheduler
// and the kubelet wrote.
func pendingReason(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return strings.TrimSpace("unschedulable: " + c.Message)
		}
	}
	if r := containerReason(pod); r != "" {
		return r
	}
	if pod.Spec.NodeName == "" {
		return "pod not scheduled yet"
	}
	return "pod starting"
}

// containerReason describes the squid container when it is not simply
// running (ImagePullBackOff, CrashLoopBackOff, …) or has restarted, with
// how its last run ended (OOMKilled, exit code): the kubelet restarts squid
// in place, so without this a restart loop shows only as "not ready".
func containerReason(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		var parts []string
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
			part := w.Reason
			if w.Message != "" {
				part += ": " + w.Message
			}
			parts = append(parts, part)
		}
		if r := restarts(cs); r != "" {
			parts = append(parts, r)
		}
		if len(parts) > 0 {
			return "container " + cs.Name + ": " + strings.Join(parts, "; ")
		}
	}
	return ""
}

// maxTerminationMessage bounds what a container's termination message adds
// to a condition.
const maxTerminationMessage = 256

// restarts is "<n> restarts, last exit: <reason> (exit code <c>): <message>",
// or "" for a container that never restarted.
func restarts(cs corev1.ContainerStatus) string {
	if cs.RestartCount == 0 {
		return ""
	}
	out := fmt.Sprintf("%d restarts", cs.RestartCount)
	t := cs.LastTerminationState.Terminated
	if t == nil {
		return out
	}
	reason := t.Reason
	if reason == "" {
		reason = "Error"
	}
	out += fmt.Sprintf(", last exit: %s (exit code %d", reason, t.ExitCode)
	if t.Signal != 0 {
		out += fmt.Sprintf(", signal %d", t.Signal)
	}
	out += ")"
	if msg := strings.TrimSpace(t.Message); msg != "" {
		if len(msg) > maxTerminationMessage {
			msg = msg[:maxTerminationMessage] + "…"
		}
		out += ": " + msg
	}
	return out
}
