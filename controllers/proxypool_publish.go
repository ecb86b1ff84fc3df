package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	poolfleet "crawl.example.com/proxy-operator/pkg/fleet"
)

// EndpointSliceManagedBy is the endpointslice.kubernetes.io/managed-by
// value of the EndpointSlices a pool publishes: Kubernetes' own
// EndpointSlice controllers leave slices with another value alone. (A label
// value cannot hold '/', hence the dotted form.)
const EndpointSliceManagedBy = "proxypool-controller.crawl.example.com"

// maxEndpointsPerSlice is the split point, Kubernetes' default
// (kube-controller-manager --max-endpoints-per-slice): consumers and
// kube-proxy expect slices of about this size.
const maxEndpointsPerSlice = 100

// defaultCredentialTTL bounds how long a credential URL read from a
// replica's Secret is reused.
const defaultCredentialTTL = 5 * time.Minute

// ErrReplicasLeftOut is wrapped by the error Publish returns when it
// published the other replicas but had to leave some out (credentials not
// there yet, no usable endpoint). It is worth a retry: a credential Secret
// that appears later is not an event the pool controller watches. It says
// nothing about the other objects: whether the lists were written is
// PublishError.Written.
var ErrReplicasLeftOut = errors.New("replicas left out of the published lists")

// PublishError is what Publish returns when it could not publish all it was
// given. Its parts are told apart, because they call for different
// actions: a replica left out is simply not listed; an object the pool may
// not write lists nothing of the pool's; a failed write may still list what
// it listed before, so a replica must not be deleted on the strength of it.
type PublishError struct {
	pool string
	// LeftOut are the replicas written into no list (each with why); the
	// lists were written without them.
	LeftOut []LeftOutReplica
	// Blocked are the objects the pool cannot write until someone acts
	// (another owner's object under the name, a name no Service can
	// have). They hold none of the pool's lists.
	Blocked []*PublishBlocked
	// Failed are writes worth retrying (the API server refused or did not
	// answer); the object may hold the list from before.
	Failed []error
}

// LeftOutReplica is one replica Publish left out, and why.
type LeftOutReplica struct{ Name, Reason string }

// PublishBlocked is an object the pool cannot publish under.
type PublishBlocked struct {
	// Kind and Name of the object, e.g. Service crawl/crawl-a-proxies.
	Kind, Name string
	// Reason is the Published condition's reason.
	Reason string
	// Message says what is in the way and what to do.
	Message string
}

func (b *PublishBlocked) Error() string { return b.Message }

// Written reports whether every object the pool can write now lists
// exactly the replicas given, less those left out.
func (e *PublishError) Written() bool { return len(e.Failed) == 0 }

func (e *PublishError) Error() string { return errors.Join(e.Unwrap()...).Error() }

func (e *PublishError) Unwrap() []error {
	var errs []error
	for _, b := range e.Blocked {
		errs = append(errs, b)
	}
	errs = append(errs, e.Failed...)
	if len(e.LeftOut) > 0 {
		errs = append(errs, leftOutError(e.pool, e.LeftOut))
	}
	return errs
}

// PublishedProxy is one entry of proxies.json.
type PublishedProxy struct {
	// Name of the replica (the Proxy).
	Name string `json:"name"`
	// URL is the same line as in proxies.txt, credentials included.
	URL string `json:"url"`
	// Host the replica runs on (KVMHost, node or zone).
	Host string `json:"host,omitempty"`
	// EgressAddress target sites see the replica's requests come from,
	// and EgressSource how it is known (echo: measured through it; static:
	// assigned on a network without NAT); both absent while it is not
	// known (docs/egress.md).
	EgressAddress string               `json:"egressAddress,omitempty"`
	EgressSource  crawlv1.EgressSource `json:"egressSource,omitempty"`
	// CreatedAt and ExpiresAt (when rotation will replace it) in RFC 3339.
	CreatedAt string `json:"createdAt"`
	ExpiresAt string `json:"expiresAt,omitempty"`
	// BannedDomains the replica was reported banned on, until when: the
	// crawler leaves it out for those (and their subdomains).
	BannedDomains []BannedDomain `json:"bannedDomains,omitempty"`
}

// Publisher writes the replicas a pool serves with where crawlers read
// them, in the pool's namespace and controlled by the pool:
//
//   - Secret <pool>-proxies with proxies.txt and proxies.json;
//   - a headless Service <pool>-proxies without selector, and
//     EndpointSlices of at most 100 endpoints for it, managed by
//     EndpointSliceManagedBy.
//
// Publish is idempotent: an object already as wanted is not written, so
// watchers (kubelet refreshing the mounted Secret, DNS, crawlers watching
// slices) wake only on a real change. Credentials never reach the Service,
// the EndpointSlices, the logs or the returned errors.
type Publisher struct {
	// Client writes the published objects. Required.
	Client client.Client
	// Reader reads the credential Secrets and the published objects; nil:
	// Client. In a manager pass mgr.GetAPIReader(): the cached client would
	// list and watch every Secret of the cluster, which the manager's RBAC
	// does not grant (it gets Secrets by name only), and a stale cache
	// would make Publish write what is already there.
	Reader client.Reader
	// CredentialTTL is how long a replica's credential URL, read from its
	// Secret, is reused while the replica's UID, Secret name and endpoint
	// stay the same, so a pool of 1000 does not read 1000 Secrets on every
	// change. 0: 5 minutes; negative: read every time.
	CredentialTTL time.Duration
	// Clock: nil is the real clock.
	Clock clock.PassiveClock
	// BannedDomains, if set, gives each entry's bannedDomains (the pool
	// controller's ban reports).
	BannedDomains func(pool *crawlv1.ProxyPool, replica string) []BannedDomain

	mu sync.Mutex
	// creds holds, per pool UID, the credential URLs of its published
	// replicas by replica UID; each Publish keeps only its current replicas.
	creds map[types.UID]map[types.UID]credentialEntry
}

type credentialEntry struct {
	secret, endpoint, url string
	readAt                time.Time
}

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;create;update;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;create;update;delete

// Publish makes the pool's published objects list exactly replicas (the
// pool controller passes the Ready, non-draining ones). A replica that
// cannot be published yet (its credential Secret is missing or has no url,
// or it has no endpoint) is left out of every list and logged at V(1); an
// object the pool may not write under its name is skipped; the others are
// written all the same. Anything short of all that is a *PublishError
// saying which part fell short; any other error means nothing was read or
// written: call again.
func (p *Publisher) Publish(ctx context.Context, pool *crawlv1.ProxyPool, replicas []crawlv1.Proxy) error {
	if p.Client == nil {
		return errors.New("Publisher: Client is required")
	}
	if pool.UID == "" {
		return fmt.Errorf("ProxyPool %s/%s has no UID: publish a pool read from the API", pool.Namespace, pool.Name)
	}
	log := ctrl.LoggerFrom(ctx)

	entries, endpoints, leftOut, err := p.resolve(ctx, pool, replicas)
	if err != nil {
		return err
	}
	for _, l := range leftOut {
		log.V(1).Info("replica left out of the published lists", "proxy", types.NamespacedName{Namespace: pool.Namespace, Name: l.Name}, "reason", l.Reason)
	}

	perr := &PublishError{pool: pool.Namespace + "/" + pool.Name, LeftOut: leftOut}
	note := func(err error) {
		var b *PublishBlocked
		switch {
		case err == nil:
		case errors.As(err, &b):
			perr.Blocked = append(perr.Blocked, b)
		default:
			perr.Failed = append(perr.Failed, err)
		}
	}
	note(p.publishSecret(ctx, pool, entries))
	svc := crawlv1.PublishedName(pool.Name)
	if msgs := validation.IsDNS1035Label(svc); len(msgs) > 0 {
		// A pool admitted before the webhook refused such names: crawlers
		// still get the Secret; in-cluster discovery needs another name.
		note(&PublishBlocked{Kind: "Service", Name: pool.Namespace + "/" + svc, Reason: crawlv1.PoolPublishInvalidNameReason,
			Message: fmt.Sprintf("no Service or EndpointSlices published: %q is not a valid Service name (%s); the Secret is published",
				svc, strings.Join(msgs, "; "))})
	} else {
		note(p.publishService(ctx, pool))
		note(p.publishEndpointSlices(ctx, pool, endpoints))
	}
	if len(perr.LeftOut) == 0 && len(perr.Blocked) == 0 && len(perr.Failed) == 0 {
		return nil
	}
	return perr
}

// Unpublish deletes what Publish wrote for pool (those objects it
// controls); already gone is success. For a pool being deleted, before its
// finalizer is released: garbage collection would get there too, but
// later, and crawlers must stop using the proxies first.
func (p *Publisher) Unpublish(ctx context.Context, pool *crawlv1.ProxyPool) error {
	if p.Client == nil {
		return errors.New("Publisher: Client is required")
	}
	key := client.ObjectKey{Namespace: pool.Namespace, Name: crawlv1.PublishedName(pool.Name)}
	var errs []error
	for _, obj := range []client.Object{&corev1.Secret{}, &corev1.Service{}} {
		if err := p.reader().Get(ctx, key, obj); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
			continue
		}
		if controlledBy(obj, pool) {
			errs = append(errs, p.delete(ctx, obj))
		}
	}
	published, err := p.listSlices(ctx, pool)
	if err != nil {
		errs = append(errs, err)
	}
	for i := range published {
		if controlledBy(&published[i], pool) {
			errs = append(errs, p.delete(ctx, &published[i]))
		}
	}
	p.mu.Lock()
	delete(p.creds, pool.UID)
	p.mu.Unlock()
	return errors.Join(errs...)
}

// leftOutError names the first few replicas left out, with why; pool is
// namespace/name.
func leftOutError(pool string, l []LeftOutReplica) error {
	const shown = 10
	var parts []string
	for _, r := range l[:min(len(l), shown)] {
		parts = append(parts, r.Name+": "+r.Reason)
	}
	if len(l) > shown {
		parts = append(parts, fmt.Sprintf("and %d more", len(l)-shown))
	}
	return fmt.Errorf("ProxyPool %s: %w (%d): %s", pool, ErrReplicasLeftOut, len(l), strings.Join(parts, "; "))
}

// sliceEndpoint is one replica's endpoint in the EndpointSlices.
type sliceEndpoint struct {
	name string // the replica's name: its identity across slices
	port int32
	ep   discoveryv1.Endpoint
}

// resolve turns replicas into the Secret's entries and the slices'
// endpoints, reading credentials. An error other than a replica left out
// (the API server did not answer) aborts: publishing without a replica that
// is fine would make crawlers drop it for nothing.
func (p *Publisher) resolve(ctx context.Context, pool *crawlv1.ProxyPool, replicas []crawlv1.Proxy) ([]PublishedProxy, []sliceEndpoint, []LeftOutReplica, error) {
	log := ctrl.LoggerFrom(ctx)
	sorted := make([]*crawlv1.Proxy, 0, len(replicas))
	for i := range replicas {
		sorted = append(sorted, &replicas[i])
	}
	slices.SortStableFunc(sorted, func(a, b *crawlv1.Proxy) int { return strings.Compare(a.Name, b.Name) })
	sorted = slices.CompactFunc(sorted, func(a, b *crawlv1.Proxy) bool { return a.Name == b.Name })

	var (
		entries   []PublishedProxy
		endpoints []sliceEndpoint
		leftOut   []LeftOutReplica
		fresh     = map[types.UID]credentialEntry{}
	)
	for _, r := range sorted {
		if r.Namespace != pool.Namespace {
			leftOut = append(leftOut, LeftOutReplica{r.Name, fmt.Sprintf("in namespace %q, not the pool's", r.Namespace)})
			continue
		}
		u, entry, reason, err := p.replicaURL(ctx, pool, r)
		if err != nil {
			return nil, nil, nil, err
		}
		if reason != "" {
			leftOut = append(leftOut, LeftOutReplica{r.Name, reason})
			continue
		}
		if entry != nil && r.UID != "" {
			fresh[r.UID] = *entry
		}
		e := publishedProxy(pool, r, u)
		if p.BannedDomains != nil {
			e.BannedDomains = p.BannedDomains(pool, r.Name)
		}
		entries = append(entries, e)
		if ep, why := endpointOf(r); why != "" {
			// Still in the Secret: only in-cluster discovery misses it.
			log.V(1).Info("replica left out of the EndpointSlices", "proxy", client.ObjectKeyFromObject(r), "reason", why)
		} else {
			endpoints = append(endpoints, ep)
		}
	}
	p.mu.Lock()
	if p.creds == nil {
		p.creds = map[types.UID]map[types.UID]credentialEntry{}
	}
	p.creds[pool.UID] = fresh
	p.mu.Unlock()
	return entries, endpoints, leftOut, nil
}

// replicaURL is the URL crawlers use for r, with its credential when r has
// one. reason says why r is left out; entry is what to remember of a
// credential read.
func (p *Publisher) replicaURL(ctx context.Context, pool *crawlv1.ProxyPool, r *crawlv1.Proxy) (u string, entry *credentialEntry, reason string, err error) {
	ref := r.Status.CredentialsSecretRef
	if ref == nil {
		if needsCredentials(r) {
			return "", nil, "no credentials Secret in status yet", nil
		}
		// auth None, or squid left to the user's cloud-init: the endpoint is
		// all there is.
		u, why := plainURL(r.Status.Endpoint)
		return u, nil, why, nil
	}
	now := p.clock().Now()
	if e, ok := p.remembered(pool.UID, r.UID); ok && e.secret == ref.Name && e.endpoint == r.Status.Endpoint && p.ttl() > 0 && now.Sub(e.readAt) < p.ttl() {
		return e.url, &e, "", nil
	}
	sec := &corev1.Secret{}
	if err := p.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: ref.Name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil, fmt.Sprintf("credentials Secret %q not found", ref.Name), nil
		}
		return "", nil, "", fmt.Errorf("read credentials Secret %s/%s of Proxy %s: %w", r.Namespace, ref.Name, r.Name, err)
	}
	u, why := credentialURL(r.Status.Endpoint, sec.Data)
	if why != "" {
		return "", nil, fmt.Sprintf("credentials Secret %q: %s", ref.Name, why), nil
	}
	return u, &credentialEntry{secret: ref.Name, endpoint: r.Status.Endpoint, url: u, readAt: now}, "", nil
}

func (p *Publisher) remembered(pool, replica types.UID) (credentialEntry, bool) {
	if replica == "" {
		return credentialEntry{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.creds[pool][replica]
	return e, ok
}

// needsCredentials: a managed squid with Basic auth (the default) refuses
// clients without the credential, so its bare endpoint is useless.
func needsCredentials(r *crawlv1.Proxy) bool {
	if !r.IsManaged() {
		return false
	}
	a := r.Spec.Access.Auth
	return a == nil || a.Type == "" || a.Type == crawlv1.ProxyAuthBasic
}

// plainURL is endpoint (http://address:port) in the one form published.
func plainURL(endpoint string) (string, string) {
	e, why := parseEndpoint(endpoint)
	if why != "" {
		return "", why
	}
	return e.String(), ""
}

func parseEndpoint(endpoint string) (*url.URL, string) {
	if endpoint == "" {
		return nil, "no endpoint in status"
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "http" || u.Hostname() == "" || u.Port() == "" || u.User != nil {
		return nil, fmt.Sprintf("endpoint %q is not http://address:port", endpoint)
	}
	return &url.URL{Scheme: u.Scheme, Host: u.Host}, ""
}

// credentialURL is http://user:pass@address:port from the credential
// Secret's data: its url, unless that names another address than the
// endpoint the replica was proven Ready at (an address changed and the
// Secret not yet), in which case username and password with the endpoint.
// The reason never holds a credential.
func credentialURL(endpoint string, data map[string][]byte) (string, string) {
	ep, epWhy := parseEndpoint(endpoint)
	if raw := string(data[crawlv1.CredentialsURLKey]); raw != "" {
		u, err := url.Parse(raw)
		switch {
		case err != nil, u.Scheme != "http", u.Hostname() == "", !hasPassword(u.User):
			// Neither err nor raw: both could hold the password.
			if ep == nil {
				return "", "key url is not http://user:pass@address:port"
			}
		case ep == nil || strings.EqualFold(u.Host, ep.Host):
			return (&url.URL{Scheme: u.Scheme, User: u.User, Host: u.Host}).String(), ""
		}
	}
	user, pass := string(data[crawlv1.CredentialsUsernameKey]), string(data[crawlv1.CredentialsPasswordKey])
	if user == "" || pass == "" {
		return "", "no url for the replica's endpoint, and no username and password"
	}
	if ep == nil {
		return "", epWhy
	}
	return (&url.URL{Scheme: ep.Scheme, User: url.UserPassword(user, pass), Host: ep.Host}).String(), ""
}

func hasPassword(u *url.Userinfo) bool {
	if u == nil || u.Username() == "" {
		return false
	}
	p, ok := u.Password()
	return ok && p != ""
}

func publishedProxy(pool *crawlv1.ProxyPool, r *crawlv1.Proxy, u string) PublishedProxy {
	e := PublishedProxy{Name: r.Name, URL: u, Host: r.Status.Host, CreatedAt: r.CreationTimestamp.UTC().Format(time.RFC3339)}
	if a := measuredEgress(r); a != "" {
		e.EgressAddress, e.EgressSource = a, r.Status.EgressSource
	}
	// The pool's own rule (pkg/fleet), so the list says what rotation does.
	if policy, err := poolfleet.PolicyFor(&pool.Spec); err == nil {
		if t, ok := poolfleet.ExpiresAt(r.CreationTimestamp.Time, string(r.UID), policy.MaxAge, policy.Jitter); ok {
			e.ExpiresAt = t.UTC().Format(time.RFC3339)
		}
	}
	return e
}

// endpointOf is r's endpoint in an IPv4 slice, or why it has none. The
// address must be one the API server takes in a slice (not loopback,
// link-local or unspecified), so one bad replica cannot fail the write of
// its whole slice.
func endpointOf(r *crawlv1.Proxy) (sliceEndpoint, string) {
	addr, err := netip.ParseAddr(r.Status.Address)
	if err != nil || !addr.Is4() {
		return sliceEndpoint{}, fmt.Sprintf("address %q is not IPv4", r.Status.Address)
	}
	if addr.IsUnspecified() || addr.IsLoopback() || addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast() {
		return sliceEndpoint{}, fmt.Sprintf("address %s cannot be an endpoint", addr)
	}
	port := defaulted(&r.Spec).Port
	if ep, why := parseEndpoint(r.Status.Endpoint); why == "" {
		if n, err := strconv.ParseInt(ep.Port(), 10, 32); err == nil && n > 0 {
			port = int32(n)
		}
	}
	ep := discoveryv1.Endpoint{
		Addresses: []string{addr.String()},
		Conditions: discoveryv1.EndpointConditions{
			Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false),
		},
		TargetRef: &corev1.ObjectReference{
			APIVersion: crawlv1.GroupVersion.String(), Kind: "Proxy",
			Namespace: r.Namespace, Name: r.Name, UID: r.UID,
		},
	}
	// <name>.<service>.<namespace>.svc then resolves to this replica.
	if len(validation.IsDNS1123Label(r.Name)) == 0 {
		ep.Hostname = ptr.To(r.Name)
	}
	// The host stands for the zone: what a crawler spreads its load over.
	if h := r.Status.Host; h != "" && len(validation.IsValidLabelValue(h)) == 0 {
		ep.Zone = ptr.To(h)
	}
	return sliceEndpoint{name: r.Name, port: port, ep: ep}, ""
}

// renderProxies is the Secret's data. proxies.json is an array with one
// compact entry per line: a Secret holds at most 1 MiB, and indented
// entries (150 bytes each where compact ones take 110) made a pool of
// 5,250 overflow it, so that nothing could be published and every drain
// waited for a list that could not be written.
func renderProxies(entries []PublishedProxy) (txt, js []byte, err error) {
	var b, j bytes.Buffer
	j.WriteByte('[')
	for i, e := range entries {
		b.WriteString(e.URL)
		b.WriteByte('\n')
		line, err := json.Marshal(e)
		if err != nil {
			return nil, nil, err
		}
		if i > 0 {
			j.WriteByte(',')
		}
		j.WriteString("\n")
		j.Write(line)
	}
	if len(entries) > 0 {
		j.WriteByte('\n')
	}
	j.WriteString("]\n")
	return b.Bytes(), j.Bytes(), nil
}

func (p *Publisher) publishSecret(ctx context.Context, pool *crawlv1.ProxyPool, entries []PublishedProxy) error {
	txt, js, err := renderProxies(entries)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{}
	return p.ensure(ctx, pool, "Secret", sec, func(created bool) error {
		if created {
			sec.Type = corev1.SecretTypeOpaque
		}
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		// Other keys are left alone; these two are the pool's.
		sec.Data[crawlv1.ProxiesTextKey] = txt
		sec.Data[crawlv1.ProxiesJSONKey] = js
		return nil
	})
}

func (p *Publisher) publishService(ctx context.Context, pool *crawlv1.ProxyPool) error {
	port := defaulted(&pool.Spec.Template.Spec).Port
	svc := &corev1.Service{}
	return p.ensure(ctx, pool, "Service", svc, func(created bool) error {
		if created {
			svc.Spec.ClusterIP = corev1.ClusterIPNone
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			// clusterIP is immutable; a load-balanced address would pin a
			// crawler's connections to one proxy anyway.
			return &PublishBlocked{Kind: "Service", Name: svc.Namespace + "/" + svc.Name, Reason: crawlv1.PoolPublishConflictReason,
				Message: fmt.Sprintf("Service %s/%s is not headless (clusterIP %s): delete it and the pool recreates it", svc.Namespace, svc.Name, svc.Spec.ClusterIP)}
		}
		// No selector: the slices below are the only endpoints, not Pods.
		svc.Spec.Selector = nil
		svc.Spec.Ports = []corev1.ServicePort{{Name: crawlv1.PublishedPortName, Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(port)}}
		return nil
	})
}

// ensure reads <pool>-proxies into obj (an empty object of its kind) and
// applies mutate to it: a missing object is created, a stored one updated
// only if mutate changed it. An object of that name the pool does not
// control is refused, never overwritten.
func (p *Publisher) ensure(ctx context.Context, pool *crawlv1.ProxyPool, kind string, obj client.Object, mutate func(created bool) error) error {
	key := client.ObjectKey{Namespace: pool.Namespace, Name: crawlv1.PublishedName(pool.Name)}
	err := p.reader().Get(ctx, key, obj)
	switch {
	case apierrors.IsNotFound(err):
		obj.SetNamespace(key.Namespace)
		obj.SetName(key.Name)
		if err := mutate(true); err != nil {
			return err
		}
		if err := p.stamp(pool, obj); err != nil {
			return err
		}
		if err := p.Client.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %s %s: %w", kind, key, err)
		}
		ctrl.LoggerFrom(ctx).V(1).Info("created published "+kind, strings.ToLower(kind), key.Name)
		return nil
	case err != nil:
		return fmt.Errorf("read %s %s: %w", kind, key, err)
	}
	if !controlledBy(obj, pool) {
		return &PublishBlocked{Kind: kind, Name: key.String(), Reason: crawlv1.PoolPublishConflictReason,
			Message: fmt.Sprintf("%s %s exists and is not controlled by ProxyPool %s%s: rename or delete it, the pool publishes there",
				kind, key, pool.Name, ownerOf(obj))}
	}
	before := obj.DeepCopyObject()
	if err := mutate(false); err != nil {
		return err
	}
	if err := p.stamp(pool, obj); err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(before, obj) {
		return nil
	}
	if err := p.Client.Update(ctx, obj); err != nil {
		return fmt.Errorf("update %s %s: %w", kind, key, err)
	}
	ctrl.LoggerFrom(ctx).V(1).Info("updated published "+kind, strings.ToLower(kind), key.Name)
	return nil
}

// stamp sets the pool label and the pool as controller.
func (p *Publisher) stamp(pool *crawlv1.ProxyPool, obj client.Object) error {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[crawlv1.PoolNameLabel] = pool.Name
	obj.SetLabels(labels)
	return controllerutil.SetControllerReference(pool, obj, p.Client.Scheme())
}

// ownerOf says who controls obj, for a message: ", controlled by Kind
// name", or nothing.
func ownerOf(obj client.Object) string {
	if ref := metav1.GetControllerOf(obj); ref != nil {
		return fmt.Sprintf(" (it is controlled by %s %s)", ref.Kind, ref.Name)
	}
	return ""
}

func controlledBy(obj client.Object, pool *crawlv1.ProxyPool) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == pool.UID
}

func (p *Publisher) listSlices(ctx context.Context, pool *crawlv1.ProxyPool) ([]discoveryv1.EndpointSlice, error) {
	var list discoveryv1.EndpointSliceList
	if err := p.reader().List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{
		discoveryv1.LabelServiceName: crawlv1.PublishedName(pool.Name),
		discoveryv1.LabelManagedBy:   EndpointSliceManagedBy,
	}); err != nil {
		return nil, fmt.Errorf("list EndpointSlices of %s/%s: %w", pool.Namespace, crawlv1.PublishedName(pool.Name), err)
	}
	return list.Items, nil
}

func (p *Publisher) publishEndpointSlices(ctx context.Context, pool *crawlv1.ProxyPool, want []sliceEndpoint) error {
	existing, err := p.listSlices(ctx, pool)
	if err != nil {
		return err
	}
	var stampErr error
	plan := planEndpointSlices(existing, want, maxEndpointsPerSlice,
		func(s *discoveryv1.EndpointSlice) bool { return controlledBy(s, pool) },
		func(s *discoveryv1.EndpointSlice) {
			if s.Name == "" {
				s.Namespace, s.GenerateName = pool.Namespace, crawlv1.PublishedName(pool.Name)+"-"
			}
			if err := p.stamp(pool, s); err != nil {
				stampErr = err
			}
			s.Labels[discoveryv1.LabelServiceName] = crawlv1.PublishedName(pool.Name)
			s.Labels[discoveryv1.LabelManagedBy] = EndpointSliceManagedBy
		})
	if stampErr != nil {
		return stampErr
	}
	log := ctrl.LoggerFrom(ctx)
	// New and changed slices first, removals last: an endpoint moving
	// between slices is never absent from all of them.
	for _, s := range plan.create {
		if err := p.Client.Create(ctx, s); err != nil {
			return fmt.Errorf("create EndpointSlice %s*: %w", s.GenerateName, err)
		}
		log.V(1).Info("created published EndpointSlice", "endpointSlice", s.Name, "endpoints", len(s.Endpoints))
	}
	for _, s := range plan.update {
		if err := p.Client.Update(ctx, s); err != nil {
			return fmt.Errorf("update EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
		}
		log.V(1).Info("updated published EndpointSlice", "endpointSlice", s.Name, "endpoints", len(s.Endpoints))
	}
	for _, s := range plan.delete {
		if err := p.delete(ctx, s); err != nil {
			return err
		}
		log.V(1).Info("deleted published EndpointSlice", "endpointSlice", s.Name)
	}
	return nil
}

func (p *Publisher) delete(ctx context.Context, obj client.Object) error {
	uid := obj.GetUID()
	if err := p.Client.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

type slicePlan struct {
	create, update, delete []*discoveryv1.EndpointSlice
}

// planEndpointSlices says which slices to create, update and delete so that
// they hold exactly want, at most limit endpoints each. An endpoint stays in
// the slice it is in, so a change rewrites only the slices it touches (a
// replica gone: its slice; a new one: the first slice with room, else a new
// slice), not every slice after it. Slices of another owner, address type
// or port, and slices left empty, are deleted. stamp sets labels, owner and,
// on a new slice, namespace and generateName.
func planEndpointSlices(existing []discoveryv1.EndpointSlice, want []sliceEndpoint, limit int, owned func(*discoveryv1.EndpointSlice) bool, stamp func(*discoveryv1.EndpointSlice)) slicePlan {
	byPort := map[int32]map[string]sliceEndpoint{}
	for _, w := range want {
		if byPort[w.port] == nil {
			byPort[w.port] = map[string]sliceEndpoint{}
		}
		byPort[w.port][w.name] = w
	}
	var plan slicePlan
	keep, stale, assigned := keepInPlace(existing, byPort, limit, owned)
	plan.delete = stale
	for _, port := range slices.Sorted(maps.Keys(byPort)) {
		rest := placeRest(keep, want, port, assigned, limit)
		for len(rest) > 0 {
			n := min(limit, len(rest))
			s := &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4, Ports: slicePorts(port), Endpoints: endpointsOf(rest[:n])}
			stamp(s)
			plan.create = append(plan.create, s)
			rest = rest[n:]
		}
	}
	for _, k := range keep {
		if len(k.eps) == 0 {
			plan.delete = append(plan.delete, k.old)
			continue
		}
		s := k.old.DeepCopy()
		s.Ports = slicePorts(k.port)
		s.Endpoints = endpointsOf(k.eps)
		stamp(s)
		if !equality.Semantic.DeepEqual(k.old, s) {
			plan.update = append(plan.update, s)
		}
	}
	return plan
}

// keptSlice is an existing slice planEndpointSlices keeps, with the
// endpoints it is to hold.
type keptSlice struct {
	old  *discoveryv1.EndpointSlice
	port int32
	eps  []sliceEndpoint
}

// keepInPlace goes through the existing slices by name: each of the pool's
// slices of a wanted port keeps the wanted endpoints it holds (up to limit,
// each endpoint in one slice only, marked assigned); the other slices are
// stale.
func keepInPlace(existing []discoveryv1.EndpointSlice, byPort map[int32]map[string]sliceEndpoint, limit int,
	owned func(*discoveryv1.EndpointSlice) bool) (keep []*keptSlice, stale []*discoveryv1.EndpointSlice, assigned map[string]bool) {
	sorted := make([]*discoveryv1.EndpointSlice, 0, len(existing))
	for i := range existing {
		sorted = append(sorted, &existing[i])
	}
	slices.SortFunc(sorted, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })

	assigned = map[string]bool{}
	for _, s := range sorted {
		port, ok := slicePort(s)
		if !owned(s) || s.AddressType != discoveryv1.AddressTypeIPv4 || !ok || byPort[port] == nil {
			stale = append(stale, s)
			continue
		}
		k := &keptSlice{old: s, port: port}
		for _, e := range s.Endpoints {
			if e.TargetRef == nil || e.TargetRef.Kind != "Proxy" {
				continue
			}
			if w, ok := byPort[port][e.TargetRef.Name]; ok && !assigned[w.name] && len(k.eps) < limit {
				k.eps = append(k.eps, w)
				assigned[w.name] = true
			}
		}
		keep = append(keep, k)
	}
	return keep, stale, assigned
}

// placeRest puts the wanted endpoints of port that no slice holds yet, by
// name, into the kept slices of that port while they have room, and returns
// the ones left for new slices.
func placeRest(keep []*keptSlice, want []sliceEndpoint, port int32, assigned map[string]bool, limit int) []sliceEndpoint {
	var rest []sliceEndpoint
	for _, w := range want {
		if w.port == port && !assigned[w.name] {
			rest = append(rest, w)
			assigned[w.name] = true
		}
	}
	slices.SortFunc(rest, func(a, b sliceEndpoint) int { return strings.Compare(a.name, b.name) })
	for _, k := range keep {
		if k.port != port {
			continue
		}
		n := min(limit-len(k.eps), len(rest))
		k.eps, rest = append(k.eps, rest[:n]...), rest[n:]
	}
	return rest
}

// slicePort is the port of a slice this pool wrote: one TCP port named
// proxy.
func slicePort(s *discoveryv1.EndpointSlice) (int32, bool) {
	if len(s.Ports) != 1 {
		return 0, false
	}
	p := s.Ports[0]
	if p.Name == nil || *p.Name != crawlv1.PublishedPortName || p.Port == nil || (p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP) {
		return 0, false
	}
	return *p.Port, true
}

func slicePorts(port int32) []discoveryv1.EndpointPort {
	return []discoveryv1.EndpointPort{{Name: ptr.To(crawlv1.PublishedPortName), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port)}}
}

// endpointsOf sorts by name, so the same set always reads the same.
func endpointsOf(eps []sliceEndpoint) []discoveryv1.Endpoint {
	sorted := slices.Clone(eps)
	slices.SortFunc(sorted, func(a, b sliceEndpoint) int { return strings.Compare(a.name, b.name) })
	out := make([]discoveryv1.Endpoint, len(sorted))
	for i, e := range sorted {
		out[i] = e.ep
	}
	return out
}

func (p *Publisher) reader() client.Reader {
	if p.Reader != nil {
		return p.Reader
	}
	return p.Client
}

func (p *Publisher) clock() clock.PassiveClock {
	if p.Clock != nil {
		return p.Clock
	}
	return clock.RealClock{}
}

func (p *Publisher) ttl() time.Duration {
	if p.CredentialTTL == 0 {
		return defaultCredentialTTL
	}
	return p.CredentialTTL
}
