package controllers

import (
	"context"
	"errors"
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
	r.attachSquid(p, s.machine, s.creds, s.stats)
	// probeOnly after a call: the provider could not be asked; nothing to
	// record, and the instance was not read.
	if p.Status.ProviderID != "" {
		if res, err := r.readRecorded(ctx, s); ends(res, err) || s.probeOnly {
			return res, err
		}
	}
	if s.instance == nil {
		if res, err := r.createInstance(ctx, s); ends(res, err) || s.probeOnly {
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
	inst, err := r.get(ctx, s)
	switch {
	case provider.Class(err) == provider.ClassNotFound:
		return r.rebuild(ctx, p)
	case errors.Is(err, provider.ErrUnavailable):
		return r.hostNotAnswering(s, err)
	case errors.Is(err, provider.ErrBusy) && !conditions.IsTrue(p, crawlv1.InstanceProvisionedCondition):
		// A Create now would be turned away too.
		return waitBusy(ctx, err)
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
	return ctrl.Result{}, nil //nolint:nilerr // a Get failing otherwise leaves s.instance nil: createInstance's idempotent Create finds or makes it
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
	noteHost(p, err)
	switch {
	case errors.Is(err, provider.ErrUnavailable):
		return r.hostNotAnswering(s, err)
	case errors.Is(err, provider.ErrBusy):
		return waitBusy(ctx, err)
	case err != nil:
		return r.fail(p, reasonFor(err), err)
	}
	r.recordInstance(p, created)
	inst, err := r.get(ctx, s)
	switch {
	case provider.Class(err) == provider.ClassNotFound:
		return r.rebuild(ctx, p)
	case errors.Is(err, provider.ErrUnavailable):
		return r.hostNotAnswering(s, err)
	case errors.Is(err, provider.ErrBusy):
		return waitBusy(ctx, err)
	case err != nil:
		return r.fail(p, reasonFor(err), err)
	}
	s.instance = inst
	return ctrl.Result{}, nil
}

// busyRetry is how soon a Proxy turned away by a busy provider asks
// again if no event has woken it first.
const busyRetry = 5 * time.Second

// waitBusy handles a call the provider turned away as busy
// (provider.ErrBusy): flow control, not a failure. Nothing about the
// instance changed, so status stays as it is, and no error goes back to
// the controller: no backoff that doubles at each refusal and no error
// log per refusal. The provider wakes the Proxy when a call slot frees;
// busyRetry is the safety net.
func waitBusy(ctx context.Context, err error) (ctrl.Result, error) {
	logf.FromContext(ctx).V(1).Info("provider busy; waiting for a call slot", "err", err.Error())
	return ctrl.Result{RequeueAfter: busyRetry}, nil
}

// get reads s's instance.
func (r *ProxyReconciler) get(ctx context.Context, s *proxyScope) (*provider.Instance, error) {
	callCtx, cancel := r.providerCall(ctx)
	defer cancel()
	inst, err := s.provider.Get(callCtx, s.machine)
	noteHost(s.proxy, err)
	return inst, err
}

// noteHost records what a provider call (its error, err) says of the
// instance's host: HostUnavailable while the provider refuses to call it
// (provider.ErrUnavailable), removed as soon as a call goes to the host,
// whatever it returns.
func noteHost(p *crawlv1.Proxy, err error) {
	if errors.Is(err, provider.ErrUnavailable) {
		conditions.Set(p, metav1.Condition{Type: crawlv1.HostUnavailableCondition, Status: metav1.ConditionTrue,
			Reason: crawlv1.ProxyHostNotAnsweringReason, Message: err.Error()})
		return
	}
	conditions.Delete(p, crawlv1.HostUnavailableCondition)
}

// hostNotAnswering ends a phase whose provider call was refused because the
// instance's host does not answer (noteHost recorded it). What is known of
// the instance stays: a provisioned Proxy goes on to be probed, its proxy
// likely serving still (a hung libvirtd stops no guest), and is read again
// when the host answers; the provider wakes it then, and its probe
// schedule brings it back in any case. A Proxy without a provisioned
// instance says why it waits, and is retried within dependencyPoll: no
// worker waits on the host meanwhile.
func (r *ProxyReconciler) hostNotAnswering(s *proxyScope, err error) (ctrl.Result, error) {
	p := s.proxy
	s.log.V(1).Info("host not answering; instance not read, keeping its last state", "providerID", p.Status.ProviderID, "err", err)
	if conditions.IsTrue(p, crawlv1.InstanceProvisionedCondition) {
		s.probeOnly = true
		return ctrl.Result{}, nil
	}
	r.setNotProvisioned(p, crawlv1.ProxyHostNotAnsweringReason, err.Error())
	return ctrl.Result{RequeueAfter: dependencyPoll}, nil
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
