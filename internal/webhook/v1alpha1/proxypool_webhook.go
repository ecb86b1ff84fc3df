package v1alpha1

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/fleet"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
)

// SetupWithManager registers the ProxyPool webhook.
func (w *ProxyPoolWebhook) SetupWithManager(mgr ctrl.Manager) error {
	if err := w.Proxy.Plugins.Validate(); err != nil {
		return fmt.Errorf("ProxyPool webhook: Proxy.Plugins (controllers.Plugins()): %w", err)
	}
	return ctrl.NewWebhookManagedBy(mgr, &crawlv1.ProxyPool{}).WithValidator(w).Complete()
}

// +kubebuilder:webhook:path=/validate-crawl-example-com-v1alpha1-proxypool,mutating=false,failurePolicy=fail,sideEffects=None,groups=crawl.example.com,resources=proxypools,verbs=create;update,versions=v1alpha1,name=vproxypool.crawl.example.com,admissionReviewVersions=v1

// ProxyPoolWebhook validates ProxyPools. It defaults nothing: the pool's
// own defaults are the controller's (an empty field keeps meaning the
// operator's default), and defaulting the template would change the hash
// that tells its replicas out of date. The template is validated as each
// replica will be: defaulted by the Proxy webhook, then validated by it.
type ProxyPoolWebhook struct {
	// Proxy is the Proxy webhook every replica passes: the manager's
	// policy (--allow-proxy-image-urls) and the providers' plug-ins, whose
	// placement domains also decide which pool placement fields apply.
	Proxy ProxyWebhook
}

func (w *ProxyPoolWebhook) ValidateCreate(_ context.Context, p *crawlv1.ProxyPool) (admission.Warnings, error) {
	return slices.Concat(templateWarnings(p), w.egressWarnings(p), rotationWarnings(p)), toInvalid(p, w.validate(p))
}

func (w *ProxyPoolWebhook) ValidateUpdate(_ context.Context, old, p *crawlv1.ProxyPool) (admission.Warnings, error) {
	if leftAlone(p, old.Spec, p.Spec) {
		return nil, nil
	}
	errs := ratchet(w.validate(p), w.validate(old))
	if !equality.Semantic.DeepEqual(old.Spec.Selector, p.Spec.Selector) {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "selector"), "selector is immutable: the pool would lose its replicas"))
	}
	return slices.Concat(templateWarnings(p), w.egressWarnings(p), rotationWarnings(p)), toInvalid(p, errs)
}

// rotationWarnings: rotation limits that cannot replace the pool within
// one maxAge are allowed (a pool may be about to shrink), but the pool
// will report RotationBehind; say so when they are written.
func rotationWarnings(p *crawlv1.ProxyPool) admission.Warnings {
	policy, err := fleet.PolicyFor(&p.Spec)
	if err != nil || policy.MaxAge <= 0 {
		return nil // refused, or no rotation
	}
	if n := policy.RotationsPerMaxAge(); n < policy.Replicas {
		return admission.Warnings{fmt.Sprintf("spec.rotation: the limits replace at most %d of %d replicas per maxAge %s (%s): replicas will outlive maxAge (RotationBehind)",
			n, policy.Replicas, policy.MaxAge, policy.RotationLimits())}
	}
	return nil
}

// templateWarnings are the Proxy webhook's warnings about access that
// every replica would draw.
func templateWarnings(p *crawlv1.ProxyPool) admission.Warnings {
	return proxyaccess.Warnings(field.NewPath("spec", "template", "spec", "access"), p.Spec.Template.Spec.Access)
}

func (w *ProxyPoolWebhook) ValidateDelete(context.Context, *crawlv1.ProxyPool) (admission.Warnings, error) {
	return nil, nil
}

func (w *ProxyPoolWebhook) validate(p *crawlv1.ProxyPool) field.ErrorList {
	errs := ValidateProxyPoolName(p.Name)
	errs = append(errs, w.validateTemplate(p)...)
	errs = append(errs, validatePoolSpec(&p.Spec)...)
	errs = append(errs, w.validateEgress(p)...)
	return errs
}

// validateEgress refuses an echo URL the measurement cannot use, and
// egress.distinct Required on a provider whose plug-in says its instances
// share one egress address (docs/egress.md): the pool could never keep it.
func (w *ProxyPoolWebhook) validateEgress(p *crawlv1.ProxyPool) field.ErrorList {
	eg := field.NewPath("spec", "egress")
	var errs field.ErrorList
	if err := proxyprobe.ValidateEchoURL(p.Spec.Egress.EchoURL); err != nil {
		errs = append(errs, field.Invalid(eg.Child("echoURL"), p.Spec.Egress.EchoURL, err.Error()))
	}
	if p.Spec.Egress.Distinct == crawlv1.EgressDistinctRequired {
		if pl := w.Proxy.Plugins.Get(string(p.Spec.Template.Spec.Provider)); pl != nil {
			if why := plugin.SharedEgressOf(pl, &p.Spec.Template.Spec); why != "" {
				errs = append(errs, field.Invalid(eg.Child("distinct"), p.Spec.Egress.Distinct,
					"cannot be kept: "+why+"; use Preferred (counted and reported) or Ignore"))
			}
		}
	}
	return errs
}

// egressWarnings: with Preferred (the default) on a provider whose
// instances share one egress, the pool will report one address.
func (w *ProxyPoolWebhook) egressWarnings(p *crawlv1.ProxyPool) admission.Warnings {
	if p.Spec.Egress.Distinct == crawlv1.EgressDistinctIgnore {
		return nil
	}
	pl := w.Proxy.Plugins.Get(string(p.Spec.Template.Spec.Provider))
	if pl == nil {
		return nil
	}
	if why := plugin.SharedEgressOf(pl, &p.Spec.Template.Spec); why != "" && p.Spec.Egress.Distinct != crawlv1.EgressDistinctRequired {
		return admission.Warnings{"spec.egress.distinct: " + why + ": the replicas will not have distinct egress addresses"}
	}
	return nil
}

// ValidateProxyPoolName: the pool publishes and names its replicas under
// its name; the rule is the API's.
func ValidateProxyPoolName(name string) field.ErrorList {
	return crawlv1.ValidateProxyPoolName(field.NewPath("metadata", "name"), name)
}

// reservedTemplateLabels and -Annotations are the pool's own marks on its
// replicas; in a template they would mark every replica (a delete-proxy
// annotation would replace each forever).
var (
	reservedTemplateLabels      = []string{crawlv1.PoolNameLabel, crawlv1.TemplateHashLabel}
	reservedTemplateAnnotations = []string{crawlv1.DeleteProxyAnnotation, crawlv1.DrainingAnnotation, crawlv1.RotationAnnotation,
		crawlv1.StartupFailuresAnnotation, crawlv1.ReplacesAnnotation, crawlv1.SkipCleanupAnnotation}
)

func (w *ProxyPoolWebhook) validateTemplate(p *crawlv1.ProxyPool) field.ErrorList {
	errs := validateSelection(p)
	// Each replica is the template, placed by the pool, defaulted and
	// validated by the Proxy webhook.
	replica := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "replica"}, Spec: *p.Spec.Template.Spec.DeepCopy()}
	errs = append(errs, w.placeReplica(p, replica)...)
	w.Proxy.DefaultProxy(replica)
	for _, e := range w.Proxy.ValidateProxy(replica) {
		rest, ok := strings.CutPrefix(e.Field, "spec")
		if !ok {
			continue // the replica's name is the pool's, checked above
		}
		e.Field = "spec.template.spec" + rest
		errs = append(errs, e)
	}
	return errs
}

// validateSelection checks that the pool finds its replicas (the selector
// matches the template's labels) and that the template leaves the pool's
// own marks to the pool.
func validateSelection(p *crawlv1.ProxyPool) field.ErrorList {
	spec := field.NewPath("spec")
	meta := spec.Child("template", "metadata")
	tpl := &p.Spec.Template
	var errs field.ErrorList

	sel := &p.Spec.Selector
	errs = append(errs, metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, spec.Child("selector"))...)
	if len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
		errs = append(errs, field.Required(spec.Child("selector"), "select the template's labels; an empty selector would select every Proxy"))
	}
	errs = append(errs, metav1validation.ValidateLabels(tpl.Metadata.Labels, meta.Child("labels"))...)
	errs = append(errs, apivalidation.ValidateAnnotations(tpl.Metadata.Annotations, meta.Child("annotations"))...)
	if s, err := metav1.LabelSelectorAsSelector(sel); err == nil && !s.Empty() && !s.Matches(labels.Set(tpl.Metadata.Labels)) {
		// As a string: an empty and an absent map read alike.
		errs = append(errs, field.Invalid(meta.Child("labels"), labels.Set(tpl.Metadata.Labels).String(), fmt.Sprintf("do not match spec.selector (%s): the pool would not find its replicas", s)))
	}
	for _, k := range reservedTemplateLabels {
		if _, ok := tpl.Metadata.Labels[k]; ok {
			errs = append(errs, field.Forbidden(meta.Child("labels").Key(k), "set by the pool on each replica"))
		}
	}
	for _, k := range reservedTemplateAnnotations {
		if _, ok := tpl.Metadata.Annotations[k]; ok {
			errs = append(errs, field.Forbidden(meta.Child("annotations").Key(k), "set on one replica, never on every replica"))
		}
	}
	return errs
}

// placeReplica gives replica the pool's placement as the pool will, and
// checks that each placement field applies to the replicas' placement
// domain and is not also set in the template.
func (w *ProxyPoolWebhook) placeReplica(p *crawlv1.ProxyPool, replica *crawlv1.Proxy) field.ErrorList {
	spec := field.NewPath("spec")
	pl, tplPl := &p.Spec.Placement, spec.Child("template", "spec", "placement")
	plugins := w.Proxy.Plugins
	domain := plugins.DomainOf(string(replica.Spec.Provider))
	onlyFor := func(d plugin.Domain) string {
		return "only for " + strings.Join(plugins.NamesIn(d), ", ") + " replicas"
	}
	var errs field.ErrorList
	switch {
	case pl.HostSelector != nil && domain != plugin.Hosts:
		errs = append(errs, field.Forbidden(spec.Child("placement", "hostSelector"), onlyFor(plugin.Hosts)))
	case pl.HostSelector != nil && (replica.Spec.Placement.Host != "" || replica.Spec.Placement.HostSelector != nil):
		errs = append(errs, field.Forbidden(tplPl.Child("host"), "spec.placement.hostSelector places the replicas: leave host and hostSelector out of the template"))
	case pl.HostSelector != nil:
		replica.Spec.Placement.HostSelector = pl.HostSelector.DeepCopy()
	}
	if pl.HostSelector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(pl.HostSelector, metav1validation.LabelSelectorValidationOptions{}, spec.Child("placement", "hostSelector"))...)
	}
	if pl.CPUOvercommit != 0 && domain != plugin.Hosts {
		errs = append(errs, field.Forbidden(spec.Child("placement", "cpuOvercommit"), onlyFor(plugin.Hosts)))
	}
	if len(pl.Zones) > 0 {
		zones := spec.Child("placement", "zones")
		switch {
		case domain != plugin.Zones:
			errs = append(errs, field.Forbidden(zones, onlyFor(plugin.Zones)))
		case replica.Spec.Placement.Zone != "":
			errs = append(errs, field.Forbidden(tplPl.Child("zone"), "spec.placement.zones places the replicas: leave zone out of the template"))
		}
		errs = append(errs, validateZoneNames(zones, pl.Zones)...)
	}
	return errs
}

// validateZoneNames refuses empty and repeated zone names.
func validateZoneNames(path *field.Path, zones []string) field.ErrorList {
	var errs field.ErrorList
	for i, z := range zones {
		if z == "" {
			errs = append(errs, field.Required(path.Index(i), "a zone name"))
		} else if slices.Index(zones, z) < i {
			errs = append(errs, field.Duplicate(path.Index(i), z))
		}
	}
	return errs
}

func validatePoolSpec(s *crawlv1.ProxyPoolSpec) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	ro := spec.Child("rollout")
	surge, errSurge := validateIntOrPercent(ro.Child("maxSurge"), s.Rollout.MaxSurge, false)
	unavail, errUnavail := validateIntOrPercent(ro.Child("maxUnavailable"), s.Rollout.MaxUnavailable, true)
	errs = append(errs, errSurge...)
	errs = append(errs, errUnavail...)
	if surge != nil && unavail != nil && *surge == 0 && *unavail == 0 {
		errs = append(errs, field.Invalid(ro.Child("maxUnavailable"), s.Rollout.MaxUnavailable.String(),
			"may not be 0 when maxSurge is 0: nothing could ever be replaced"))
	}
	if s.Rollout.MinReadySeconds < 0 {
		errs = append(errs, field.Invalid(ro.Child("minReadySeconds"), s.Rollout.MinReadySeconds, "must not be negative"))
	}
	if d := s.Rollout.DrainSeconds; d != nil && *d < 0 {
		errs = append(errs, field.Invalid(ro.Child("drainSeconds"), *d, "must not be negative"))
	}

	rot := spec.Child("rotation")
	r := &s.Rotation
	errs = append(errs, positive(rot.Child("maxAge"), r.MaxAge)...)
	errs = append(errs, notNegative(rot.Child("jitter"), r.Jitter)...)
	errs = append(errs, notNegative(rot.Child("minInterval"), r.MinInterval)...)
	if r.MaxAge == nil {
		// A slice, not a map: the same input gives the same error text.
		for _, f := range []struct {
			name string
			set  bool
		}{{"jitter", r.Jitter != nil}, {"minInterval", r.MinInterval != nil}, {"maxConcurrent", r.MaxConcurrent != 0}} {
			if f.set {
				errs = append(errs, field.Forbidden(rot.Child(f.name), "only with rotation.maxAge"))
			}
		}
	} else if r.Jitter != nil && r.MaxAge.Duration > 0 && r.Jitter.Duration >= r.MaxAge.Duration {
		errs = append(errs, field.Invalid(rot.Child("jitter"), r.Jitter.Duration.String(), fmt.Sprintf("must be less than maxAge (%s)", r.MaxAge.Duration)))
	}
	if r.MaxConcurrent < 0 {
		errs = append(errs, field.Invalid(rot.Child("maxConcurrent"), r.MaxConcurrent, "must be at least 1"))
	}

	rem := spec.Child("remediation")
	m := &s.Remediation
	errs = append(errs, positive(rem.Child("startupTimeout"), m.StartupTimeout)...)
	errs = append(errs, positive(rem.Child("unhealthyTimeout"), m.UnhealthyTimeout)...)
	errs = append(errs, positive(rem.Child("startupBackoff"), m.StartupBackoff)...)
	errs = append(errs, positive(rem.Child("deletionTimeout"), m.DeletionTimeout)...)
	_, e := validateIntOrPercent(rem.Child("maxUnhealthy"), m.MaxUnhealthy, true)
	errs = append(errs, e...)
	if m.MaxCreatesPerMinute < 0 {
		errs = append(errs, field.Invalid(rem.Child("maxCreatesPerMinute"), m.MaxCreatesPerMinute, "must be at least 1"))
	}
	if s.Placement.MaxConcurrentCreates < 0 {
		errs = append(errs, field.Invalid(spec.Child("placement", "maxConcurrentCreates"), s.Placement.MaxConcurrentCreates, "must be at least 1"))
	}
	if s.Replicas != nil && *s.Replicas < 0 {
		errs = append(errs, field.Invalid(spec.Child("replicas"), *s.Replicas, "must not be negative"))
	}
	errs = append(errs, validatePoolBans(s)...)
	return errs
}

// validateIntOrPercent checks a count (≥ 0) or a percentage ("N%", N ≥ 0,
// at most 100 when capped) and returns it as a count or percent number (nil
// when unset or invalid).
func validateIntOrPercent(p *field.Path, v *intstr.IntOrString, capped bool) (*int, field.ErrorList) {
	if v == nil {
		return nil, nil
	}
	if v.Type == intstr.Int {
		n := int(v.IntVal)
		if n < 0 {
			return nil, field.ErrorList{field.Invalid(p, n, "must not be negative")}
		}
		return &n, nil
	}
	num, ok := strings.CutSuffix(v.StrVal, "%")
	n, err := parseNonNegative(num)
	switch {
	case !ok || err != nil:
		return nil, field.ErrorList{field.Invalid(p, v.StrVal, `a count, or a percentage such as "25%"`)}
	case capped && n > 100:
		return nil, field.ErrorList{field.Invalid(p, v.StrVal, "must not be more than 100%")}
	}
	return &n, nil
}

func parseNonNegative(s string) (int, error) {
	if s == "" || len(s) > 9 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("not a non-negative integer: %q", s)
	}
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n, nil
}

func positive(p *field.Path, d *metav1.Duration) field.ErrorList {
	if d != nil && d.Duration <= 0 {
		return field.ErrorList{field.Invalid(p, d.Duration.String(), "must be positive")}
	}
	return nil
}

func notNegative(p *field.Path, d *metav1.Duration) field.ErrorList {
	if d != nil && d.Duration < 0 {
		return field.ErrorList{field.Invalid(p, d.Duration.String(), "must not be negative")}
	}
	return nil
}
