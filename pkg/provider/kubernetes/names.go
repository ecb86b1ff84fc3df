package kubernetes

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// ObjectName is the name of the Pod and ConfigMap of a Proxy: a DNS-1123
// label (so also a valid hostname), at most 63 characters.
func ObjectName(proxyName, uid string) string {
	return PodName(proxyName, uid, 0)
}

// PodName is the name of a Proxy's pod of the given incarnation: the
// ObjectName for the first, with "-<incarnation>" for each replacement.
func PodName(proxyName, uid string, incarnation int) string {
	suffix := provider.UIDSuffix(uid)
	if incarnation > 0 {
		suffix += "-" + strconv.Itoa(incarnation)
	}
	return provider.DNSLabel("proxy-"+proxyName, suffix, validation.DNS1123LabelMaxLength)
}

// labelValue cuts s to a valid label value (Proxy names may be 253 long).
func labelValue(s string) string {
	if len(s) > validation.LabelValueMaxLength {
		s = s[:validation.LabelValueMaxLength]
	}
	return strings.TrimRightFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	})
}

// spreadGroupValue is group as a label value: as is when it is one, else
// cut and suffixed with its hash so long names stay apart.
func spreadGroupValue(group string) string {
	if len(validation.IsValidLabelValue(group)) == 0 {
		return group
	}
	return provider.DNSLabel(group, provider.UIDSuffix(group), validation.LabelValueMaxLength)
}

// FormatProviderID returns kubernetes://<namespace>/<pod>.
func FormatProviderID(namespace, pod string) string {
	return provider.ProviderID{Scheme: provider.SchemeKubernetes, Location: namespace, ID: pod}.String()
}

// ParseProviderID splits a kubernetes provider ID.
func ParseProviderID(s string) (namespace, pod string, err error) {
	id, err := provider.ParseProviderID(s)
	if err != nil {
		return "", "", err
	}
	if id.Scheme != provider.SchemeKubernetes || strings.Contains(id.Location, "/") {
		return "", "", fmt.Errorf("provider ID %q: want kubernetes://<namespace>/<pod>", s)
	}
	return id.Location, id.ID, nil
}

// key is the Pod's (and ConfigMap's) name for m: the recorded provider ID's
// pod once there is one, so a later change of naming never loses a pod.
func key(m *provider.Machine) (types.NamespacedName, error) {
	if m.Namespace == "" || m.Name == "" || m.UID == "" {
		return types.NamespacedName{}, provider.Permanentf("kubernetes: Machine lacks namespace, name or uid (%q/%q uid %q)", m.Namespace, m.Name, m.UID)
	}
	if m.ProviderID == "" {
		return types.NamespacedName{Namespace: m.Namespace, Name: ObjectName(m.Name, m.UID)}, nil
	}
	ns, pod, err := ParseProviderID(m.ProviderID)
	if err != nil {
		return types.NamespacedName{}, provider.Permanentf("kubernetes: recorded %w", err)
	}
	if ns != m.Namespace {
		return types.NamespacedName{}, provider.Permanentf("kubernetes: recorded provider ID %q is not in the Proxy's namespace %q", m.ProviderID, m.Namespace)
	}
	return types.NamespacedName{Namespace: ns, Name: pod}, nil
}

// configKey is the name of the ConfigMap, Secret and NetworkPolicy: one
// each per Proxy, shared by every incarnation of its pod.
func configKey(m *provider.Machine) types.NamespacedName {
	return types.NamespacedName{Namespace: m.Namespace, Name: ObjectName(m.Name, m.UID)}
}
