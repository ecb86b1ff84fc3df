package v1alpha1

// Reasons of the ProxyPool EgressDistinct condition (docs/egress.md), and
// of PlacementBlocked when no host can give a new egress address.
const (
	// PoolEgressDistinctReason: every measured replica leaves from its own
	// address.
	PoolEgressDistinctReason = "Distinct"
	// PoolEgressSharedReason: replicas share an egress address (the
	// message gives the count, the address, the hosts and their model).
	PoolEgressSharedReason = "EgressShared"
	// PoolEgressIgnoredReason: egress.distinct Ignore; nothing promised.
	PoolEgressIgnoredReason = "Ignored"
	// PoolEgressProviderSharedReason: the replicas' provider gives them
	// one shared address (a Cloud NAT, a node's address), so Required
	// cannot be kept.
	PoolEgressProviderSharedReason = "ProviderSharesEgress"
	// PoolNoDistinctEgressReason: with Required, every eligible host
	// already gives the pool an address in use (PlacementBlocked and
	// EgressDistinct).
	PoolNoDistinctEgressReason = "NoDistinctEgress"
)
