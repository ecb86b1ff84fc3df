package kubernetes

import (
	"net/netip"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// DefaultAllowedClientCIDRs are the ranges pod and node addresses come
// from in practically every cluster: RFC 1918, carrier-grade NAT (used by
// some CNIs), IPv6 ULA. They are the squid.conf of an unmanaged Proxy (no
// spec.access, or managed: false), which has no credential; its
// NetworkPolicy admits only its spec.access.allowedSourceCIDRs (which
// admission requires), or these ranges for a Proxy stored without them:
// then it is open to every pod of every tenant. A managed Proxy admits
// only its spec.access.allowedSourceCIDRs, with a credential, in squid and
// in its NetworkPolicy. Clusters whose pod network uses other ranges set
// Options.AllowedClientCIDRs.
var DefaultAllowedClientCIDRs = []string{
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7",
}

// Where squid's files are in the pod. The access log goes to stdout and
// cache.log to stderr (the container's log); the pid file and core dumps
// to StateDir, the only writable directory, so squid runs as an
// unprivileged user on a read-only root. The cluster's ranges are a file
// beside squid.conf, and so is the upstream counter, which squid.conf runs
// only when counter says the pods reading it have it executable
// (runsCounter): squid does not start, nor survive a reconfigure, with a
// logfile daemon it cannot run.
func squidPaths(counter bool) squid.Paths {
	paths := squid.Paths{
		PasswordFile:           AuthDir + "/" + PasswordKey,
		AuthHelper:             squid.DefaultAuthHelper,
		PidFile:                StateDir + "/squid.pid",
		CacheLog:               "/dev/stderr",
		AccessLog:              "/dev/stdout",
		CoredumpDir:            StateDir,
		DeniedDestinationsFile: ConfigDir + "/" + ClusterRangesKey,
	}
	if counter {
		paths.UpstreamCounter = CounterPath
	}
	return paths
}

// squidConfig is what the pod's squid runs: the Machine's managed
// configuration, or for an unmanaged Proxy the provider's built-in policy
// (Options.AllowedClientCIDRs, no credential), both rendered by pkg/squid.
func (p *Provider) squidConfig(m *provider.Machine, counter bool) (c squid.Config, managed bool, err error) {
	c, managed, err = provider.ManagedSquid(m, squidPaths(counter))
	if err != nil || managed {
		return c, managed, err
	}
	return squid.Config{
		Port:                    int(port(m)),
		AllowedSourceCIDRs:      p.opts.AllowedClientCIDRs,
		Auth:                    squid.Auth{Type: squid.AuthNone},
		BroadSourcesWithoutAuth: true,
		Paths:                   squidPaths(false),
	}, false, nil
}

// squidFiles are the rendered squid.conf and, with Basic auth, the
// basic_ncsa_auth password file (nil otherwise) of one Proxy, as the
// ConfigMap and the Secret carry them, and the sources its NetworkPolicy
// admits.
type squidFiles struct {
	Conf     []byte
	Password []byte
	Sources  []string
	// Own is what squid.conf refuses by itself, Cluster what the cluster's
	// ranges add (the ClusterRangesKey file); see denylist.go.
	Own, Cluster []netip.Prefix
	// users are what Password admits, to compare with a deployed file.
	users []squid.Auth
}

// renderSquid renders m's squid files with the pod's paths, refusing the
// cluster's ranges too, and running the upstream counter when counter
// (and m has the Stats credential that reads it). Errors are permanent and
// name spec.access fields.
func (p *Provider) renderSquid(m *provider.Machine, cluster []netip.Prefix, counter bool) (squidFiles, error) {
	c, managed, err := p.squidConfig(m, counter)
	if err != nil {
		return squidFiles{}, provider.Permanentf("kubernetes: %w", err)
	}
	conf, err := squid.Render(c)
	if err != nil {
		return squidFiles{}, provider.Permanentf("kubernetes: squid configuration: %w", err)
	}
	own, err := c.DeniedDestinations()
	if err != nil {
		return squidFiles{}, provider.Permanentf("kubernetes: squid configuration: %w", err)
	}
	f := squidFiles{Conf: conf, users: c.PasswordUsers(), Own: own, Cluster: clusterDenied(own, cluster), Sources: c.AllowedSourceCIDRs}
	if !managed && len(m.AllowedSourceCIDRs) > 0 {
		// Squid admits the built-in policy's ranges; the NetworkPolicy only
		// the Proxy's own (admission requires them). A Proxy stored without
		// them keeps the built-in ranges there too.
		if errs := squid.ValidateSources(field.NewPath("spec", "access", "allowedSourceCIDRs"), m.AllowedSourceCIDRs); len(errs) > 0 {
			return squidFiles{}, provider.Permanentf("kubernetes: %w", errs.ToAggregate())
		}
		f.Sources = m.AllowedSourceCIDRs
	}
	if len(f.users) > 0 {
		if f.Password, err = squid.PasswordFile(f.users...); err != nil {
			return squidFiles{}, provider.Permanentf("kubernetes: %w", err)
		}
	}
	return f, nil
}
