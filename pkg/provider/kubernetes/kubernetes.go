// Package kubernetes is the in-cluster provider: one Proxy becomes a squid
// Pod and the ConfigMap holding its squid.conf, in the Proxy's namespace;
// a managed Proxy (Machine.Squid) also gets a Secret with its password file
// and a NetworkPolicy admitting only its clients and the manager.
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

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// Name is the value of Proxy.spec.provider this provider serves.
const Name = "kubernetes"

// The tag contract, as labels on the Pod and the ConfigMap.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelTag       = "crawl.example.com/tag"
	LabelProxyUID  = "crawl.example.com/proxy-uid"
	// LabelInstall is the operator install that made the object
	// (provider.ValidateInstallID); ListByTag selects it too, so two
	// installs in one cluster never collect each other's pods.
	LabelInstall = "crawl.example.com/install"
	// LabelProxyName is the Proxy name, cut to a valid label value;
	// AnnotationProxyName has it exactly.
	LabelProxyName      = "crawl.example.com/proxy-name"
	AnnotationProxyName = "crawl.example.com/proxy-name"
	// LabelAppName lets NetworkPolicies select proxy pods.
	LabelAppName = "app.kubernetes.io/name"
	// LabelSpreadGroup holds Machine.SpreadGroup (cut to a label value) on
	// pods, which spread with the others of their group over nodes.
	LabelSpreadGroup = "crawl.example.com/spread-group"
	// AnnotationIncarnation counts the pods of one Proxy: 0 (or absent) for
	// the first, n for its n-th replacement.
	AnnotationIncarnation = "crawl.example.com/incarnation"

	ManagedBy = "proxy-operator"
	AppName   = "squid"
)

// The owning Proxy's type, for owner references.
const (
	ProxyAPIVersion = "crawl.example.com/v1alpha1"
	ProxyKind       = "Proxy"
)

// Pod layout.
const (
	ContainerName = "squid"
	PortName      = "proxy"
	// ConfigDir is where the ConfigMap is mounted, as a directory: the
	// kubelet updates its files in place (a subPath mount never changes).
	ConfigDir  = "/etc/squid/conf"
	ConfigKey  = "squid.conf"
	ConfigPath = ConfigDir + "/" + ConfigKey
	// ClusterRangesKey is the ConfigMap's file of the cluster's ranges,
	// which squid.conf reads as an ACL (squid.Paths.DeniedDestinationsFile).
	ClusterRangesKey = "cluster-ranges"
	// PasswordKey is the Secret's key holding the basic_ncsa_auth file,
	// mounted (as a directory: it follows updates) at AuthDir.
	PasswordKey = "passwd"
	AuthDir     = "/etc/squid/auth"
	// StateDir is squid's only writable directory (an emptyDir).
	StateDir = "/var/run/squid"
	// SquidUID runs squid: "proxy" in Debian and Ubuntu, the owner squid
	// switches to when started as root. Never root (restricted Pod
	// Security), so squid cannot bind below 1024 or switch users.
	SquidUID int64 = 13

	// DefaultSquidImage is pinned by digest so every node runs the same
	// squid; it is the ubuntu/squid image the operator was written
	// against. Whoever runs the operator pins the digest of the image they
	// have vetted (--kubernetes-squid-image); any image with squid 5 or
	// later on PATH meets the contract of SquidCommand.
	DefaultSquidImage = "docker.io/ubuntu/squid@sha256:6a097f68bae708cedbabd6188d68c7e2e7a38cedd05a176e1cc0ba29e3bbe029"
	DefaultPort       = 3128

	// DefaultStuckDeletionAfter is how long past its deletion deadline a
	// pod on a NotReady node may stay before it is written off. The node
	// lifecycle controller has already waited (tolerationSeconds, 300 by
	// default) before it asked for the deletion.
	DefaultStuckDeletionAfter = 2 * time.Minute
)

// Options configures the provider.
type Options struct {
	// InstallID names this operator install (provider.ValidateInstallID):
	// the LabelInstall label of every object, and ListByTag returns only
	// pods carrying it.
	InstallID string
	// SquidImage runs squid; default DefaultSquidImage. Its entrypoint is
	// not used: the container runs SquidCommand(ConfigDir).
	SquidImage      string
	ImagePullPolicy corev1.PullPolicy // default IfNotPresent
	// AllowedClientCIDRs may use the proxy; default DefaultAllowedClientCIDRs.
	AllowedClientCIDRs []string
	// APIReader reads uncached. With a manager's cached client (and
	// especially with CacheByObject, whose cache holds only our objects) a
	// same-named foreign object is invisible to the cache; on
	// AlreadyExists it is read through APIReader to be identified. Default:
	// the client itself. Pass mgr.GetAPIReader(). It also lists a Proxy's
	// pods when choosing a replacement's name and reads the Node of a pod
	// stuck terminating (one GET: its current conditions, not the
	// cache's).
	APIReader client.Reader
	// StuckDeletionAfter: see DefaultStuckDeletionAfter.
	StuckDeletionAfter time.Duration
	// ManagerNamespace and ManagerPodLabels select the manager's pods,
	// which a managed Proxy's NetworkPolicy admits beside its
	// allowedSourceCIDRs (the health probe comes from there). Without a
	// namespace only allowedSourceCIDRs are admitted. Labels default to
	// DefaultManagerPodLabels.
	ManagerNamespace string
	ManagerPodLabels map[string]string

	// ClusterRanges are the cluster's own ranges, which every squid
	// refuses; Create waits for their first discovery. NewForManager sets
	// it and keeps them current; nil: only ExtraClusterRanges.
	ClusterRanges *ClusterRanges
	// ExtraClusterRanges (--kubernetes-cluster-ranges) are refused as the
	// cluster's own beside what is discovered: pod ranges the cluster
	// does not record on Nodes (Calico or Cilium IPAM), the Service range
	// of a cluster without the ServiceCIDR API, the whole pod range (so a
	// node joining changes nothing).
	ExtraClusterRanges []netip.Prefix
	// DNSNamespace and DNSPodLabels select the cluster DNS pods, which a
	// managed Proxy's NetworkPolicy lets squid reach on port 53; default
	// kube-system and DefaultDNSPodLabels. DNSCIDRs are DNS servers
	// reached by address (NodeLocal DNSCache's 169.254.20.10/32), on port
	// 53 only.
	DNSNamespace string
	DNSPodLabels map[string]string
	DNSCIDRs     []netip.Prefix
}

// DefaultDNSPodLabels select the cluster DNS pods: CoreDNS and kube-dns
// carry k8s-app=kube-dns in kubeadm, kind, GKE, EKS and AKS clusters.
var DefaultDNSPodLabels = map[string]string{"k8s-app": "kube-dns"}

// DefaultDNSNamespace is where the cluster DNS pods run.
const DefaultDNSNamespace = "kube-system"

// DefaultManagerPodLabels are the manager pod's labels in config/manager.
var DefaultManagerPodLabels = map[string]string{
	"control-plane":          "controller-manager",
	"app.kubernetes.io/name": "proxy-operator",
}

// BindFlags registers the provider's flags on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.SquidImage, "kubernetes-squid-image", DefaultSquidImage,
		"Container image running squid for Proxies with provider kubernetes; pin it by digest (@sha256:...). It must have squid (5 or later) on PATH; it runs as uid 13 on a read-only root.")
	fs.Func("kubernetes-manager-pod-labels",
		"Labels of the manager's pods (k=v,k=v), which managed Proxies' NetworkPolicies admit from --manager-namespace (default "+labels.Set(DefaultManagerPodLabels).String()+").",
		labelsFlag(&o.ManagerPodLabels))
	fs.Func("kubernetes-cluster-ranges",
		"Comma-separated CIDRs every squid of provider kubernetes refuses as the cluster's own, beside those discovered (ServiceCIDRs, the kubernetes Service, Nodes' podCIDRs and addresses): pod ranges not on Nodes (Calico or Cilium IPAM), the Service range before Kubernetes 1.33, the whole pod range.",
		cidrFlag(&o.ExtraClusterRanges))
	fs.StringVar(&o.DNSNamespace, "kubernetes-dns-namespace", DefaultDNSNamespace,
		"Namespace of the cluster DNS pods, which managed Proxies' NetworkPolicies let squid reach on port 53.")
	fs.Func("kubernetes-dns-pod-labels",
		"Labels of the cluster DNS pods (k=v,k=v) in --kubernetes-dns-namespace (default "+labels.Set(DefaultDNSPodLabels).String()+").",
		labelsFlag(&o.DNSPodLabels))
	fs.Func("kubernetes-dns-cidrs",
		"Comma-separated CIDRs of DNS servers squid reaches by address, on port 53 only (NodeLocal DNSCache: 169.254.20.10/32).",
		cidrFlag(&o.DNSCIDRs))
}

// labelsFlag parses k=v,k=v into *dst.
func labelsFlag(dst *map[string]string) func(string) error {
	return func(v string) error {
		set, err := labels.ConvertSelectorToLabelsMap(v)
		if err != nil {
			return err
		}
		*dst = set
		return nil
	}
}

// cidrFlag parses a comma-separated list of canonical CIDRs into *dst.
func cidrFlag(dst *[]netip.Prefix) func(string) error {
	return func(v string) error {
		var out []netip.Prefix
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			p, ok := parseRange(s)
			if !ok || p.String() != s {
				return fmt.Errorf("%q is not a CIDR such as 10.96.0.0/12 (no host bits, no IPv4-mapped IPv6)", s)
			}
			out = append(out, p)
		}
		*dst = out
		return nil
	}
}

// CacheByObject restricts a manager's cache of Pods and ConfigMaps to the
// ones this provider manages, so the operator does not hold every pod of
// the cluster in memory:
//
//	ctrl.Options{Cache: cache.Options{ByObject: kubernetes.CacheByObject()}}
//
// Pass the manager's API reader as Options.APIReader alongside
// (NewForManager does). Nodes are cached for ClusterRanges, every one of
// them (a Node's pod range and addresses are what is watched), trimmed of
// their image and volume lists: at 5000 nodes a few MiB, and an event per
// node status update (every few minutes each), of which only changed
// ranges or addresses cause work.
func CacheByObject() map[client.Object]cache.ByObject {
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy})
	return map[client.Object]cache.ByObject{
		&corev1.Pod{}:       {Label: sel},
		&corev1.ConfigMap{}: {Label: sel},
		&corev1.Node{}:      {Transform: trimNode},
	}
}

// Provider implements provider.Provider on the cluster the client talks to.
type Provider struct {
	c    client.Client
	r    client.Reader
	opts Options
}

var _ provider.Provider = (*Provider)(nil)

// New returns the provider. c needs get/list/watch/create/delete on pods
// and configmaps in every namespace holding Proxies (list across all
// namespaces for ListByTag).
func New(c client.Client, opts Options) provider.Provider {
	if opts.SquidImage == "" {
		opts.SquidImage = DefaultSquidImage
	}
	if opts.ImagePullPolicy == "" {
		opts.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if opts.AllowedClientCIDRs == nil {
		opts.AllowedClientCIDRs = DefaultAllowedClientCIDRs
	}
	if opts.StuckDeletionAfter <= 0 {
		opts.StuckDeletionAfter = DefaultStuckDeletionAfter
	}
	if opts.ManagerPodLabels == nil {
		opts.ManagerPodLabels = DefaultManagerPodLabels
	}
	if opts.DNSNamespace == "" {
		opts.DNSNamespace = DefaultDNSNamespace
	}
	if opts.DNSPodLabels == nil {
		opts.DNSPodLabels = DefaultDNSPodLabels
	}
	r := opts.APIReader
	if r == nil {
		r = c
	}
	return &Provider{c: c, r: r, opts: opts}
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return Name }

// Create makes the ConfigMap and the Pod exist. An existing live pod of
// ours is reported as it is (a terminating one is a transient error: Create
// cannot make it run, and it will be gone shortly); one gone for good is
// deleted and replaced by the next incarnation.
func (p *Provider) Create(ctx context.Context, m *provider.Machine) (*provider.Instance, error) {
	k, err := key(m)
	if err != nil {
		return nil, err
	}
	if err := validateMachine(m); err != nil {
		return nil, err
	}

	cluster, err := p.clusterRanges(ctx)
	if err != nil {
		return nil, provider.Transientf("kubernetes: %w", err)
	}
	files, err := p.renderSquid(m, cluster)
	if err != nil {
		return nil, err
	}
	if err := p.converge(ctx, m, p.configMap(m, files), func(have, want client.Object) bool {
		h, w := have.(*corev1.ConfigMap), want.(*corev1.ConfigMap)
		return equality.Semantic.DeepEqual(h.Data, w.Data) && h.Annotations[AnnotationDeniedDestinations] == w.Annotations[AnnotationDeniedDestinations]
	}); err != nil {
		return nil, err
	}
	if files.Password != nil {
		if err := p.converge(ctx, m, p.secret(m, files), func(have, _ client.Object) bool {
			// The hash's salt is random: compare what it admits.
			return squid.PasswordFileMatches(have.(*corev1.Secret).Data[PasswordKey], files.auth)
		}); err != nil {
			return nil, err
		}
	}
	if files.Managed {
		np := p.networkPolicy(m, files)
		if err := p.converge(ctx, m, np, func(have, want client.Object) bool {
			return equality.Semantic.DeepEqual(have.(*networkingv1.NetworkPolicy).Spec, want.(*networkingv1.NetworkPolicy).Spec)
		}); err != nil {
			return nil, err
		}
	}
	pods, err := p.podsOf(ctx, m)
	if err != nil {
		return nil, err
	}
	next, recordedExists := 0, false
	for i := range pods {
		pod := &pods[i]
		next = max(next, incarnation(pod)+1)
		recordedExists = recordedExists || pod.Name == k.Name
		if why := p.gone(ctx, pod); why != "" {
			if err := p.deleteGone(ctx, m, pod, why); err != nil {
				return nil, err
			}
			continue
		}
		// The recorded pod, or (nothing recorded: a crash between our
		// create and the status write) the newest live one.
		if m.ProviderID == "" || pod.Name == k.Name {
			if pod.DeletionTimestamp != nil {
				return nil, provider.Transientf("kubernetes: pod %s/%s is terminating; it is recreated once gone", pod.Namespace, pod.Name)
			}
			return instance(pod), nil
		}
	}
	name := PodName(m.Name, m.UID, next)
	if m.ProviderID != "" && !recordedExists {
		// The recorded pod is simply missing: recreate it where the
		// status says it is, whatever today's naming would be.
		name = k.Name
	}
	pod := p.pod(m, types.NamespacedName{Namespace: m.Namespace, Name: name}, next, files.Password != nil)
	if _, err := p.ensure(ctx, m, pod); err != nil {
		return nil, err
	}
	if pod.DeletionTimestamp != nil {
		return nil, provider.Transientf("kubernetes: pod %s/%s is terminating; it is recreated once gone", pod.Namespace, pod.Name)
	}
	return instance(pod), nil
}

// podsOf lists the Proxy's pods, newest incarnation first, through the API
// reader: a replacement's name must not be chosen from a lagging cache.
func (p *Provider) podsOf(ctx context.Context, m *provider.Machine) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := p.r.List(ctx, &list, client.InNamespace(m.Namespace),
		client.MatchingLabels{LabelManagedBy: ManagedBy, LabelProxyUID: m.UID}); err != nil {
		return nil, classify(err, "list pods of Proxy "+m.Namespace+"/"+m.Name)
	}
	pods := list.Items[:0]
	for _, pod := range list.Items {
		if checkOwner(&pod, m) == nil {
			pods = append(pods, pod)
		}
	}
	sort.Slice(pods, func(i, j int) bool { return incarnation(&pods[i]) > incarnation(&pods[j]) })
	return pods, nil
}

func incarnation(pod *corev1.Pod) int {
	n, _ := strconv.Atoi(pod.Annotations[AnnotationIncarnation])
	return n
}

// gone says why pod will never serve again, or "" while it may.
func (p *Provider) gone(ctx context.Context, pod *corev1.Pod) string {
	if ph := pod.Status.Phase; ph == corev1.PodFailed || ph == corev1.PodSucceeded {
		// restartPolicy Always: a terminal pod was evicted, or its node
		// shut down; the kubelet will not start it again.
		return strings.TrimSpace(fmt.Sprintf("pod %s: %s %s", strings.ToLower(string(ph)), pod.Status.Reason, pod.Status.Message))
	}
	if pod.DeletionTimestamp == nil || time.Since(pod.DeletionTimestamp.Time) < p.opts.StuckDeletionAfter {
		return ""
	}
	if pod.Spec.NodeName == "" {
		return "pod stuck terminating, never scheduled"
	}
	var node corev1.Node
	if err := p.r.Get(ctx, types.NamespacedName{Name: pod.Spec.NodeName}, &node); err != nil {
		if apierrors.IsNotFound(err) {
			return "pod stuck terminating, node " + pod.Spec.NodeName + " is gone"
		}
		// Cannot tell: a pod that may still run is not written off.
		log.FromContext(ctx).V(1).Info("cannot read the node of a pod stuck terminating", "pod", pod.Name, "node", pod.Spec.NodeName, "err", err)
		return ""
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			return fmt.Sprintf("pod stuck terminating since %s on node %s, which is NotReady (%s)",
				pod.DeletionTimestamp.UTC().Format(time.RFC3339), node.Name, c.Reason)
		}
	}
	return ""
}

// deleteGone deletes a pod written off (UID precondition: only that pod),
// unless its deletion is pending already. A stuck pod is not force-deleted:
// its node may be partitioned, not dead, and only its removal proves the
// container stopped; the replacement's new name does not need the old one
// gone.
func (p *Provider) deleteGone(ctx context.Context, m *provider.Machine, pod *corev1.Pod, why string) error {
	log.FromContext(ctx).Info("replacing a pod gone for good", "pod", pod.Name, "reason", why)
	if pod.DeletionTimestamp != nil {
		return nil
	}
	return p.deleteOne(ctx, m, client.ObjectKeyFromObject(pod), &corev1.Pod{})
}

// Get reports the pod; ErrNotFound when there is none.
func (p *Provider) Get(ctx context.Context, m *provider.Machine) (*provider.Instance, error) {
	k, err := key(m)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{}
	if m.ProviderID == "" {
		// Nothing recorded yet: the newest pod of the Proxy, else the
		// first pod's name (where a foreign object is found and refused).
		pods, err := p.podsOf(ctx, m)
		if err != nil {
			return nil, err
		}
		if len(pods) > 0 {
			pod = &pods[0]
			k = client.ObjectKeyFromObject(pod)
		}
	}
	if pod.Name == "" {
		if err := p.getFresh(ctx, k, pod); err != nil {
			return nil, classify(err, "get pod "+k.String())
		}
	}
	if err := checkOwner(pod, m); err != nil {
		return nil, err
	}
	if why := p.gone(ctx, pod); why != "" {
		// Not found as far as serving goes: the controller rebuilds, and
		// Create replaces it under a new name.
		return nil, provider.NotFoundf("kubernetes: pod %s is gone for good (%s); replacing it", k, why)
	}
	return instance(pod), nil
}

// Delete deletes the pods, then the ConfigMap, the Secret and the
// NetworkPolicy (last: it guards the pods while they go), each only after
// checking its proxy-uid label, and with a UID precondition so that an
// object replaced between our read and our delete is not the one deleted.
// It returns once the deletions are accepted: a pod then terminates within
// its grace period on its own (squid closes its port at once on SIGTERM),
// and Get reports it as Deleting meanwhile. Gone is success.
func (p *Provider) Delete(ctx context.Context, m *provider.Machine) error {
	k, err := key(m)
	if err != nil {
		return err
	}
	if err := p.deleteOne(ctx, m, k, &corev1.Pod{}); err != nil {
		return err
	}
	// Earlier incarnations (written off, maybe still terminating) go too.
	pods, err := p.podsOf(ctx, m)
	if err != nil {
		return err
	}
	for i := range pods {
		if err := p.deleteOne(ctx, m, client.ObjectKeyFromObject(&pods[i]), &corev1.Pod{}); err != nil {
			return err
		}
	}
	for _, obj := range []client.Object{&corev1.ConfigMap{}, &corev1.Secret{}, &networkingv1.NetworkPolicy{}} {
		if err := p.deleteOne(ctx, m, configKey(m), obj); err != nil {
			return err
		}
	}
	return nil
}

// ListByTag lists, in all namespaces, the pods labelled with tag and this
// install's id, and managed by us. ConfigMaps are not listed: they share the pod's name and owner
// reference, and Delete removes both.
func (p *Provider) ListByTag(ctx context.Context, tag string) ([]provider.Instance, error) {
	if errs := validation.IsValidLabelValue(tag); len(errs) > 0 {
		return nil, provider.Permanentf("kubernetes: tag %q is not a label value: %s", tag, strings.Join(errs, "; "))
	}
	sel := client.MatchingLabels{LabelTag: tag, LabelManagedBy: ManagedBy}
	if p.opts.InstallID != "" {
		sel[LabelInstall] = p.opts.InstallID
	}
	var pods corev1.PodList
	if err := p.c.List(ctx, &pods, sel); err != nil {
		return nil, classify(err, "list pods tagged "+tag)
	}
	out := make([]provider.Instance, 0, len(pods.Items))
	for i := range pods.Items {
		pod := &pods.Items[i]
		// A selector is a promise of the server (or the cache); checking
		// keeps "never an untagged instance" even if it is not kept.
		if pod.Labels[LabelTag] != tag || pod.Labels[LabelManagedBy] != ManagedBy || pod.Labels[LabelInstall] != p.opts.InstallID {
			continue
		}
		out = append(out, *instance(pod))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ProviderID < out[j].ProviderID })
	return out, nil
}

// Check lists at most one of our pods: cheap, and it exercises the
// cluster-wide list permission ListByTag needs.
func (p *Provider) Check(ctx context.Context) error {
	var pods corev1.PodList
	err := p.c.List(ctx, &pods, client.MatchingLabels{LabelManagedBy: ManagedBy}, client.Limit(1))
	return classify(err, "list pods")
}

// validateMachine checks what would otherwise be refused by the API server
// with a less helpful message.
func validateMachine(m *provider.Machine) error {
	if errs := validation.IsValidLabelValue(m.Tag); len(errs) > 0 {
		return provider.Permanentf("kubernetes: tag %q is not a label value: %s", m.Tag, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(m.UID); len(errs) > 0 {
		return provider.Permanentf("kubernetes: uid %q is not a label value: %s", m.UID, strings.Join(errs, "; "))
	}
	if m.Port < 0 || m.Port > 65535 {
		return provider.Permanentf("kubernetes: port %d out of range", m.Port)
	}
	if m.Port != 0 && m.Port < 1024 {
		return provider.Permanentf("kubernetes: spec.port %d: squid runs unprivileged here and cannot bind below 1024", m.Port)
	}
	if m.CPUs < 0 || m.MemoryBytes < 0 {
		return provider.Permanentf("kubernetes: negative resources (cpus %d, memory %d)", m.CPUs, m.MemoryBytes)
	}
	return nil
}
