// Package kubernetes is the in-cluster provider: one Proxy becomes a squid
// Pod and the ConfigMap holding its squid.conf, in the Proxy's namespace.
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
// (liveness probe) squid in place, same pod, same IP; only a pod that is
// gone for good (node lost, evicted) reaches Failed and a rebuild.
//
// Why no Service: the endpoint is the pod IP. A Proxy is one pod, so a
// ClusterIP would only add a second object and a virtual IP that, like the
// pod IP, is reachable only inside the cluster; and the pod IP is reported
// only once the readiness probe passes, which is what a Service would have
// added. The controller re-reads the address through Get, so a rebuilt pod's
// new IP is picked up.
//
// Naming and identity: both objects are named ObjectName(name, uid),
// "proxy-<name>-<8 hex of sha256(uid)>". Every object carries the tag
// contract labels (LabelManagedBy, LabelTag, LabelProxyUID, LabelProxyName)
// and a controller owner reference to the Proxy, so Kubernetes' garbage
// collector removes them with the Proxy even if the operator never gets to.
// Get and Delete act only on objects whose proxy-uid label equals the
// Machine's UID; anything else under our name is a *provider.IdentityError
// and is never deleted. Because the uid is in the name, a Proxy deleted and
// recreated under the same name never meets its predecessor's terminating
// pod.
//
// Machine fields used: Namespace, Name, UID, ProviderID, Tag, Port, CPUs and
// MemoryBytes (requests = limits, for the Guaranteed QoS class: an evicted
// proxy is an outage). Not used: UserData, VendorData, Image (the squid
// image is Options.SquidImage), DiskBytes (squid keeps no cache here) and the
// GCP/KVM placement fields.
//
// Spec changes are not applied to an existing pod (pods are immutable);
// the controller rebuilds (Delete, then Create) when it wants them.
//
// +kubebuilder:rbac:groups="",resources=pods;configmaps,verbs=get;list;watch;create;delete
package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/pkg/provider"
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
	ConfigKey     = "squid.conf"
	ConfigPath    = "/etc/squid/squid.conf"

	DefaultSquidImage = "ubuntu/squid:latest"
	DefaultPort       = 3128
)

// Options configures the provider.
type Options struct {
	// InstallID names this operator install (provider.ValidateInstallID):
	// the LabelInstall label of every object, and ListByTag returns only
	// pods carrying it.
	InstallID string
	// SquidImage runs squid; default DefaultSquidImage. The container is
	// started with args "-f /etc/squid/squid.conf -NYC", which the Ubuntu
	// image's entrypoint hands to squid (and which is squid's own argument
	// list for images whose entrypoint is squid).
	SquidImage      string
	ImagePullPolicy corev1.PullPolicy // default IfNotPresent
	// AllowedClientCIDRs may use the proxy; default DefaultAllowedClientCIDRs.
	AllowedClientCIDRs []string
	// APIReader reads uncached. With a manager's cached client (and
	// especially with CacheByObject, whose cache holds only our objects) a
	// same-named foreign object is invisible to the cache; on
	// AlreadyExists it is read through APIReader to be identified. Default:
	// the client itself. Pass mgr.GetAPIReader().
	APIReader client.Reader
}

// BindFlags registers the provider's flags on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.SquidImage, "kubernetes-squid-image", DefaultSquidImage,
		"Container image running squid for Proxies with provider kubernetes.")
}

// CacheByObject restricts a manager's cache of Pods and ConfigMaps to the
// ones this provider manages, so the operator does not hold every pod of
// the cluster in memory:
//
//	ctrl.Options{Cache: cache.Options{ByObject: kubernetes.CacheByObject()}}
//
// Pass the manager's API reader as Options.APIReader alongside.
func CacheByObject() map[client.Object]cache.ByObject {
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy})
	return map[client.Object]cache.ByObject{
		&corev1.Pod{}:       {Label: sel},
		&corev1.ConfigMap{}: {Label: sel},
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
	r := opts.APIReader
	if r == nil {
		r = c
	}
	return &Provider{c: c, r: r, opts: opts}
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return Name }

// ObjectName is the name of the Pod and ConfigMap of a Proxy: a DNS-1123
// label (so also a valid hostname), at most 63 characters.
func ObjectName(proxyName, uid string) string {
	sum := sha256.Sum256([]byte(uid))
	suffix := "-" + hex.EncodeToString(sum[:])[:8]
	base := "proxy-" + dnsLabel(proxyName)
	if max := validation.DNS1123LabelMaxLength - len(suffix); len(base) > max {
		base = base[:max]
	}
	return strings.TrimRight(base, "-") + suffix
}

// dnsLabel lowercases s and turns runs of other characters into '-'.
func dnsLabel(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimRight(b.String(), "-")
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

// Create makes the ConfigMap and the Pod exist. An existing pod of ours is
// reported as it is: a terminating one is a transient error (Create cannot
// make it run; it will be gone shortly), a Failed one is returned in state
// Failed for the controller to rebuild.
func (p *Provider) Create(ctx context.Context, m *provider.Machine) (*provider.Instance, error) {
	k, err := key(m)
	if err != nil {
		return nil, err
	}
	if err := validateMachine(m); err != nil {
		return nil, err
	}

	cm := p.configMap(m, k)
	if err := p.ensure(ctx, m, cm); err != nil {
		return nil, err
	}
	pod := p.pod(m, k)
	if err := p.ensure(ctx, m, pod); err != nil {
		return nil, err
	}
	if pod.DeletionTimestamp != nil {
		return nil, provider.Transientf("kubernetes: pod %s is terminating; it is recreated once gone", k)
	}
	return instance(pod), nil
}

// ensure creates obj, or on AlreadyExists reads the existing object into obj
// and checks it is m's.
func (p *Provider) ensure(ctx context.Context, m *provider.Machine, obj client.Object) error {
	kind := kindOf(obj)
	k := client.ObjectKeyFromObject(obj)
	err := p.c.Create(ctx, obj)
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return classify(err, fmt.Sprintf("create %s %s", kind, k))
	}
	if err := p.r.Get(ctx, k, obj); err != nil {
		if apierrors.IsNotFound(err) {
			// Exists for the API server, not (yet) for our reader:
			// a lagging cache, or deleted in between.
			return provider.Transientf("kubernetes: %s %s exists but cannot be read yet", kind, k)
		}
		return classify(err, fmt.Sprintf("get %s %s", kind, k))
	}
	return checkOwner(obj, m)
}

// getFresh reads through the cache and, on a miss, through the API reader:
// the cache holds only our labelled objects (and may lag a create), so a
// miss there does not prove the name is free — a foreign object without our
// labels must still be seen, and refused, rather than read as "gone".
func (p *Provider) getFresh(ctx context.Context, k types.NamespacedName, obj client.Object) error {
	err := p.c.Get(ctx, k, obj)
	if apierrors.IsNotFound(err) {
		return p.r.Get(ctx, k, obj)
	}
	return err
}

// Get reports the pod; ErrNotFound when there is none.
func (p *Provider) Get(ctx context.Context, m *provider.Machine) (*provider.Instance, error) {
	k, err := key(m)
	if err != nil {
		return nil, err
	}
	var pod corev1.Pod
	if err := p.getFresh(ctx, k, &pod); err != nil {
		return nil, classify(err, "get pod "+k.String())
	}
	if err := checkOwner(&pod, m); err != nil {
		return nil, err
	}
	return instance(&pod), nil
}

// Delete deletes the pod, then the ConfigMap, each only after checking its
// proxy-uid label, and with a UID precondition so that an object replaced
// between our read and our delete is not the one deleted. It returns once
// the deletions are accepted: a pod then terminates within its grace period
// on its own, and Get reports it as Deleting meanwhile. Gone is success.
func (p *Provider) Delete(ctx context.Context, m *provider.Machine) error {
	k, err := key(m)
	if err != nil {
		return err
	}
	for _, obj := range []client.Object{&corev1.Pod{}, &corev1.ConfigMap{}} {
		if err := p.deleteOne(ctx, m, k, obj); err != nil {
			return err
		}
	}
	return nil
}

func (p *Provider) deleteOne(ctx context.Context, m *provider.Machine, k types.NamespacedName, obj client.Object) error {
	kind := kindOf(obj)
	if err := p.getFresh(ctx, k, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return classify(err, fmt.Sprintf("get %s %s", kind, k))
	}
	if err := checkOwner(obj, m); err != nil {
		return err
	}
	if obj.GetDeletionTimestamp() != nil {
		return nil
	}
	var opts []client.DeleteOption
	if uid := obj.GetUID(); uid != "" {
		opts = append(opts, client.Preconditions{UID: &uid})
	}
	if err := p.c.Delete(ctx, obj, opts...); err != nil && !apierrors.IsNotFound(err) {
		// A failed UID precondition is a Conflict: classified transient,
		// the next call re-reads and re-checks.
		return classify(err, fmt.Sprintf("delete %s %s", kind, k))
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
	if m.CPUs < 0 || m.MemoryBytes < 0 {
		return provider.Permanentf("kubernetes: negative resources (cpus %d, memory %d)", m.CPUs, m.MemoryBytes)
	}
	return nil
}

func port(m *provider.Machine) int32 {
	if m.Port == 0 {
		return DefaultPort
	}
	return m.Port
}

func (p *Provider) meta(m *provider.Machine, k types.NamespacedName) metav1.ObjectMeta {
	objLabels := map[string]string{
		LabelManagedBy: ManagedBy,
		LabelAppName:   AppName,
		LabelTag:       m.Tag,
		LabelProxyUID:  m.UID,
		LabelProxyName: labelValue(m.Name),
	}
	if p.opts.InstallID != "" {
		objLabels[LabelInstall] = p.opts.InstallID
	}
	return metav1.ObjectMeta{
		Name:            k.Name,
		Namespace:       k.Namespace,
		Labels:          objLabels,
		Annotations:     map[string]string{AnnotationProxyName: m.Name},
		OwnerReferences: []metav1.OwnerReference{OwnerReference(m)},
	}
}

// OwnerReference makes the Proxy of m the controller owner. With
// BlockOwnerDeletion the operator needs update on proxies/finalizers.
func OwnerReference(m *provider.Machine) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{
		APIVersion:         ProxyAPIVersion,
		Kind:               ProxyKind,
		Name:               m.Name,
		UID:                types.UID(m.UID),
		Controller:         &yes,
		BlockOwnerDeletion: &yes,
	}
}

func (p *Provider) configMap(m *provider.Machine, k types.NamespacedName) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: p.meta(m, k),
		Data: map[string]string{
			ConfigKey: SquidConf(port(m), p.opts.AllowedClientCIDRs, m.Namespace+"/"+m.Name),
		},
	}
}

func (p *Provider) pod(m *provider.Machine, k types.NamespacedName) *corev1.Pod {
	no := false
	grace := int64(10) // squid is told to finish within 3s (shutdown_lifetime)
	res := corev1.ResourceList{}
	if m.CPUs > 0 {
		res[corev1.ResourceCPU] = *resource.NewQuantity(int64(m.CPUs), resource.DecimalSI)
	}
	if m.MemoryBytes > 0 {
		res[corev1.ResourceMemory] = *resource.NewQuantity(m.MemoryBytes, resource.BinarySI)
	}
	tcp := corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString(PortName)}}
	return &corev1.Pod{
		ObjectMeta: p.meta(m, k),
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyAlways,
			// squid talks to no Kubernetes API; no token, no service env.
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           p.opts.SquidImage,
				ImagePullPolicy: p.opts.ImagePullPolicy,
				Args:            []string{"-f", ConfigPath, "-NYC"},
				Ports: []corev1.ContainerPort{{
					Name: PortName, ContainerPort: port(m), Protocol: corev1.ProtocolTCP,
				}},
				VolumeMounts: []corev1.VolumeMount{{
					Name: "config", MountPath: ConfigPath, SubPath: ConfigKey, ReadOnly: true,
				}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:     tcp,
					PeriodSeconds:    5,
					TimeoutSeconds:   2,
					FailureThreshold: 2,
				},
				// Restarts a squid that stops accepting connections,
				// in place; generous, so a busy proxy is not killed.
				LivenessProbe: &corev1.Probe{
					ProbeHandler:        tcp,
					InitialDelaySeconds: 15,
					PeriodSeconds:       20,
					TimeoutSeconds:      5,
					FailureThreshold:    3,
				},
				Resources: corev1.ResourceRequirements{Requests: res, Limits: res.DeepCopy()},
				// squid starts as root to bind and drops to its own user;
				// it never needs to gain privileges.
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &no},
			}},
			Volumes: []corev1.Volume{{
				Name: "config",
				VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: k.Name},
				}},
			}},
		},
	}
}

// instance maps a pod to the provider-neutral view.
func instance(pod *corev1.Pod) *provider.Instance {
	out := &provider.Instance{
		ProviderID: FormatProviderID(pod.Namespace, pod.Name),
		Name:       pod.Name,
		Host:       pod.Spec.NodeName,
		Owner: provider.Owner{
			Namespace: pod.Namespace,
			Name:      pod.Annotations[AnnotationProxyName],
			UID:       pod.Labels[LabelProxyUID],
		},
		InstallID: pod.Labels[LabelInstall],
	}
	if out.Owner.Name == "" {
		out.Owner.Name = pod.Labels[LabelProxyName]
	}
	if pod.DeletionTimestamp != nil {
		out.State, out.Message = provider.StateDeleting, "pod is terminating"
		return out
	}
	switch pod.Status.Phase {
	case corev1.PodPending, "":
		out.State, out.Message = provider.StatePending, pendingReason(pod)
	case corev1.PodRunning:
		if !podReady(pod) {
			// Running but refusing connections is not usable: report
			// Pending so no address is published before squid listens.
			out.State = provider.StatePending
			out.Message = "readiness probe not passing"
			if r := containerReason(pod); r != "" {
				out.Message += ": " + r
			}
			return out
		}
		out.State = provider.StateRunning
		if ip := podIPv4(pod); ip != "" {
			out.Address, out.AddressSource = ip, provider.AddressSourcePod
		} else {
			out.Message = "pod has no IP yet"
		}
	case corev1.PodSucceeded, corev1.PodFailed:
		// restartPolicy Always: a terminal pod was evicted, its node
		// lost, or similar. It will not run again.
		out.State = provider.StateFailed
		out.Message = strings.TrimSpace(fmt.Sprintf("pod %s: %s %s", strings.ToLower(string(pod.Status.Phase)), pod.Status.Reason, pod.Status.Message))
	default:
		out.State = provider.StateUnknown
		out.Message = fmt.Sprintf("pod phase %q", pod.Status.Phase)
	}
	return out
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podIPv4 is the first IPv4 pod IP, else the primary one (IPv6-only).
func podIPv4(pod *corev1.Pod) string {
	for _, ip := range pod.Status.PodIPs {
		if strings.Contains(ip.IP, ".") {
			return ip.IP
		}
	}
	return pod.Status.PodIP
}

// pendingReason says why a pod is not running yet, from what the scheduler
// and the kubelet wrote.
func pendingReason(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return strings.TrimSpace("unschedulable: " + c.Message)
		}
	}
	if r := containerReason(pod); r != "" {
		return r
	}
	if pod.Spec.NodeName == "" {
		return "pod not scheduled yet"
	}
	return "pod starting"
}

// containerReason describes the squid container when it is not simply
// running (ImagePullBackOff, CrashLoopBackOff, …).
func containerReason(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
			msg := fmt.Sprintf("container %s: %s", cs.Name, w.Reason)
			if w.Message != "" {
				msg += ": " + w.Message
			}
			if cs.RestartCount > 0 {
				msg += fmt.Sprintf(" (%d restarts)", cs.RestartCount)
			}
			return msg
		}
	}
	return ""
}

// checkOwner refuses an object whose proxy-uid label is not m's.
func checkOwner(obj client.Object, m *provider.Machine) error {
	got, ok := obj.GetLabels()[LabelProxyUID]
	if ok && got == m.UID {
		return nil
	}
	mismatch := "no " + LabelProxyUID + " label"
	if ok {
		mismatch = fmt.Sprintf("%s %q != Proxy uid %q", LabelProxyUID, got, m.UID)
	}
	return &provider.IdentityError{Kind: strings.ToLower(kindOf(obj)), Name: obj.GetNamespace() + "/" + obj.GetName(), Mismatch: mismatch}
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *corev1.Pod:
		return "Pod"
	case *corev1.ConfigMap:
		return "ConfigMap"
	default:
		return fmt.Sprintf("%T", obj)
	}
}

// classify maps an API server error to the provider taxonomy.
func classify(err error, what string) error {
	if err == nil || provider.HasClass(err) {
		return err
	}
	wrapped := fmt.Errorf("kubernetes: %s: %w", what, err)
	switch {
	case apierrors.IsNotFound(err):
		return provider.NotFound(wrapped)
	case apierrors.IsConflict(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsInternalError(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsUnexpectedServerError(err),
		apierrors.IsAlreadyExists(err), apierrors.IsGone(err):
		return provider.Transient(wrapped)
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err),
		apierrors.IsUnauthorized(err), apierrors.IsMethodNotSupported(err),
		apierrors.IsNotAcceptable(err), apierrors.IsUnsupportedMediaType(err),
		apierrors.IsRequestEntityTooLargeError(err):
		// Forbidden covers RBAC, an exceeded ResourceQuota and a
		// terminating namespace: none is fixed by retrying.
		return provider.Permanent(wrapped)
	}
	// Network errors, context deadlines, unknown: retry with backoff.
	return provider.Transient(wrapped)
}
