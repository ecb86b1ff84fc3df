package gcp

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"google.golang.org/api/compute/v1"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// checkNAT: instances without an external IP (Options.NoExternalIP) reach
// the Internet only through a Cloud NAT serving their subnetwork in its
// region. Without one the startup script cannot install squid and every
// Proxy only ever shows a closed port, so Check says by name what is
// missing. The region is the subnetwork's, else the default zone's; with
// neither, any NAT of the project on the network will do (routers are
// listed over every region).
func (p *Provider) checkNAT(ctx context.Context) error {
	network := lastSegment(p.opts.Network)
	// In an auto-mode network (no --gcp-subnetwork) each region's
	// subnetwork is named after the network.
	subnet := network
	region := ""
	if p.opts.Subnetwork != "" {
		subnet = lastSegment(p.opts.Subnetwork)
		region = segmentAfter(p.opts.Subnetwork, "regions")
	}
	if region == "" && p.opts.Zone != "" {
		region = regionOfZone(p.opts.Zone)
	}

	var seen []string
	found := false
	look := func(routers []*compute.Router) {
		for _, r := range routers {
			if lastSegment(r.Network) != network || (region != "" && lastSegment(r.Region) != region) {
				continue
			}
			what := describeNATs(r)
			if slices.ContainsFunc(r.Nats, func(n *compute.RouterNat) bool { return natServes(n, subnet) }) {
				found = true
			}
			seen = append(seen, fmt.Sprintf("router %s (%s)", r.Name, what))
		}
	}
	var err error
	where := "region " + region
	if region != "" {
		err = p.svc.Routers.List(p.opts.Project, region).Context(ctx).Pages(ctx, func(l *compute.RouterList) error {
			look(l.Items)
			return nil
		})
		err = classify(err, "list Cloud Routers of "+p.opts.Project+"/"+region)
	} else {
		where = "any region"
		err = p.svc.Routers.AggregatedList(p.opts.Project).Context(ctx).Pages(ctx, func(l *compute.RouterAggregatedList) error {
			scopes := make([]string, 0, len(l.Items))
			for s := range l.Items {
				scopes = append(scopes, s)
			}
			sort.Strings(scopes)
			for _, s := range scopes {
				look(l.Items[s].Routers)
			}
			return nil
		})
		err = classify(err, "list Cloud Routers of "+p.opts.Project)
	}
	if provider.Class(err) == provider.ClassNotFound {
		return provider.Permanentf("%v (check --gcp-zone and --gcp-subnetwork)", err)
	}
	if err != nil || found {
		return err
	}
	have := "no Cloud Router on that network there"
	if len(seen) > 0 {
		have = "only " + strings.Join(seen, "; ")
	}
	r := region
	if r == "" {
		r = "REGION"
	}
	return provider.Permanentf("gcp: --gcp-no-external-ip: no Cloud NAT serves subnetwork %s of network %s in %s of project %s (%s): "+
		"the instances cannot reach the Internet, so the startup script cannot install squid and every Proxy only shows a closed port. "+
		"Create one, e.g. gcloud compute routers create proxy-nat --network %s --region %s && "+
		"gcloud compute routers nats create proxy-nat --router proxy-nat --region %s --auto-allocate-nat-external-ips --nat-all-subnet-ip-ranges",
		subnet, network, where, p.opts.Project, have, network, r, r)
}

// natServes: n translates the primary addresses of subnetwork subnet (the
// instances' own addresses) to public ones.
func natServes(n *compute.RouterNat, subnet string) bool {
	if n.Type == "PRIVATE" || (n.NatIpAllocateOption == "MANUAL_ONLY" && len(n.NatIps) == 0) {
		return false
	}
	switch n.SourceSubnetworkIpRangesToNat {
	case "ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES":
		return true
	case "LIST_OF_SUBNETWORKS":
		for _, s := range n.Subnetworks {
			if lastSegment(s.Name) == subnet &&
				(slices.Contains(s.SourceIpRangesToNat, "ALL_IP_RANGES") || slices.Contains(s.SourceIpRangesToNat, "PRIMARY_IP_RANGE")) {
				return true
			}
		}
	}
	return false
}

// describeNATs says what a router's NATs serve, for the message.
func describeNATs(r *compute.Router) string {
	if len(r.Nats) == 0 {
		return "no NAT"
	}
	var out []string
	for _, n := range r.Nats {
		var what string
		switch {
		case n.Type == "PRIVATE":
			what = "private NAT, no Internet egress"
		case n.NatIpAllocateOption == "MANUAL_ONLY" && len(n.NatIps) == 0:
			what = "no NAT addresses"
		case n.SourceSubnetworkIpRangesToNat == "LIST_OF_SUBNETWORKS":
			var subs []string
			for _, s := range n.Subnetworks {
				subs = append(subs, lastSegment(s.Name)+" "+strings.Join(s.SourceIpRangesToNat, ","))
			}
			what = "serves subnetworks " + strings.Join(subs, ", ")
		default:
			what = "serves " + n.SourceSubnetworkIpRangesToNat
		}
		out = append(out, "NAT "+n.Name+": "+what)
	}
	return strings.Join(out, ", ")
}

// segmentAfter is the path segment after name in a resource path or URL
// ("regions" in .../regions/us-central1/subnetworks/s → us-central1).
func segmentAfter(path, name string) string {
	parts := strings.Split(path, "/")
	for i := 0; i+1 < len(parts); i++ {
		if parts[i] == name {
			return parts[i+1]
		}
	}
	return ""
}

// regionOfZone: us-central1-a → us-central1.
func regionOfZone(zone string) string {
	if i := strings.LastIndex(zone, "-"); i > 0 {
		return zone[:i]
	}
	return zone
}
