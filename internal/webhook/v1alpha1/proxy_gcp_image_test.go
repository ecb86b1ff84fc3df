package v1alpha1

import (
	"strings"
	"testing"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func TestGCPImageWithoutCloudInitIsRefusedNamingTheField(t *testing.T) {
	gcpProxy := func(image, userData string, b64 []byte) *crawlv1.Proxy {
		p := &crawlv1.Proxy{}
		p.Name, p.Namespace = "cloud", "default"
		p.Spec.Provider = crawlv1.ProviderGCP
		p.Spec.Port = 3128
		p.Spec.Placement.Image = image
		p.Spec.CloudInit.UserData, p.Spec.CloudInit.UserDataBase64 = userData, b64
		proxyWebhook(false).DefaultProxy(p)
		return p
	}
	for _, tc := range []struct {
		name, image, userData string
		b64                   []byte
		refused               bool
	}{
		{"debian family with user-data", "projects/debian-cloud/global/images/family/debian-12", "#cloud-config\n", nil, true},
		{"debian URL with base64 user-data", "https://www.googleapis.com/compute/v1/projects/debian-cloud/global/images/debian-12-bookworm-v20250101", "", []byte{0x1f, 0x8b}, true},
		{"rocky with user-data", "projects/rocky-linux-cloud/global/images/family/rocky-linux-9", "#cloud-config\n", nil, true},
		{"ubuntu with user-data", "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64", "#cloud-config\n", nil, false},
		{"default image with user-data", "", "#cloud-config\n", nil, false},
		{"debian without user-data", "projects/debian-cloud/global/images/family/debian-12", "", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := proxyWebhook(true).ValidateProxy(gcpProxy(tc.image, tc.userData, tc.b64))
			var found bool
			for _, e := range errs {
				if e.Field == "spec.placement.image" && strings.Contains(e.Detail, "cloud-init") {
					found = true
				}
			}
			if found != tc.refused {
				t.Errorf("refused = %v, want %v (errors: %v)", found, tc.refused, errs.ToAggregate())
			}
		})
	}
}
