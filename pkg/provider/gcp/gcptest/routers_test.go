package gcptest

import (
	"errors"
	"net/http"
	"slices"
	"testing"

	"google.golang.org/api/compute/v1"
	"google.golang.org/api/googleapi"
)

// The routers the fake serves read back through the real client as the
// API answers: per region, and aggregated over every region of the
// project (empty regions with a warning), NAT configurations included.
func TestRoutersListAndAggregatedList(t *testing.T) {
	s := NewServer()
	defer s.Close()
	s.PageSize = 1
	svc := client(t, s)
	for _, r := range []struct {
		region string
		router *compute.Router
	}{
		{"us-central1", &compute.Router{Name: "nat-router", Nats: []*compute.RouterNat{{Name: "nat-all",
			SourceSubnetworkIpRangesToNat: NATAllSubnetworksAllRanges, NatIpAllocateOption: "AUTO_ONLY"}}}},
		{"us-central1", &compute.Router{Name: "bgp-only"}},
		{"europe-west4", &compute.Router{Name: "eu", Network: "global/networks/default", Nats: []*compute.RouterNat{{Name: "some",
			SourceSubnetworkIpRangesToNat: NATListOfSubnetworks,
			Subnetworks:                   []*compute.RouterNatSubnetworkToNat{{Name: "regions/europe-west4/subnetworks/crawl", SourceIpRangesToNat: []string{NATSubnetPrimaryRange}}}}}}},
	} {
		if err := s.PutRouter("p", r.region, r.router); err != nil {
			t.Fatal(err)
		}
	}

	var names []string
	err := svc.Routers.List("p", "us-central1").Pages(t.Context(), func(l *compute.RouterList) error {
		for _, r := range l.Items {
			names = append(names, r.Name)
			if r.Name == "nat-router" && (len(r.Nats) != 1 || r.Nats[0].SourceSubnetworkIpRangesToNat != NATAllSubnetworksAllRanges || r.Nats[0].Type != "PUBLIC") {
				t.Errorf("nats %+v", r.Nats)
			}
		}
		return nil
	})
	if err != nil || !slices.Equal(names, []string{"bgp-only", "nat-router"}) {
		t.Fatalf("routers.list: %v %v (two pages of one)", names, err)
	}

	scopes := map[string][]string{}
	err = svc.Routers.AggregatedList("p").Pages(t.Context(), func(l *compute.RouterAggregatedList) error {
		for scope, sl := range l.Items {
			if sl.Warning != nil && len(sl.Routers) > 0 {
				t.Errorf("scope %s has routers and a warning", scope)
			}
			for _, r := range sl.Routers {
				scopes[scope] = append(scopes[scope], r.Name)
				if r.Name == "eu" && r.Nats[0].Subnetworks[0].Name != "https://www.googleapis.com/compute/v1/projects/p/regions/europe-west4/subnetworks/crawl" {
					t.Errorf("subnetwork stored as %q, want its URL", r.Nats[0].Subnetworks[0].Name)
				}
			}
		}
		return nil
	})
	if err != nil || len(scopes["regions/us-central1"]) != 2 || len(scopes["regions/europe-west4"]) != 1 {
		t.Fatalf("routers.aggregatedList: %v %v", scopes, err)
	}

	_, err = svc.Routers.List("p", "mars-north1").Do()
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != http.StatusNotFound {
		t.Errorf("routers.list of an unknown region: %v, want 404", err)
	}
	if err := s.PutRouter("p", "us-central1", &compute.Router{Name: "bad", Nats: []*compute.RouterNat{{Name: "n", SourceSubnetworkIpRangesToNat: NATListOfSubnetworks}}}); err == nil {
		t.Error("a LIST_OF_SUBNETWORKS NAT without subnetworks was stored; the API refuses it")
	}
	if got := s.Count(CallRouterList); got != 3 {
		t.Errorf("%d routers.list calls counted, want 3", got)
	}
}
