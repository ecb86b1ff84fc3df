package controllers

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// NamespacesFlag is the manager flag that restricts the namespaces it
// serves.
const NamespacesFlag = "--namespaces"

// ParseNamespaces parses the comma-separated value of --namespaces; empty:
// every namespace (nil).
func ParseNamespaces(list string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, ns := range strings.Split(list, ",") {
		if ns = strings.TrimSpace(ns); ns == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("%s: %q is not a namespace name: %s", NamespacesFlag, ns, strings.Join(errs, "; "))
		}
		if seen[ns] {
			return nil, fmt.Errorf("%s: namespace %q is listed twice", NamespacesFlag, ns)
		}
		seen[ns] = true
		out = append(out, ns)
	}
	return out, nil
}

// ServeNamespaces restricts the manager's cache of namespaced kinds to
// namespaces, so that its controllers see, and its informers list and
// watch, only objects there: RBAC can then grant Secrets, Pods and the
// rest through Roles in those namespaces alone. Cluster-scoped kinds
// (KVMHost, KVMImage, Node, ServiceCIDR) stay cached cluster-wide. No
// namespaces: every namespace, as before.
func ServeNamespaces(opts cache.Options, namespaces []string) cache.Options {
	if len(namespaces) == 0 {
		return opts
	}
	opts.DefaultNamespaces = make(map[string]cache.Config, len(namespaces))
	for _, ns := range namespaces {
		opts.DefaultNamespaces[ns] = cache.Config{}
	}
	return opts
}
