package v1alpha1

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// Bounds of the ban and quarantine durations: under a minute a ban would
// end before a crawler reloads its list; past 30 days a stale report
// outlives any site's memory of an address (and the quarantine's status
// list would fill with addresses long released).
const (
	minBanDuration = time.Minute
	maxBanDuration = 720 * time.Hour
)

// validatePoolBans checks spec.bans and spec.egress.quarantine.
func validatePoolBans(s *crawlv1.ProxyPoolSpec) field.ErrorList {
	spec := field.NewPath("spec")
	bans := spec.Child("bans")
	errs := banDuration(spec.Child("egress", "quarantine"), s.Egress.Quarantine)
	errs = append(errs, banDuration(bans.Child("domainBanDuration"), s.Bans.DomainBanDuration)...)
	if n := s.Bans.ReplaceAfterDomains; n < 0 {
		errs = append(errs, field.Invalid(bans.Child("replaceAfterDomains"), n, "must be at least 1"))
	}
	if n := s.Bans.MaxReplacementsPerHour; n != nil && *n < 0 {
		errs = append(errs, field.Invalid(bans.Child("maxReplacementsPerHour"), *n, "must not be negative (0 replaces none)"))
	}
	_, e := validateIntOrPercent(bans.Child("maxBanned"), s.Bans.MaxBanned, true)
	return append(errs, e...)
}

func banDuration(p *field.Path, d *metav1.Duration) field.ErrorList {
	if d != nil && (d.Duration < minBanDuration || d.Duration > maxBanDuration) {
		return field.ErrorList{field.Invalid(p, d.Duration.String(), fmt.Sprintf("must be from %s to %s", minBanDuration, maxBanDuration))}
	}
	return nil
}
