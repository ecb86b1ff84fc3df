package e2eutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
)

// Pool replicas are small: TCG guests on a shared machine boot one vCPU
// each, two or three at a time (docs/testing.md).
const (
	PoolReplicaCPUs   = 1
	PoolReplicaMemory = "768Mi"
	// PoolDrainSeconds: the pool's drain before deleting a replaced
	// replica. The suite's crawler re-reads the list every half second
	// through the API, so a few seconds is what it needs to stop using a
	// replica; a crawler reading a mounted file needs about 90 s.
	PoolDrainSeconds = 5
	// PoolLabel is the template label that selects a pool's replicas.
	PoolLabel = "e2e-pool"
)

// NewPool is a ProxyPool of replicas in the run's namespace, its template
// the spec NewProxy gives (the run's KVMHost and KVMImage, the managed
// squid, Access), with 1 vCPU and 768Mi guests; it rolls with maxSurge 1
// and maxUnavailable 0 and drains PoolDrainSeconds. A replica not Ready
// within the run's ProxyReadyTimeout is replaced (TCG boots are slow).
func (o *Objects) NewPool(name string, replicas int32) *crawlv1.ProxyPool {
	labels := map[string]string{PoolLabel: name}
	return &crawlv1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.Namespace.Name},
		Spec: crawlv1.ProxyPoolSpec{
			Replicas: ptr.To(replicas),
			Selector: metav1.LabelSelector{MatchLabels: labels},
			Template: crawlv1.ProxyTemplate{
				Metadata: crawlv1.ProxyTemplateMeta{Labels: labels},
				Spec:     o.NewProxy(name, PoolReplicaCPUs, PoolReplicaMemory).Spec,
			},
			Rollout: crawlv1.ProxyPoolRollout{
				Type:           crawlv1.RollingUpdateStrategy,
				MaxSurge:       ptr.To(intstr.FromInt32(1)),
				MaxUnavailable: ptr.To(intstr.FromInt32(0)),
				DrainSeconds:   ptr.To(int32(PoolDrainSeconds)),
			},
			Remediation: crawlv1.ProxyPoolRemediation{
				StartupTimeout: &metav1.Duration{Duration: o.proxyReadyTimeout},
			},
		},
	}
}

// PoolReplicas lists the Proxies of a pool, by name.
func PoolReplicas(ctx context.Context, c client.Reader, pool *crawlv1.ProxyPool) ([]crawlv1.Proxy, error) {
	list := &crawlv1.ProxyList{}
	if err := c.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingLabels{crawlv1.PoolNameLabel: pool.Name}); err != nil {
		return nil, err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

// ReadPublished reads proxies.txt from the pool's Secret <pool>-proxies,
// as a crawler reading it through the API does: one URL a line.
func ReadPublished(ctx context.Context, c client.Reader, namespace, pool string) ([]string, error) {
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: crawlv1.PublishedName(pool)}, sec); err != nil {
		return nil, err
	}
	return publishedLines(sec), nil
}

// publishedLines are the lines of proxies.txt in the pool's Secret sec.
func publishedLines(sec *corev1.Secret) []string {
	var lines []string
	for _, l := range strings.Split(string(sec.Data[crawlv1.ProxiesTextKey]), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// ViaURL is how a request reaches the proxy of one proxies.txt line
// (http://user:password@address:port).
func ViaURL(line string) (Via, error) {
	u, err := url.Parse(line)
	if err != nil {
		// url's error quotes the line, credential included.
		return Via{}, errors.New("a proxies.txt line is not a URL")
	}
	if u.Scheme != "http" || u.Host == "" || u.Path != "" && u.Path != "/" {
		return Via{}, fmt.Errorf("proxies.txt line %s is not http://[user:password@]address:port", MaskURL(line))
	}
	return Via{Endpoint: u.Scheme + "://" + u.Host, Credentials: u.User}, nil
}

// MaskURL is a proxies.txt line with its password replaced, fit to print.
func MaskURL(line string) string {
	u, err := url.Parse(line)
	if err != nil {
		return "(unparsable line)"
	}
	return u.Redacted()
}

// PoolServing: the pool has observed its spec, status reports replicas
// replicas, all Ready, available and up to date, Available is True, every
// replica is a Ready KVM Proxy on host (CheckReadyProxy), and proxies.txt
// lists exactly their endpoints. It returns the pool, its replicas and the
// published lines.
func PoolServing(ctx context.Context, c client.Reader, key client.ObjectKey, replicas int32, host string) (*crawlv1.ProxyPool, []crawlv1.Proxy, []string, error) {
	return PoolServingFrom(ctx, c, key, replicas, host, provider.AddressSourceLease)
}

// PoolServingFrom is PoolServing for replicas whose address comes from
// addressSource (CheckReadyProxyFrom).
func PoolServingFrom(ctx context.Context, c client.Reader, key client.ObjectKey, replicas int32, host, addressSource string) (*crawlv1.ProxyPool, []crawlv1.Proxy, []string, error) {
	pool := &crawlv1.ProxyPool{}
	if err := c.Get(ctx, key, pool); err != nil {
		return nil, nil, nil, err
	}
	st := pool.Status
	if st.ObservedGeneration != pool.Generation {
		return pool, nil, nil, fmt.Errorf("ProxyPool %s: observedGeneration %d, generation %d", key, st.ObservedGeneration, pool.Generation)
	}
	if st.Replicas != replicas || st.ReadyReplicas != replicas || st.AvailableReplicas != replicas || st.UpToDateReplicas != replicas {
		return pool, nil, nil, fmt.Errorf("ProxyPool %s: %d replicas, %d ready, %d available, %d up to date, want %d of each (Available %s)",
			key, st.Replicas, st.ReadyReplicas, st.AvailableReplicas, st.UpToDateReplicas, replicas, CondString(pool, crawlv1.PoolAvailableCondition))
	}
	if !conditions.IsTrue(pool, crawlv1.PoolAvailableCondition) {
		return pool, nil, nil, fmt.Errorf("ProxyPool %s: Available is %s", key, CondString(pool, crawlv1.PoolAvailableCondition))
	}
	reps, err := PoolReplicas(ctx, c, pool)
	if err != nil {
		return pool, nil, nil, err
	}
	if len(reps) != int(replicas) {
		return pool, reps, nil, fmt.Errorf("ProxyPool %s: %d Proxies exist, want %d", key, len(reps), replicas)
	}
	var want []string
	for i := range reps {
		p := &reps[i]
		if p.Status.Phase != crawlv1.ProxyReady {
			return pool, reps, nil, fmt.Errorf("replica %s is %s: %s", p.Name, p.Status.Phase, CondString(p, crawlv1.ReadyCondition))
		}
		if err := CheckReadyProxyFrom(p, host, addressSource); err != nil {
			return pool, reps, nil, fmt.Errorf("replica %s: %w", p.Name, err)
		}
		want = append(want, strings.TrimPrefix(p.Status.Endpoint, "http://"))
	}
	lines, err := ReadPublished(ctx, c, key.Namespace, key.Name)
	if err != nil {
		return pool, reps, nil, fmt.Errorf("published list: %w", err)
	}
	var got []string
	for _, l := range lines {
		via, err := ViaURL(l)
		if err != nil {
			return pool, reps, lines, err
		}
		if via.Credentials == nil {
			return pool, reps, lines, fmt.Errorf("proxies.txt line %s has no credential", MaskURL(l))
		}
		got = append(got, strings.TrimPrefix(via.Endpoint, "http://"))
	}
	sort.Strings(want)
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		return pool, reps, lines, fmt.Errorf("proxies.txt lists %v, the Ready replicas are %v", got, want)
	}
	return pool, reps, lines, nil
}

// PoolWatch is an observer of one pool's replicas independent of the
// manager: a watch of the namespace's Proxies straight from the API server
// that checks, after every event once armed, the pool's disruption budget:
// whenever the pool takes an available replica out of service (drains or
// deletes it), at least replicas-maxUnavailable replicas are still
// available (Ready, not draining, not being deleted), and at every event at
// most
// replicas+maxSurge exist (draining and deleting ones included). It also
// records the lowest availability from any cause and the replicas that lost
// Ready while in service (a failed probe, e.g. a timeout on a loaded
// machine), which the pool does not control.
type PoolWatch struct {
	pool string

	mu                        sync.Mutex
	objs                      map[string]*crawlv1.Proxy
	armed                     bool
	replicas, surge, unavail  int
	minAvailable, mostExisted int
	violations                []string
	events                    int
	seen                      map[string]ProxyRef
	disruptions               int
	minAtDisruption           int
	readyLost                 []string
	// reported: replicas a ban report asked to replace. The pool takes
	// them out of service at once, by design (docs/pools.md: a crawler
	// said it cannot use them), so that is no disruption of the budget.
	reported    map[string]bool
	reportedOut int
	err         error
	cancel      context.CancelFunc
	done        chan struct{}
}

// WatchPool starts watching the Proxies of pool in namespace, through a
// client of its own made from kubeconfig.
func WatchPool(ctx context.Context, kubeconfig, namespace, pool string) (*PoolWatch, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	wc, err := client.NewWithWatch(rc, client.Options{Scheme: Scheme})
	if err != nil {
		return nil, err
	}
	list := &crawlv1.ProxyList{}
	sel := client.MatchingLabels{crawlv1.PoolNameLabel: pool}
	if err := wc.List(ctx, list, client.InNamespace(namespace), sel); err != nil {
		return nil, err
	}
	w := &PoolWatch{pool: pool, objs: map[string]*crawlv1.Proxy{}, seen: map[string]ProxyRef{}, minAvailable: 1 << 30, done: make(chan struct{})}
	for i := range list.Items {
		w.add(&list.Items[i])
	}
	ctx, w.cancel = context.WithCancel(ctx)
	rv := list.ResourceVersion
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			wi, err := wc.Watch(ctx, &crawlv1.ProxyList{}, client.InNamespace(namespace), sel,
				&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
			if err != nil {
				if ctx.Err() == nil {
					w.fail(fmt.Errorf("watch Proxies: %w", err))
				}
				return
			}
			if !w.consume(ctx, wi, &rv) {
				return
			}
		}
	}()
	return w, nil
}

// consume handles the events of one watch until it closes (true: watch
// again from rv) or ctx ends or it fails (false).
func (w *PoolWatch) consume(ctx context.Context, wi watch.Interface, rv *string) bool {
	defer wi.Stop()
	for {
		var ev watch.Event
		var open bool
		select {
		case <-ctx.Done():
			return false
		case ev, open = <-wi.ResultChan():
		}
		if !open {
			return true
		}
		if ev.Type == watch.Error {
			// An expired resourceVersion: the budget cannot be checked
			// across the gap, so the observation ends.
			w.fail(fmt.Errorf("watch Proxies: %v", ev.Object))
			return false
		}
		p, ok := ev.Object.(*crawlv1.Proxy)
		if !ok {
			continue
		}
		*rv = p.ResourceVersion
		if ev.Type != watch.Bookmark {
			w.observe(ev.Type, p)
		}
	}
}

func (w *PoolWatch) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

func (w *PoolWatch) observe(t watch.EventType, p *crawlv1.Proxy) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events++
	prev, existed := w.objs[p.Name]
	if t == watch.Deleted {
		delete(w.objs, p.Name)
	} else {
		w.add(p)
	}
	if !w.armed {
		return
	}
	// The pool's own disruptions: it drains a replica, deletes it, or (a
	// replica it never drained) it disappears. Only taking out a replica
	// that was available (Ready) lowers availability: replacing one that
	// is not Ready first is what the pool should do, and the budget allows
	// it even when availability is already below the bound.
	disrupted := existed && inService(prev) && (t == watch.Deleted || !inService(p))
	if disrupted && w.reported[p.Name] {
		disrupted = false
		w.reportedOut++
	}
	tookAvailable := disrupted && conditions.IsTrue(prev, crawlv1.ReadyCondition)
	// Ready lost by a replica the pool left in service: the manager's
	// probe failed (under load, a timeout), not a decision of the pool.
	flapped := existed && t != watch.Deleted && inService(prev) && inService(p) &&
		conditions.IsTrue(prev, crawlv1.ReadyCondition) && !conditions.IsTrue(p, crawlv1.ReadyCondition)
	existing, available := w.counts()
	w.minAvailable = min(w.minAvailable, available)
	w.mostExisted = max(w.mostExisted, existing)
	at := time.Now().UTC().Format("15:04:05.000")
	if flapped {
		w.readyLost = append(w.readyLost, fmt.Sprintf("%s %s: %s", at, p.Name, CondString(p, crawlv1.ReadyCondition)))
	}
	if disrupted {
		w.disruptions++
	}
	if tookAvailable {
		w.minAtDisruption = min(w.minAtDisruption, available)
		if available < w.replicas-w.unavail {
			w.violations = append(w.violations, fmt.Sprintf("%s the pool took %s out of service (%s) leaving %d available, fewer than %d",
				at, p.Name, t, available, w.replicas-w.unavail))
		}
	}
	if existing > w.replicas+w.surge {
		w.violations = append(w.violations, fmt.Sprintf("%s %s %s: %d exist, more than %d", at, t, p.Name, existing, w.replicas+w.surge))
	}
}

// inService: not draining and not being deleted.
func inService(p *crawlv1.Proxy) bool {
	_, draining := p.Annotations[crawlv1.DrainingAnnotation]
	return !draining && p.DeletionTimestamp.IsZero()
}

func (w *PoolWatch) add(p *crawlv1.Proxy) {
	w.objs[p.Name] = p
	w.seen[string(p.UID)] = ProxyRef{Domain: domxml.DomainName(p.Namespace, p.Name), UID: string(p.UID)}
}

// Seen lists every replica the watch saw, deleted ones included.
func (w *PoolWatch) Seen() []ProxyRef {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]ProxyRef, 0, len(w.seen))
	for _, r := range w.seen {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Domain < out[j].Domain })
	return out
}

func (w *PoolWatch) counts() (existing, available int) {
	for _, o := range w.objs {
		if inService(o) && conditions.IsTrue(o, crawlv1.ReadyCondition) {
			available++
		}
	}
	return len(w.objs), available
}

// Arm checks the budget of replicas, maxSurge surge and maxUnavailable
// unavailable from now on, starting from the state now.
func (w *PoolWatch) Arm(replicas, surge, unavailable int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed, w.replicas, w.surge, w.unavail = true, replicas, surge, unavailable
	w.violations, w.readyLost, w.disruptions, w.reportedOut = nil, nil, 0, 0
	existing, available := w.counts()
	w.minAvailable, w.mostExisted, w.minAtDisruption = available, existing, available
}

// Reported tells the watch a ban report asks to replace the replica name:
// the pool taking it out of service is then not counted against the budget
// (PoolBudget.ReportedOut counts it).
func (w *PoolWatch) Reported(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.reported == nil {
		w.reported = map[string]bool{}
	}
	w.reported[name] = true
}

// Disarm stops checking (the budget changes with replicas).
func (w *PoolWatch) Disarm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
}

// PoolBudget is what the watch saw while armed.
type PoolBudget struct {
	// MinAvailable is the fewest replicas available at any event, whatever
	// the cause; MinAtDisruption the fewest left available when the pool
	// itself took an available replica out of service (drained or deleted
	// it), which is what the budget bounds.
	MinAvailable, MinAtDisruption, MostExisted, Events int
	// Disruptions counts the replicas the pool took out of service;
	// ReportedOut those it took out because a ban report asked to replace
	// them (not counted in Disruptions or against the budget).
	Disruptions, ReportedOut int
	// Violations of the budget by the pool: an available replica taken out
	// of service leaving fewer than replicas-maxUnavailable available, or
	// more than replicas+maxSurge in existence.
	Violations []string
	// ReadyLost lists replicas in service that lost Ready (the manager's
	// probe failed): not the pool's doing, but a crawler's loss.
	ReadyLost []string
	// Err is set when the watch broke: the budget was not observed
	// throughout.
	Err error
}

// Budget returns what the watch saw since it was armed.
func (w *PoolWatch) Budget() PoolBudget {
	w.mu.Lock()
	defer w.mu.Unlock()
	return PoolBudget{MinAvailable: w.minAvailable, MinAtDisruption: w.minAtDisruption, MostExisted: w.mostExisted, Events: w.events,
		Disruptions: w.disruptions, ReportedOut: w.reportedOut, Violations: append([]string(nil), w.violations...), ReadyLost: append([]string(nil), w.readyLost...), Err: w.err}
}

// Stop ends the watch.
func (w *PoolWatch) Stop() {
	w.cancel()
	<-w.done
}

// PoolLeftovers is what is left on the host of the replicas named (their
// domains, per-VM volumes and NVRAM files), and the audit of the whole
// inventory against the Proxies that still exist: both empty once a
// deleted pool has cleaned up.
func PoolLeftovers(ctx context.Context, h Host, c client.Client, storagePool string, replicas []ProxyRef) (left []string, audit Audit, err error) {
	inv, err := TakeInventory(ctx, h, storagePool)
	if err != nil {
		return nil, Audit{}, err
	}
	refs, err := ProxyRefs(ctx, c)
	if err != nil {
		return nil, Audit{}, err
	}
	uids := map[string]bool{}
	for _, r := range replicas {
		uids[r.UID] = true
		if _, ok := inv.Domains[r.Domain]; ok {
			left = append(left, "domain "+r.Domain)
		}
		for _, f := range inv.NVRAM {
			if f == r.Domain+"_VARS.fd" {
				left = append(left, "NVRAM "+f)
			}
		}
	}
	for _, v := range inv.Volumes[storagePool] {
		if uid, ok := domxml.VolumeOwnerUID(v); ok && uids[uid] {
			left = append(left, "volume "+storagePool+"/"+v)
		}
	}
	sort.Strings(left)
	return left, inv.Audit(refs, Foreign{}), nil
}

// DumpPool writes a pool as the API server has it, each replica's state and
// the published list with passwords masked (never a credential).
func DumpPool(ctx context.Context, w io.Writer, c client.Reader, key client.ObjectKey) {
	pool := &crawlv1.ProxyPool{}
	fmt.Fprintf(w, "\n===== ProxyPool %s =====\n", key)
	if err := c.Get(ctx, key, pool); err != nil {
		fmt.Fprintln(w, err)
		return
	}
	pool.SetManagedFields(nil)
	b, _ := yaml.Marshal(pool)
	fmt.Fprint(w, string(b))
	fmt.Fprintf(w, "\n===== replicas of %s =====\n", key)
	reps, err := PoolReplicas(ctx, c, pool)
	if err != nil {
		fmt.Fprintln(w, err)
	}
	for _, p := range reps {
		fmt.Fprintf(w, "%s uid=%s hash=%s phase=%s address=%s deleting=%v draining=%q\n  Ready %s\n  ProxyHealthy %s\n",
			p.Name, p.UID, p.Labels[crawlv1.TemplateHashLabel], p.Status.Phase, p.Status.Address, !p.DeletionTimestamp.IsZero(),
			p.Annotations[crawlv1.DrainingAnnotation], CondString(&p, crawlv1.ReadyCondition), CondString(&p, crawlv1.ProxyHealthyCondition))
	}
	fmt.Fprintf(w, "\n===== %s of Secret %s (passwords masked) =====\n", crawlv1.ProxiesTextKey, crawlv1.PublishedName(key.Name))
	lines, err := ReadPublished(ctx, c, key.Namespace, key.Name)
	if err != nil {
		fmt.Fprintln(w, err)
	}
	for _, l := range lines {
		fmt.Fprintln(w, MaskURL(l))
	}
}
