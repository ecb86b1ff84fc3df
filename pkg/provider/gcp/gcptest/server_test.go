package gcptest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/api/compute/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
)

func client(t *testing.T, s *Server) *compute.Service {
	t.Helper()
	svc, err := compute.NewService(context.Background(), option.WithEndpoint(s.Endpoint()), option.WithHTTPClient(s.Client()))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func TestOperationProgressesOverPolls(t *testing.T) {
	s := NewServer()
	defer s.Close()
	s.OperationPolls = 3
	svc := client(t, s)
	inst := &compute.Instance{
		Name:              "vm-1",
		MachineType:       "zones/us-central1-a/machineTypes/e2-small",
		Disks:             []*compute.AttachedDisk{{Boot: true, InitializeParams: &compute.AttachedDiskInitializeParams{SourceImage: "projects/debian-cloud/global/images/family/debian-12"}}},
		NetworkInterfaces: []*compute.NetworkInterface{{AccessConfigs: []*compute.AccessConfig{{Type: "ONE_TO_ONE_NAT"}}}},
	}
	op, err := svc.Instances.Insert("p", "us-central1-a", inst).Do()
	if err != nil {
		t.Fatal(err)
	}
	got := []string{op.Status}
	for op.Status != "DONE" {
		if op, err = svc.ZoneOperations.Get("p", "us-central1-a", op.Name).Do(); err != nil {
			t.Fatal(err)
		}
		got = append(got, op.Status)
	}
	want := []string{"PENDING", "RUNNING", "RUNNING", "DONE"}
	if len(got) != len(want) {
		t.Fatalf("statuses = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("statuses = %v, want %v", got, want)
		}
	}
	vm, err := svc.Instances.Get("p", "us-central1-a", "vm-1").Do()
	if err != nil {
		t.Fatal(err)
	}
	if vm.Status != "STAGING" || vm.Id == 0 || vm.SelfLink == "" {
		t.Fatalf("instance = %+v", vm)
	}
	if err := s.SetRunning("p", "us-central1-a", "vm-1", "203.0.113.50"); err != nil {
		t.Fatal(err)
	}
	vm, _ = svc.Instances.Get("p", "us-central1-a", "vm-1").Do()
	if vm.Status != "RUNNING" || vm.NetworkInterfaces[0].AccessConfigs[0].NatIP != "203.0.113.50" {
		t.Fatalf("running instance = %+v", vm.NetworkInterfaces[0].AccessConfigs[0])
	}

	// Duplicate insert: 409 alreadyExists in the real envelope.
	_, err = svc.Instances.Insert("p", "us-central1-a", inst).Do()
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != 409 || len(ge.Errors) != 1 || ge.Errors[0].Reason != "alreadyExists" {
		t.Fatalf("duplicate insert: %#v", err)
	}
	// Invalid label: 400 invalid.
	bad := *inst
	bad.Name, bad.Labels = "vm-2", map[string]string{"Bad": "x"}
	_, err = svc.Instances.Insert("p", "us-central1-a", &bad).Do()
	if !errors.As(err, &ge) || ge.Code != 400 || ge.Errors[0].Reason != "invalid" {
		t.Fatalf("bad label: %v", err)
	}
}

func TestFaultsAreOneShot(t *testing.T) {
	s := NewServer()
	defer s.Close()
	svc := client(t, s)
	s.FailNext(CallZoneGet, 429, "rateLimitExceeded", "")
	_, err := svc.Zones.Get("p", "us-central1-a").Do()
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != 429 || ge.Errors[0].Reason != "rateLimitExceeded" {
		t.Fatalf("first call: %v", err)
	}
	if _, err := svc.Zones.Get("p", "us-central1-a").Do(); err != nil {
		t.Fatalf("second call: %v", err)
	}
	if s.Count(CallZoneGet) != 2 {
		t.Fatalf("count = %d", s.Count(CallZoneGet))
	}
	if _, err := svc.Instances.List("p", "us-central1-a").Filter("labels.x ~ y").Do(); !errors.As(err, &ge) || ge.Code != 400 {
		t.Fatalf("unsupported filter: %v", err)
	}
}

func newInstance(name string) *compute.Instance {
	return &compute.Instance{
		Name:              name,
		MachineType:       "zones/us-central1-a/machineTypes/e2-small",
		Disks:             []*compute.AttachedDisk{{Boot: true, InitializeParams: &compute.AttachedDiskInitializeParams{SourceImage: "projects/debian-cloud/global/images/family/debian-12"}}},
		NetworkInterfaces: []*compute.NetworkInterface{{Network: "global/networks/default", AccessConfigs: []*compute.AccessConfig{{Type: "ONE_TO_ONE_NAT"}}}},
	}
}

func TestInsertRefusesUnknownReferences(t *testing.T) {
	for _, tc := range []struct {
		name   string
		zone   string
		mut    func(*compute.Instance)
		code   int
		reason string
		msg    string
	}{
		{"zone", "us-central1-z", func(*compute.Instance) {}, 404, "notFound", "The resource 'projects/p/zones/us-central1-z' was not found"},
		{"image family", "us-central1-a", func(i *compute.Instance) {
			i.Disks[0].InitializeParams.SourceImage = "projects/debian-cloud/global/images/family/debian-99"
		}, 404, "notFound", "The resource 'projects/debian-cloud/global/images/family/debian-99' was not found"},
		{"image URL", "us-central1-a", func(i *compute.Instance) {
			i.Disks[0].InitializeParams.SourceImage = "https://www.googleapis.com/compute/v1/projects/p/global/images/gone"
		}, 404, "notFound", "The resource 'projects/p/global/images/gone' was not found"},
		{"network", "us-central1-a", func(i *compute.Instance) { i.NetworkInterfaces[0].Network = "global/networks/vpc-x" }, 404, "notFound",
			"The resource 'projects/p/global/networks/vpc-x' was not found"},
		{"machine type", "us-central1-a", func(i *compute.Instance) { i.MachineType = "zones/us-central1-a/machineTypes/e2-huge" }, 400, "invalid",
			"Machine type with name 'e2-huge' does not exist in zone 'us-central1-a'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer()
			defer s.Close()
			inst := newInstance("vm-1")
			tc.mut(inst)
			_, err := client(t, s).Instances.Insert("p", tc.zone, inst).Do()
			var ge *googleapi.Error
			if !errors.As(err, &ge) || ge.Code != tc.code || len(ge.Errors) != 1 || ge.Errors[0].Reason != tc.reason || !strings.Contains(ge.Message, tc.msg) {
				t.Fatalf("insert: %v; want %d %s %q", err, tc.code, tc.reason, tc.msg)
			}
			if len(s.Instances("p")) != 0 {
				t.Error("refused insert left an instance")
			}
		})
	}
	s := NewServer()
	defer s.Close()
	var ge *googleapi.Error
	if _, err := client(t, s).Zones.Get("p", "mars-1a").Do(); !errors.As(err, &ge) || ge.Code != 404 {
		t.Errorf("zones.get of an unknown zone: %v", err)
	}
	s.AddImage("projects/p/global/images/mine")
	inst := newInstance("vm-2")
	inst.Disks[0].InitializeParams.SourceImage = "global/images/mine"
	if _, err := client(t, s).Instances.Insert("p", "us-central1-a", inst).Do(); err != nil {
		t.Errorf("insert with an added image: %v", err)
	}
}

// statusDuring polls op once (not to DONE) and returns the instance status.
func statusDuring(t *testing.T, s *Server, svc *compute.Service, op *compute.Operation, name string) string {
	t.Helper()
	if _, err := svc.ZoneOperations.Get("p", "us-central1-a", op.Name).Do(); err != nil {
		t.Fatal(err)
	}
	inst, ok := s.Instance("p", "us-central1-a", name)
	if !ok {
		return "(gone)"
	}
	return inst.Status
}

func TestStatusTransitions(t *testing.T) {
	s := NewServer()
	defer s.Close()
	s.OperationPolls, s.AutoRun, s.InsertCapacityWait = 3, true, true
	svc := client(t, s)
	op, err := svc.Instances.Insert("p", "us-central1-a", newInstance("vm-1")).Do()
	if err != nil {
		t.Fatal(err)
	}
	if got := statusDuring(t, s, svc, op, "vm-1"); got != "PENDING" {
		t.Errorf("insert waiting for capacity: %s, want PENDING", got)
	}
	statusDuring(t, s, svc, op, "vm-1")
	if got := statusDuring(t, s, svc, op, "vm-1"); got != "RUNNING" {
		t.Errorf("after insert: %s", got)
	}

	if err := s.Repair("p", "us-central1-a", "vm-1", 1); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for range 3 {
		inst, err := svc.Instances.Get("p", "us-central1-a", "vm-1").Do()
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, inst.Status)
	}
	if strings.Join(seen, ",") != "REPAIRING,RUNNING,RUNNING" {
		t.Errorf("repair: %v", seen)
	}

	op, err = svc.Instances.Delete("p", "us-central1-a", "vm-1").Do()
	if err != nil {
		t.Fatal(err)
	}
	if inst, _ := s.Instance("p", "us-central1-a", "vm-1"); inst.Status != "STOPPING" {
		t.Errorf("delete accepted: %s, want STOPPING", inst.Status)
	}
	if got := statusDuring(t, s, svc, op, "vm-1"); got != "DEPROVISIONING" {
		t.Errorf("delete running: %s, want DEPROVISIONING", got)
	}
	statusDuring(t, s, svc, op, "vm-1")
	if got := statusDuring(t, s, svc, op, "vm-1"); got != "(gone)" {
		t.Errorf("delete done: %s", got)
	}
}

func TestListFilterGrammar(t *testing.T) {
	s := NewServer()
	defer s.Close()
	s.PutInstance("p", "us-central1-a", &compute.Instance{Name: "a", Labels: map[string]string{"proxy_tag": "prod", "owner": "x"}})
	s.PutInstance("p", "us-central1-a", &compute.Instance{Name: "b", Labels: map[string]string{"proxy_tag": "staging"}})
	svc := client(t, s)
	for filter, want := range map[string]string{
		`labels.proxy_tag = "prod"`:                             "a",
		`labels.proxy_tag != "prod"`:                            "b",
		`labels.owner:*`:                                        "a",
		`(labels.proxy_tag = "prod") (name = a)`:                "a",
		`(labels.proxy_tag = "staging") AND (status = RUNNING)`: "b",
		`(labels.proxy_tag = "prod") (name = b)`:                "",
	} {
		list, err := svc.Instances.List("p", "us-central1-a").Filter(filter).Do()
		if err != nil {
			t.Errorf("filter %s: %v", filter, err)
			continue
		}
		var names []string
		for _, it := range list.Items {
			names = append(names, it.Name)
		}
		if strings.Join(names, ",") != want {
			t.Errorf("filter %s: %v, want %q", filter, names, want)
		}
	}
	for _, filter := range []string{
		`labels.proxy-tag = "prod"`, // hyphenated key: not in the grammar
		`labels.x ~ y`,
		`labels.a = "x" name = a`, // several comparisons need parentheses
		`(labels.a = "x"`,
		`labels.a.b = x`,
	} {
		_, err := svc.Instances.List("p", "us-central1-a").Filter(filter).Do()
		var ge *googleapi.Error
		if !errors.As(err, &ge) || ge.Code != 400 {
			t.Errorf("filter %s: %v, want 400", filter, err)
		}
	}
}
