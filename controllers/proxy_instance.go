package controllers

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
)

// reconcileInstance reads the instance into s.instance, creating it (or
// starting it) when none runs, and records it in status. With an instance
// recorded, Get first: a running one needs no Create (for gcp a Create is
// an insert answered 409). Otherwise Create, which is idempotent and starts
// a stopped instance, then Get.
func (r *ProxyReconciler) reconcileInstance(ctx context.Context, s *proxyScope) (ctrl.Result, error) {
	if s.probeOnly {
		return ctrl.Result{}, nil
	}
	p := s.proxy
	if err := r.attachSquid(p, s.machine, s.creds); err != nil {
		return r.fail(p, reasonFor(err), err)
	}
	if p.Status.ProviderID != "" {
		// probeOnly now: the provider could not be asked; nothing to record.
		if res, err := r.readRecorded(ctx, s); ends(res, err) || s.probeOnly {
			return res, err
		}
	}
	if s.instance == nil {
		if res, err := r.createInstance(ctx, s); ends(res, err) {
			return res, err
		}
	}
	r.recordInstance(p, s.instance)
	r.mem.markSynced(s.key, r.Clock.Now())
	return ctrl.Result{}, nil
}

// readRecorded reads the recorded instance: a running one goes into
// s.instance; one found not running, or a Get that failed otherwise,
// leaves it nil for createInstance.
func (r *ProxyReconciler) readRecorded(ctx context.Context, s *proxyScope) (ctrl.Result, error) {
	p := s.proxy
	inst, err := r.get(ctx, s.provider, s.machine)
	switch {
	case provider.Class(err) == provider.ClassNotFound:
		return r.rebuild(ctx, p)
	case err != nil && provider.Class(err) == provider.ClassTransient && conditions.IsTrue(p, crawlv1.InstanceProvisionedCondition):
		// The provider could not be asked (host busy, link down, call
		// deadline): that says nothing about an instance last seen
		// running. Keep what is known, let the probe judge the proxy,
		// and ask again soon; a Create now would only meet the same
		// outage.
		s.log.Info("instance not re-read, keeping its last state", "providerID", p.Status.ProviderID, "err", err)
		s.probeOnly, s.providerUnreachable = true, true
	case err != nil:
	case inst.State == provider.StateRunning:
		s.instance = inst
	default:
		// Found not running (stopped, crashed, destroyed): the proxy is
		// down now, whatever the last probes said. The probe threshold is
		// for noise on a running instance.
		wasHealthy := conditions.IsTrue(p, crawlv1.ProxyHealthyCondition)
		r.instanceDown(p, inst.State)
		if wasHealthy {
			// Say so before repairing it: starting the instance and
			// probing it again take seconds (a VM's start under load, a
			// probe to an address nothing answers yet), and clients must
			// stop using it now. The next reconcile starts it.
			return ctrl.Result{RequeueAfter: time.Millisecond}, nil
		}
	}
	return ctrl.Result{}, nil
}

// createInstance creates the instance, once what only Create needs is
// there, and reads it back into s.instance.
func (r *ProxyReconciler) createInstance(ctx context.Context, s *proxyScope) (ctrl.Result, error) {
	p, m := s.proxy, s.machine
	if wait, err := r.resolveForCreate(ctx, p, m); wait != nil || err != nil {
		return r.stopFor(p, wait, err)
	}
	callCtx, cancel := r.providerCall(ctx)
	created, err := s.provider.Create(callCtx, m)
	cancel()
	if err != nil {
		return r.fail(p, reasonFor(err), err)
	}
	r.recordInstance(p, created)
	inst, err := r.get(ctx, s.provider, m)
	switch {
	case provider.Class(err) == provider.ClassNotFound:
		return r.rebuild(ctx, p)
	case err != nil:
		return r.fail(p, reasonFor(err), err)
	}
	s.instance = inst
	return ctrl.Result{}, nil
}

func (r *ProxyReconciler) get(ctx context.Context, prov provider.Provider, m *provider.Machine) (*provider.Instance, error) {
	callCtx, cancel := r.providerCall(ctx)
	defer cancel()
	return prov.Get(callCtx, m)
}

// rebuild forgets an instance its host reports gone (the host answered, so
// this is not an outage); the next reconcile, at once, creates it again.
func (r *ProxyReconciler) rebuild(ctx context.Context, p *crawlv1.Proxy) (ctrl.Result, error) {
	logf.FromContext(ctx).Info("instance missing, rebuilding", "providerID", p.Status.ProviderID)
	r.Recorder.Eventf(p, "Warning", "InstanceMissing", "instance %s not found on its host; rebuilding", p.Status.ProviderID)
	p.Status.ProviderID, p.Status.Address, p.Status.Endpoint = "", "", ""
	r.setNotProvisioned(p, crawlv1.ProxyInstanceMissingReason, "instance not found; rebuilding")
	r.forgetHealth(p, "instance not found; rebuilding")
	return ctrl.Result{RequeueAfter: time.Millisecond}, nil
}

// instanceDown records that the instance was found not running: ProxyHealthy
// goes False at once, so the next probe decides afresh.
func (r *ProxyReconciler) instanceDown(p *crawlv1.Proxy, state provider.State) {
	conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionFalse,
		Reason: crawlv1.ProxyInstanceNotRunningReason, Message: fmt.Sprintf("instance was found %s; starting it", state)})
}

// recordInstance writes what the provider reports of the instance into
// status; a new instance or address drops the health verdict.
func (r *ProxyReconciler) recordInstance(p *crawlv1.Proxy, inst *provider.Instance) {
	if inst == nil {
		return
	}
	switch prevID, prevAddr := p.Status.ProviderID, p.Status.Address; {
	case prevID != "" && inst.ProviderID != "" && inst.ProviderID != prevID:
		r.forgetHealth(p, fmt.Sprintf("a new instance %s replaced %s", inst.ProviderID, prevID))
	case prevAddr != "" && inst.Address != "" && inst.Address != prevAddr:
		r.forgetHealth(p, fmt.Sprintf("address changed from %s to %s", prevAddr, inst.Address))
	}
	if inst.ProviderID != "" {
		p.Status.ProviderID = inst.ProviderID
	}
	if inst.Host != "" {
		p.Status.Host = inst.Host
	}
	p.Status.Address, p.Status.AddressSource, p.Status.Endpoint = inst.Address, inst.AddressSource, ""
	if inst.Address != "" {
		p.Status.Endpoint = "http://" + net.JoinHostPort(inst.Address, strconv.Itoa(int(p.Spec.Port)))
	}
}

// forgetHealth drops the health verdict: it was about another instance or
// address, and the failure threshold must not keep a proxy that has never
// answered here Ready. The next probe starts from scratch (first-probe
// backoff and a new port watch included).
func (r *ProxyReconciler) forgetHealth(p *crawlv1.Proxy, why string) {
	conditions.Set(p, metav1.Condition{Type: crawlv1.ProxyHealthyCondition, Status: metav1.ConditionFalse,
		Reason: crawlv1.ProxyNotYetProbedReason, Message: why})
	p.Status.Probe = nil
	r.forgetPort(client.ObjectKeyFromObject(p))
}
