package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	poolfleet "crawl.example.com/proxy-operator/pkg/fleet"
)

// A pool whose template takes its credential from the user's Secret
// (spec.access.auth.secretRef) gives its replicas a copy of it instead:
// one Secret of the pool per content, a credentials revision, named
// <pool>-credentials-<the user's Secret's resourceVersion when copied>,
// immutable. Each replica refers to the revision current when it was made.
// A replica's squid keeps the password it started with and its Proxy keeps
// probing with that same one, so a changed password is a rollout: the new
// revision changes the replicas' template hash, and the pool replaces them
// within the disruption budget, instead of every replica answering 407 at
// once and staying down.
//
// The first revision of a pool leaves the hash as it was, so replicas made
// before revisions existed (they refer to the user's Secret itself) are not
// rolled for nothing; any later one is part of the hash.
//
// The user's Secret is read by name through the API reader every
// CredentialsCheckInterval (the manager neither lists nor watches Secrets
// it does not label), so a change is noticed within that time.

const (
	// labelPoolCredentials marks a pool's credentials revisions with the
	// pool's name.
	labelPoolCredentials = "crawl.example.com/pool-credentials"
	// annotationCredentialsBaseline marks a pool's first revision: its
	// replicas keep the template's hash.
	annotationCredentialsBaseline = "crawl.example.com/credentials-baseline"
	// defaultCredentialsCheckInterval: how often the user's Secret is read.
	defaultCredentialsCheckInterval = time.Minute
)

// credentialsRevision is the revision new replicas refer to.
type credentialsRevision struct {
	// name of the pool's Secret.
	name string
	// baseline: the pool's first revision.
	baseline bool
}

// userCredentialsSecret is the template's secretRef, or "" when its
// replicas do not take a credential from a Secret of the user's.
func userCredentialsSecret(pool *crawlv1.ProxyPool) string {
	p := &crawlv1.Proxy{Spec: pool.Spec.Template.Spec}
	if !proxyaccess.UsesBasic(p) || p.Spec.Access.Auth == nil || p.Spec.Access.Auth.SecretRef == nil {
		return ""
	}
	return p.Spec.Access.Auth.SecretRef.Name
}

// replicaHash is the template-hash label of replicas made now: the
// template's, and a revision after the first.
func replicaHash(template string, rev *credentialsRevision) string {
	if rev == nil || rev.baseline {
		return template
	}
	sum := sha256.Sum256([]byte(template + "/" + rev.name))
	return hex.EncodeToString(sum[:8])
}

// The verbs the pool's credentials revisions call: get (the user's
// Secret), list and watch (its revisions, through the cache), create, and
// delete (revisions no replica uses).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;delete

// credentialsRevision returns the revision new replicas refer to, making
// it when the user's Secret holds a credential no revision has; nil when
// the template needs none, or when the user's Secret is unusable and the
// pool has no revision yet (replicas then refer to the user's Secret and
// their Proxies say what is missing).
func (r *ProxyPoolReconciler) credentialsRevision(ctx context.Context, pool *crawlv1.ProxyPool, mem *poolMemory, now time.Time) (*credentialsRevision, error) {
	ref := userCredentialsSecret(pool)
	if ref == "" {
		mem.credentials = nil
		return nil, nil
	}
	if c := mem.credentials; c != nil && c.ref == ref && now.Sub(c.checkedAt) < r.CredentialsCheckInterval {
		return c.rev, nil
	}
	revs, err := r.revisions(ctx, pool)
	if err != nil {
		return nil, err
	}
	theirs, err := r.userCredential(ctx, pool, ref)
	if err != nil {
		return nil, err
	}
	var rev *credentialsRevision
	if theirs == nil {
		// Nothing to copy: the newest revision stays current (its
		// replicas serve on), or, without one, the Proxies report it.
		logf.FromContext(ctx).V(1).Info("user's credentials Secret missing or incomplete; keeping the current revision", "secret", ref)
		rev = newestRevision(revs)
	} else if rev = revisionHolding(revs, theirs); rev == nil {
		// The first revision is the baseline: also none remembered (the
		// cache may not show one made a moment ago).
		first := len(revs) == 0 && (mem.credentials == nil || mem.credentials.rev == nil)
		if rev, err = r.copyCredential(ctx, pool, ref, theirs, first, len(revs) > 0); err != nil {
			return nil, err
		}
	}
	mem.credentials = &credentialsCheck{ref: ref, checkedAt: now, rev: rev}
	return rev, nil
}

// userCredential is the credential in the user's Secret, and the Secret's
// resourceVersion when read.
type userCredential struct {
	user, pass, version string
}

// userCredential reads the user's Secret ref; nil when it is missing or
// lacks a username or password.
func (r *ProxyPoolReconciler) userCredential(ctx context.Context, pool *crawlv1.ProxyPool, ref string) (*userCredential, error) {
	theirs := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: ref}, theirs); apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read Secret %s/%s (spec.template.spec.access.auth.secretRef): %w", pool.Namespace, ref, err)
	}
	c := &userCredential{user: string(theirs.Data[crawlv1.CredentialsUsernameKey]), pass: string(theirs.Data[crawlv1.CredentialsPasswordKey]),
		version: theirs.ResourceVersion}
	if c.user == "" || c.pass == "" {
		return nil, nil
	}
	return c, nil
}

// heldBy reports whether Secret s carries credential c.
func (c *userCredential) heldBy(s *corev1.Secret) bool {
	return string(s.Data[crawlv1.CredentialsUsernameKey]) == c.user && string(s.Data[crawlv1.CredentialsPasswordKey]) == c.pass
}

// revisionHolding is the revision among revs that holds c, or nil.
func revisionHolding(revs []corev1.Secret, c *userCredential) *credentialsRevision {
	for i := range revs {
		if s := &revs[i]; c.heldBy(s) {
			return &credentialsRevision{name: s.Name, baseline: s.Annotations[annotationCredentialsBaseline] == "true"}
		}
	}
	return nil
}

// copyCredential makes the revision holding c, the user's Secret ref at
// c.version; baseline when it is the pool's first. A change after an
// earlier revision (changed) is an event.
func (r *ProxyPoolReconciler) copyCredential(ctx context.Context, pool *crawlv1.ProxyPool, ref string, c *userCredential, baseline, changed bool) (*credentialsRevision, error) {
	rev := &credentialsRevision{name: fmt.Sprintf("%s-credentials-%s", pool.Name, c.version), baseline: baseline}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: rev.name,
			Labels: map[string]string{labelManagedBy: managedBy, labelPoolCredentials: pool.Name, crawlv1.PoolNameLabel: pool.Name}},
		Type:      corev1.SecretTypeOpaque,
		Immutable: ptr.To(true),
		Data:      map[string][]byte{crawlv1.CredentialsUsernameKey: []byte(c.user), crawlv1.CredentialsPasswordKey: []byte(c.pass)},
	}
	if rev.baseline {
		s.Annotations = map[string]string{annotationCredentialsBaseline: "true"}
	}
	if err := controllerutil.SetControllerReference(pool, s, r.Scheme); err != nil {
		return nil, err
	}
	err := r.Client.Create(ctx, s)
	switch {
	case apierrors.IsAlreadyExists(err):
		// Made by an earlier pass the cache has not shown yet: the same
		// resourceVersion is the same content.
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return nil, fmt.Errorf("read credentials revision %s: %w", rev.name, err)
		}
		if !metav1.IsControlledBy(s, pool) || !c.heldBy(s) {
			return nil, fmt.Errorf("Secret %s/%s exists and is not this pool's copy of Secret %s: rename or delete it, the pool keeps its credentials revisions there",
				pool.Namespace, rev.name, ref)
		}
		rev.baseline = s.Annotations[annotationCredentialsBaseline] == "true"
	case err != nil:
		return nil, fmt.Errorf("create credentials revision %s: %w", rev.name, err)
	default:
		logf.FromContext(ctx).Info("credentials changed: new revision; replicas made with the previous one are replaced", "secret", ref, "revision", rev.name)
		if changed {
			r.Recorder.Eventf(pool, corev1.EventTypeNormal, crawlv1.PoolCredentialsChangedReason,
				"Secret %s changed: replicas are replaced with the new credential (revision %s)", ref, rev.name)
		}
	}
	return rev, nil
}

// credentialsCheck is the last reading of the user's Secret.
type credentialsCheck struct {
	ref       string
	checkedAt time.Time
	rev       *credentialsRevision
}

// revisions are the pool's credentials revisions (from the cache: they
// are labelled for it).
func (r *ProxyPoolReconciler) revisions(ctx context.Context, pool *crawlv1.ProxyPool) ([]corev1.Secret, error) {
	list := &corev1.SecretList{}
	if err := r.Client.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingLabels{labelPoolCredentials: pool.Name}); err != nil {
		return nil, fmt.Errorf("list credentials revisions: %w", err)
	}
	out := list.Items[:0]
	for _, s := range list.Items {
		if metav1.IsControlledBy(&s, pool) {
			out = append(out, s)
		}
	}
	return out, nil
}

func newestRevision(revs []corev1.Secret) *credentialsRevision {
	if len(revs) == 0 {
		return nil
	}
	s := slices.MaxFunc(revs, func(a, b corev1.Secret) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return &credentialsRevision{name: s.Name, baseline: s.Annotations[annotationCredentialsBaseline] == "true"}
}

// pruneRevisions deletes the pool's revisions keep does not name.
func (r *ProxyPoolReconciler) pruneRevisions(ctx context.Context, pool *crawlv1.ProxyPool, keep map[string]bool) error {
	revs, err := r.revisions(ctx, pool)
	if err != nil {
		return err
	}
	for i := range revs {
		s := &revs[i]
		if keep[s.Name] {
			continue
		}
		uid := s.UID
		if err := r.Client.Delete(ctx, s, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete credentials revision %s: %w", s.Name, err)
		}
		logf.FromContext(ctx).V(1).Info("deleted unused credentials revision", "revision", s.Name)
	}
	return nil
}

// revisionsInUse are the revisions to keep: the current one and those a
// replica refers to; nil when nothing is known to be current and every
// revision stays.
func revisionsInUse(pool *crawlv1.ProxyPool, replicas []crawlv1.Proxy, current *credentialsRevision) map[string]bool {
	if current == nil && userCredentialsSecret(pool) != "" {
		return nil
	}
	keep := map[string]bool{}
	if current != nil {
		keep[current.name] = true
	}
	for i := range replicas {
		keep[credentialsRef(&replicas[i])] = true
	}
	return keep
}

// credentialsRef is the Secret a replica takes its credential from.
func credentialsRef(p *crawlv1.Proxy) string {
	if a := p.Spec.Access; a != nil && a.Auth != nil && a.Auth.SecretRef != nil {
		return a.Auth.SecretRef.Name
	}
	return ""
}

// rejectsCredential: the replica's squid answers 407 to the credential its
// Proxy probes with. Its squid was given another one (the user's Secret
// changed under a replica that refers to it): only a new replica serves.
func rejectsCredential(p *crawlv1.Proxy) bool {
	return conditions.GetReason(p, crawlv1.ProxyHealthyCondition) == crawlv1.ProxyProbeAuthFailedReason &&
		!conditions.IsTrue(p, crawlv1.ProxyHealthyCondition)
}

// replicaFrom is the fleet's view of p: a replica that rejects its own
// credential is out of date, so a rollout replaces it within the budget
// whatever maxUnhealthy says.
func replicaFrom(p *crawlv1.Proxy, hash string) poolfleet.Replica {
	rep := poolfleet.ReplicaFrom(p, hash)
	if rejectsCredential(p) {
		rep.UpToDate = false
	}
	return rep
}

// setCredentialsStatus says when a rollout is a credential change, and
// when replicas are down because they reject the credential they are
// probed with (a changed password), rather than for an unknown cause.
func (r *ProxyPoolReconciler) setCredentialsStatus(pool *crawlv1.ProxyPool, replicas []crawlv1.Proxy, templateHash, hash string, s poolfleet.Summary) {
	ref := userCredentialsSecret(pool)
	changed, rejecting := 0, 0
	for i := range replicas {
		p := &replicas[i]
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		if _, draining := p.Annotations[crawlv1.DrainingAnnotation]; draining {
			continue
		}
		if rejectsCredential(p) {
			rejecting++
		}
		label := p.Labels[crawlv1.TemplateHashLabel]
		if label != hash && (rejectsCredential(p) || label == templateHash ||
			label == replicaHash(templateHash, &credentialsRevision{name: credentialsRef(p)})) {
			// Of the current template, with another credential.
			changed++
		}
	}
	if changed > 0 && changed == s.Outdated && conditions.IsTrue(pool, crawlv1.PoolRollingOutCondition) {
		from := "the credential"
		if ref != "" {
			from = "Secret " + ref
		}
		setPoolCondition(pool, crawlv1.PoolRollingOutCondition, true, crawlv1.PoolCredentialsChangedReason,
			fmt.Sprintf("%s changed: %d replicas made with the previous credential are being replaced, %d up to date",
				from, changed, s.UpToDate))
	}
	if rejecting == 0 {
		return
	}
	why := fmt.Sprintf("%d replicas answer 407 to the credential they are probed with: their squid has another password (the credential changed); a rollout replaces them", rejecting)
	if c := conditions.Get(pool, crawlv1.PoolAvailableCondition); c != nil {
		reason := c.Reason
		if c.Status == metav1.ConditionFalse && s.Available+rejecting >= s.MinAvailable {
			reason = crawlv1.PoolCredentialsRejectedReason
		}
		conditions.Set(pool, metav1.Condition{Type: c.Type, Status: c.Status, Reason: reason, Message: c.Message + "; " + why})
	}
	if c := conditions.Get(pool, crawlv1.PoolRemediationAllowedCondition); c != nil && c.Status == metav1.ConditionFalse {
		conditions.Set(pool, metav1.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message + "; " + why})
	}
}
