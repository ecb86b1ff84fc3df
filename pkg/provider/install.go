package provider

import (
	"fmt"
	"regexp"
)

// An install id names one operator install. Every provider writes it on the
// instances it makes (kvm domain metadata, gcp label, kubernetes label) and
// lists only its own install's instances for garbage collection, so two
// installs sharing hypervisors or a cloud project never sweep each other's
// instances. It is written verbatim as a GCE label value and a Kubernetes
// label value, hence the shape: the intersection of both, so no provider
// has to rewrite it (a lossy rewrite could make two ids equal).
var installIDPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ValidateInstallID reports whether id can name an install: 1 to 63
// lowercase letters, digits and '-', starting and ending with a letter or
// digit (a Kubernetes UID fits).
func ValidateInstallID(id string) error {
	if !installIDPattern.MatchString(id) {
		return fmt.Errorf("install id %q: want 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit", id)
	}
	return nil
}
