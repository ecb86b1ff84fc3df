package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProxyBanSpec is one ban report: a replica of a pool, the domain it is
// banned on, why, and whether to replace it.
// +kubebuilder:validation:XValidation:rule="self.replace || has(self.domain)",message="a report without a domain must ask for replacement (replace: true)"
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a ban report is immutable: create another"
type ProxyBanSpec struct {
	// Pool is the ProxyPool the replica belongs to.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +required
	Pool string `json:"pool"`
	// Proxy is the replica reported: its name in proxies.json.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Proxy string `json:"proxy"`
	// Domain the replica is banned on, lower case, its subdomains
	// included (example.com covers www.example.com). Empty: the report
	// is about the address as a whole, and must ask for replacement.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`
	// +optional
	Domain string `json:"domain,omitempty"`
	// Reason as the crawler saw it (e.g. "HTTP 403 x12"), shown in events
	// and in the pool's quarantine. Never a credential.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Reason string `json:"reason,omitempty"`
	// Replace asks the pool to take the replica out of its list now and
	// replace it (within spec.bans and the disruption budget), and to
	// quarantine its egress address.
	// +optional
	Replace bool `json:"replace,omitempty"`
}

// ProxyBan is a crawler's report that a replica of a ProxyPool is banned
// (docs/pools.md, "Reporting a banned proxy"). A crawler needs only the
// right to create these: no write access to Proxies.
// +kubebuilder:object:root=true
// +kubebuilder:resource:categories=crawl
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Proxy",type=string,JSONPath=`.spec.proxy`
// +kubebuilder:printcolumn:name="Domain",type=string,JSONPath=`.spec.domain`
// +kubebuilder:printcolumn:name="Replace",type=boolean,JSONPath=`.spec.replace`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProxyBan struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ProxyBanSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// ProxyBanList contains a list of ProxyBan.
type ProxyBanList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyBan `json:"items"`
}

func init() {
	addKnownTypes(&ProxyBan{}, &ProxyBanList{})
}
