package v1alpha1

import (
	"context"
	"fmt"
	"net/netip"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/provider/gcp"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// Smallest sizes a squid guest boots with.
var (
	minMemory = resource.MustParse("128Mi")
	minDisk   = resource.MustParse("1Gi")
)

// SetupWithManager registers the Proxy webhooks.
func (w *ProxyWebhook) SetupWithManager(mgr ctrl.Manager) error {
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
		DefaultProxy(p)
		return nil
	}
	defaultSpec(p)
	// Placement, port and access are immutable: a value that means what
	// the stored one means keeps the stored spelling, so defaulting never
	// reads as a change to the CEL rules.
	defaulted := old.DeepCopy()
	defaultSpec(defaulted)
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

// DefaultProxy applies the defaults of a Proxy being created, in place: a
// Proxy without spec.access gets an operator-managed squid with a
// generated Basic credential (secure by default). Updates never add
// spec.access: a Proxy stored before it existed stays unmanaged, as it was
// created (see crawlv1.Proxy.IsManaged).
func DefaultProxy(p *crawlv1.Proxy) {
	if p.Spec.Access == nil {
		p.Spec.Access = &crawlv1.ProxyAccess{}
	}
	defaultSpec(p)
}

// defaultSpec applies the defaults every admission applies, creates and
// updates alike.
func defaultSpec(p *crawlv1.Proxy) {
	s := &p.Spec
	defaultAccess(s.Access)
	if s.InstallGuestAgent == nil {
		s.InstallGuestAgent = ptr.To(true)
	}
	if s.Port == 0 {
		s.Port = crawlv1.DefaultProxyPort
	}
	if s.Resources.CPUs == 0 {
		s.Resources.CPUs = 1
	}
	if s.Resources.Memory == nil {
		s.Resources.Memory = ptr.To(resource.MustParse("512Mi"))
	}
	if s.Resources.Disk == nil {
		s.Resources.Disk = ptr.To(resource.MustParse("10Gi"))
	}
	// A KVMImage carries its own firmware and format; a URL image gets the
	// same defaults a KVMImage would.
	if s.Provider == crawlv1.ProviderKVM && crawlv1.IsImageURL(s.Placement.Image) {
		if s.Placement.Firmware == "" {
			s.Placement.Firmware = crawlv1.FirmwareUEFI
		}
		if s.Placement.ImageFormat == "" {
			s.Placement.ImageFormat = crawlv1.ImageFormatQCOW2
		}
	}
}

// defaultAccess fills what spec.access leaves out, for a managed squid
// only: an unmanaged Proxy's access fields are refused by validation, and
// defaulting them would make that refusal the webhook's own doing.
func defaultAccess(a *crawlv1.ProxyAccess) {
	if a == nil {
		return
	}
	if a.Managed == nil {
		a.Managed = ptr.To(true)
	}
	if !*a.Managed {
		return
	}
	if a.Auth == nil {
		a.Auth = &crawlv1.ProxyAuth{}
	}
	if a.Auth.Type == "" {
		a.Auth.Type = crawlv1.ProxyAuthBasic
	}
	if len(a.AllowedPorts) == 0 {
		for _, port := range squid.DefaultAllowedPorts {
			a.AllowedPorts = append(a.AllowedPorts, int32(port))
		}
	}
	if a.MaxConnectionsPerClient == 0 {
		a.MaxConnectionsPerClient = squid.DefaultMaxConnectionsPerClient
	}
}

func (w *ProxyWebhook) ValidateCreate(_ context.Context, p *crawlv1.Proxy) (admission.Warnings, error) {
	return accessWarnings(p), toInvalid(p, w.validate(p))
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
	return out
}

// validate is ValidateProxy plus the manager's policy on image URLs.
func (w *ProxyWebhook) validate(p *crawlv1.Proxy) field.ErrorList {
	errs := ValidateProxy(p)
	if !w.AllowImageURLs && p.Spec.Provider == crawlv1.ProviderKVM && crawlv1.IsImageURL(p.Spec.Placement.Image) {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "placement", "image"),
			"image URLs are fetched by the manager from inside the cluster and are refused unless it runs with --allow-proxy-image-urls; name a KVMImage (created by a cluster admin) instead"))
	}
	return errs
}

func (w *ProxyWebhook) ValidateUpdate(_ context.Context, old, p *crawlv1.Proxy) (admission.Warnings, error) {
	if leftAlone(p, old.Spec, p.Spec) {
		return nil, nil
	}
	errs := ratchet(w.validate(p), w.validate(old))
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

// ValidateProxy returns every problem of p, each naming its field.
func ValidateProxy(p *crawlv1.Proxy) field.ErrorList {
	spec := field.NewPath("spec")
	pl := spec.Child("placement")
	s := &p.Spec
	var errs field.ErrorList

	// The name becomes the guest's hostname and part of the libvirt domain
	// and GCE instance names, so it must be a DNS label.
	for _, msg := range validation.IsDNS1123Label(p.Name) {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), p.Name, msg))
	}

	switch s.Provider {
	case crawlv1.ProviderKVM:
		errs = append(errs, validateKVMPlacement(pl, &s.Placement)...)
	case crawlv1.ProviderKubernetes, crawlv1.ProviderGCP:
		if s.Placement.Host != "" {
			errs = append(errs, field.Forbidden(pl.Child("host"), "only the kvm provider places on a KVMHost"))
		}
		if s.Placement.HostSelector != nil {
			errs = append(errs, field.Forbidden(pl.Child("hostSelector"), "only the kvm provider places on a KVMHost"))
		}
		if s.Provider == crawlv1.ProviderKubernetes && s.Placement.Image != "" {
			errs = append(errs, field.Forbidden(pl.Child("image"), "the kubernetes provider runs the manager's --kubernetes-squid-image"))
		}
		if s.Provider == crawlv1.ProviderGCP && (s.CloudInit.UserData != "" || len(s.CloudInit.UserDataBase64) > 0) {
			if why := gcp.CloudInitUnsupported(s.Placement.Image); why != "" {
				errs = append(errs, field.Invalid(pl.Child("image"), s.Placement.Image, why))
			}
		}
	case "":
		errs = append(errs, field.Required(spec.Child("provider"), "one of kvm, kubernetes, gcp"))
	default:
		errs = append(errs, field.NotSupported(spec.Child("provider"), s.Provider, []string{"kvm", "kubernetes", "gcp"}))
	}

	errs = append(errs, validateAccess(p)...)

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
	if s.Provider == crawlv1.ProviderGCP {
		// Checked here, not only at Create, so the Proxy is refused rather
		// than stored to fail. The content never goes into the message.
		if v, enc := crawlv1.GCEUserDataValue(s.CloudInit.UserDataBytes()); len(v) > crawlv1.GCEMaxMetadataValue {
			f := ci.Child("userData")
			if len(s.CloudInit.UserDataBase64) > 0 {
				f = ci.Child("userDataBase64")
			}
			as := "as instance metadata"
			if enc != "" {
				as = "as instance metadata (base64, since it is not UTF-8)"
			}
			errs = append(errs, field.Invalid(f, fmt.Sprintf("<%d bytes>", len(s.CloudInit.UserDataBytes())),
				fmt.Sprintf("is %d bytes %s, over Compute Engine's limit of %d", len(v), as, crawlv1.GCEMaxMetadataValue)))
		}
	}
	return errs
}

// validateAccess checks spec.access: a managed squid by the renderer's own
// rules (proxyaccess.Validate: allowedSourceCIDRs required, each a CIDR,
// auth None only with narrow sources, ...), plus what only the API has (the
// credential Secret's name). An unmanaged one may set nothing but managed.
// The Secret itself is not read here: it may be created after the Proxy,
// and the controller reports it missing.
func validateAccess(p *crawlv1.Proxy) field.ErrorList {
	a := p.Spec.Access
	if a == nil {
		return nil // stored before spec.access: unmanaged, as it was created
	}
	path := proxyaccess.AccessPath
	var errs field.ErrorList
	if !p.IsManaged() {
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"allowedSourceCIDRs", len(a.AllowedSourceCIDRs) > 0},
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
	errs = append(errs, proxyaccess.Validate(a)...)
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

func validateKVMPlacement(pl *field.Path, p *crawlv1.ProxyPlacement) field.ErrorList {
	var errs field.ErrorList
	switch {
	case p.Host == "" && p.HostSelector == nil:
		errs = append(errs, field.Required(pl.Child("host"), "kvm needs a KVMHost name (host) or a hostSelector"))
	case p.Host != "" && p.HostSelector != nil:
		errs = append(errs, field.Forbidden(pl.Child("hostSelector"), "set host or hostSelector, not both"))
	case p.Host != "":
		for _, msg := range validation.IsDNS1123Subdomain(p.Host) {
			errs = append(errs, field.Invalid(pl.Child("host"), p.Host, msg))
		}
	}
	switch {
	case p.Image == "":
		errs = append(errs, field.Required(pl.Child("image"), "a KVMImage name or an http(s) URL"))
	case crawlv1.IsImageURL(p.Image):
		errs = append(errs, validateImageURL(pl.Child("image"), p.Image)...)
		errs = append(errs, validateChecksum(pl.Child("imageChecksum"), p.ImageChecksum, true)...)
		errs = append(errs, validateFormat(pl.Child("imageFormat"), p.ImageFormat)...)
		errs = append(errs, validateFirmware(pl.Child("firmware"), p.Firmware)...)
	default:
		for _, msg := range validation.IsDNS1123Subdomain(p.Image) {
			errs = append(errs, field.Invalid(pl.Child("image"), p.Image, "not a KVMImage name ("+msg+") nor an http(s) URL"))
		}
		if p.ImageChecksum != "" {
			errs = append(errs, field.Forbidden(pl.Child("imageChecksum"), "a KVMImage carries its own checksum"))
		}
		if p.Firmware != "" {
			errs = append(errs, field.Forbidden(pl.Child("firmware"), "a KVMImage carries its own firmware"))
		}
		if p.ImageFormat != "" {
			errs = append(errs, field.Forbidden(pl.Child("imageFormat"), "a KVMImage carries its own format"))
		}
	}
	return errs
}
