package kubernetes

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// currentPod deletes the Proxy's pods (podsOf) gone for good and returns
// the one to report: the recorded pod or (nothing recorded: a crash
// between our create and the status write) the newest live one; nil when
// there is none. next is the incarnation a new pod gets, recordedExists
// whether the recorded pod is still there.
func (p *Provider) currentPod(ctx context.Context, m *provider.Machine, pods []corev1.Pod, recorded string) (current *corev1.Pod, next int, recordedExists bool, err error) {
	for i := range pods {
		pod := &pods[i]
		next = max(next, incarnation(pod)+1)
		recordedExists = recordedExists || pod.Name == recorded
		if why := p.gone(ctx, pod); why != "" {
			if err := p.deleteGone(ctx, m, pod, why); err != nil {
				return nil, 0, false, err
			}
			continue
		}
		if m.ProviderID == "" || pod.Name == recorded {
			return pod, next, recordedExists, nil
		}
	}
	return nil, next, recordedExists, nil
}

// podsOf lists the Proxy's pods, newest incarnation first, through the API
// reader: a replacement's name must not be chosen from a lagging cache.
func (p *Provider) podsOf(ctx context.Context, m *provider.Machine) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := p.r.List(ctx, &list, client.InNamespace(m.Namespace),
		client.MatchingLabels{LabelManagedBy: ManagedBy, LabelProxyUID: m.UID}); err != nil {
		return nil, classify(err, "list pods of Proxy "+m.Namespace+"/"+m.Name)
	}
	pods := list.Items[:0]
	for _, pod := range list.Items {
		if checkOwner(&pod, m) == nil {
			pods = append(pods, pod)
		}
	}
	sort.Slice(pods, func(i, j int) bool { return incarnation(&pods[i]) > incarnation(&pods[j]) })
	return pods, nil
}

// allRunCounter says whether every pod of pods that may still read the
// ConfigMap has the upstream counter (runsCounter); true for none, as the
// pod Create makes will. Terminal and terminating pods read nothing more
// that matters.
func allRunCounter(pods []corev1.Pod) bool {
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil || terminated(pod) != "" {
			continue
		}
		if !runsCounter(pod) {
			return false
		}
	}
	return true
}

// terminated says why pod has ended for good, or "" while it has not:
// with restartPolicy Always a terminal pod was evicted or its node shut
// down, and the kubelet will not start it again.
func terminated(pod *corev1.Pod) string {
	ph := pod.Status.Phase
	if ph != corev1.PodFailed && ph != corev1.PodSucceeded {
		return ""
	}
	return strings.TrimSpace(fmt.Sprintf("pod %s: %s %s", strings.ToLower(string(ph)), pod.Status.Reason, pod.Status.Message))
}

func incarnation(pod *corev1.Pod) int {
	n, _ := strconv.Atoi(pod.Annotations[AnnotationIncarnation])
	return n
}

// gone says why pod will never serve again and must be replaced under a
// new name, or "" while it may serve or is about to go by itself.
func (p *Provider) gone(ctx context.Context, pod *corev1.Pod) string {
	if pod.DeletionTimestamp == nil {
		// Evicted or its node shut down: kept until pod garbage collection.
		return terminated(pod)
	}
	// Being deleted: a terminal phase is the kubelet's last status write on
	// the way out (squid exits 0 on SIGTERM), and the pod is removed right
	// after, so its name is reused once it has gone. Only a pod stuck past
	// the bound on a node that is NotReady or gone is written off.
	if time.Since(pod.DeletionTimestamp.Time) < p.opts.StuckDeletionAfter {
		return ""
	}
	if pod.Spec.NodeName == "" {
		return "pod stuck terminating, never scheduled"
	}
	var node corev1.Node
	if err := p.r.Get(ctx, types.NamespacedName{Name: pod.Spec.NodeName}, &node); err != nil {
		if apierrors.IsNotFound(err) {
			return "pod stuck terminating, node " + pod.Spec.NodeName + " is gone"
		}
		// Cannot tell: a pod that may still run is not written off.
		logf.FromContext(ctx).V(1).Info("cannot read the node of a pod stuck terminating", "pod", pod.Name, "node", pod.Spec.NodeName, "err", err)
		return ""
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			return fmt.Sprintf("pod stuck terminating since %s on node %s, which is NotReady (%s)",
				pod.DeletionTimestamp.UTC().Format(time.RFC3339), node.Name, c.Reason)
		}
	}
	return ""
}

// deleteGone deletes a pod written off (UID precondition: only that pod),
// unless its deletion is pending already. A stuck pod is not force-deleted:
// its node may be partitioned, not dead, and only its removal proves the
// container stopped; the replacement's new name does not need the old one
// gone.
func (p *Provider) deleteGone(ctx context.Context, m *provider.Machine, pod *corev1.Pod, why string) error {
	logf.FromContext(ctx).Info("replacing a pod gone for good", "pod", pod.Name, "reason", why)
	if pod.DeletionTimestamp != nil {
		return nil
	}
	return p.deleteOne(ctx, m, client.ObjectKeyFromObject(pod), &corev1.Pod{})
}
