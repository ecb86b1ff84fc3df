package kvm

import (
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// Default gives a URL image the firmware and format a KVMImage would get;
// a KVMImage carries its own.
func (hostsPlugin) Default(s *crawlv1.ProxySpec) {
	if crawlv1.IsImageURL(s.Placement.Image) {
		s.Placement.Firmware = s.Placement.Firmware.OrDefault()
		s.Placement.ImageFormat = s.Placement.ImageFormat.OrDefault()
	}
}

// Validate checks the placement: exactly one of host and hostSelector, and
// a KVMImage name or, if the manager allows them, an image URL with its
// checksum.
func (hostsPlugin) Validate(p *crawlv1.Proxy, policy plugin.Policy) field.ErrorList {
	pl := field.NewPath("spec", "placement")
	errs := validatePlacement(pl, &p.Spec.Placement)
	if !policy.AllowImageURLs && crawlv1.IsImageURL(p.Spec.Placement.Image) {
		errs = append(errs, field.Forbidden(pl.Child("image"),
			"image URLs are fetched by the manager from inside the cluster and are refused unless it runs with --allow-proxy-image-urls; name a KVMImage (created by a cluster admin) instead"))
	}
	return errs
}

func validatePlacement(pl *field.Path, p *crawlv1.ProxyPlacement) field.ErrorList {
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
		errs = append(errs, crawlv1.ValidateImageURL(pl.Child("image"), p.Image)...)
		errs = append(errs, crawlv1.ValidateImageChecksum(pl.Child("imageChecksum"), p.ImageChecksum, true)...)
		errs = append(errs, crawlv1.ValidateImageFormat(pl.Child("imageFormat"), p.ImageFormat)...)
		errs = append(errs, crawlv1.ValidateFirmware(pl.Child("firmware"), p.Firmware)...)
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
