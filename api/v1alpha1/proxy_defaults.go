package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"crawl.example.com/proxy-operator/pkg/squid"
)

// Default fills in, in place, what a Proxy spec leaves out: the port,
// sizing, the guest agent and a managed spec.access's auth, ports and
// connection cap. The Proxy webhook applies it on every admission, the
// ProxyPool webhook to its template, and the controllers to what they
// read (a Proxy stored with the webhooks off carries none of it). A
// provider's own defaults come on top (its plug-in's Default).
//
// create is for a Proxy being created: one without spec.access then gets
// an operator-managed squid with a generated Basic credential (secure by
// default). Updates never add spec.access: a Proxy stored before it
// existed stays unmanaged, as it was created (see Proxy.IsManaged).
func (s *ProxySpec) Default(create bool) {
	if create && s.Access == nil {
		s.Access = &ProxyAccess{}
	}
	s.Access.defaultManaged()
	if s.InstallGuestAgent == nil {
		s.InstallGuestAgent = ptr.To(true)
	}
	if s.Port == 0 {
		s.Port = DefaultProxyPort
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
}

// defaultManaged fills what a managed squid's access leaves out with the
// renderer's defaults. An unmanaged Proxy's access fields are refused by
// validation, and defaulting them would make that refusal the webhook's
// own doing.
func (a *ProxyAccess) defaultManaged() {
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
		a.Auth = &ProxyAuth{}
	}
	if a.Auth.Type == "" {
		a.Auth.Type = ProxyAuthBasic
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
