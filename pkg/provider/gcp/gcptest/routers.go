package gcptest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"google.golang.org/api/compute/v1"
)

// Call names of the Cloud Router methods.
const (
	CallRouterList           = "routers.list"
	CallRouterAggregatedList = "routers.aggregatedList"
)

// NAT options of RouterNat.SourceSubnetworkIpRangesToNat and of
// RouterNatSubnetworkToNat.SourceIpRangesToNat, as the API spells them.
const (
	NATAllSubnetworksAllRanges        = "ALL_SUBNETWORKS_ALL_IP_RANGES"
	NATAllSubnetworksAllPrimaryRanges = "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES"
	NATListOfSubnetworks              = "LIST_OF_SUBNETWORKS"
	NATSubnetAllRanges                = "ALL_IP_RANGES"
	NATSubnetPrimaryRange             = "PRIMARY_IP_RANGE"
	NATSubnetSecondaryRanges          = "LIST_OF_SECONDARY_IP_RANGES"
)

// PutRouter stores a Cloud Router (with its NAT configurations) in region
// of project, as `gcloud compute routers create` and `routers nats create`
// leave it. The network defaults to default; like the API it refuses a
// region no known zone is in, and NAT configurations the API refuses (an
// unknown source option, LIST_OF_SUBNETWORKS without subnetworks, or
// subnetworks with another option).
func (s *Server) PutRouter(project, region string, r *compute.Router) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.regionKnown(region) {
		return fmt.Errorf("gcptest: The resource 'projects/%s/regions/%s' was not found", project, region)
	}
	b, _ := json.Marshal(r)
	var c compute.Router
	_ = json.Unmarshal(b, &c)
	if c.Network == "" {
		c.Network = "global/networks/default"
	}
	c.Network = selfLinkBase + resourcePath(project, c.Network)
	c.Kind = "compute#router"
	c.Region = selfLinkBase + "projects/" + project + "/regions/" + region
	c.SelfLink = c.Region + "/routers/" + c.Name
	for _, n := range c.Nats {
		switch n.SourceSubnetworkIpRangesToNat {
		case NATAllSubnetworksAllRanges, NATAllSubnetworksAllPrimaryRanges:
			if len(n.Subnetworks) > 0 {
				return fmt.Errorf("gcptest: Invalid value for field 'resource.nats[%s].subnetworks': only with %s", n.Name, NATListOfSubnetworks)
			}
		case NATListOfSubnetworks:
			if len(n.Subnetworks) == 0 {
				return fmt.Errorf("gcptest: Invalid value for field 'resource.nats[%s].subnetworks': required with %s", n.Name, NATListOfSubnetworks)
			}
		default:
			return fmt.Errorf("gcptest: Invalid value for field 'resource.nats[%s].sourceSubnetworkIpRangesToNat': '%s'", n.Name, n.SourceSubnetworkIpRangesToNat)
		}
		for _, sn := range n.Subnetworks {
			// The API stores subnetworks as full URLs.
			sn.Name = selfLinkBase + resourcePath(project, sn.Name)
		}
		if n.Type == "" {
			n.Type = "PUBLIC"
		}
	}
	if s.routers == nil {
		s.routers = map[string]*compute.Router{}
	}
	s.routers[key(project, region, c.Name)] = &c
	return nil
}

// regionKnown: some known zone is in region. Callers hold mu.
func (s *Server) regionKnown(region string) bool {
	for z := range s.zones {
		if regionOf(z) == region {
			return true
		}
	}
	return false
}

func regionOf(zone string) string {
	if i := strings.LastIndex(zone, "-"); i > 0 {
		return zone[:i]
	}
	return zone
}

func (s *Server) routerList(w http.ResponseWriter, r *http.Request) {
	project, region := r.PathValue("project"), r.PathValue("region")
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.begin(CallRouterList); f != nil {
		writeError(w, f.code, f.reason, f.message)
		return
	}
	if !s.regionKnown(region) {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/regions/%s' was not found", project, region))
		return
	}
	var all []*compute.Router
	for _, k := range s.sortedRouterKeys(project + "/" + region + "/") {
		all = append(all, s.routers[k])
	}
	items, next, ok := pageOf(s, w, r, all)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, &compute.RouterList{
		Kind:          "compute#routerList",
		Id:            "projects/" + project + "/regions/" + region + "/routers",
		Items:         items,
		NextPageToken: next,
		SelfLink:      selfLinkBase + "projects/" + project + "/regions/" + region + "/routers",
	})
}

func (s *Server) routerAggregatedList(w http.ResponseWriter, r *http.Request) {
	project := r.PathValue("project")
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.begin(CallRouterAggregatedList); f != nil {
		writeError(w, f.code, f.reason, f.message)
		return
	}
	keys, next, ok := pageOf(s, w, r, s.sortedRouterKeys(project+"/"))
	if !ok {
		return
	}
	items := map[string]compute.RoutersScopedList{}
	for _, k := range keys {
		scope := "regions/" + strings.Split(k, "/")[1]
		sl := items[scope]
		sl.Routers = append(sl.Routers, s.routers[k])
		items[scope] = sl
	}
	// The real API lists every region, the empty ones with a warning.
	for z := range s.zones {
		scope := "regions/" + regionOf(z)
		if _, ok := items[scope]; !ok {
			items[scope] = compute.RoutersScopedList{Warning: &compute.RoutersScopedListWarning{
				Code:    "NO_RESULTS_ON_PAGE",
				Message: "There are no results for scope '" + scope + "' on this page.",
				Data:    []*compute.RoutersScopedListWarningData{{Key: "scope", Value: scope}},
			}}
		}
	}
	writeJSON(w, http.StatusOK, &compute.RouterAggregatedList{
		Kind:          "compute#routerAggregatedList",
		Id:            "projects/" + project + "/aggregated/routers",
		Items:         items,
		NextPageToken: next,
		SelfLink:      selfLinkBase + "projects/" + project + "/aggregated/routers",
	})
}

func (s *Server) sortedRouterKeys(prefix string) []string {
	var ks []string
	for k := range s.routers {
		if strings.HasPrefix(k, prefix) {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}
