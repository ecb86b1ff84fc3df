package controllers

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/url"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
)

// Labels of the credential Secrets the operator writes. The manager's
// cache holds only Secrets labelled managed-by (see ManagerOptions), so it
// never keeps every Secret of the cluster in memory.
const (
	labelManagedBy   = "app.kubernetes.io/managed-by"
	managedBy        = "proxy-operator"
	labelCredentials = "crawl.example.com/proxy-credentials"
)

// The verbs the credential code calls: get (the user's Secret, by name),
// list and watch (the informer behind the cache, label-filtered), create,
// and patch (the url). Deletion is the garbage collector's.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;patch

// credentials is a managed Proxy's Basic credential and the Secret the
// operator keeps it in (status.credentialsSecretRef). The password is
// plaintext: never log it, nor put it in status, events or conditions.
type credentials struct {
	Username, Password string
	// secret is the operator's Secret as last read or written.
	secret *corev1.Secret
}

func (c *credentials) auth() squid.Auth {
	return squid.Auth{Type: squid.AuthBasic, Username: c.Username, Password: c.Password}
}

// reconcileCredentials puts the credential of a managed Proxy with Basic
// auth into s.creds (nil for others); see credentialsFor. On the fast path
// (s.probeOnly) a user's credential is taken from the operator's copy.
func (r *ProxyReconciler) reconcileCredentials(ctx context.Context, s *proxyScope) (ctrl.Result, error) {
	creds, wait, err := r.credentialsFor(ctx, s.proxy, s.probeOnly)
	if err != nil || wait != nil {
		return r.stopFor(s.proxy, wait, err)
	}
	s.creds = creds
	if s.stats, err = r.statsCredential(ctx, s.proxy, creds); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// credentialsFor returns the credential of a managed Proxy with Basic
// auth (nil for others), keeping the operator's Secret with it:
//
//   - generated (no secretRef): made once, a random password
//     (squid.GeneratePassword), and reused from the Secret ever after. A
//     Secret lost while the instance exists is reported, never silently
//     regenerated: the instance's squid keeps the old password.
//   - the user's (secretRef): read with the API reader (the cache holds
//     only the operator's Secrets) and copied into the operator's Secret,
//     which then holds the url too. On the fast path of a Ready Proxy the
//     copy is used, so steady state reads no Secret from the API server.
//
// A missing or unusable credential is a wait with the Secret and key in
// its message: no instance is created without one.
func (r *ProxyReconciler) credentialsFor(ctx context.Context, p *crawlv1.Proxy, fast bool) (*credentials, *waitFor, error) {
	if !proxyaccess.UsesBasic(p) {
		p.Status.CredentialsSecretRef = nil
		return nil, nil, nil
	}
	name := crawlv1.CredentialsSecretName(p)
	owned, err := r.credentialsSecret(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	if owned != nil && !metav1.IsControlledBy(owned, p) {
		return nil, &waitFor{crawlv1.ProxyCredentialsConflictReason, fmt.Sprintf(
			"Secret %s/%s exists and is not this Proxy's (it has no controller reference to it); the operator keeps this Proxy's credential under that name: delete or rename that Secret",
			p.Namespace, name), dependencyPoll}, nil
	}

	var user, pass string
	var from string // where the credential came from, for messages
	switch ref := p.Spec.Access.Auth.SecretRef; {
	case ref != nil && fast && owned != nil && len(owned.Data[crawlv1.CredentialsPasswordKey]) > 0:
		user, pass = string(owned.Data[crawlv1.CredentialsUsernameKey]), string(owned.Data[crawlv1.CredentialsPasswordKey])
		from = fmt.Sprintf("Secret %s/%s (copied from spec.access.auth.secretRef %s)", p.Namespace, name, ref.Name)
	case ref != nil:
		from = fmt.Sprintf("Secret %s/%s (spec.access.auth.secretRef)", p.Namespace, ref.Name)
		var wait *waitFor
		if user, pass, wait, err = r.usersCredential(ctx, p.Namespace, ref.Name, from); wait != nil || err != nil {
			return nil, wait, err
		}
	case owned != nil && len(owned.Data[crawlv1.CredentialsPasswordKey]) > 0 && len(owned.Data[crawlv1.CredentialsUsernameKey]) > 0:
		user, pass = string(owned.Data[crawlv1.CredentialsUsernameKey]), string(owned.Data[crawlv1.CredentialsPasswordKey])
		from = fmt.Sprintf("Secret %s/%s (generated)", p.Namespace, name)
	case p.Status.ProviderID != "":
		// The instance's squid holds a password nobody can read back.
		what := "was deleted"
		if owned != nil {
			what = "lost its username or password"
		}
		return nil, &waitFor{crawlv1.ProxyCredentialsMissingReason, fmt.Sprintf(
			"Secret %s/%s holding this Proxy's generated credential %s while instance %s exists, whose squid keeps the old password: restore the Secret, or delete the Proxy and create it again",
			p.Namespace, name, what, p.Status.ProviderID), dependencyPoll}, nil
	default:
		user, pass = p.Name, squid.GeneratePassword()
		from = fmt.Sprintf("Secret %s/%s (generated)", p.Namespace, name)
	}
	if why := credentialProblems(user, pass); why != "" {
		return nil, &waitFor{crawlv1.ProxyCredentialsInvalidReason, from + ": " + why, dependencyPoll}, nil
	}

	c := &credentials{Username: user, Password: pass, secret: owned}
	if err := r.writeCredentials(ctx, p, c); err != nil {
		return nil, nil, err
	}
	p.Status.CredentialsSecretRef = &crawlv1.LocalObjectReference{Name: name}
	return c, nil, nil
}

// usersCredential reads the credential in the user's Secret namespace/name
// with the API reader; a missing Secret or key, or a Secret not of type
// CredentialsSecretType, is a wait whose message names the Secret as from
// does.
func (r *ProxyReconciler) usersCredential(ctx context.Context, namespace, name, from string) (user, pass string, wait *waitFor, err error) {
	theirs := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, theirs); err != nil {
		if apierrors.IsNotFound(err) {
			return "", "", &waitFor{crawlv1.ProxyCredentialsMissingReason, from + " not found: create it with keys " +
				crawlv1.CredentialsUsernameKey + " and " + crawlv1.CredentialsPasswordKey, dependencyPoll}, nil
		}
		return "", "", nil, provider.Transientf("read %s: %w", from, err)
	}
	// Checked before any key is read: a Secret made for something else
	// (every kubernetes.io/basic-auth Secret has username and password) is
	// never copied nor sent by the probe to the Proxy's address.
	if theirs.Type != crawlv1.CredentialsSecretType {
		return "", "", &waitFor{crawlv1.ProxyCredentialsNotForProxiesReason, fmt.Sprintf(
			"%s has type %q, not %s: only Secrets made for proxies are adopted, nothing was copied; create one with kubectl create secret generic NAME --type=%s --from-literal=%s=... --from-literal=%s=...",
			from, theirs.Type, crawlv1.CredentialsSecretType, crawlv1.CredentialsSecretType,
			crawlv1.CredentialsUsernameKey, crawlv1.CredentialsPasswordKey), dependencyPoll}, nil
	}
	for _, key := range []string{crawlv1.CredentialsUsernameKey, crawlv1.CredentialsPasswordKey} {
		if len(theirs.Data[key]) == 0 {
			return "", "", &waitFor{crawlv1.ProxyCredentialsMissingReason, fmt.Sprintf("%s has no key %q (it needs %s and %s)",
				from, key, crawlv1.CredentialsUsernameKey, crawlv1.CredentialsPasswordKey), dependencyPoll}, nil
		}
	}
	return string(theirs.Data[crawlv1.CredentialsUsernameKey]), string(theirs.Data[crawlv1.CredentialsPasswordKey]), nil, nil
}

// credentialsSecret reads the operator's Secret of p from the cache, and
// a miss again from the API server: the cache may not have seen a Secret
// this manager has just created, and a second one must never be generated.
func (r *ProxyReconciler) credentialsSecret(ctx context.Context, p *crawlv1.Proxy) (*corev1.Secret, error) {
	key := client.ObjectKey{Namespace: p.Namespace, Name: crawlv1.CredentialsSecretName(p)}
	s := &corev1.Secret{}
	err := r.Client.Get(ctx, key, s)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, s)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, provider.Transientf("read Secret %s: %w", key, err)
	}
	return s, nil
}

// credentialProblems checks a credential by the renderer's rules, in
// words that name the Secret's keys; the password itself never appears.
func credentialProblems(user, pass string) string {
	errs := squid.Config{AllowedSourceCIDRs: []string{"192.0.2.0/24"}, Auth: squid.Auth{Type: squid.AuthBasic, Username: user, Password: pass}}.
		ValidateFields(field.NewPath("data"))
	var msg string
	for _, e := range errs {
		key := crawlv1.CredentialsUsernameKey
		if e.Field == "data.auth.password" {
			key = crawlv1.CredentialsPasswordKey
		} else if e.Field != "data.auth.username" {
			continue
		}
		if msg != "" {
			msg += "; "
		}
		msg += fmt.Sprintf("key %q %s", key, e.Detail)
	}
	return msg
}

// writeCredentials makes the operator's Secret hold c, and the url once
// the Proxy has an address (none while it has not: a stale url would
// point at a gone instance). It writes only on a change.
func (r *ProxyReconciler) writeCredentials(ctx context.Context, p *crawlv1.Proxy, c *credentials) error {
	want := map[string][]byte{
		crawlv1.CredentialsUsernameKey: []byte(c.Username),
		crawlv1.CredentialsPasswordKey: []byte(c.Password),
	}
	if u := credentialsURL(p, c); u != "" {
		want[crawlv1.CredentialsURLKey] = []byte(u)
	}
	if c.secret == nil {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: crawlv1.CredentialsSecretName(p),
				Labels: map[string]string{labelManagedBy: managedBy, labelCredentials: p.Name}},
			Type: corev1.SecretTypeOpaque,
			Data: want,
		}
		if err := controllerutil.SetControllerReference(p, s, r.Client.Scheme()); err != nil {
			return provider.Permanent(err)
		}
		if err := r.Client.Create(ctx, s); err != nil {
			// AlreadyExists: another reconcile won; the next one reads it.
			return provider.Transientf("create Secret %s/%s: %w", s.Namespace, s.Name, err)
		}
		if p.Spec.Access.Auth.SecretRef == nil {
			r.Recorder.Eventf(p, corev1.EventTypeNormal, "CredentialsGenerated", "generated a credential for user %s into Secret %s", c.Username, s.Name)
		}
		logf.FromContext(ctx).Info("credential Secret created", "secret", s.Name)
		c.secret = s
		return nil
	}
	if maps.EqualFunc(c.secret.Data, want, func(a, b []byte) bool { return string(a) == string(b) }) {
		return nil
	}
	orig := c.secret.DeepCopy()
	s := c.secret.DeepCopy()
	s.Data = want
	if err := r.Client.Patch(ctx, s, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return provider.Transientf("update Secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	logf.FromContext(ctx).V(1).Info("credential Secret updated", "secret", s.Name)
	c.secret = s
	return nil
}

// credentialsURL is http://user:pass@address:port (user and password
// escaped as URL userinfo), empty until the Proxy has an address.
func credentialsURL(p *crawlv1.Proxy, c *credentials) string {
	if p.Status.Address == "" {
		return ""
	}
	port := defaulted(&p.Spec).Port
	u := url.URL{Scheme: "http", User: url.UserPassword(c.Username, c.Password), Host: net.JoinHostPort(p.Status.Address, strconv.Itoa(int(port)))}
	return u.String()
}

// CredentialsCacheOptions restricts a manager's cache of Secrets to the
// operator's own (labelled managed-by), so watching the credential Secrets
// does not hold every Secret of the cluster in memory. The user's Secrets
// (spec.access.auth.secretRef, KVMHost SSH keys) are read with the API
// reader.
func CredentialsCacheOptions() cache.ByObject {
	return cache.ByObject{Label: labels.SelectorFromSet(labels.Set{labelManagedBy: managedBy})}
}
