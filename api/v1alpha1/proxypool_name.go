package v1alpha1

import (
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MaxPoolNameLength is the longest ProxyPool name: the pool publishes a
// Service named <pool>-proxies (PublishedName), a DNS-1035 label of at
// most 63 characters. Its replicas, <pool>-<5 characters>, fit within that.
const MaxPoolNameLength = validation.DNS1035LabelMaxLength - len(PublishedNameSuffix)

// ValidateProxyPoolName says why a pool cannot be named name (path is
// where the name is): every name the pool publishes and names its
// replicas under must be valid, so the name is a DNS-1035 label (a letter
// first) of at most MaxPoolNameLength characters.
func ValidateProxyPoolName(path *field.Path, name string) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1035Label(name) {
		errs = append(errs, field.Invalid(path, name, msg))
	}
	if len(name) > MaxPoolNameLength {
		errs = append(errs, field.TooLong(path, name, MaxPoolNameLength))
	}
	return errs
}
