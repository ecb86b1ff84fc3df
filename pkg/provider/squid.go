package provider

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	"crawl.example.com/proxy-operator/pkg/squid"
)

// ManagedSquid returns the squid configuration a provider renders and
// delivers for m: m.Squid with the provider's paths and, when Squid.Port
// is 0, the Machine's Port (0 is squid's 3128 either way). ok is false when
// the user's cloud-init owns squid (m.Squid nil). Errors are permanent and
// name spec.access fields; they never carry the password.
func ManagedSquid(m *Machine, paths squid.Paths) (c squid.Config, ok bool, err error) {
	if m.Squid == nil {
		return squid.Config{}, false, nil
	}
	c = *m.Squid
	c.Paths = paths
	switch {
	case c.Port == 0:
		c.Port = int(m.Port)
	case m.Port != 0 && c.Port != int(m.Port):
		return squid.Config{}, true, Permanentf("managed squid listens on %d but the Proxy's port is %d", c.Port, m.Port)
	}
	if err := c.ValidateFields(field.NewPath("spec", "access")).ToAggregate(); err != nil {
		return squid.Config{}, true, Permanentf("managed squid configuration: %w", err)
	}
	return c, true, nil
}
