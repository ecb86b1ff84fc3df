package gcptest

import (
	"context"
	"errors"
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
		MachineType:       "zones/z-a/machineTypes/e2-small",
		Disks:             []*compute.AttachedDisk{{Boot: true, InitializeParams: &compute.AttachedDiskInitializeParams{SourceImage: "projects/debian-cloud/global/images/family/debian-12"}}},
		NetworkInterfaces: []*compute.NetworkInterface{{AccessConfigs: []*compute.AccessConfig{{Type: "ONE_TO_ONE_NAT"}}}},
	}
	op, err := svc.Instances.Insert("p", "z-a", inst).Do()
	if err != nil {
		t.Fatal(err)
	}
	got := []string{op.Status}
	for op.Status != "DONE" {
		if op, err = svc.ZoneOperations.Get("p", "z-a", op.Name).Do(); err != nil {
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
	vm, err := svc.Instances.Get("p", "z-a", "vm-1").Do()
	if err != nil {
		t.Fatal(err)
	}
	if vm.Status != "STAGING" || vm.Id == 0 || vm.SelfLink == "" {
		t.Fatalf("instance = %+v", vm)
	}
	if err := s.SetRunning("p", "z-a", "vm-1", "203.0.113.50"); err != nil {
		t.Fatal(err)
	}
	vm, _ = svc.Instances.Get("p", "z-a", "vm-1").Do()
	if vm.Status != "RUNNING" || vm.NetworkInterfaces[0].AccessConfigs[0].NatIP != "203.0.113.50" {
		t.Fatalf("running instance = %+v", vm.NetworkInterfaces[0].AccessConfigs[0])
	}

	// Duplicate insert: 409 alreadyExists in the real envelope.
	_, err = svc.Instances.Insert("p", "z-a", inst).Do()
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != 409 || len(ge.Errors) != 1 || ge.Errors[0].Reason != "alreadyExists" {
		t.Fatalf("duplicate insert: %#v", err)
	}
	// Invalid label: 400 invalid.
	bad := *inst
	bad.Name, bad.Labels = "vm-2", map[string]string{"Bad": "x"}
	_, err = svc.Instances.Insert("p", "z-a", &bad).Do()
	if !errors.As(err, &ge) || ge.Code != 400 || ge.Errors[0].Reason != "invalid" {
		t.Fatalf("bad label: %v", err)
	}
}

func TestFaultsAreOneShot(t *testing.T) {
	s := NewServer()
	defer s.Close()
	svc := client(t, s)
	s.FailNext(CallZoneGet, 429, "rateLimitExceeded", "")
	_, err := svc.Zones.Get("p", "z-a").Do()
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != 429 || ge.Errors[0].Reason != "rateLimitExceeded" {
		t.Fatalf("first call: %v", err)
	}
	if _, err := svc.Zones.Get("p", "z-a").Do(); err != nil {
		t.Fatalf("second call: %v", err)
	}
	if s.Count(CallZoneGet) != 2 {
		t.Fatalf("count = %d", s.Count(CallZoneGet))
	}
	if _, err := svc.Instances.List("p", "z-a").Filter("labels.x ~ y").Do(); !errors.As(err, &ge) || ge.Code != 400 {
		t.Fatalf("unsupported filter: %v", err)
	}
}
