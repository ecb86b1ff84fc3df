package gcp

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/api/compute/v1"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/gcp/gcptest"
)

const (
	project = "proj-1"
	zone    = "us-central1-a"
	uid     = "6f1c3a52-95c4-4b43-9d8e-0c0d7c1f2a10"
)

func newProvider(t *testing.T, srv *gcptest.Server, mut ...func(*Options)) *Provider {
	t.Helper()
	o := Options{
		Project:      project,
		Zone:         zone,
		Endpoint:     srv.Endpoint(),
		HTTPClient:   srv.Client(),
		PollInterval: time.Millisecond,
	}
	for _, f := range mut {
		f(&o)
	}
	p, err := New(context.Background(), o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p.(*Provider)
}

func newServer(t *testing.T) *gcptest.Server {
	t.Helper()
	srv := gcptest.NewServer()
	t.Cleanup(srv.Close)
	return srv
}

func machine() *provider.Machine {
	return &provider.Machine{
		Namespace: "crawl",
		Name:      "eu-egress",
		UID:       uid,
		Tag:       "prod",
		DiskBytes: 10<<30 + 1, // rounds up to 11 GiB
		UserData:  []byte("#cloud-config\r\npackages: [squid]\n# ünïcode ✓\x00\n"),
		Port:      3128,
	}
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func wantClass(t *testing.T, err error, want provider.ErrorClass) {
	t.Helper()
	if got := provider.Class(err); got != want {
		t.Fatalf("error %v: class %q, want %q", err, got, want)
	}
}

var gceName = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

func TestInstanceName(t *testing.T) {
	long := strings.Repeat("a", 253)
	for _, tc := range []struct{ ns, name, uid string }{
		{"default", "p", uid},
		{"crawl", "eu.egress.Proxy_1", uid},
		{"1ns", "-x-", uid},
		{strings.Repeat("n", 63), long, uid},
		{"", "", ""},
	} {
		n := InstanceName(tc.ns, tc.name, tc.uid)
		if !gceName.MatchString(n) || len(n) > 63 {
			t.Errorf("InstanceName(%q, %q) = %q: not a GCE name", tc.ns, tc.name, n)
		}
		if n != InstanceName(tc.ns, tc.name, tc.uid) {
			t.Errorf("InstanceName not deterministic")
		}
	}
	a := InstanceName("ns", long, "uid-a")
	b := InstanceName("ns", long+"b", "uid-b")
	if a == b {
		t.Errorf("truncated names with different uids collide: %q", a)
	}
	// Existing instances are found by these names: they must never change.
	if got := InstanceName("crawl", "Eu.Egress_1", "u1"); got != "proxy-crawl-eu-egress-1-bb82030d" {
		t.Errorf("InstanceName changed: %q", got)
	}
	if got := InstanceName(strings.Repeat("n", 40), strings.Repeat("a", 40), "u2"); got != "proxy-"+strings.Repeat("n", 40)+"-aaaaaaa-6ca202c8" {
		t.Errorf("InstanceName changed: %q", got)
	}
	if got := InstanceName("crawl", "eu-egress", uid); !strings.HasPrefix(got, "proxy-crawl-eu-egress-") {
		t.Errorf("InstanceName = %q, want readable prefix", got)
	}
}

func TestLabelValue(t *testing.T) {
	for in, want := range map[string]string{
		"prod":                  "prod",
		"Prod.EU/1":             "prod-eu-1",
		uid:                     uid,
		strings.Repeat("x", 70): strings.Repeat("x", 63),
	} {
		if got := LabelValue(in); got != want {
			t.Errorf("LabelValue(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestProviderIDRoundTrip(t *testing.T) {
	id := FormatProviderID("p", "z", "n")
	if id != "gce://p/z/n" {
		t.Fatalf("FormatProviderID = %q", id)
	}
	p, z, n, err := ParseProviderID(id)
	if err != nil || p != "p" || z != "z" || n != "n" {
		t.Fatalf("ParseProviderID = %q %q %q %v", p, z, n, err)
	}
	for _, bad := range []string{"kubernetes://ns/pod", "gce://p/n", "gce://p/z/x/n"} {
		if _, _, _, err := ParseProviderID(bad); err == nil {
			t.Errorf("ParseProviderID(%q) accepted", bad)
		}
	}
}

func TestCreateGetDeleteLifecycle(t *testing.T) {
	srv := newServer(t)
	srv.OperationPolls = 3 // PENDING → RUNNING → RUNNING → DONE
	p := newProvider(t, srv)
	m := machine()
	name := InstanceName(m.Namespace, m.Name, m.UID)

	inst, err := p.Create(ctx(t), m)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if got := srv.Count(gcptest.CallOperationWait); got != 3 {
		t.Errorf("operation polled %d times, want 3", got)
	}
	wantID := "gce://" + project + "/" + zone + "/" + name
	if inst.ProviderID != wantID || inst.Name != name || inst.Host != zone {
		t.Errorf("instance = %+v, want provider ID %s", inst, wantID)
	}
	if inst.State != provider.StatePending {
		t.Errorf("state after insert = %s, want Pending (STAGING)", inst.State)
	}
	if inst.Owner != (provider.Owner{Namespace: "crawl", Name: "eu-egress", UID: uid}) {
		t.Errorf("owner = %+v", inst.Owner)
	}

	// What was sent, as the API stored it.
	got, ok := srv.Instance(project, zone, name)
	if !ok {
		t.Fatalf("instance %s not created", name)
	}
	wantLabels := map[string]string{
		"managed_by": "proxy-operator", "proxy_tag": "prod", "proxy-uid": uid,
		"proxy-namespace": "crawl", "proxy-name": "eu-egress",
	}
	for k, v := range wantLabels {
		if got.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, got.Labels[k], v)
		}
	}
	if ud := metadata(got, "user-data"); ud == nil || *ud != string(m.UserData) {
		t.Errorf("user-data not byte for byte: %v", ud)
	}
	if metadata(got, "user-data-encoding") != nil {
		t.Errorf("UTF-8 user-data must not be encoded")
	}
	if metadata(got, "vendor-data") != nil {
		t.Errorf("vendor-data is not a GCE cloud-init key")
	}
	ac := got.NetworkInterfaces[0].AccessConfigs
	if len(ac) != 1 || ac[0].Type != "ONE_TO_ONE_NAT" {
		t.Errorf("access configs = %+v, want one ONE_TO_ONE_NAT", ac)
	}
	d := got.Disks[0]
	if !d.Boot || !d.AutoDelete || d.InitializeParams.SourceImage != DefaultImage || d.InitializeParams.DiskSizeGb != 11 {
		t.Errorf("boot disk = %+v / %+v", d, d.InitializeParams)
	}
	if !strings.HasSuffix(got.MachineType, "/zones/"+zone+"/machineTypes/"+DefaultMachineType) {
		t.Errorf("machine type = %s", got.MachineType)
	}
	if len(got.ServiceAccounts) != 0 {
		t.Errorf("service accounts = %+v, want none", got.ServiceAccounts)
	}
	if got.Tags == nil || len(got.Tags.Items) != 1 || got.Tags.Items[0] != DefaultNetworkTag {
		t.Errorf("network tags = %+v", got.Tags)
	}

	// Running with an external IP.
	if err := srv.SetRunning(project, zone, name, "203.0.113.7"); err != nil {
		t.Fatal(err)
	}
	m.ProviderID = inst.ProviderID
	inst, err = p.Get(ctx(t), m)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if inst.State != provider.StateRunning || inst.Address != "203.0.113.7" || inst.AddressSource != provider.AddressSourceNIC {
		t.Errorf("Get = %+v, want Running at 203.0.113.7 (nic)", inst)
	}

	// Delete waits for the operation, then the instance is gone.
	if err := p.Delete(ctx(t), m); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, ok := srv.Instance(project, zone, name); ok {
		t.Fatalf("instance still there after Delete")
	}
	_, err = p.Get(ctx(t), m)
	wantClass(t, err, provider.ClassNotFound)
	if err := p.Delete(ctx(t), m); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
}

func metadata(inst *compute.Instance, key string) *string {
	if inst.Metadata == nil {
		return nil
	}
	for _, it := range inst.Metadata.Items {
		if it.Key == key {
			return it.Value
		}
	}
	return nil
}

func TestCreateIsIdempotent(t *testing.T) {
	srv := newServer(t)
	p := newProvider(t, srv)
	m := machine()
	a, err := p.Create(ctx(t), m)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Create(ctx(t), m)
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if a.ProviderID != b.ProviderID {
		t.Errorf("provider IDs differ: %s, %s", a.ProviderID, b.ProviderID)
	}
	if n := len(srv.Instances(project)); n != 1 {
		t.Errorf("%d instances, want 1", n)
	}
	if n := srv.Count(gcptest.CallInsert); n != 2 {
		t.Errorf("%d inserts, want 2 (second one answered 409)", n)
	}
}

func TestCreateBinaryUserDataIsBase64(t *testing.T) {
	srv := newServer(t)
	p := newProvider(t, srv)
	m := machine()
	m.UserData = []byte{0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe, 0x00, 'x'} // gzip-ish, not UTF-8
	if _, err := p.Create(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	got, _ := srv.Instance(project, zone, InstanceName(m.Namespace, m.Name, m.UID))
	enc := metadata(got, "user-data-encoding")
	if enc == nil || *enc != "base64" {
		t.Fatalf("user-data-encoding = %v, want base64", enc)
	}
	dec, err := base64.StdEncoding.DecodeString(*metadata(got, "user-data"))
	if err != nil || string(dec) != string(m.UserData) {
		t.Fatalf("decoded user-data = %x, %v; want %x", dec, err, m.UserData)
	}
}

func TestCreateStartsStoppedInstance(t *testing.T) {
	srv := newServer(t)
	srv.AutoRun = true
	p := newProvider(t, srv)
	m := machine()
	inst, err := p.Create(ctx(t), m)
	if err != nil {
		t.Fatal(err)
	}
	if inst.State != provider.StateRunning || inst.Address == "" {
		t.Fatalf("AutoRun instance = %+v, want Running with address", inst)
	}
	for _, status := range []string{"TERMINATED", "SUSPENDED"} {
		if err := srv.SetStatus(project, zone, inst.Name, status, ""); err != nil {
			t.Fatal(err)
		}
		got, err := p.Create(ctx(t), m)
		if err != nil {
			t.Fatalf("Create on %s: %v", status, err)
		}
		if got.State != provider.StateRunning {
			t.Errorf("after Create on %s: state %s, want Running", status, got.State)
		}
	}
	if srv.Count(gcptest.CallStart) != 1 || srv.Count(gcptest.CallResume) != 1 {
		t.Errorf("start/resume calls = %d/%d, want 1/1", srv.Count(gcptest.CallStart), srv.Count(gcptest.CallResume))
	}
}

func TestForeignInstanceIsNeverTouched(t *testing.T) {
	srv := newServer(t)
	p := newProvider(t, srv)
	m := machine()
	name := InstanceName(m.Namespace, m.Name, m.UID)
	srv.PutInstance(project, zone, &compute.Instance{
		Name:   name,
		Labels: map[string]string{"managed_by": "proxy-operator", "proxy-uid": "someone-else"},
	})
	unlabelled := machine()
	unlabelled.Name = "other"
	srv.PutInstance(project, zone, &compute.Instance{Name: InstanceName(unlabelled.Namespace, unlabelled.Name, unlabelled.UID)})

	for _, tc := range []struct {
		name string
		m    *provider.Machine
	}{{"other uid", m}, {"no label", unlabelled}} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Create(ctx(t), tc.m)
			var ie *provider.IdentityError
			if !errors.As(err, &ie) || !errors.Is(err, provider.ErrPermanent) {
				t.Fatalf("Create: %v, want permanent IdentityError", err)
			}
			_, err = p.Get(ctx(t), tc.m)
			if !errors.As(err, &ie) {
				t.Fatalf("Get: %v, want IdentityError", err)
			}
			err = p.Delete(ctx(t), tc.m)
			if !errors.As(err, &ie) {
				t.Fatalf("Delete: %v, want IdentityError", err)
			}
		})
	}
	if srv.Count(gcptest.CallDelete) != 0 {
		t.Fatalf("a delete was sent for a foreign instance")
	}
	if len(srv.Instances(project)) != 2 {
		t.Fatalf("foreign instances changed")
	}
}

func TestGetStatusMapping(t *testing.T) {
	srv := newServer(t)
	p := newProvider(t, srv)
	m := machine()
	if _, err := p.Create(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	name := InstanceName(m.Namespace, m.Name, m.UID)
	for _, tc := range []struct {
		status  string
		running bool
		want    provider.State
		addr    string
	}{
		{"PROVISIONING", false, provider.StatePending, ""},
		{"STAGING", false, provider.StatePending, ""},
		{"REPAIRING", false, provider.StatePending, ""},
		{"RUNNING", true, provider.StateRunning, "203.0.113.9"},
		{"STOPPING", false, provider.StateStopped, ""},
		{"STOPPED", false, provider.StateStopped, ""},
		{"SUSPENDING", false, provider.StateStopped, ""},
		{"SUSPENDED", false, provider.StateStopped, ""},
		{"TERMINATED", false, provider.StateStopped, ""},
		// Waiting for capacity (e.g. a reservation or flex-start).
		{"PENDING", false, provider.StatePending, ""},
		// Resources being released on the way to stopped, suspended
		// or deleted.
		{"DEPROVISIONING", false, provider.StateStopped, ""},
		{"SOMETHING_NEW", false, provider.StateUnknown, ""},
	} {
		t.Run(tc.status, func(t *testing.T) {
			if tc.running {
				if err := srv.SetRunning(project, zone, name, tc.addr); err != nil {
					t.Fatal(err)
				}
			} else if err := srv.SetStatus(project, zone, name, tc.status, ""); err != nil {
				t.Fatal(err)
			}
			inst, err := p.Get(ctx(t), m)
			if err != nil {
				t.Fatal(err)
			}
			if inst.State != tc.want || (tc.running && inst.Address != tc.addr) {
				t.Errorf("status %s → %+v, want %s %s", tc.status, inst, tc.want, tc.addr)
			}
			if !tc.running && inst.Address != "" {
				t.Errorf("status %s reported address %s", tc.status, inst.Address)
			}
			if tc.want != provider.StateRunning && inst.Message == "" {
				t.Errorf("status %s: no message says why it is not running", tc.status)
			}
		})
	}

	t.Run("RUNNING without external IP", func(t *testing.T) {
		srv.PutInstance(project, zone, &compute.Instance{Name: "noip", Labels: map[string]string{"proxy-uid": uid}})
		mm := machine()
		mm.ProviderID = FormatProviderID(project, zone, "noip")
		inst, err := p.Get(ctx(t), mm)
		if err != nil {
			t.Fatal(err)
		}
		if inst.State != provider.StateRunning || inst.Address != "" || inst.Message == "" {
			t.Errorf("got %+v, want Running without address, with a message", inst)
		}
	})
	t.Run("missing", func(t *testing.T) {
		mm := machine()
		mm.UID = "another"
		_, err := p.Get(ctx(t), mm)
		wantClass(t, err, provider.ClassNotFound)
	})
}

func TestRecordedProviderIDWins(t *testing.T) {
	srv := newServer(t)
	p := newProvider(t, srv)
	srv.PutInstance("other-proj", "europe-west4-b", &compute.Instance{
		Name: "legacy-name", Labels: map[string]string{"proxy-uid": uid}, Status: "STAGING",
	})
	m := machine()
	m.ProviderID = "gce://other-proj/europe-west4-b/legacy-name"
	inst, err := p.Get(ctx(t), m)
	if err != nil {
		t.Fatal(err)
	}
	if inst.ProviderID != m.ProviderID || inst.Host != "europe-west4-b" {
		t.Errorf("Get = %+v", inst)
	}
	if err := p.Delete(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	if _, ok := srv.Instance("other-proj", "europe-west4-b", "legacy-name"); ok {
		t.Error("not deleted")
	}
	m.ProviderID = "kvm://host/6f1c3a52-95c4-4b43-9d8e-0c0d7c1f2a10"
	_, err = p.Get(ctx(t), m)
	wantClass(t, err, provider.ClassPermanent)
}

func TestErrorClassification(t *testing.T) {
	for _, tc := range []struct {
		name   string
		code   int
		reason string
		want   provider.ErrorClass
	}{
		{"429 rate limit", 429, "rateLimitExceeded", provider.ClassTransient},
		{"403 rate limit", 403, "rateLimitExceeded", provider.ClassTransient},
		{"403 user rate limit", 403, "userRateLimitExceeded", provider.ClassTransient},
		{"403 quota", 403, "quotaExceeded", provider.ClassPermanent},
		{"403 forbidden", 403, "forbidden", provider.ClassPermanent},
		{"400 invalid", 400, "invalid", provider.ClassPermanent},
		{"400 resource not ready", 400, "resourceNotReady", provider.ClassTransient},
		{"401", 401, "authError", provider.ClassPermanent},
		{"500", 500, "backendError", provider.ClassTransient},
		{"503 no reason", 503, "", provider.ClassTransient},
		// An organisation policy refuses the request until it changes.
		{"412 org policy", 412, "conditionNotMet", provider.ClassPermanent},
		// insert's 404 is about what it references (image, family,
		// zone), never the instance it makes.
		{"404 on insert", 404, "notFound", provider.ClassPermanent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t)
			p := newProvider(t, srv)
			srv.FailNext(gcptest.CallInsert, tc.code, tc.reason, "")
			_, err := p.Create(ctx(t), machine())
			wantClass(t, err, tc.want)
			// The caller retries; the fault was one-shot.
			if _, err := p.Create(ctx(t), machine()); err != nil {
				t.Fatalf("retry: %v", err)
			}
		})
	}

	t.Run("network", func(t *testing.T) {
		srv := gcptest.NewServer()
		p := newProvider(t, srv)
		srv.Close()
		_, err := p.Get(ctx(t), machine())
		wantClass(t, err, provider.ClassTransient)
	})
	t.Run("404 on get is not found", func(t *testing.T) {
		srv := newServer(t)
		p := newProvider(t, srv)
		_, err := p.Get(ctx(t), machine())
		wantClass(t, err, provider.ClassNotFound)
		if !errors.Is(err, provider.ErrNotFound) {
			t.Fatal("not ErrNotFound")
		}
	})
	t.Run("wait fails transiently", func(t *testing.T) {
		srv := newServer(t)
		p := newProvider(t, srv)
		srv.FailNext(gcptest.CallOperationWait, 503, "backendError", "")
		_, err := p.Create(ctx(t), machine())
		wantClass(t, err, provider.ClassTransient)
		inst, err := p.Create(ctx(t), machine())
		if err != nil || inst.State != provider.StatePending {
			t.Fatalf("retry = %+v, %v", inst, err)
		}
	})
}

func TestCapacityErrorNamesZonesWithCapacity(t *testing.T) {
	srv := newServer(t)
	p := newProvider(t, srv)
	srv.FailNextOperation(gcptest.CallInsert, "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
		"The zone 'projects/p/zones/us-central1-a' does not have enough resources available to fulfill the request.", 503,
		&compute.OperationErrorErrorsErrorDetails{ErrorInfo: &compute.ErrorInfo{
			Reason: "RESOURCE_AVAILABILITY", Domain: "compute.googleapis.com",
			Metadatas: map[string]string{"zone": "us-central1-a", "vmType": "e2-small", "zonesAvailable": "us-central1-b,us-central1-f"},
		}},
		&compute.OperationErrorErrorsErrorDetails{LocalizedMessage: &compute.LocalizedMessage{Locale: "en-US", Message: "Try us-central1-b or us-central1-f."}},
	)
	_, err := p.Create(ctx(t), machine())
	wantClass(t, err, provider.ClassTransient)
	if !errors.Is(err, provider.ErrNoCapacity) {
		t.Errorf("error %v does not say the zone has no capacity (provider.ErrNoCapacity): a pool would try the zone again first", err)
	}
	for _, want := range []string{"ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "RESOURCE_AVAILABILITY", "zonesAvailable=us-central1-b,us-central1-f", "Try us-central1-b or us-central1-f."} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not carry %q", err, want)
		}
	}
}

func TestOperationErrors(t *testing.T) {
	for _, tc := range []struct {
		code   string
		status int
		want   provider.ErrorClass
	}{
		{"QUOTA_EXCEEDED", 403, provider.ClassPermanent},
		{"ZONE_RESOURCE_POOL_EXHAUSTED", 503, provider.ClassTransient},
		{"RESOURCE_NOT_FOUND", 404, provider.ClassPermanent}, // e.g. the image: permanent for Create
		{"INVALID_FIELD_VALUE", 400, provider.ClassPermanent},
		{"SOMETHING_ELSE", 500, provider.ClassTransient},
		{"SOMETHING_ELSE", 400, provider.ClassPermanent},
		{"CONDITION_NOT_MET", 412, provider.ClassPermanent},
	} {
		t.Run(tc.code, func(t *testing.T) {
			srv := newServer(t)
			p := newProvider(t, srv)
			srv.FailNextOperation(gcptest.CallInsert, tc.code, "boom", tc.status)
			_, err := p.Create(ctx(t), machine())
			wantClass(t, err, tc.want)
			if got, want := errors.Is(err, provider.ErrNoCapacity), strings.HasPrefix(tc.code, "ZONE_RESOURCE_POOL_EXHAUSTED"); got != want {
				t.Errorf("error %v: no capacity %v, want %v", err, got, want)
			}
			if !strings.Contains(err.Error(), tc.code) {
				t.Errorf("error %q does not name %s", err, tc.code)
			}
			if n := len(srv.Instances(project)); n != 0 {
				t.Errorf("failed insert left %d instances", n)
			}
		})
	}
}

func TestOperationTimeoutThenResume(t *testing.T) {
	srv := newServer(t)
	srv.OperationPolls = 1 << 30 // never done in time
	p := newProvider(t, srv, func(o *Options) { o.OperationTimeout = 50 * time.Millisecond })
	_, err := p.Create(ctx(t), machine())
	wantClass(t, err, provider.ClassTransient)
	// The instance exists (PROVISIONING); the next Create finds it.
	inst, err := p.Create(ctx(t), machine())
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if inst.State != provider.StatePending {
		t.Errorf("state = %s, want Pending", inst.State)
	}
}

func TestDeleteTolerance(t *testing.T) {
	srv := newServer(t)
	p := newProvider(t, srv)
	m := machine()
	if _, err := p.Create(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	// Gone between our get and our delete.
	srv.FailNext(gcptest.CallDelete, 404, "notFound", "")
	if err := p.Delete(ctx(t), m); err != nil {
		t.Fatalf("Delete with 404: %v", err)
	}
	// A delete whose operation is refused transiently is retried by the caller.
	srv.FailNext(gcptest.CallDelete, 400, "resourceNotReady", "")
	wantClass(t, p.Delete(ctx(t), m), provider.ClassTransient)
	if err := p.Delete(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	if len(srv.Instances(project)) != 0 {
		t.Fatal("instance survived")
	}
}

func TestListByTag(t *testing.T) {
	srv := newServer(t)
	srv.PageSize = 1 // exercise paging through the aggregated list
	p := newProvider(t, srv)

	a := machine()
	b := machine()
	b.Name, b.UID, b.Zone = "b.with.dots", "11111111-2222-3333-4444-555555555555", "europe-west4-b"
	other := machine()
	other.Name, other.UID, other.Tag = "other-tag", "99999999-2222-3333-4444-555555555555", "staging"
	for _, m := range []*provider.Machine{a, b, other} {
		if _, err := p.Create(ctx(t), m); err != nil {
			t.Fatal(err)
		}
	}
	srv.PutInstance(project, zone, &compute.Instance{Name: "untagged"})
	srv.PutInstance(project, zone, &compute.Instance{Name: "not-managed", Labels: map[string]string{"proxy_tag": "prod"}})

	got, err := p.ListByTag(ctx(t), "prod")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("ListByTag = %+v, want 2 instances", got)
	}
	owners := map[string]provider.Owner{}
	for _, i := range got {
		owners[i.Owner.Name] = i.Owner
		if i.Host == "" || !strings.HasPrefix(i.ProviderID, "gce://"+project+"/"+i.Host+"/") {
			t.Errorf("instance %+v: bad host/provider ID", i)
		}
	}
	if owners["eu-egress"].UID != a.UID || owners["b.with.dots"].UID != b.UID || owners["b.with.dots"].Namespace != "crawl" {
		t.Errorf("owners = %+v (want exact names from metadata)", owners)
	}
	if srv.Count(gcptest.CallAggregatedList) < 2 {
		t.Errorf("aggregated list not paged")
	}
	none, err := p.ListByTag(ctx(t), "nope")
	if err != nil || len(none) != 0 {
		t.Fatalf("ListByTag(nope) = %v, %v", none, err)
	}
}

// proxyFirewall is the rule docs/providers.md tells the VPC owner to make.
func proxyFirewall() *compute.Firewall {
	return &compute.Firewall{
		Name: "allow-proxy", TargetTags: []string{DefaultNetworkTag}, SourceRanges: []string{"10.0.0.0/8"},
		Allowed: []*compute.FirewallAllowed{{IPProtocol: "tcp", Ports: []string{"3128"}}},
	}
}

func TestCheck(t *testing.T) {
	srv := newServer(t)
	srv.PutFirewall(project, proxyFirewall())
	p := newProvider(t, srv)
	if err := p.Check(ctx(t)); err != nil {
		t.Fatal(err)
	}
	srv.FailNext(gcptest.CallZoneGet, 403, "accessNotConfigured", "Compute Engine API has not been used in project")
	wantClass(t, p.Check(ctx(t)), provider.ClassPermanent)

	noZone := newProvider(t, srv, func(o *Options) { o.Zone = "" })
	if err := noZone.Check(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if srv.Count(gcptest.CallZoneList) != 1 {
		t.Error("zones.list not used without a zone")
	}

	srv.FailNext(gcptest.CallZoneGet, 404, "notFound", "The resource 'projects/proj-1/zones/us-central1-a' was not found")
	wantClass(t, p.Check(ctx(t)), provider.ClassPermanent)
	bad := newProvider(t, srv, func(o *Options) { o.Zone = "mars-1a" })
	if err := bad.Check(ctx(t)); err == nil {
		t.Error("Check passed with a zone that does not exist")
	}
}

func TestCheckNamesAMissingFirewallRule(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*compute.Firewall)
		ok   bool
	}{
		{"rule for our tag and port", func(*compute.Firewall) {}, true},
		{"port range", func(f *compute.Firewall) { f.Allowed[0].Ports = []string{"3000-4000"} }, true},
		{"all ports", func(f *compute.Firewall) { f.Allowed[0].Ports = nil }, true},
		{"all instances", func(f *compute.Firewall) { f.TargetTags = nil }, true},
		{"one of its tags ours", func(f *compute.Firewall) { f.TargetTags = []string{"web", DefaultNetworkTag} }, true},
		{"all protocols", func(f *compute.Firewall) { f.Allowed[0].IPProtocol = "all" }, true},
		{"tcp by number", func(f *compute.Firewall) { f.Allowed[0].IPProtocol = "6" }, true},
		{"port in a later entry", func(f *compute.Firewall) {
			f.Allowed = []*compute.FirewallAllowed{{IPProtocol: "udp", Ports: []string{"3128"}}, {IPProtocol: "tcp", Ports: []string{"22", "3128"}}}
		}, true},
		{"no rule at all", nil, false},
		{"by service account", func(f *compute.Firewall) { f.TargetServiceAccounts = []string{"sa@example.iam.gserviceaccount.com"} }, false},
		{"other port", func(f *compute.Firewall) { f.Allowed[0].Ports = []string{"22"} }, false},
		{"other tag", func(f *compute.Firewall) { f.TargetTags = []string{"web"} }, false},
		{"udp", func(f *compute.Firewall) { f.Allowed[0].IPProtocol = "udp" }, false},
		{"disabled", func(f *compute.Firewall) { f.Disabled = true }, false},
		{"egress", func(f *compute.Firewall) { f.Direction = "EGRESS" }, false},
		{"other network", func(f *compute.Firewall) { f.Network = "global/networks/vpc-b" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t)
			if tc.mut != nil {
				fw := proxyFirewall()
				tc.mut(fw)
				srv.PutFirewall(project, fw)
			}
			err := newProvider(t, srv).Check(ctx(t))
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantClass(t, err, provider.ClassPermanent)
			for _, want := range []string{"firewall rule", "tcp:3128", DefaultNetworkTag, "network default"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
		})
	}
}

func TestPortInRange(t *testing.T) {
	for _, tc := range []struct {
		r    string
		port int
		want bool
	}{
		{"3128", 3128, true},
		{"3129", 3128, false},
		{"3000-4000", 3128, true},
		{"3000-4000", 3000, true},
		{"3000-4000", 4000, true},
		{"3129-4000", 3128, false},
		{"4000-3000", 3128, false}, // not a range Compute Engine accepts
		{"3128-", 3128, true},      // no upper bound: the port alone
		{"", 3128, false},
		{"http", 3128, false},
		{"3000-x", 3128, false},
	} {
		if got := portInRange(tc.r, tc.port); got != tc.want {
			t.Errorf("portInRange(%q, %d) = %v, want %v", tc.r, tc.port, got, tc.want)
		}
	}
}

func TestNoExternalIPReportsTheInternalAddress(t *testing.T) {
	srv := newServer(t)
	srv.AutoRun = true
	p := newProvider(t, srv, func(o *Options) { o.NoExternalIP = true })
	m := machine()
	inst, err := p.Create(ctx(t), m)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := srv.Instance(project, zone, inst.Name)
	if n := len(got.NetworkInterfaces[0].AccessConfigs); n != 0 {
		t.Errorf("insert asked for %d access configs, want none", n)
	}
	if inst.State != provider.StateRunning || inst.Address != got.NetworkInterfaces[0].NetworkIP || inst.Address == "" ||
		inst.AddressSource != provider.AddressSourceNIC {
		t.Errorf("Create = %+v, want Running at the internal IP %s", inst, got.NetworkInterfaces[0].NetworkIP)
	}
}

func TestImageSelection(t *testing.T) {
	srv := newServer(t)
	p := newProvider(t, srv)
	m := machine()
	m.Image.URL = "https://cloud-images.example/jammy.qcow2"
	_, err := p.Create(ctx(t), m)
	wantClass(t, err, provider.ClassPermanent)
	if srv.Count(gcptest.CallInsert) != 0 {
		t.Error("insert sent with a KVM image")
	}
	m.Image.URL = ""
	m.Image.Name = "my-kvm-image"
	_, err = p.Create(ctx(t), m)
	wantClass(t, err, provider.ClassPermanent)

	const img = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
	for _, im := range []provider.Image{{URL: img}, {Name: img}} {
		m.Image = im
		m.UID += "x" // a fresh instance each time
		if _, err := p.Create(ctx(t), m); err != nil {
			t.Fatal(err)
		}
		got, _ := srv.Instance(project, zone, InstanceName(m.Namespace, m.Name, m.UID))
		if got.Disks[0].InitializeParams.SourceImage != img {
			t.Errorf("image %+v: source image = %s", im, got.Disks[0].InitializeParams.SourceImage)
		}
	}
}

func TestMachineValidation(t *testing.T) {
	srv := newServer(t)
	p := newProvider(t, srv, func(o *Options) { o.Zone = "" })
	m := machine()
	_, err := p.Create(ctx(t), m) // no zone anywhere
	wantClass(t, err, provider.ClassPermanent)
	m.Zone = zone
	m.UID = ""
	_, err = p.Create(ctx(t), m)
	wantClass(t, err, provider.ClassPermanent)
	m = machine()
	m.Zone = zone
	m.UserData = []byte(strings.Repeat("x", maxMetadataValue+1))
	_, err = p.Create(ctx(t), m)
	wantClass(t, err, provider.ClassPermanent)
}

const fakeKey = "-----BEGIN PRIVATE KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASCAT8wggE7AgEAAkEA\n-----END PRIVATE KEY-----\n"

func TestCredentials(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sa := `{"type":"service_account","project_id":"p","client_email":"op@p.iam.gserviceaccount.com","private_key":` + jsonString(fakeKey) + `}`

	for _, tc := range []struct {
		name string
		opts Options
		want provider.ErrorClass
	}{
		{"missing file", Options{CredentialsFile: filepath.Join(dir, "absent.json")}, provider.ClassTransient},
		{"garbage file", Options{CredentialsFile: write("garbage.json", "not json {")}, provider.ClassPermanent},
		{"empty file", Options{CredentialsFile: write("empty.json", "")}, provider.ClassPermanent},
		{"no type", Options{CredentialsJSON: []byte(`{"client_email":"x"}`)}, provider.ClassPermanent},
		{"unknown type", Options{CredentialsJSON: []byte(`{"type":"api_key"}`)}, provider.ClassPermanent},
		{"sa without key", Options{CredentialsJSON: []byte(`{"type":"service_account","client_email":"x"}`)}, provider.ClassPermanent},
		{"sa key not PEM", Options{CredentialsJSON: []byte(`{"type":"service_account","client_email":"x","private_key":"abc"}`)}, provider.ClassPermanent},
		{"both", Options{CredentialsJSON: []byte(sa), CredentialsFile: "/x"}, provider.ClassPermanent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Project = project
			_, err := New(context.Background(), tc.opts)
			wantClass(t, err, tc.want)
			if strings.Contains(fmtErr(err), "PRIVATE KEY") {
				t.Errorf("error leaks key material: %v", err)
			}
		})
	}

	// Well-formed documents pass validation (New would then build a client;
	// it is not called here so no test ever reaches Google's token endpoint).
	for _, doc := range []string{
		sa,
		`{"type":"authorized_user","client_id":"a","client_secret":"b","refresh_token":"c"}`,
		`{"type":"external_account","audience":"//iam.googleapis.com/x"}`,
	} {
		if _, err := credentialsOption(Options{CredentialsJSON: []byte(doc)}); err != nil {
			t.Errorf("credentialsOption(%.30s…): %v", doc, err)
		}
	}
	if _, err := credentialsOption(Options{CredentialsFile: write("sa.json", sa)}); err != nil {
		t.Errorf("credentials file: %v", err)
	}
}

func jsonString(s string) string {
	return `"` + strings.ReplaceAll(s, "\n", `\n`) + `"`
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestCreateWithAMissingReferenceFailsPermanently(t *testing.T) {
	for name, mut := range map[string]func(*Options, *provider.Machine){
		"image family gone": func(o *Options, m *provider.Machine) {
			m.Image.URL = "projects/debian-cloud/global/images/family/debian-99"
		},
		"unknown network":      func(o *Options, m *provider.Machine) { o.Network = "global/networks/vpc-gone" },
		"unknown zone":         func(o *Options, m *provider.Machine) { m.Zone = "us-central1-z" },
		"unknown machine type": func(o *Options, m *provider.Machine) { m.MachineType = "e2-huge" },
	} {
		t.Run(name, func(t *testing.T) {
			srv := newServer(t)
			m := machine()
			p := newProvider(t, srv, func(o *Options) { mut(o, m) })
			_, err := p.Create(ctx(t), m)
			// Permanent, not "instance not found": the controller would
			// rebuild in a loop on that.
			wantClass(t, err, provider.ClassPermanent)
		})
	}
}

func TestRepairingInstanceIsPendingThenRunning(t *testing.T) {
	srv := newServer(t)
	srv.AutoRun = true
	p := newProvider(t, srv)
	m := machine()
	inst, err := p.Create(ctx(t), m)
	if err != nil || inst.State != provider.StateRunning {
		t.Fatalf("Create = %+v, %v", inst, err)
	}
	addr := inst.Address
	if err := srv.Repair(project, zone, inst.Name, 1); err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctx(t), m)
	if err != nil || got.State != provider.StatePending || got.Address != "" || !strings.Contains(got.Message, "repairing") {
		t.Errorf("repairing: %+v, %v", got, err)
	}
	got, err = p.Get(ctx(t), m)
	if err != nil || got.State != provider.StateRunning || got.Address != addr {
		t.Errorf("after repair: %+v, %v; want Running at %s", got, err, addr)
	}
}

func TestDeleteWaitsThroughDeprovisioning(t *testing.T) {
	srv := newServer(t)
	srv.OperationPolls = 4
	p := newProvider(t, srv)
	m := machine()
	if _, err := p.Create(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	if _, ok := srv.Instance(project, zone, InstanceName(m.Namespace, m.Name, m.UID)); ok {
		t.Error("Delete returned before the instance was gone")
	}
}

func TestUserDataOnAnImageWithoutCloudInitIsRefused(t *testing.T) {
	if why := CloudInitUnsupported(DefaultImage); why != "" {
		t.Fatalf("the default image %s cannot run cloud-init: %s", DefaultImage, why)
	}
	const debian = "projects/debian-cloud/global/images/family/debian-12"
	srv := newServer(t)
	m := machine()
	m.Image.URL = debian
	_, err := newProvider(t, srv).Create(ctx(t), m)
	wantClass(t, err, provider.ClassPermanent)
	if !strings.Contains(err.Error(), "spec.placement.image") || !strings.Contains(err.Error(), "cloud-init") {
		t.Errorf("error %q does not name the field and the reason", err)
	}
	// The same image as the manager's default is the flag's fault.
	_, err = newProvider(t, srv, func(o *Options) { o.Image = debian }).Create(ctx(t), machine())
	wantClass(t, err, provider.ClassPermanent)
	if !strings.Contains(err.Error(), "--gcp-image") {
		t.Errorf("error %q does not name --gcp-image", err)
	}
	if srv.Count(gcptest.CallInsert) != 0 {
		t.Error("insert sent although the image cannot apply the user-data")
	}
	// Without user-data there is nothing for cloud-init to do.
	m = machine()
	m.Image.URL, m.UserData = debian, nil
	if _, err := newProvider(t, srv).Create(ctx(t), m); err != nil {
		t.Errorf("Debian without user-data: %v", err)
	}
}

// Two installs sharing a project list only their own instances, and
// instances made before install ids (no label) are nobody's to collect.
func TestListByTagReturnsOnlyThisInstall(t *testing.T) {
	srv := newServer(t)
	mine := newProvider(t, srv, func(o *Options) { o.InstallID = "install-a" })
	theirs := newProvider(t, srv, func(o *Options) { o.InstallID = "install-b" })
	legacy := newProvider(t, srv)
	a, b, old := machine(), machine(), machine()
	b.Name, b.UID = "b", "11111111-2222-3333-4444-555555555555"
	old.Name, old.UID = "old", "99999999-2222-3333-4444-555555555555"
	for p, m := range map[*Provider]*provider.Machine{mine: a, theirs: b, legacy: old} {
		if _, err := p.Create(ctx(t), m); err != nil {
			t.Fatal(err)
		}
	}
	got, err := mine.ListByTag(ctx(t), "prod")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Owner.UID != a.UID || got[0].InstallID != "install-a" {
		t.Fatalf("ListByTag = %+v, want only %s of install-a", got, a.UID)
	}
	for _, inst := range srv.Instances(project) {
		if inst.Labels[LabelUID] == a.UID && (inst.Labels[LabelInstall] != "install-a" ||
			len(inst.Disks) == 0 || inst.Disks[0].InitializeParams == nil || inst.Disks[0].InitializeParams.Labels[LabelInstall] != "install-a") {
			t.Errorf("instance %s: labels %v, want %s=install-a on it and its boot disk", inst.Name, inst.Labels, LabelInstall)
		}
	}
}

// Without external IPs the instances reach the Internet only through a
// Cloud NAT serving their subnetwork; Check names what is missing.
func TestCheckNamesAMissingCloudNAT(t *testing.T) {
	all := func(name string) *compute.RouterNat {
		return &compute.RouterNat{Name: name, SourceSubnetworkIpRangesToNat: gcptest.NATAllSubnetworksAllRanges, NatIpAllocateOption: "AUTO_ONLY"}
	}
	listed := func(subnet string, ranges ...string) *compute.RouterNat {
		return &compute.RouterNat{Name: "listed", SourceSubnetworkIpRangesToNat: gcptest.NATListOfSubnetworks, NatIpAllocateOption: "AUTO_ONLY",
			Subnetworks: []*compute.RouterNatSubnetworkToNat{{Name: "regions/us-central1/subnetworks/" + subnet, SourceIpRangesToNat: ranges}}}
	}
	type router struct {
		region, network string
		nats            []*compute.RouterNat
	}
	for _, tc := range []struct {
		name    string
		opts    func(*Options)
		routers []router
		// want: words the error names; none: Check passes.
		want []string
	}{
		{name: "a NAT for every subnetwork of the region", routers: []router{{"us-central1", "", []*compute.RouterNat{all("nat")}}}},
		{name: "primary ranges of every subnetwork", routers: []router{{"us-central1", "", []*compute.RouterNat{{Name: "nat",
			SourceSubnetworkIpRangesToNat: gcptest.NATAllSubnetworksAllPrimaryRanges}}}}},
		{name: "the subnetwork listed", opts: func(o *Options) { o.Subnetwork = "regions/us-central1/subnetworks/crawl" },
			routers: []router{{"us-central1", "", []*compute.RouterNat{listed("crawl", gcptest.NATSubnetPrimaryRange)}}}},
		{name: "no router at all", want: []string{"no Cloud NAT serves subnetwork default", "region us-central1", "no Cloud Router on that network there",
			"gcloud compute routers nats create", "--region us-central1"}},
		{name: "a router without NAT", routers: []router{{"us-central1", "", nil}}, want: []string{"router r0 (no NAT)"}},
		{name: "a NAT in another region", routers: []router{{"europe-west4", "", []*compute.RouterNat{all("eu")}}},
			want: []string{"region us-central1", "no Cloud Router on that network there"}},
		{name: "a NAT on another network", routers: []router{{"us-central1", "global/networks/vpc-b", []*compute.RouterNat{all("b")}}},
			want: []string{"network default", "no Cloud Router on that network there"}},
		{name: "other subnetworks listed", opts: func(o *Options) { o.Subnetwork = "regions/us-central1/subnetworks/crawl" },
			routers: []router{{"us-central1", "", []*compute.RouterNat{listed("web", gcptest.NATSubnetAllRanges)}}},
			want:    []string{"subnetwork crawl", "NAT listed: serves subnetworks web ALL_IP_RANGES"}},
		{name: "only secondary ranges of ours", opts: func(o *Options) { o.Subnetwork = "regions/us-central1/subnetworks/crawl" },
			routers: []router{{"us-central1", "", []*compute.RouterNat{listed("crawl", gcptest.NATSubnetSecondaryRanges)}}},
			want:    []string{"subnetwork crawl", "LIST_OF_SECONDARY_IP_RANGES"}},
		{name: "a private NAT", routers: []router{{"us-central1", "", []*compute.RouterNat{{Name: "p", Type: "PRIVATE",
			SourceSubnetworkIpRangesToNat: gcptest.NATAllSubnetworksAllRanges}}}},
			want: []string{"private NAT, no Internet egress"}},
		{name: "no default zone: a NAT in any region will do", opts: func(o *Options) { o.Zone = "" },
			routers: []router{{"europe-west4", "", []*compute.RouterNat{all("eu")}}}},
		{name: "no default zone and no NAT anywhere", opts: func(o *Options) { o.Zone = "" },
			routers: []router{{"europe-west4", "", nil}}, want: []string{"any region", "router r0 (no NAT)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t)
			srv.PutFirewall(project, proxyFirewall())
			for i, r := range tc.routers {
				if err := srv.PutRouter(project, r.region, &compute.Router{Name: fmt.Sprintf("r%d", i), Network: r.network, Nats: r.nats}); err != nil {
					t.Fatal(err)
				}
			}
			p := newProvider(t, srv, func(o *Options) {
				o.NoExternalIP = true
				if tc.opts != nil {
					tc.opts(o)
				}
			})
			err := p.Check(ctx(t))
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantClass(t, err, provider.ClassPermanent)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
	t.Run("with external IPs no NAT is needed", func(t *testing.T) {
		srv := newServer(t)
		srv.PutFirewall(project, proxyFirewall())
		if err := newProvider(t, srv).Check(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if n := srv.Count(gcptest.CallRouterList) + srv.Count(gcptest.CallRouterAggregatedList); n != 0 {
			t.Errorf("%d router lists without --gcp-no-external-ip", n)
		}
	})
}
