package kubernetes

import (
	"context"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// Name is the value of Proxy.spec.provider this provider serves.
const Name = "kubernetes"

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
	pods, err := p.podsOf(ctx, m)
	if err != nil {
		return nil, err
	}
	files, err := p.ensureConfig(ctx, m, allRunCounter(pods))
	if err != nil {
		return nil, err
	}
	pod, next, recordedExists, err := p.currentPod(ctx, m, pods, k.Name)
	if err != nil {
		return nil, err
	}
	if pod == nil {
		name := PodName(m.Name, m.UID, next)
		if m.ProviderID != "" && !recordedExists {
			// The recorded pod is simply missing: recreate it where the
			// status says it is, whatever today's naming would be.
			name = k.Name
		}
		pod = p.pod(m, types.NamespacedName{Namespace: m.Namespace, Name: name}, next, files.Password != nil)
		if _, err := p.ensure(ctx, m, pod); err != nil {
			return nil, err
		}
	}
	if pod.DeletionTimestamp != nil {
		return nil, provider.Transientf("kubernetes: pod %s/%s is terminating; it is recreated once gone", pod.Namespace, pod.Name)
	}
	return instance(pod), nil
}

// ensureConfig makes what the pod runs with match m: the squid ConfigMap,
// the password Secret when there is one, and a managed squid's
// NetworkPolicy. squid.conf runs the upstream counter only with counter:
// every pod that reads it has the counter (a new pod will).
func (p *Provider) ensureConfig(ctx context.Context, m *provider.Machine, counter bool) (squidFiles, error) {
	cluster, err := p.clusterRanges(ctx)
	if err != nil {
		return squidFiles{}, provider.Transientf("kubernetes: %w", err)
	}
	files, err := p.renderSquid(m, cluster, counter)
	if err != nil {
		return squidFiles{}, err
	}
	if err := p.converge(ctx, m, p.configMap(m, files), func(have, want client.Object) bool {
		h, w := have.(*corev1.ConfigMap), want.(*corev1.ConfigMap)
		return equality.Semantic.DeepEqual(h.Data, w.Data) && h.Annotations[AnnotationDeniedDestinations] == w.Annotations[AnnotationDeniedDestinations]
	}); err != nil {
		return squidFiles{}, err
	}
	if files.Password != nil {
		if err := p.converge(ctx, m, p.secret(m, files), func(have, _ client.Object) bool {
			// The hash's salt is random: compare what it admits.
			return squid.PasswordFileMatches(have.(*corev1.Secret).Data[PasswordKey], files.users...)
		}); err != nil {
			return squidFiles{}, err
		}
	}
	// Managed or not, the pod is guarded: squid.conf of an unmanaged Proxy
	// is the built-in policy, open to every client it admits.
	np := p.networkPolicy(m, files)
	if err := p.converge(ctx, m, np, func(have, want client.Object) bool {
		return equality.Semantic.DeepEqual(have.(*networkingv1.NetworkPolicy).Spec, want.(*networkingv1.NetworkPolicy).Spec)
	}); err != nil {
		return squidFiles{}, err
	}
	return files, nil
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
