package gcp

import (
	"fmt"
	"strings"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// Label keys written on every instance (and its boot disk). They are the
// tag contract: ListByTag filters on LabelTag, ownership checks compare
// LabelUID, garbage collection reads the owner back.
//
// Keys that list filters name use underscores: the documented filter
// grammar has dotted identifiers (labels.owner) and says nothing of
// hyphens, which AIP-160 reads as negation.
const (
	LabelManagedBy = "managed_by"
	LabelTag       = "proxy_tag"
	LabelUID       = "proxy-uid"
	LabelNamespace = "proxy-namespace"
	LabelName      = "proxy-name"
	// LabelInstall is the operator install that made the instance
	// (provider.ValidateInstallID, so written verbatim); ListByTag selects
	// it too, so installs sharing a project never collect each other's.
	LabelInstall = "proxy_install"

	// ManagedBy is the value of LabelManagedBy.
	ManagedBy = "proxy-operator"
)

// Metadata keys. GCE labels are lossy (lowercase, 63 characters, a small
// alphabet), so the exact owner is also kept in metadata, which takes any
// string; the labels remain what filters and identity checks use.
const (
	MetadataUserData         = "user-data"
	MetadataUserDataEncoding = "user-data-encoding"
	// MetadataStartupScript carries the managed squid's script
	// (guestsquid, final stage), which google-guest-agent runs at every
	// boot once the network is up.
	MetadataStartupScript = "startup-script"
	MetadataNamespace     = "proxy-namespace"
	MetadataName          = "proxy-name"
)

const maxNameLen = 63

// InstanceName is the Compute Engine instance name for a Proxy:
// "proxy-<namespace>-<name>" sanitized and cut so that, with "-" and the
// first 8 hex digits of sha256(uid), it fits GCE's rule
// [a-z]([-a-z0-9]{0,61}[a-z0-9])?. The uid hash keeps two Proxies whose
// names sanitize or truncate to the same prefix apart, and gives a Proxy
// recreated under the same name a fresh instance instead of a collision with
// the one its predecessor left behind.
func InstanceName(namespace, name, uid string) string {
	return provider.DNSLabel("proxy-"+namespace+"-"+name, provider.UIDSuffix(uid), maxNameLen)
}

// LabelValue makes s a valid GCE label value: lowercase, only [a-z0-9_-],
// at most 63 characters. Other characters become '-'. It is deterministic,
// so the same input always compares equal to what was written at create.
func LabelValue(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	return string(b)
}

// ListFilter is the list filter selecting the instances of install that
// carry tag. With no install it selects on the tag alone: instances without
// the install label are then the caller's to tell apart.
func ListFilter(tag, install string) string {
	f := fmt.Sprintf("(labels.%s = %q)", LabelTag, LabelValue(tag))
	if install != "" {
		f += fmt.Sprintf(" AND (labels.%s = %q)", LabelInstall, install)
	}
	return f
}

// FormatProviderID returns gce://<project>/<zone>/<instance>.
func FormatProviderID(project, zone, instance string) string {
	return provider.ProviderID{Scheme: provider.SchemeGCE, Location: project + "/" + zone, ID: instance}.String()
}

// ParseProviderID splits a gce provider ID.
func ParseProviderID(s string) (project, zone, instance string, err error) {
	p, err := provider.ParseProviderID(s)
	if err != nil {
		return "", "", "", err
	}
	if p.Scheme != provider.SchemeGCE {
		return "", "", "", fmt.Errorf("provider ID %q: scheme %q is not %q", s, p.Scheme, provider.SchemeGCE)
	}
	project, zone, ok := strings.Cut(p.Location, "/")
	if !ok || project == "" || zone == "" || strings.Contains(zone, "/") {
		return "", "", "", fmt.Errorf("provider ID %q: want gce://<project>/<zone>/<instance>", s)
	}
	return project, zone, p.ID, nil
}

// lastSegment returns what follows the last '/' of a resource URL
// ("https://…/zones/us-central1-a" → "us-central1-a").
func lastSegment(s string) string {
	if i := strings.LastIndex(s, "/"); i >= 0 {
		return s[i+1:]
	}
	return s
}
