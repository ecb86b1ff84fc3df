package v1alpha1

// Condition types shared by the kinds of this group.
const (
	// ReadyCondition: KVMHost answers and its pool serves; KVMImage is
	// verified on every host that needs it; Proxy serves traffic.
	ReadyCondition = "Ready"

	// InstanceProvisionedCondition (Proxy): the provider instance exists and
	// runs with an address.
	InstanceProvisionedCondition = "InstanceProvisioned"

	// ProxyHealthyCondition (Proxy): the proxy port answers (TCP connect) or,
	// with --proxy-probe-url, a request through the proxy succeeds.
	ProxyHealthyCondition = "ProxyHealthy"

	// SecureCondition (Proxy): a request without credentials is refused
	// with 407. False names what answered instead, or that auth type None
	// leaves only the source list. Checked after each successful probe.
	SecureCondition = "Secure"

	// DeletionBlockedCondition (Proxy): deletion cannot converge without an
	// operator, e.g. a same-named domain that is not this Proxy's, or until
	// the host the instance is on answers again (HostNotAnswering).
	DeletionBlockedCondition = "DeletionBlocked"

	// HostUnavailableCondition (Proxy): True while the provider does not
	// call the host the instance is on (a KVM host whose health checks get
	// no answer), so the Proxy keeps its last known instance state and
	// its proxy is still probed. Removed once a call reaches the host.
	HostUnavailableCondition = "HostUnavailable"
)

// KVMHost Ready reasons. The dial-stage reasons name where the connection
// failed, so `kubectl get kvmhosts` says what to fix.
const (
	HostReadyReason                = "Ready"
	HostSSHMaterialMissingReason   = "SSHMaterialMissing"
	HostSSHMaterialInvalidReason   = "SSHMaterialInvalid"
	HostTCPUnreachableReason       = "TCPUnreachable"
	HostSSHHandshakeFailedReason   = "SSHHandshakeFailed"
	HostLibvirtConnectFailedReason = "LibvirtConnectFailed"
	HostPoolMissingReason          = "PoolMissing"
	HostPoolInactiveReason         = "PoolInactive"
	HostTimeoutReason              = "Timeout"
	HostProbeFailedReason          = "ProbeFailed"
	HostProxiesRemainingReason     = "ProxiesRemaining"
)

// Proxy condition reasons.
const (
	ProxyReadyReason             = "Ready"
	ProxyProvisioningReason      = "Provisioning"
	ProxyWaitingForHostReason    = "WaitingForHost"
	ProxyWaitingForImageReason   = "WaitingForImage"
	ProxyWaitingForAddressReason = "WaitingForAddress"
	ProxyAddressTimeoutReason    = "AddressTimeout"
	ProxyTransientErrorReason    = "TransientError"
	ProxyPermanentErrorReason    = "PermanentError"
	ProxyProviderDisabledReason  = "ProviderNotEnabled"
	ProxyInstanceMissingReason   = "InstanceMissing"
	// ProxyHostNotAnsweringReason (HostUnavailable; InstanceProvisioned
	// while no instance serves; DeletionBlocked): the provider did not call
	// the instance's host, which does not answer its health checks; retried
	// when it does.
	ProxyHostNotAnsweringReason = "HostNotAnswering"

	// ProxyInsufficientCapacityReason (InstanceProvisioned): where the
	// instance is to go (its zone) has no room now; retried. A pool places
	// its next replicas in its other zones first.
	ProxyInsufficientCapacityReason = "InsufficientCapacity"

	// ProxyInstanceNotRunningReason (ProxyHealthy): the provider reported
	// the instance not running; it is being started.
	ProxyInstanceNotRunningReason = "InstanceNotRunning"
	ProxyNotProbedReason          = "PortOpenProxyNotProbed"
	// ProxyNotYetProbedReason (ProxyHealthy): the instance was rebuilt or
	// its address changed; health is judged anew there.
	ProxyNotYetProbedReason    = "NotYetProbed"
	ProxyProbeSucceededReason  = "ProbeSucceeded"
	ProxyProbeFailedReason     = "ProbeFailed"
	ProxyPortClosedReason      = "PortClosed"
	ProxyForeignInstanceReason = "ForeignInstance"
	ProxyDeletingReason        = "Deleting"
	// ProxyProbeAuthFailedReason (ProxyHealthy): squid refused the
	// manager's credentials with 407.
	ProxyProbeAuthFailedReason = "ProbeAuthFailed"
	// ProxyCredentialsMissingReason (InstanceProvisioned): the credential
	// Secret named by spec.access.auth.secretRef is absent or lacks a key,
	// or the operator's Secret with a generated credential was lost while
	// the instance exists.
	ProxyCredentialsMissingReason = "CredentialsMissing"
	// ProxyCredentialsInvalidReason (InstanceProvisioned): the credential
	// does not meet squid's rules (username characters, password length).
	ProxyCredentialsInvalidReason = "CredentialsInvalid"
	// ProxyCredentialsConflictReason (InstanceProvisioned): a Secret not
	// owned by the Proxy has the name of its credential Secret.
	ProxyCredentialsConflictReason = "CredentialsConflict"
	// ProxyCredentialsNotForProxiesReason (InstanceProvisioned): the
	// Secret named by spec.access.auth.secretRef is not of type
	// CredentialsSecretType, so it was not made for proxies and is
	// neither copied nor used.
	ProxyCredentialsNotForProxiesReason = "CredentialsNotForProxies"
	// ProxySpecRefusedReason (InstanceProvisioned): the stored spec
	// breaks a rule admission applies under the manager's flags (stored
	// before the rule, or past the webhook): nothing is created for it.
	ProxySpecRefusedReason = "SpecRefused"
	// ProxyWaitingForIPAddressReason (InstanceProvisioned): the Proxy's
	// IPAddressClaim is not bound yet; the message names the pool and the
	// claim's own Ready reason (e.g. PoolExhausted). Nothing is created.
	ProxyWaitingForIPAddressReason = "WaitingForIPAddress"
	// ProxyAddressInUseReason (InstanceProvisioned): another Proxy, named in
	// the message, holds the address the claim was given; nothing is
	// created until it lets the address go.
	ProxyAddressInUseReason = "AddressInUse"
	// ProxyIPAMNotInstalledReason (InstanceProvisioned): the Proxy names an
	// IPAM pool and the cluster serves no ipam.cluster.x-k8s.io/v1beta2
	// IPAddressClaim (install an IPAM provider, then restart the manager).
	ProxyIPAMNotInstalledReason = "IPAMNotInstalled"
	// Secure reasons. OpenProxy on a managed squid with Basic auth also
	// makes Ready False: an open proxy is never reported serving.
	ProxyAuthRequiredReason  = "AuthenticationRequired"
	ProxyOpenProxyReason     = "OpenProxy"
	ProxySecureUnknownReason = "NotChecked"
	// ProxySourceListOnlyReason (Secure False): auth type None, so only
	// spec.access.allowedSourceCIDRs guards the proxy.
	ProxySourceListOnlyReason = "SourceListOnly"
)

// KVMImage Ready reasons.
const (
	ImageVerifiedReason = "Verified"
	ImagePendingReason  = "Pending"
	ImageFailedReason   = "Failed"
	ImageNoHostsReason  = "NoHosts"
)
