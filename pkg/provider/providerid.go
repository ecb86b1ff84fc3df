package provider

import (
	"fmt"
	"strings"
)

// ProviderID identifies an instance across providers: "<scheme>://<location>/<id>".
//
//	kvm://<host>/<domain-uuid>
//	kubernetes://<namespace>/<pod-name>
//	gce://<project>/<zone>/<instance-name>   (location "project/zone")
type ProviderID struct {
	Scheme   string
	Location string
	ID       string
}

const (
	SchemeKVM        = "kvm"
	SchemeKubernetes = "kubernetes"
	SchemeGCE        = "gce"
)

func (p ProviderID) String() string {
	return p.Scheme + "://" + p.Location + "/" + p.ID
}

// ParseProviderID parses and validates s. Every part must be non-empty.
func ParseProviderID(s string) (ProviderID, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || scheme == "" {
		return ProviderID{}, fmt.Errorf("provider ID %q: want <scheme>://<location>/<id>", s)
	}
	i := strings.LastIndex(rest, "/")
	if i <= 0 || i == len(rest)-1 {
		return ProviderID{}, fmt.Errorf("provider ID %q: want <scheme>://<location>/<id>", s)
	}
	p := ProviderID{Scheme: scheme, Location: rest[:i], ID: rest[i+1:]}
	if strings.Contains(p.Location, "//") || strings.HasPrefix(p.Location, "/") {
		return ProviderID{}, fmt.Errorf("provider ID %q: empty location segment", s)
	}
	return p, nil
}

// FormatKVMProviderID returns kvm://<host>/<uuid>.
func FormatKVMProviderID(host, uuid string) string {
	return ProviderID{Scheme: SchemeKVM, Location: host, ID: uuid}.String()
}

// ParseKVMProviderID returns the host and the domain UUID of a kvm provider ID.
func ParseKVMProviderID(s string) (host, uuid string, err error) {
	p, err := ParseProviderID(s)
	if err != nil {
		return "", "", err
	}
	if p.Scheme != SchemeKVM {
		return "", "", fmt.Errorf("provider ID %q: scheme %q is not %q", s, p.Scheme, SchemeKVM)
	}
	if strings.Contains(p.Location, "/") {
		return "", "", fmt.Errorf("provider ID %q: host %q must not contain '/'", s, p.Location)
	}
	if !isUUID(p.ID) {
		return "", "", fmt.Errorf("provider ID %q: %q is not a UUID", s, p.ID)
	}
	return p.Location, strings.ToLower(p.ID), nil
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return false
			}
		}
	}
	return true
}
