package kubernetes

import (
	"flag"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

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
	// CounterKey is the ConfigMap's squid.UpstreamCounter, projected
	// executable (CounterMode) at CounterPath, which squid.conf runs as its
	// logfile daemon once the pod reading it has it (runsCounter).
	CounterKey  = "upstream-counter"
	CounterPath = ConfigDir + "/" + CounterKey
	CounterMode = int32(0o755)
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
	// later on PATH meets the contract of SquidCommand, and perl (for
	// squid.UpstreamCounter) that of counting the target sites' answers.
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
	SquidImage string
	// AllowSquidImageTag (--kubernetes-squid-image-allow-tag) admits a
	// SquidImage named by tag alone; Validate refuses one otherwise.
	AllowSquidImageTag bool
	ImagePullPolicy    corev1.PullPolicy // default IfNotPresent
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
		"Container image running squid for Proxies with provider kubernetes; pin it by digest (@sha256:...). It must have squid (5 or later) and perl (perl-base: Debian's and Ubuntu's images have it; without it squid runs but the target sites' answers are not counted) on PATH; it runs as uid 13 on a read-only root.")
	fs.BoolVar(&o.AllowSquidImageTag, "kubernetes-squid-image-allow-tag", false,
		"Accept a --kubernetes-squid-image without a digest: whoever can push that tag then chooses what runs in every squid pod, and nodes may run different images.")
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
	fs.DurationVar(&o.StuckDeletionAfter, "kubernetes-stuck-deletion-after", DefaultStuckDeletionAfter,
		"How long past its deletion deadline a squid pod on a NotReady or missing node may stay Terminating before it is written off and replaced under a new name (the node lifecycle controller has already waited its tolerationSeconds). The pod itself is never force-deleted.")
	fs.Func("kubernetes-dns-cidrs",
		"Comma-separated CIDRs of DNS servers squid reaches by address, on port 53 only (NodeLocal DNSCache: 169.254.20.10/32).",
		cidrFlag(&o.DNSCIDRs))
}

// squidImageDigest is how a pinned image reference ends.
var squidImageDigest = regexp.MustCompile(`@sha256:[0-9a-f]{64}$`)

// Validate refuses flags the provider could only fail on later, or that
// weaken it without being asked to: a squid image named by tag alone,
// which the tag's owner can replace under every squid pod, and a stuck
// deletion bound of zero or less.
func (o *Options) Validate() error {
	if !o.AllowSquidImageTag && o.SquidImage != "" && !squidImageDigest.MatchString(o.SquidImage) {
		return fmt.Errorf("--kubernetes-squid-image %q has no digest: pin the image you vetted (name@sha256:<64 hex>), or accept a tag with --kubernetes-squid-image-allow-tag", o.SquidImage)
	}
	// Zero Options mean the default (New), but a flag given as 0 asks for
	// something New would silently not do.
	if o.StuckDeletionAfter <= 0 {
		return fmt.Errorf("--kubernetes-stuck-deletion-after %v: want a positive duration (default %v)", o.StuckDeletionAfter, DefaultStuckDeletionAfter)
	}
	return nil
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
