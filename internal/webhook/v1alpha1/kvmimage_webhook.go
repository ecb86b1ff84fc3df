package v1alpha1

import (
	"context"
	"net/url"
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// SetupWithManager registers the KVMImage webhooks.
func (w *KVMImageWebhook) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &crawlv1.KVMImage{}).WithDefaulter(w).WithValidator(w).Complete()
}

// +kubebuilder:webhook:path=/mutate-crawl-example-com-v1alpha1-kvmimage,mutating=true,failurePolicy=fail,sideEffects=None,groups=crawl.example.com,resources=kvmimages,verbs=create;update,versions=v1alpha1,name=mkvmimage.crawl.example.com,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-crawl-example-com-v1alpha1-kvmimage,mutating=false,failurePolicy=fail,sideEffects=None,groups=crawl.example.com,resources=kvmimages,verbs=create;update,versions=v1alpha1,name=vkvmimage.crawl.example.com,admissionReviewVersions=v1

// KVMImageWebhook defaults and validates KVMImages.
type KVMImageWebhook struct{}

func (w *KVMImageWebhook) Default(ctx context.Context, img *crawlv1.KVMImage) error {
	old := &crawlv1.KVMImage{}
	update, err := storedObject(ctx, old)
	if err != nil {
		return err
	}
	if update && leftAlone(img, old.Spec, img.Spec) {
		return nil
	}
	DefaultKVMImage(img)
	return nil
}

// DefaultKVMImage applies KVMImage defaults in place.
func DefaultKVMImage(img *crawlv1.KVMImage) {
	if img.Spec.Firmware == "" {
		img.Spec.Firmware = crawlv1.FirmwareUEFI
	}
	if img.Spec.Format == "" {
		img.Spec.Format = crawlv1.ImageFormatQCOW2
	}
}

func (w *KVMImageWebhook) ValidateCreate(_ context.Context, img *crawlv1.KVMImage) (admission.Warnings, error) {
	return nil, toInvalid(img, ValidateKVMImage(img))
}

func (w *KVMImageWebhook) ValidateUpdate(_ context.Context, old, img *crawlv1.KVMImage) (admission.Warnings, error) {
	if leftAlone(img, old.Spec, img.Spec) {
		return nil, nil
	}
	return nil, toInvalid(img, ratchet(ValidateKVMImage(img), ValidateKVMImage(old)))
}

func (w *KVMImageWebhook) ValidateDelete(context.Context, *crawlv1.KVMImage) (admission.Warnings, error) {
	return nil, nil
}

// ValidateKVMImage returns every problem of img's spec, each naming its field.
func ValidateKVMImage(img *crawlv1.KVMImage) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	errs = append(errs, validateImageURL(spec.Child("url"), img.Spec.URL)...)
	errs = append(errs, validateChecksum(spec.Child("checksum"), img.Spec.Checksum, true)...)
	errs = append(errs, validateFormat(spec.Child("format"), img.Spec.Format)...)
	errs = append(errs, validateFirmware(spec.Child("firmware"), img.Spec.Firmware)...)
	return errs
}

var checksumRE = regexp.MustCompile(`^sha256:[0-9a-fA-F]{64}$`)

func validateChecksum(p *field.Path, sum string, required bool) field.ErrorList {
	if sum == "" {
		if required {
			return field.ErrorList{field.Required(p, `"sha256:<64 hex digits>" of the image`)}
		}
		return nil
	}
	if !checksumRE.MatchString(sum) {
		return field.ErrorList{field.Invalid(p, sum, `must be "sha256:" followed by 64 hex digits`)}
	}
	return nil
}

func validateImageURL(p *field.Path, raw string) field.ErrorList {
	if raw == "" {
		return field.ErrorList{field.Required(p, "http(s) URL of the image")}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return field.ErrorList{field.Invalid(p, raw, "not a URL: "+err.Error())}
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return field.ErrorList{field.Invalid(p, raw, "scheme must be http or https")}
	}
	if u.Host == "" {
		return field.ErrorList{field.Invalid(p, raw, "URL has no host")}
	}
	return nil
}

func validateFormat(p *field.Path, f crawlv1.ImageFormat) field.ErrorList {
	switch f {
	case "", crawlv1.ImageFormatQCOW2, crawlv1.ImageFormatRaw:
		return nil
	}
	return field.ErrorList{field.NotSupported(p, f, []string{string(crawlv1.ImageFormatQCOW2), string(crawlv1.ImageFormatRaw)})}
}

func validateFirmware(p *field.Path, f crawlv1.Firmware) field.ErrorList {
	switch f {
	case "", crawlv1.FirmwareUEFI, crawlv1.FirmwareBIOS:
		return nil
	}
	return field.ErrorList{field.NotSupported(p, f, []string{string(crawlv1.FirmwareUEFI), string(crawlv1.FirmwareBIOS)})}
}
