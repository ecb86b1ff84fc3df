package controllers

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
)

// reconcileAddress turns InstanceProvisioned True once the instance runs
// with an address, and puts the url into the credential Secret; until then
// the Proxy waits (waitForAddress).
func (r *ProxyReconciler) reconcileAddress(ctx context.Context, s *proxyScope) (ctrl.Result, error) {
	if s.probeOnly {
		return ctrl.Result{}, nil
	}
	p, inst := s.proxy, s.instance
	if inst.State != provider.StateRunning || inst.Address == "" {
		return r.waitForAddress(p, inst)
	}
	r.mem.stopWaiting(s.key)
	conditions.Set(p, metav1.Condition{Type: crawlv1.InstanceProvisionedCondition, Status: metav1.ConditionTrue,
		Reason: crawlv1.ProxyReadyReason, Message: provisionedMessage(inst)})
	if s.creds != nil {
		// The address is known now: the url in the credential Secret
		// follows it.
		if err := r.writeCredentials(ctx, p, s.creds); err != nil {
			return r.fail(p, reasonFor(err), err)
		}
	}
	return ctrl.Result{}, nil
}

func provisionedMessage(inst *provider.Instance) string {
	msg := fmt.Sprintf("running on %s, address %s from %s", inst.Host, inst.Address, inst.AddressSource)
	if inst.Message != "" {
		// What the provider remarks on a running instance (the guest
		// agent disagreeing with the lease, squid's restarts) stays visible.
		msg += "; " + inst.Message
	}
	return msg
}

// waitForAddress keeps the Proxy Provisioning while the instance boots, and
// fails it with what was missing once AddressTimeout has passed since this
// manager first saw it waiting.
func (r *ProxyReconciler) waitForAddress(p *crawlv1.Proxy, inst *provider.Instance) (ctrl.Result, error) {
	reason, msg := crawlv1.ProxyProvisioningReason, fmt.Sprintf("instance is %s", inst.State)
	if inst.State == provider.StateRunning {
		reason, msg = crawlv1.ProxyWaitingForAddressReason, "running, no routable IPv4 address yet"
	}
	if inst.Message != "" {
		msg += ": " + inst.Message
	}
	if inst.State == provider.StateFailed {
		r.setNotProvisioned(p, crawlv1.ProxyPermanentErrorReason, msg)
		return ctrl.Result{RequeueAfter: r.ResyncInterval}, nil
	}
	since := r.mem.waitingSince(client.ObjectKeyFromObject(p), r.Clock.Now())
	if waited := r.Clock.Since(since); waited > r.AddressTimeout {
		r.setNotProvisioned(p, crawlv1.ProxyAddressTimeoutReason, fmt.Sprintf("no address after %s: %s", waited.Round(time.Second), msg))
		// Keep looking, slowly: a late address still heals the Proxy.
		return ctrl.Result{RequeueAfter: max(r.ProvisionPollInterval, time.Minute)}, nil
	}
	r.setNotProvisioned(p, reason, msg)
	return ctrl.Result{RequeueAfter: r.ProvisionPollInterval}, nil
}
