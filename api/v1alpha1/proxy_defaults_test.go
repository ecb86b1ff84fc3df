package v1alpha1

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

func TestProxySpecDefault(t *testing.T) {
	t.Run("create fills everything and adds a managed access", func(t *testing.T) {
		s := &ProxySpec{}
		s.Default(true)
		if s.Port != DefaultProxyPort || s.Resources.CPUs != 1 || !*s.InstallGuestAgent ||
			s.Resources.Memory.Cmp(resource.MustParse("512Mi")) != 0 || s.Resources.Disk.Cmp(resource.MustParse("10Gi")) != 0 {
			t.Errorf("defaults: %+v", s)
		}
		a := s.Access
		if a == nil || !*a.Managed || a.Auth.Type != ProxyAuthBasic || len(a.AllowedPorts) != 2 || a.MaxConnectionsPerClient != 256 {
			t.Errorf("access: %+v", a)
		}
	})
	t.Run("update never adds access", func(t *testing.T) {
		s := &ProxySpec{}
		s.Default(false)
		if s.Access != nil {
			t.Errorf("access added on update: %+v", s.Access)
		}
		if s.Port != DefaultProxyPort {
			t.Errorf("port %d", s.Port)
		}
	})
	t.Run("set values stay", func(t *testing.T) {
		s := &ProxySpec{Port: 8080, InstallGuestAgent: ptr.To(false), Resources: ProxyResources{CPUs: 4, Memory: ptr.To(resource.MustParse("1Gi"))},
			Access: &ProxyAccess{AllowedPorts: []int32{8443}, Auth: &ProxyAuth{Type: ProxyAuthNone}}}
		s.Default(true)
		if s.Port != 8080 || *s.InstallGuestAgent || s.Resources.CPUs != 4 || s.Resources.Memory.String() != "1Gi" ||
			len(s.Access.AllowedPorts) != 1 || s.Access.Auth.Type != ProxyAuthNone {
			t.Errorf("a set value was overwritten: %+v, access %+v", s, s.Access)
		}
	})
	t.Run("an unmanaged access gets nothing but managed", func(t *testing.T) {
		s := &ProxySpec{Access: &ProxyAccess{Managed: ptr.To(false)}}
		s.Default(true)
		if a := s.Access; a.Auth != nil || a.AllowedPorts != nil || a.MaxConnectionsPerClient != 0 {
			t.Errorf("unmanaged access defaulted: %+v", a)
		}
	})
}
