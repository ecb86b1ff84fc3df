// Package kubernetes is the in-cluster provider: one Proxy becomes a squid
// Pod and the ConfigMap holding its squid.conf, in the Proxy's namespace,
// behind a NetworkPolicy admitting only its clients and the manager; a
// managed Proxy (Machine.Squid) with Basic auth also gets a Secret with
// its password file. An unmanaged one's clients are
// Machine.AllowedSourceCIDRs.
//
// Why a bare Pod and not a one-replica Deployment: the provider contract is
// one instance with an exact lifecycle, addressed by a provider ID
// (kubernetes://<namespace>/<pod-name>) and checked by identity before it is
// touched. A Pod gives exactly that: a fixed name, a phase that maps 1:1 to
// provider states, and deletion guarded by a UID precondition. A
// Deployment's self-healing would replace the pod under a new name (a
// stale provider ID), hide failures the Proxy controller is meant to see and
// act on (it owns rebuild decisions for every provider alike), and add a
// ReplicaSet between the Proxy and its pod. The self-healing that matters is
// kept: restartPolicy Always lets the kubelet restart a crashed or wedged
// (liveness probe) squid in place, same pod, same IP.
//
// A pod gone for good is replaced by this provider, under a new name: one
// in phase Failed (evicted, its node shut down; it stays so until pod
// garbage collection), or one whose deletion is pending StuckDeletionAfter
// past its deadline while its node is NotReady or gone (a pod on an
// unreachable node stays Terminating until the node object is removed).
// Get reports such a pod as not found, so the controller rebuilds; Create
// deletes it (if not already deleting) and creates incarnation n+1,
// "proxy-<name>-<8 hex>-<n>", which never meets the old pod's name.
//
// Why no Service: the endpoint is the pod IP. A Proxy is one pod, so a
// ClusterIP would only add a second object and a virtual IP that, like the
// pod IP, is reachable only inside the cluster; and the pod IP is reported
// only once the readiness probe passes, which is what a Service would have
// added. The controller re-reads the address through Get, so a rebuilt pod's
// new IP is picked up.
//
// squid.conf is rendered by pkg/squid, the one renderer: for a managed
// Proxy from Machine.Squid (allow-list AND Basic auth, denied destinations,
// connection cap), for an unmanaged one from the provider's built-in policy
// (Options.AllowedClientCIDRs, no auth; see DefaultAllowedClientCIDRs).
// The bcrypt password file is a Secret mounted as a directory (AuthDir), so
// a changed password reaches the running squid without a restart
// (basic_ncsa_auth re-reads the file when it changes); Create rewrites the
// ConfigMap, Secret and NetworkPolicy when what they hold differs from the
// Machine. The NetworkPolicy is made before the pod, so the pod never runs
// unguarded, and deleted after it. It admits the proxy port from the
// clients and the manager, and lets squid reach the cluster's DNS and
// every address its deny list does not hold.
//
// Every squid of this provider also refuses the cluster's own ranges
// (ClusterRanges: ServiceCIDRs, the kubernetes Service, Nodes' pod ranges
// and addresses, Options.ExtraClusterRanges), which no exception of a
// Proxy lifts (denylist.go). They change as nodes come and go, so they are
// a file of their own in the ConfigMap, which is mounted as a directory
// (ConfigDir): when they change, NewForManager's watch rewrites that file
// and the NetworkPolicies, the kubelet updates the mounted files, and the
// container's reloader (SquidCommand) has squid re-read them, without a new
// pod.
//
// The upstream counter (squid.UpstreamCounter), which counts the target
// sites' answers by class for the operator's Stats credential, is a key of
// the same ConfigMap, projected executable beside squid.conf
// (configVolume). squid does not start, nor survive a reconfigure, when its
// logfile daemon cannot run, and a pod re-reads its ConfigMap in place: so
// squid.conf runs the counter only while every live pod of the Proxy has
// it (runsCounter). A pod made before the operator delivered it keeps a
// squid.conf without it, and its Proxy reports no classes, until it is
// replaced (a rebuild, a pool's rollout or rotation); the provider does
// not replace a serving pod for it.
//
// Naming and identity: the ConfigMap, Secret, NetworkPolicy and the first
// pod are named ObjectName(name, uid), "proxy-<name>-<8 hex of
// sha256(uid)>"; replacement pods add "-<incarnation>" (PodName). Every
// object carries the tag contract labels (LabelManagedBy, LabelTag,
// LabelProxyUID, LabelProxyName)
// and a controller owner reference to the Proxy, so Kubernetes' garbage
// collector removes them with the Proxy even if the operator never gets to.
// Get and Delete act only on objects whose proxy-uid label equals the
// Machine's UID; anything else under our name is a *provider.IdentityError
// and is never deleted. Because the uid is in the name, a Proxy deleted and
// recreated under the same name never meets its predecessor's terminating
// pod.
//
// Machine fields used: Namespace, Name, UID, ProviderID, Tag, Port, Squid,
// CPUs and MemoryBytes (requests = limits, for the Guaranteed QoS class: an
// evicted proxy is an outage). Not used: UserData, VendorData, Image (the squid
// image is Options.SquidImage), DiskBytes (squid keeps no cache here) and the
// GCP/KVM placement fields.
//
// Spec changes are not applied to an existing pod (pods are immutable);
// the controller rebuilds (Delete, then Create) when it wants them.
//
// Secrets and NetworkPolicies are read only through the API reader, never
// the cache: a Secret informer would hold every Secret of the cluster.
//
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;create;update;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=get
// +kubebuilder:rbac:groups=networking.k8s.io,resources=servicecidrs,verbs=list;watch
package kubernetes
