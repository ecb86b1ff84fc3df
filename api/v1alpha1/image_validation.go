package v1alpha1

import (
	"net/url"
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Image rules shared by a KVMImage and a kvm Proxy's URL image
// (spec.placement.image), so both are admitted and defaulted alike.

// OrDefault is f, or qcow2 when unset.
func (f ImageFormat) OrDefault() ImageFormat {
	if f == "" {
		return ImageFormatQCOW2
	}
	return f
}

// OrDefault is f, or uefi when unset.
func (f Firmware) OrDefault() Firmware {
	if f == "" {
		return FirmwareUEFI
	}
	return f
}

var checksumRE = regexp.MustCompile(`^sha256:[0-9a-fA-F]{64}$`)

// ValidateImageChecksum checks a "sha256:<64 hex>" checksum at p.
func ValidateImageChecksum(p *field.Path, sum string, required bool) field.ErrorList {
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

// ValidateImageURL checks an http(s) image URL at p.
func ValidateImageURL(p *field.Path, raw string) field.ErrorList {
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

// ValidateImageFormat checks an image format at p (unset is allowed).
func ValidateImageFormat(p *field.Path, f ImageFormat) field.ErrorList {
	switch f {
	case "", ImageFormatQCOW2, ImageFormatRaw:
		return nil
	}
	return field.ErrorList{field.NotSupported(p, f, []string{string(ImageFormatQCOW2), string(ImageFormatRaw)})}
}

// ValidateFirmware checks a firmware at p (unset is allowed).
func ValidateFirmware(p *field.Path, f Firmware) field.ErrorList {
	switch f {
	case "", FirmwareUEFI, FirmwareBIOS:
		return nil
	}
	return field.ErrorList{field.NotSupported(p, f, []string{string(FirmwareUEFI), string(FirmwareBIOS)})}
}
