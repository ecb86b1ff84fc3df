package v1alpha1

import (
	"context"

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
	img.Spec.Firmware = img.Spec.Firmware.OrDefault()
	img.Spec.Format = img.Spec.Format.OrDefault()
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
	errs = append(errs, crawlv1.ValidateImageURL(spec.Child("url"), img.Spec.URL)...)
	errs = append(errs, crawlv1.ValidateImageChecksum(spec.Child("checksum"), img.Spec.Checksum, true)...)
	errs = append(errs, crawlv1.ValidateImageFormat(spec.Child("format"), img.Spec.Format)...)
	errs = append(errs, crawlv1.ValidateFirmware(spec.Child("firmware"), img.Spec.Firmware)...)
	return errs
}
