package v1alpha1

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// Smallest sizes a squid guest boots with.
var (
	minMemory = resource.MustParse("128Mi")
	minDisk   = resource.MustParse("1Gi")
)

// SetupWithManager registers the Proxy webhooks.
func (w *ProxyWebhook) SetupWithManager(mgr ctrl.Manager) error {
	if err := w.Plugins.Validate(); err != nil {
		return fmt.Errorf("Proxy webhook: Plugins (controllers.Plugins()): %w", err)
	}
	return ctrl.NewWebhookManagedBy(mgr, &crawlv1.Proxy{}).WithDefaulter(w).WithValidator(w).Complete()
}

// +kubebuilder:webhook:path=/mutate-crawl-example-com-v1alpha1-proxy,mutating=true,failurePolicy=fail,sideEffects=None,groups=crawl.example.com,resources=proxies,verbs=create;update,versions=v1alpha1,name=mproxy.crawl.example.com,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-crawl-example-com-v1alpha1-proxy,mutating=false,failurePolicy=fail,sideEffects=None,groups=crawl.example.com,resources=proxies,verbs=create;update,versions=v1alpha1,name=vproxy.crawl.example.com,admissionReviewVersions=v1

// ProxyWebhook defaults and validates Proxies.
type ProxyWebhook struct {
	// AllowImageURLs admits a kvm spec.placement.image URL (the manager's
	// --allow-proxy-image-urls). The manager downloads it from inside the
	// cluster, so a URL lets anyone who may create a Proxy make the manager
	// fetch internal addresses (SSRF); a KVMImage, which only cluster admins
	// create, is the default way to name an image.
	AllowImageURLs bool
	// DestinationExceptionGrants (--allow-destination-exceptions) are the
	// loopback, link-local and metadata ranges Proxy authors may list in
	// allowedDestinationExceptions; none by default (proxyaccess.Validate).
	DestinationExceptionGrants proxyaccess.Grants
	// RefuseUserData refuses spec.cloudInit (--allow-proxy-user-data=false;
	// plugin.Policy.ValidateCloudInit).
	RefuseUserData bool
	// Plugins are the providers a Proxy may name, with their part of
	// defaulting and validation: the list the controllers run with
	// (controllers.Plugins). Required.
	Plugins plugin.List
}

func (w *ProxyWebhook) Default(ctx context.Context, p *crawlv1.Proxy) error {
	old := &crawlv1.Proxy{}
	update, err := storedObject(ctx, old)
	if err != nil {
		return err
	}
	if update && leftAlone(p, old.Spec, p.Spec) {
		return nil
	}
	if !update {
		w.DefaultProxy(p)
		return nil
	}
	w.defaultSpec(&p.Spec, false)
	// Placement, port and access are immutable: a value that means what
	// the stored one means keeps the stored spelling, so defaulting never
	// reads as a change to the CEL rules.
	defaulted := old.DeepCopy()
	w.defaultSpec(&defaulted.Spec, false)
	if equality.Semantic.DeepEqual(defaulted.Spec.Placement, p.Spec.Placement) {
		p.Spec.Placement = old.Spec.Placement
	}
	if defaulted.Spec.Port == p.Spec.Port {
		p.Spec.Port = old.Spec.Port
	}
	if equality.Semantic.DeepEqual(defaulted.Spec.Access, p.Spec.Access) {
		p.Spec.Access = old.Spec.Access
	}
	return nil
}

// DefaultProxy applies the defaults of a Proxy being created, in place:
// crawlv1.ProxySpec.Default's (spec.access included: secure by default),
// then its provider's.
func (w *ProxyWebhook) DefaultProxy(p *crawlv1.Proxy) {
	w.defaultSpec(&p.Spec, true)
}

func (w *ProxyWebhook) defaultSpec(s *crawlv1.ProxySpec, create bool) {
	s.Default(create)
	if pl := w.Plugins.Get(string(s.Provider)); pl != nil {
		pl.Default(s)
	}
}

func (w *ProxyWebhook) ValidateCreate(_ context.Context, p *crawlv1.Proxy) (admission.Warnings, error) {
	return accessWarnings(p), toInvalid(p, w.ValidateProxy(p))
}

// unmanagedWarning is returned on every admission of a Proxy whose squid
// the operator does not configure.
const unmanagedWarning = "spec.access.managed is false: the operator does not configure squid, so who may use this proxy and where it may go are decided by your cloud-init alone; an open proxy is found and abused within hours (docs/security.md)"

// accessWarnings are admission warnings about p's safety that are the
// user's choice to make, so not errors.
func accessWarnings(p *crawlv1.Proxy) admission.Warnings {
	a := p.Spec.Access
	if a == nil {
		return nil // stored before spec.access (updates only); it stays as it was
	}
	if !p.IsManaged() {
		return admission.Warnings{unmanagedWarning}
	}
	var out admission.Warnings
	for i, cidr := range a.AllowedSourceCIDRs {
		if pfx, err := netip.ParsePrefix(cidr); err == nil && pfx.Bits() == 0 {
			out = append(out, fmt.Sprintf("%s is %s: every address may try credentials, and the password is the only guard",
				proxyaccess.AccessPath.Child("allowedSourceCIDRs").Index(i), cidr))
		}
	}
	return append(out, proxyaccess.Warnings(proxyaccess.AccessPath, a)...)
}

func (w *ProxyWebhook) ValidateUpdate(_ context.Context, old, p *crawlv1.Proxy) (admission.Warnings, error) {
	if leftAlone(p, old.Spec, p.Spec) {
		return nil, nil
	}
	errs := ratchet(w.ValidateProxy(p), w.ValidateProxy(old))
	errs = append(errs, ValidateProxyUpdate(old, p)...)
	return accessWarnings(p), toInvalid(p, errs)
}

func (w *ProxyWebhook) ValidateDelete(context.Context, *crawlv1.Proxy) (admission.Warnings, error) {
	return nil, nil
}

// ValidateProxyUpdate rejects changes to fields that would need a new
// instance: the provider, the port, the access (squid's configuration) and
// the placement (host, image, firmware).
func ValidateProxyUpdate(old, p *crawlv1.Proxy) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if old.Spec.Provider != p.Spec.Provider {
		errs = append(errs, field.Forbidden(spec.Child("provider"), "provider is immutable"))
	}
	if old.Spec.Port != p.Spec.Port {
		errs = append(errs, field.Forbidden(spec.Child("port"), "port is immutable: the instance keeps the port it was created with; delete the Proxy and create another"))
	}
	if !equality.Semantic.DeepEqual(old.Spec.Network, p.Spec.Network) {
		errs = append(errs, field.Forbidden(spec.Child("network"), "network is immutable: the instance keeps the address it was created with; delete the Proxy and create another (a ProxyPool rolls its replicas)"))
	}
	if !equality.Semantic.DeepEqual(old.Spec.Access, p.Spec.Access) {
		errs = append(errs, field.Forbidden(spec.Child("access"), "access is immutable: the instance keeps the access it was created with; delete the Proxy and create another (a ProxyPool rolls its replicas)"))
	}
	op, np := old.Spec.Placement, p.Spec.Placement
	pl := spec.Child("placement")
	immutable := []struct {
		name     string
		old, new any
	}{
		{"host", op.Host, np.Host},
		{"hostSelector", op.HostSelector, np.HostSelector},
		{"image", op.Image, np.Image},
		{"imageChecksum", op.ImageChecksum, np.ImageChecksum},
		{"imageFormat", op.ImageFormat, np.ImageFormat},
		{"firmware", op.Firmware, np.Firmware},
		{"project", op.Project, np.Project},
		{"zone", op.Zone, np.Zone},
		{"machineType", op.MachineType, np.MachineType},
	}
	for _, f := range immutable {
		if !equality.Semantic.DeepEqual(f.old, f.new) {
			errs = append(errs, field.Forbidden(pl.Child(f.name), f.name+" is immutable: delete the Proxy and create another"))
		}
	}
	return errs
}

// policy is the manager's policy the plug-ins and the generic rules apply.
func (w *ProxyWebhook) policy() plugin.Policy {
	return plugin.Policy{AllowImageURLs: w.AllowImageURLs, RefuseUserData: w.RefuseUserData}
}

// ValidateProxy returns every problem of p, each naming its field: the
// rules of every Proxy, and those of its provider's plug-in under the
// manager's policy (--allow-proxy-image-urls, --allow-proxy-user-data,
// --allow-destination-exceptions).
func (w *ProxyWebhook) ValidateProxy(p *crawlv1.Proxy) field.ErrorList {
	spec := field.NewPath("spec")
	pl := spec.Child("placement")
	s := &p.Spec
	var errs field.ErrorList

	// The name becomes the guest's hostname and part of the libvirt domain
	// and GCE instance names, so it must be a DNS label.
	for _, msg := range validation.IsDNS1123Label(p.Name) {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), p.Name, msg))
	}

	switch prov := w.Plugins.Get(string(s.Provider)); {
	case s.Provider == "":
		errs = append(errs, field.Required(spec.Child("provider"), "one of "+strings.Join(w.Plugins.Names(), ", ")))
	case prov == nil:
		errs = append(errs, field.NotSupported(spec.Child("provider"), s.Provider, w.Plugins.Names()))
	default:
		if prov.Domain() != plugin.Hosts {
			onlyHosts := "only the " + strings.Join(w.Plugins.NamesIn(plugin.Hosts), ", ") + " provider places on a KVMHost"
			if s.Placement.Host != "" {
				errs = append(errs, field.Forbidden(pl.Child("host"), onlyHosts))
			}
			if s.Placement.HostSelector != nil {
				errs = append(errs, field.Forbidden(pl.Child("hostSelector"), onlyHosts))
			}
		}
		errs = append(errs, prov.Validate(p, w.policy())...)
	}
	errs = append(errs, w.policy().ValidateCloudInit(s)...)
	errs = append(errs, w.validateNetwork(s)...)

	errs = append(errs, validateAccess(p, w.DestinationExceptionGrants, w.Plugins.GuardsUnmanagedSources(string(s.Provider)))...)

	if s.Port != 0 && (s.Port < 1 || s.Port > 65535) {
		errs = append(errs, field.Invalid(spec.Child("port"), s.Port, "must be from 1 to 65535"))
	}
	res := spec.Child("resources")
	if s.Resources.CPUs < 0 || s.Resources.CPUs > 64 {
		errs = append(errs, field.Invalid(res.Child("cpus"), s.Resources.CPUs, "must be from 1 to 64"))
	}
	if m := s.Resources.Memory; m != nil && m.Cmp(minMemory) < 0 {
		errs = append(errs, field.Invalid(res.Child("memory"), m.String(), "must be at least 128Mi"))
	}
	if d := s.Resources.Disk; d != nil && d.Cmp(minDisk) < 0 {
		errs = append(errs, field.Invalid(res.Child("disk"), d.String(), "must be at least 1Gi"))
	}
	ci := spec.Child("cloudInit")
	if s.CloudInit.UserData != "" && len(s.CloudInit.UserDataBase64) > 0 {
		errs = append(errs, field.Forbidden(ci.Child("userDataBase64"), "set userData or userDataBase64, not both"))
	}
	return errs
}

// validateNetwork checks spec.network: pools only on a provider whose
// plug-in takes static addresses, each of a kind an IPAM provider the
// operator knows serves (crawlv1.KnownIPPoolKinds), at most one.
func (w *ProxyWebhook) validateNetwork(s *crawlv1.ProxySpec) field.ErrorList {
	pools := s.AddressPools()
	if len(pools) == 0 {
		return nil
	}
	fp := field.NewPath("spec", "network", "addressesFromPools")
	var errs field.ErrorList
	if prov := w.Plugins.Get(string(s.Provider)); prov != nil && !plugin.TakesStaticAddresses(prov) {
		var takers []string
		for _, p := range w.Plugins {
			if plugin.TakesStaticAddresses(p) {
				takers = append(takers, p.Name())
			}
		}
		errs = append(errs, field.Forbidden(fp, fmt.Sprintf("provider %s cannot boot an instance with a static address from an IPAM pool (only %s can)", s.Provider, strings.Join(takers, ", "))))
	}
	if len(pools) > 1 {
		errs = append(errs, field.TooMany(fp, len(pools), 1))
	}
	for i, ref := range pools {
		errs = append(errs, validatePoolRef(fp.Index(i), ref)...)
	}
	return errs
}

// validatePoolRef refuses a reference no known IPAM provider serves: its
// claim would wait forever.
func validatePoolRef(fp *field.Path, ref ipamv1.IPPoolReference) field.ErrorList {
	var errs field.ErrorList
	if ref.Name == "" {
		errs = append(errs, field.Required(fp.Child("name"), "the pool's name"))
	}
	kinds, ok := crawlv1.KnownIPPoolKinds[ref.APIGroup]
	switch {
	case ref.APIGroup == "":
		errs = append(errs, field.Required(fp.Child("apiGroup"), "the pool's API group, e.g. ipam.cluster.x-k8s.io"))
	case !ok:
		errs = append(errs, field.NotSupported(fp.Child("apiGroup"), ref.APIGroup, slices.Sorted(maps.Keys(crawlv1.KnownIPPoolKinds))))
	case !slices.Contains(kinds, ref.Kind):
		errs = append(errs, field.NotSupported(fp.Child("kind"), ref.Kind, kinds))
	}
	return errs
}

// validateAccess checks spec.access: a managed squid by the renderer's own
// rules (proxyaccess.Validate: allowedSourceCIDRs required, each a CIDR,
// auth None only with narrow sources, ...), plus what only the API has (the
// credential Secret's name). An unmanaged one may set nothing but managed,
// and allowedSourceCIDRs, which it must set, when its provider admits
// clients by them itself (guardsSources: plugin.UnmanagedSourcesGuard).
// The Secret itself is not read here: it may be created after the Proxy,
// and the controller reports it missing.
func validateAccess(p *crawlv1.Proxy, grants proxyaccess.Grants, guardsSources bool) field.ErrorList {
	a := p.Spec.Access
	if a == nil {
		return nil // stored before spec.access: unmanaged, as it was created
	}
	path := proxyaccess.AccessPath
	var errs field.ErrorList
	if !p.IsManaged() {
		if guardsSources {
			errs = append(errs, squid.ValidateSources(path.Child("allowedSourceCIDRs"), a.AllowedSourceCIDRs)...)
		}
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"allowedSourceCIDRs", !guardsSources && len(a.AllowedSourceCIDRs) > 0},
			{"auth", a.Auth != nil},
			{"allowedPorts", len(a.AllowedPorts) > 0},
			{"extraDeniedDestinations", len(a.ExtraDeniedDestinations) > 0},
			{"allowedDestinationExceptions", len(a.AllowedDestinationExceptions) > 0},
			{"maxConnectionsPerClient", a.MaxConnectionsPerClient != 0},
		} {
			if f.set {
				errs = append(errs, field.Forbidden(path.Child(f.name), "only used when the operator manages squid (managed: true); with managed: false your cloud-init configures squid"))
			}
		}
		return errs
	}
	errs = append(errs, proxyaccess.Validate(a, grants)...)
	if a.Auth != nil && a.Auth.SecretRef != nil {
		ref := path.Child("auth", "secretRef", "name")
		switch {
		case a.Auth.Type == crawlv1.ProxyAuthNone:
			errs = append(errs, field.Forbidden(path.Child("auth", "secretRef"), "a credential is only used with type Basic"))
		case a.Auth.SecretRef.Name == crawlv1.CredentialsSecretName(p):
			errs = append(errs, field.Invalid(ref, a.Auth.SecretRef.Name, "is the Secret the operator writes for this Proxy (status.credentialsSecretRef); name the Secret that holds your username and password"))
		default:
			for _, msg := range validation.IsDNS1123Subdomain(a.Auth.SecretRef.Name) {
				errs = append(errs, field.Invalid(ref, a.Auth.SecretRef.Name, msg))
			}
		}
	}
	return errs
}
