package controllers

import (
	"context"

	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// reconcilePolicy refuses, permanently, a Proxy that breaks a rule
// admission applies under the manager's flags, with the functions
// admission calls: a managed spec.access by proxyaccess.Validate
// (--allow-destination-exceptions), spec.cloudInit by
// plugin.Policy.ValidateCloudInit (--allow-proxy-user-data). Such a Proxy
// was stored before the rule, or with the webhook bypassed; nothing is
// created, copied or probed for it. An instance made before the rule is
// left alone (no provider call), and not Ready.
func (r *ProxyReconciler) reconcilePolicy(_ context.Context, s *proxyScope) (ctrl.Result, error) {
	p := s.proxy
	var errs field.ErrorList
	if p.IsManaged() {
		errs = append(errs, proxyaccess.Validate(p.Spec.Access, r.DestinationExceptionGrants)...)
	}
	errs = append(errs, plugin.Policy{RefuseUserData: r.RefuseUserData}.ValidateCloudInit(&p.Spec)...)
	if len(errs) == 0 {
		return ctrl.Result{}, nil
	}
	return r.fail(p, crawlv1.ProxySpecRefusedReason, provider.Permanentf("refused by the manager's rules: %v", errs.ToAggregate()))
}
