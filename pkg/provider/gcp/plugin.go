package gcp

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// Plugin is the gcp provider's part in the operator's generic code (see
// package plugin): instances in zones, booting spec.placement.image as
// given. With noExternalIP (--gcp-no-external-ip) instances leave through
// the region's Cloud NAT, which they share.
func Plugin(noExternalIP bool) plugin.Plugin {
	b := plugin.Basic{Provider: Name, In: plugin.Zones, Rules: validate}
	if noExternalIP {
		b.Shared = func(*crawlv1.ProxySpec) string {
			return "gcp instances without external IPs (--gcp-no-external-ip) leave through the region's Cloud NAT, which they share"
		}
	}
	return b
}

// validate refuses user-data an instance could not use: on an image whose
// guest has no cloud-init, or over Compute Engine's metadata limit.
// Checked here, not only at Create, so the Proxy is refused rather than
// stored to fail. The content never goes into a message.
func validate(p *crawlv1.Proxy, _ plugin.Policy) field.ErrorList {
	s := &p.Spec
	ci := field.NewPath("spec", "cloudInit")
	var errs field.ErrorList
	if s.CloudInit.UserData != "" || len(s.CloudInit.UserDataBase64) > 0 {
		if why := CloudInitUnsupported(s.Placement.Image); why != "" {
			errs = append(errs, field.Invalid(field.NewPath("spec", "placement", "image"), s.Placement.Image, why))
		}
	}
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
	return errs
}
