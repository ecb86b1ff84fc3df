// Package v1alpha1 holds the defaulting and validating admission webhooks of
// the crawl.example.com/v1alpha1 kinds.
//
// Where the rules live: the CRD schema (markers, CEL) carries what needs no
// code — enums, patterns, ranges, immutability of Proxy provider/placement.
// These webhooks carry what needs logic or derived defaults — the derived
// check timeout, URL and address parsing, per-provider placement rules, names
// usable as libvirt domains — and repeat the schema's rules so that every
// error names its field even when the webhook is called directly.
package v1alpha1

import (
	"context"
	"fmt"
	"net"
	"path"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// DefaultSSHPort is used when KVMHost.spec.address has no port.
const DefaultSSHPort = 22

// SetupWithManager registers the KVMHost webhooks.
func (w *KVMHostWebhook) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &crawlv1.KVMHost{}).WithDefaulter(w).WithValidator(w).Complete()
}

// +kubebuilder:webhook:path=/mutate-crawl-example-com-v1alpha1-kvmhost,mutating=true,failurePolicy=fail,sideEffects=None,groups=crawl.example.com,resources=kvmhosts,verbs=create;update,versions=v1alpha1,name=mkvmhost.crawl.example.com,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-crawl-example-com-v1alpha1-kvmhost,mutating=false,failurePolicy=fail,sideEffects=None,groups=crawl.example.com,resources=kvmhosts,verbs=create;update,versions=v1alpha1,name=vkvmhost.crawl.example.com,admissionReviewVersions=v1

// KVMHostWebhook defaults and validates KVMHosts.
type KVMHostWebhook struct {
	// ManagerNamespace is the manager's namespace (--manager-namespace), the
	// only one an sshKeySecretRef may name: the manager may read Secrets
	// there and nowhere else, so a KVMHost cannot make it read (and use as
	// SSH material) a Secret of another tenant. Empty refuses every
	// sshKeySecretRef.
	ManagerNamespace string
}

// Default fills the socket path, the SSH port and the derived check timeout.
func (w *KVMHostWebhook) Default(ctx context.Context, h *crawlv1.KVMHost) error {
	old := &crawlv1.KVMHost{}
	update, err := storedObject(ctx, old)
	if err != nil {
		return err
	}
	if update && leftAlone(h, old.Spec, h.Spec) {
		return nil
	}
	DefaultKVMHost(h)
	if update {
		// Address and pool are immutable: a value that means what the stored
		// one means ("hv1" and "hv1:22") keeps the stored spelling.
		defaulted := old.DeepCopy()
		DefaultKVMHost(defaulted)
		if defaulted.Spec.Address == h.Spec.Address {
			h.Spec.Address = old.Spec.Address
		}
		if defaulted.Spec.StoragePool == h.Spec.StoragePool {
			h.Spec.StoragePool = old.Spec.StoragePool
		}
	}
	return nil
}

// DefaultKVMHost applies KVMHost defaults in place.
func DefaultKVMHost(h *crawlv1.KVMHost) {
	s := &h.Spec
	if s.SocketPath == "" {
		s.SocketPath = crawlv1.DefaultLibvirtSocket
	}
	if s.User == "" {
		s.User = "root"
	}
	if s.StoragePool == "" {
		s.StoragePool = crawlv1.DefaultStoragePool
	}
	if s.Network == "" {
		s.Network = crawlv1.DefaultNetwork
	}
	if s.NetworkMode == "" {
		s.NetworkMode = crawlv1.NetworkModeNetwork
	}
	if s.DomainType == "" {
		s.DomainType = crawlv1.DomainTypeKVM
	}
	if s.Address != "" && !hasPort(s.Address) {
		host := strings.TrimSuffix(strings.TrimPrefix(s.Address, "["), "]")
		// A malformed address ("0[") would not split back after the port
		// is added and would be wrapped again on every update: leave it for
		// validation to refuse, naming the field.
		if withPort := net.JoinHostPort(host, strconv.Itoa(DefaultSSHPort)); hasPort(withPort) {
			s.Address = withPort
		}
	}
	// Only a host with its own interval gets a derived timeout written down;
	// without one, the manager's --provider-check-interval decides at run time.
	if s.CheckInterval != nil && s.CheckInterval.Duration > 0 && (s.CheckTimeout == nil || s.CheckTimeout.Duration == 0) {
		s.CheckTimeout = &metav1.Duration{Duration: crawlv1.EffectiveCheckTimeout(s.CheckInterval.Duration, 0)}
	}
}

// hasPort reports whether addr already ends in :port (bracketed IPv6 or a
// name/IPv4 with a single colon).
func hasPort(addr string) bool {
	_, _, err := net.SplitHostPort(addr)
	return err == nil
}

func (w *KVMHostWebhook) ValidateCreate(_ context.Context, h *crawlv1.KVMHost) (admission.Warnings, error) {
	return nil, toInvalid(h, w.validate(h))
}

// validate is ValidateKVMHost plus the manager's namespace rule.
func (w *KVMHostWebhook) validate(h *crawlv1.KVMHost) field.ErrorList {
	errs := ValidateKVMHost(h)
	if ref := h.Spec.SSHKeySecretRef; ref != nil && ref.Namespace != "" && ref.Namespace != w.ManagerNamespace {
		errs = append(errs, field.Invalid(field.NewPath("spec", "sshKeySecretRef", "namespace"), ref.Namespace,
			fmt.Sprintf("SSH Secrets are read only from the manager's namespace %q: put the Secret there", w.ManagerNamespace)))
	}
	return errs
}

func (w *KVMHostWebhook) ValidateUpdate(_ context.Context, old, h *crawlv1.KVMHost) (admission.Warnings, error) {
	if leftAlone(h, old.Spec, h.Spec) {
		return nil, nil
	}
	errs := ratchet(w.validate(h), w.validate(old))
	errs = append(errs, ValidateKVMHostUpdate(old, h)...)
	return nil, toInvalid(h, errs)
}

// ValidateKVMHostUpdate rejects changes to where the host's VMs live: with a
// new address or pool, Delete would look on another machine or pool, find
// nothing and leak the VMs. The CRD has the same rules in CEL.
func ValidateKVMHostUpdate(old, h *crawlv1.KVMHost) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if old.Spec.Address != h.Spec.Address {
		errs = append(errs, field.Forbidden(spec.Child("address"), "address is immutable: its VMs stay on that machine; create another KVMHost for another machine"))
	}
	if old.Spec.StoragePool != h.Spec.StoragePool {
		errs = append(errs, field.Forbidden(spec.Child("storagePool"), "storagePool is immutable: existing disks stay in that pool; create another KVMHost for another pool"))
	}
	return errs
}

func (w *KVMHostWebhook) ValidateDelete(context.Context, *crawlv1.KVMHost) (admission.Warnings, error) {
	return nil, nil
}

// ValidateKVMHost returns every problem of h's spec, each naming its field.
func ValidateKVMHost(h *crawlv1.KVMHost) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	s := &h.Spec

	errs = append(errs, validateHostPort(spec.Child("address"), s.Address)...)
	if s.SocketPath != "" && !path.IsAbs(s.SocketPath) {
		errs = append(errs, field.Invalid(spec.Child("socketPath"), s.SocketPath, "must be an absolute path"))
	}
	if s.SSHKeySecretRef != nil {
		if s.SSHKeySecretRef.Name == "" {
			errs = append(errs, field.Required(spec.Child("sshKeySecretRef", "name"), "name the Secret holding ssh-privatekey and known_hosts"))
		}
		if s.SSHKeySecretRef.Namespace == "" {
			errs = append(errs, field.Required(spec.Child("sshKeySecretRef", "namespace"), "KVMHost is cluster-scoped: name the Secret's namespace"))
		}
	}
	if s.NetworkMode != "" && s.NetworkMode != crawlv1.NetworkModeNetwork && s.NetworkMode != crawlv1.NetworkModeBridge {
		errs = append(errs, field.NotSupported(spec.Child("networkMode"), s.NetworkMode, []string{"network", "bridge"}))
	}
	for i, ns := range s.Nameservers {
		if ip := net.ParseIP(ns); ip == nil {
			errs = append(errs, field.Invalid(spec.Child("nameservers").Index(i), ns, "must be an IP address"))
		}
	}
	if s.DomainType != "" && s.DomainType != crawlv1.DomainTypeKVM && s.DomainType != crawlv1.DomainTypeQEMU {
		errs = append(errs, field.NotSupported(spec.Child("domainType"), s.DomainType, []string{"kvm", "qemu"}))
	}

	var interval, timeout time.Duration
	if s.CheckInterval != nil {
		interval = s.CheckInterval.Duration
		if interval <= 0 {
			errs = append(errs, field.Invalid(spec.Child("checkInterval"), s.CheckInterval.Duration.String(), "must be positive"))
		}
	}
	if s.CheckTimeout != nil {
		timeout = s.CheckTimeout.Duration
		if timeout < 0 {
			errs = append(errs, field.Invalid(spec.Child("checkTimeout"), timeout.String(), "must not be negative"))
		}
	}
	if interval > 0 && timeout > interval {
		errs = append(errs, field.Invalid(spec.Child("checkTimeout"), timeout.String(),
			fmt.Sprintf("must not exceed checkInterval (%s)", interval)))
	}
	return errs
}

func validateHostPort(p *field.Path, addr string) field.ErrorList {
	if addr == "" {
		return field.ErrorList{field.Required(p, "host[:port] of the hypervisor's SSH server")}
	}
	host, port := addr, ""
	if hasPort(addr) {
		host, port, _ = net.SplitHostPort(addr)
	}
	if host == "" {
		return field.ErrorList{field.Invalid(p, addr, "host is empty")}
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return field.ErrorList{field.Invalid(p, addr, "port must be a number from 1 to 65535")}
		}
	}
	return nil
}

// toInvalid turns a field.ErrorList into the API's Invalid error for obj.
func toInvalid(obj interface {
	GetName() string
	GetObjectKind() schema.ObjectKind
}, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	gk := schema.GroupKind{Group: crawlv1.GroupVersion.Group, Kind: kindOf(obj)}
	return apierrors.NewInvalid(gk, obj.GetName(), errs)
}

func kindOf(obj any) string {
	switch obj.(type) {
	case *crawlv1.KVMHost:
		return "KVMHost"
	case *crawlv1.KVMImage:
		return "KVMImage"
	case *crawlv1.Proxy:
		return "Proxy"
	case *crawlv1.ProxyPool:
		return "ProxyPool"
	}
	return ""
}
