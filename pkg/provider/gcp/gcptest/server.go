// Package gcptest is an in-process fake of the Compute Engine v1 REST API,
// enough of it for the gcp provider: instances insert/get/delete/list/
// aggregatedList/start/resume, zoneOperations get/wait, zones get/list,
// firewalls list, routers list/aggregatedList (Cloud Routers with their
// NAT configurations, PutRouter).
//
// It speaks the real wire format: bodies are the compute/v1 package's own
// types marshalled as the client expects them, errors are the
// {"error":{"code","message","errors":[{"reason"}]}} envelope the client
// parses into *googleapi.Error, and mutations return zone operations that go
// PENDING → RUNNING → DONE over OperationPolls polls before their effect
// lands. Point the real client at it:
//
//	srv := gcptest.NewServer()
//	defer srv.Close()
//	svc, _ := compute.NewService(ctx, option.WithEndpoint(srv.Endpoint()),
//		option.WithHTTPClient(srv.Client()))
//
// Like the API it refuses what it does not know: an insert naming an
// unknown zone, image or network is a 404 notFound ("The resource '…' was
// not found"), an unknown machine type a 400 invalid; NewServer knows a few
// real ones and Add* adds more. Instances pass through the statuses the
// API reports: PROVISIONING (PENDING while InsertCapacityWait), STAGING,
// RUNNING; STOPPING and DEPROVISIONING while a delete runs; REPAIRING
// after Repair. The list filter accepts only the documented grammar.
//
// Tests steer it with SetRunning/SetStatus/PutInstance, inject failures with
// FailNext (an HTTP error for one call) and FailNextOperation (an operation
// that ends in error), and inspect it with Instance and Count. It is safe
// for concurrent use, so an envtest suite can share one across reconcilers.
package gcptest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/api/compute/v1"
)

// selfLinkBase is the prefix the real API puts on resource URLs.
const selfLinkBase = "https://www.googleapis.com/compute/v1/"

// Call names, as counted by Count and matched by FailNext (the API's method
// IDs without the "compute." prefix).
const (
	CallInsert         = "instances.insert"
	CallGet            = "instances.get"
	CallDelete         = "instances.delete"
	CallList           = "instances.list"
	CallAggregatedList = "instances.aggregatedList"
	CallStart          = "instances.start"
	CallResume         = "instances.resume"
	CallOperationGet   = "zoneOperations.get"
	CallOperationWait  = "zoneOperations.wait"
	CallZoneGet        = "zones.get"
	CallZoneList       = "zones.list"
	CallFirewallList   = "firewalls.list"
)

// Server is the fake. Set the exported fields before the first request.
type Server struct {
	// OperationPolls is how many zoneOperations.get/wait calls an
	// operation takes to reach DONE: it is PENDING when returned, RUNNING
	// on every poll before the last, DONE on the last. 0 makes every
	// operation DONE at once. NewServer sets 2.
	OperationPolls int
	// AutoRun makes a finished insert/start leave the instance RUNNING
	// with an external IP, as a real instance soon is. Without it the
	// instance stays STAGING until SetRunning.
	AutoRun bool
	// PageSize caps items per list page (the client's maxResults can lower
	// it). NewServer sets 500, the API's default.
	PageSize int
	// InsertCapacityWait keeps an inserted instance PENDING (waiting for
	// capacity) instead of PROVISIONING while its operation runs.
	InsertCapacityWait bool

	srv *httptest.Server

	mu        sync.Mutex
	instances map[string]*compute.Instance // key: project/zone/name
	ops       map[string]*operation        // key: project/zone/opname
	faults    []fault
	opFaults  []opFault
	calls     []string
	nextID    uint64
	nextIP    int
	repairs   map[string]int                 // instance key → gets left in REPAIRING
	firewalls map[string][]*compute.Firewall // by project
	routers   map[string]*compute.Router     // key: project/region/name

	// Resources an insert may reference (see Add*).
	zones, images, networks, machineTypes map[string]bool
}

type operation struct {
	op      *compute.Operation
	left    int      // polls until DONE
	finish  func()   // effect applied at DONE (under mu)
	running func()   // effect of a poll before DONE, if any (under mu)
	failure *opFault // if set, DONE with this error instead
}

type fault struct {
	call    string
	code    int
	reason  string
	message string
}

type opFault struct {
	call       string
	code       string
	message    string
	httpStatus int
	details    []*compute.OperationErrorErrorsErrorDetails
}

// NewServer starts a fake. Close it when done.
func NewServer() *Server {
	s := &Server{
		OperationPolls: 2,
		PageSize:       500,
		instances:      map[string]*compute.Instance{},
		ops:            map[string]*operation{},
		nextID:         1000000000000000000,
		repairs:        map[string]int{},
		firewalls:      map[string][]*compute.Firewall{},
		zones:          set("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "europe-west4-a", "europe-west4-b"),
		images: set(
			"projects/debian-cloud/global/images/family/debian-12",
			"projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64",
			"projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts",
			"projects/cos-cloud/global/images/family/cos-stable",
		),
		networks:     set("default"),
		machineTypes: set("e2-micro", "e2-small", "e2-medium", "e2-standard-2", "n2-standard-2"),
	}
	s.srv = httptest.NewServer(s.handler())
	return s
}

func set(items ...string) map[string]bool {
	m := map[string]bool{}
	for _, it := range items {
		m[it] = true
	}
	return m
}

// PutFirewall adds a firewall rule to project (network defaults to
// global/networks/default, direction to INGRESS).
func (s *Server) PutFirewall(project string, fw *compute.Firewall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, _ := json.Marshal(fw)
	var c compute.Firewall
	_ = json.Unmarshal(b, &c)
	if c.Network == "" {
		c.Network = selfLinkBase + "projects/" + project + "/global/networks/default"
	}
	if c.Direction == "" {
		c.Direction = "INGRESS"
	}
	c.Kind = "compute#firewall"
	c.SelfLink = selfLinkBase + "projects/" + project + "/global/firewalls/" + c.Name
	s.firewalls[project] = append(s.firewalls[project], &c)
}

// AddZone makes zone exist (in every project).
func (s *Server) AddZone(zone string) { s.add(s.zones, zone) }

// AddImage makes an image or image family exist, as
// "projects/<p>/global/images/<name>" or ".../images/family/<family>".
func (s *Server) AddImage(path string) { s.add(s.images, path) }

// AddNetwork makes a network exist (by name, in every project).
func (s *Server) AddNetwork(name string) { s.add(s.networks, name) }

// AddMachineType makes a machine type exist (by name, in every zone).
func (s *Server) AddMachineType(name string) { s.add(s.machineTypes, name) }

func (s *Server) add(m map[string]bool, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m[v] = true
}

// Repair puts a RUNNING instance into REPAIRING (its host failed) for the
// next gets instances.get calls on it, then RUNNING again on the same
// address, as after a live migration or host repair.
func (s *Server) Repair(project, zone, name string, gets int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := key(project, zone, name)
	inst, ok := s.instances[k]
	if !ok {
		return fmt.Errorf("gcptest: no instance %s", k)
	}
	inst.Status = "REPAIRING"
	s.repairs[k] = gets
	return nil
}

// Close shuts the server down.
func (s *Server) Close() { s.srv.Close() }

// URL is the server's root URL.
func (s *Server) URL() string { return s.srv.URL }

// Endpoint is the base path to pass to option.WithEndpoint.
func (s *Server) Endpoint() string { return s.srv.URL + "/compute/v1/" }

// Client is an HTTP client for the server (no authentication).
func (s *Server) Client() *http.Client { return s.srv.Client() }

// FailNext makes the next call named call (a Call* constant) answer with an
// HTTP error of code and reason, e.g. (CallInsert, 403, "quotaExceeded").
// Queued faults are consumed one per matching call, in order.
func (s *Server) FailNext(call string, code int, reason, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if message == "" {
		message = http.StatusText(code)
	}
	s.faults = append(s.faults, fault{call: call, code: code, reason: reason, message: message})
}

// FailNextOperation makes the operation of the next call named call accepted
// (200 with an operation) but DONE with error code (e.g. "QUOTA_EXCEEDED",
// "ZONE_RESOURCE_POOL_EXHAUSTED") and httpStatus, as Compute Engine reports
// failures found after accepting a request. A failed insert leaves no
// instance behind. details become the error's errorDetails, as the API
// attaches to ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS or QUOTA_EXCEEDED.
func (s *Server) FailNextOperation(call, code, message string, httpStatus int, details ...*compute.OperationErrorErrorsErrorDetails) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opFaults = append(s.opFaults, opFault{call: call, code: code, message: message, httpStatus: httpStatus, details: details})
}

// Count is how many calls named call the server has received.
func (s *Server) Count(call string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		if c == call {
			n++
		}
	}
	return n
}

// Calls returns the names of all calls received, in order.
func (s *Server) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// Instance returns a copy of the stored instance.
func (s *Server) Instance(project, zone, name string) (*compute.Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[key(project, zone, name)]
	if !ok {
		return nil, false
	}
	return clone(inst), true
}

// Instances returns copies of all stored instances of project, by name.
func (s *Server) Instances(project string) []*compute.Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*compute.Instance
	for k, inst := range s.instances {
		if strings.HasPrefix(k, project+"/") {
			out = append(out, clone(inst))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PutInstance stores inst as if it had been created by someone else (the
// server fills id, zone, selfLink and, if empty, status RUNNING).
func (s *Server) PutInstance(project, zone string, inst *compute.Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst = clone(inst)
	s.fill(project, zone, inst)
	if inst.Status == "" {
		inst.Status = "RUNNING"
	}
	s.instances[key(project, zone, inst.Name)] = inst
}

// SetRunning marks an instance RUNNING with natIP as its external address
// (an address is allocated if natIP is empty).
func (s *Server) SetRunning(project, zone, name, natIP string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[key(project, zone, name)]
	if !ok {
		return fmt.Errorf("gcptest: no instance %s", key(project, zone, name))
	}
	s.run(inst, natIP)
	return nil
}

// SetStatus sets an instance's status (e.g. "TERMINATED") and message.
func (s *Server) SetStatus(project, zone, name, status, message string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[key(project, zone, name)]
	if !ok {
		return fmt.Errorf("gcptest: no instance %s", key(project, zone, name))
	}
	inst.Status, inst.StatusMessage = status, message
	return nil
}

// run makes inst RUNNING with an external IP on every ONE_TO_ONE_NAT
// access config. Addresses come from 203.0.113.0/24 (TEST-NET-3): strings
// only, never contacted.
func (s *Server) run(inst *compute.Instance, natIP string) {
	inst.Status, inst.StatusMessage = "RUNNING", ""
	inst.LastStartTimestamp = now()
	for _, nic := range inst.NetworkInterfaces {
		if nic.NetworkIP == "" {
			nic.NetworkIP = "10.128.0." + strconv.Itoa(2+int(inst.Id%250))
		}
		for _, ac := range nic.AccessConfigs {
			if ac.NatIP != "" && natIP == "" {
				continue
			}
			if natIP == "" {
				s.nextIP++
				natIP = "203.0.113." + strconv.Itoa(1+(s.nextIP-1)%254)
			}
			ac.NatIP = natIP
		}
	}
}

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	const p = "/compute/v1/projects/{project}"
	mux.HandleFunc("POST "+p+"/zones/{zone}/instances", s.insert)
	mux.HandleFunc("GET "+p+"/zones/{zone}/instances", s.list)
	mux.HandleFunc("GET "+p+"/zones/{zone}/instances/{instance}", s.get)
	mux.HandleFunc("DELETE "+p+"/zones/{zone}/instances/{instance}", s.delete)
	mux.HandleFunc("POST "+p+"/zones/{zone}/instances/{instance}/start", s.start(CallStart))
	mux.HandleFunc("POST "+p+"/zones/{zone}/instances/{instance}/resume", s.start(CallResume))
	mux.HandleFunc("GET "+p+"/aggregated/instances", s.aggregatedList)
	mux.HandleFunc("GET "+p+"/zones/{zone}/operations/{operation}", s.pollOperation(CallOperationGet))
	mux.HandleFunc("POST "+p+"/zones/{zone}/operations/{operation}/wait", s.pollOperation(CallOperationWait))
	mux.HandleFunc("GET "+p+"/zones/{zone}", s.zoneGet)
	mux.HandleFunc("GET "+p+"/zones", s.zoneList)
	mux.HandleFunc("GET "+p+"/global/firewalls", s.firewallList)
	mux.HandleFunc("GET "+p+"/regions/{region}/routers", s.routerList)
	mux.HandleFunc("GET "+p+"/aggregated/routers", s.routerAggregatedList)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("gcptest: no such method: %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// begin records call and returns a queued fault for it, if any. Callers
// hold mu.
func (s *Server) begin(call string) *fault {
	s.calls = append(s.calls, call)
	for i, f := range s.faults {
		if f.call == call {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
			return &f
		}
	}
	return nil
}

func (s *Server) takeOpFault(call string) *opFault {
	for i, f := range s.opFaults {
		if f.call == call {
			s.opFaults = append(s.opFaults[:i], s.opFaults[i+1:]...)
			return &f
		}
	}
	return nil
}

var (
	nameRE      = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	labelKeyRE  = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	labelValRE  = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
	metaKeyRE   = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,128}$`)
	maxMetaItem = 256 * 1024
	maxMetaAll  = 512 * 1024
)

func (s *Server) insert(w http.ResponseWriter, r *http.Request) {
	project, zone := r.PathValue("project"), r.PathValue("zone")
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.begin(CallInsert); f != nil {
		writeError(w, f.code, f.reason, f.message)
		return
	}
	var inst compute.Instance
	if err := json.NewDecoder(r.Body).Decode(&inst); err != nil {
		writeError(w, http.StatusBadRequest, "parseError", "Parse Error: "+err.Error())
		return
	}
	if msg := validate(&inst); msg != "" {
		writeError(w, http.StatusBadRequest, "invalid", msg)
		return
	}
	if code, reason, msg := s.references(project, zone, &inst); code != 0 {
		writeError(w, code, reason, msg)
		return
	}
	k := key(project, zone, inst.Name)
	if _, ok := s.instances[k]; ok {
		writeError(w, http.StatusConflict, "alreadyExists",
			fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", project, zone, inst.Name))
		return
	}
	s.fill(project, zone, &inst)
	inst.Status = "PROVISIONING"
	if s.InsertCapacityWait {
		inst.Status = "PENDING"
	}
	stored := &inst
	s.instances[k] = stored
	s.startOp(w, project, zone, "insert", CallInsert, stored, func() {
		if s.AutoRun {
			s.run(stored, "")
		} else {
			stored.Status = "STAGING"
		}
	}, func() { delete(s.instances, k) })
}

// validate applies the API's checks that our provider could get wrong.
func validate(inst *compute.Instance) string {
	if !nameRE.MatchString(inst.Name) {
		return fmt.Sprintf("Invalid value for field 'resource.name': '%s'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'", inst.Name)
	}
	if inst.MachineType == "" {
		return "Invalid value for field 'resource.machineType': ''. Machine type is required."
	}
	for k, v := range inst.Labels {
		if !labelKeyRE.MatchString(k) {
			return fmt.Sprintf("Invalid value for field 'resource.labels': label key '%s' violates format constraints", k)
		}
		if !labelValRE.MatchString(v) {
			return fmt.Sprintf("Invalid value for field 'resource.labels': label value '%s' violates format constraints", v)
		}
	}
	boot := 0
	for _, d := range inst.Disks {
		if d.Boot {
			boot++
			if d.Source == "" && (d.InitializeParams == nil || d.InitializeParams.SourceImage == "") {
				return "Invalid value for field 'resource.disks[0]': boot disk needs a source or a source image"
			}
		}
	}
	if boot != 1 {
		return "Invalid value for field 'resource.disks': exactly one boot disk is required"
	}
	if len(inst.NetworkInterfaces) == 0 {
		return "Invalid value for field 'resource.networkInterfaces': at least one network interface is required"
	}
	if inst.Metadata != nil {
		total := 0
		for _, it := range inst.Metadata.Items {
			if !metaKeyRE.MatchString(it.Key) {
				return fmt.Sprintf("Invalid value for field 'resource.metadata.items.key': '%s'", it.Key)
			}
			if it.Value != nil {
				if len(*it.Value) > maxMetaItem {
					return fmt.Sprintf("Value for field 'resource.metadata.items[%s].value' is too large", it.Key)
				}
				total += len(*it.Value)
			}
		}
		if total > maxMetaAll {
			return "Metadata total size exceeds 512 KB"
		}
	}
	return ""
}

// references checks what an insert refers to, in the order and with the
// answers of the API. Callers hold mu.
func (s *Server) references(project, zone string, inst *compute.Instance) (int, string, string) {
	if !s.zones[zone] {
		return http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s' was not found", project, zone)
	}
	if mt := lastPathSegment(inst.MachineType); !s.machineTypes[mt] {
		// The API answers an unknown machine type with 400, not 404.
		return http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.machineType': '%s'. Machine type with name '%s' does not exist in zone '%s'.", inst.MachineType, mt, zone)
	}
	for _, d := range inst.Disks {
		if d.InitializeParams == nil || d.InitializeParams.SourceImage == "" {
			continue
		}
		img := resourcePath(project, d.InitializeParams.SourceImage)
		if !s.images[img] {
			return http.StatusNotFound, "notFound", fmt.Sprintf("The resource '%s' was not found", img)
		}
	}
	for _, nic := range inst.NetworkInterfaces {
		network := nic.Network
		if network == "" {
			network = "global/networks/default"
		}
		if !s.networks[lastPathSegment(network)] {
			return http.StatusNotFound, "notFound", fmt.Sprintf("The resource '%s' was not found", resourcePath(project, network))
		}
	}
	return 0, "", ""
}

// resourcePath turns a resource URL or partial path into
// "projects/<p>/…", the form the API's messages use.
func resourcePath(project, s string) string {
	for _, prefix := range []string{selfLinkBase, "https://compute.googleapis.com/compute/v1/"} {
		s = strings.TrimPrefix(s, prefix)
	}
	if !strings.HasPrefix(s, "projects/") {
		s = "projects/" + project + "/" + s
	}
	return s
}

func lastPathSegment(s string) string {
	if i := strings.LastIndex(s, "/"); i >= 0 {
		return s[i+1:]
	}
	return s
}

// fill sets the server-side fields of a new instance.
func (s *Server) fill(project, zone string, inst *compute.Instance) {
	s.nextID++
	inst.Kind = "compute#instance"
	inst.Id = s.nextID
	inst.CreationTimestamp = now()
	inst.Zone = selfLinkBase + "projects/" + project + "/zones/" + zone
	inst.SelfLink = inst.Zone + "/instances/" + inst.Name
	if inst.MachineType != "" && !strings.HasPrefix(inst.MachineType, "https://") {
		inst.MachineType = selfLinkBase + "projects/" + project + "/" + strings.TrimPrefix(inst.MachineType, "projects/"+project+"/")
	}
	if inst.Labels != nil {
		inst.LabelFingerprint = "42WmSpB8rSM="
	}
	if inst.Metadata == nil {
		inst.Metadata = &compute.Metadata{}
	}
	inst.Metadata.Kind = "compute#metadata"
	inst.Metadata.Fingerprint = "xl0Yd_ok5mU="
	inst.Fingerprint = "dwV5b3SO5h4="
	for i, nic := range inst.NetworkInterfaces {
		nic.Kind = "compute#networkInterface"
		nic.Name = "nic" + strconv.Itoa(i)
		for _, ac := range nic.AccessConfigs {
			ac.Kind = "compute#accessConfig"
			if ac.NetworkTier == "" {
				ac.NetworkTier = "PREMIUM"
			}
		}
	}
	for i, d := range inst.Disks {
		d.Kind = "compute#attachedDisk"
		d.Index = int64(i)
		if d.DeviceName == "" {
			d.DeviceName = inst.Name
		}
		d.Source = inst.Zone + "/disks/" + inst.Name
		if d.Mode == "" {
			d.Mode = "READ_WRITE"
		}
		if d.Type == "" {
			d.Type = "PERSISTENT"
		}
	}
}

// startOp creates an operation for a mutation of inst and writes it. finish
// runs at DONE; undo runs instead when the operation was told to fail.
// Callers hold mu.
func (s *Server) startOp(w http.ResponseWriter, project, zone, opType, call string, inst *compute.Instance, finish, undo func()) *operation {
	s.nextID++
	name := fmt.Sprintf("operation-%d-%s-%08x", time.Now().UnixMilli(), opType, s.nextID&0xffffffff)
	zoneURL := selfLinkBase + "projects/" + project + "/zones/" + zone
	o := &operation{
		op: &compute.Operation{
			Kind:          "compute#operation",
			Id:            s.nextID,
			Name:          name,
			Zone:          zoneURL,
			OperationType: opType,
			TargetLink:    zoneURL + "/instances/" + inst.Name,
			TargetId:      inst.Id,
			Status:        "PENDING",
			User:          "proxy-operator@" + project + ".iam.gserviceaccount.com",
			InsertTime:    now(),
			StartTime:     now(),
			SelfLink:      zoneURL + "/operations/" + name,
		},
		left:   s.OperationPolls,
		finish: finish,
	}
	if f := s.takeOpFault(call); f != nil {
		o.failure = f
		o.finish = undo
	}
	s.ops[key(project, zone, name)] = o
	if o.left <= 0 {
		s.complete(o)
	}
	writeJSON(w, http.StatusOK, o.op)
	return o
}

// complete moves an operation to DONE and applies its effect.
func (s *Server) complete(o *operation) {
	o.op.Status, o.op.Progress, o.op.EndTime = "DONE", 100, now()
	if f := o.failure; f != nil {
		o.op.Error = &compute.OperationError{Errors: []*compute.OperationErrorErrors{{Code: f.code, Message: f.message, ErrorDetails: f.details}}}
		o.op.HttpErrorStatusCode = int64(f.httpStatus)
		o.op.HttpErrorMessage = strings.ToUpper(strings.ReplaceAll(http.StatusText(f.httpStatus), " ", "_"))
	}
	if o.finish != nil {
		o.finish()
	}
}

func (s *Server) pollOperation(call string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		project, zone, name := r.PathValue("project"), r.PathValue("zone"), r.PathValue("operation")
		s.mu.Lock()
		defer s.mu.Unlock()
		if f := s.begin(call); f != nil {
			writeError(w, f.code, f.reason, f.message)
			return
		}
		o, ok := s.ops[key(project, zone, name)]
		if !ok {
			writeError(w, http.StatusNotFound, "notFound",
				fmt.Sprintf("The resource 'projects/%s/zones/%s/operations/%s' was not found", project, zone, name))
			return
		}
		if o.op.Status != "DONE" {
			o.left--
			if o.left <= 0 {
				s.complete(o)
			} else {
				o.op.Status, o.op.Progress = "RUNNING", 50
				if o.running != nil {
					o.running()
				}
			}
		}
		writeJSON(w, http.StatusOK, o.op)
	}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	project, zone, name := r.PathValue("project"), r.PathValue("zone"), r.PathValue("instance")
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.begin(CallGet); f != nil {
		writeError(w, f.code, f.reason, f.message)
		return
	}
	k := key(project, zone, name)
	inst, ok := s.instances[k]
	if !ok {
		writeNotFound(w, project, zone, name)
		return
	}
	if left, ok := s.repairs[k]; ok {
		if left <= 0 {
			delete(s.repairs, k)
			inst.Status = "RUNNING"
		} else {
			s.repairs[k] = left - 1
		}
	}
	writeJSON(w, http.StatusOK, inst)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	project, zone, name := r.PathValue("project"), r.PathValue("zone"), r.PathValue("instance")
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.begin(CallDelete); f != nil {
		writeError(w, f.code, f.reason, f.message)
		return
	}
	k := key(project, zone, name)
	inst, ok := s.instances[k]
	if !ok {
		writeNotFound(w, project, zone, name)
		return
	}
	prev := inst.Status
	inst.Status = "STOPPING"
	o := s.startOp(w, project, zone, "delete", CallDelete, inst,
		func() { delete(s.instances, k) },
		func() { inst.Status = prev })
	if o.failure == nil {
		// Stopped, its resources being released.
		o.running = func() { inst.Status = "DEPROVISIONING" }
	}
}

func (s *Server) start(call string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		project, zone, name := r.PathValue("project"), r.PathValue("zone"), r.PathValue("instance")
		s.mu.Lock()
		defer s.mu.Unlock()
		if f := s.begin(call); f != nil {
			writeError(w, f.code, f.reason, f.message)
			return
		}
		inst, ok := s.instances[key(project, zone, name)]
		if !ok {
			writeNotFound(w, project, zone, name)
			return
		}
		prev := inst.Status
		inst.Status = "STAGING"
		opType := strings.TrimPrefix(call, "instances.")
		s.startOp(w, project, zone, opType, call, inst, func() {
			if s.AutoRun {
				s.run(inst, "")
			}
		}, func() { inst.Status = prev })
	}
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	project, zone := r.PathValue("project"), r.PathValue("zone")
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.begin(CallList); f != nil {
		writeError(w, f.code, f.reason, f.message)
		return
	}
	match, err := parseFilter(r.URL.Query().Get("filter"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	var all []*compute.Instance
	for _, k := range s.sortedKeys(project + "/" + zone + "/") {
		if inst := s.instances[k]; match(inst) {
			all = append(all, inst)
		}
	}
	items, next, ok := pageOf(s, w, r, all)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, &compute.InstanceList{
		Kind:          "compute#instanceList",
		Id:            "projects/" + project + "/zones/" + zone + "/instances",
		Items:         items,
		NextPageToken: next,
		SelfLink:      selfLinkBase + "projects/" + project + "/zones/" + zone + "/instances",
	})
}

func (s *Server) aggregatedList(w http.ResponseWriter, r *http.Request) {
	project := r.PathValue("project")
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.begin(CallAggregatedList); f != nil {
		writeError(w, f.code, f.reason, f.message)
		return
	}
	match, err := parseFilter(r.URL.Query().Get("filter"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	type hit struct {
		zone string
		inst *compute.Instance
	}
	var all []hit
	zones := map[string]bool{}
	for _, k := range s.sortedKeys(project + "/") {
		inst := s.instances[k]
		zone := strings.Split(k, "/")[1]
		zones[zone] = true
		if match(inst) {
			all = append(all, hit{zone, inst})
		}
	}
	hits, next, ok := pageOf(s, w, r, all)
	if !ok {
		return
	}
	items := map[string]compute.InstancesScopedList{}
	for _, h := range hits {
		sl := items["zones/"+h.zone]
		sl.Instances = append(sl.Instances, h.inst)
		items["zones/"+h.zone] = sl
	}
	// The real API lists every zone, the empty ones with a warning.
	for z := range zones {
		if _, ok := items["zones/"+z]; !ok {
			items["zones/"+z] = compute.InstancesScopedList{Warning: &compute.InstancesScopedListWarning{
				Code:    "NO_RESULTS_ON_PAGE",
				Message: "There are no results for scope 'zones/" + z + "' on this page.",
				Data:    []*compute.InstancesScopedListWarningData{{Key: "scope", Value: "zones/" + z}},
			}}
		}
	}
	writeJSON(w, http.StatusOK, &compute.InstanceAggregatedList{
		Kind:          "compute#instanceAggregatedList",
		Id:            "projects/" + project + "/aggregated/instances",
		Items:         items,
		NextPageToken: next,
		SelfLink:      selfLinkBase + "projects/" + project + "/aggregated/instances",
	})
}

// pageOf is the page of all this request asks for and the next page
// token; false when the paging parameters are refused (the 400 written).
func pageOf[T any](s *Server, w http.ResponseWriter, r *http.Request, all []T) ([]T, string, bool) {
	page, next, err := s.paginate(r, len(all))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return nil, "", false
	}
	return all[page[0]:page[1]], next, true
}

// paginate returns the [from, to) window for this request and the next
// page token ("" on the last page). Tokens are opaque to the client.
func (s *Server) paginate(r *http.Request, n int) ([2]int, string, error) {
	size := s.PageSize
	if v := r.URL.Query().Get("maxResults"); v != "" {
		m, err := strconv.Atoi(v)
		if err != nil || m < 0 || m > 500 {
			return [2]int{}, "", fmt.Errorf("Invalid value for field 'maxResults': '%s'. Must be less than or equal to 500", v)
		}
		if m > 0 && m < size {
			size = m
		}
	}
	if size <= 0 {
		size = 500
	}
	from := 0
	if t := r.URL.Query().Get("pageToken"); t != "" {
		v, err := strconv.Atoi(strings.TrimPrefix(t, "gcptest-page-"))
		if err != nil || v < 0 || v > n {
			return [2]int{}, "", fmt.Errorf("Invalid value for field 'pageToken': '%s'", t)
		}
		from = v
	}
	to := min(from+size, n)
	next := ""
	if to < n {
		next = "gcptest-page-" + strconv.Itoa(to)
	}
	return [2]int{from, to}, next, nil
}

func (s *Server) sortedKeys(prefix string) []string {
	var ks []string
	for k := range s.instances {
		if strings.HasPrefix(k, prefix) {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

// filterTermRE matches one comparison of the documented list filter
// grammar (the AIP-160 form of the instances.list "filter" parameter):
// `FIELD OP VALUE`, FIELD a dotted path of identifiers ([A-Za-z_][A-Za-z0-9_]*,
// so `labels.owner` but not a hyphenated key, which the grammar does not
// document), OP one of = != :, VALUE a quoted string, a bare word, or * after
// ':' (key defined). Several comparisons are each parenthesized and ANDed,
// by juxtaposition or an explicit AND; a lone one may go bare.
var filterTermRE = regexp.MustCompile(`^(\()?\s*((?:[A-Za-z_][A-Za-z0-9_]*)(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*(=|!=|:)\s*("[^"]*"|[^\s()"]+)\s*(\))?`)

// parseFilter compiles a list filter. Anything outside the grammar is a
// 400, as the real API answers an expression it cannot parse.
func parseFilter(f string) (func(*compute.Instance) bool, error) {
	type term struct {
		field, op, value string
	}
	invalid := fmt.Errorf("Invalid list filter expression '%s'", f)
	var terms []term
	rest := strings.TrimSpace(f)
	for rest != "" {
		m := filterTermRE.FindStringSubmatch(rest)
		if m == nil || (m[1] == "") != (m[5] == "") {
			return nil, invalid
		}
		field := m[2]
		if field != "name" && field != "status" && !(strings.HasPrefix(field, "labels.") && strings.Count(field, ".") == 1) {
			return nil, fmt.Errorf("Invalid list filter expression '%s': gcptest supports name, status and labels.KEY", f)
		}
		terms = append(terms, term{field, m[3], strings.Trim(m[4], `"`)})
		rest = strings.TrimSpace(rest[len(m[0]):])
		if rest != "" && m[1] == "" {
			// Only parenthesized comparisons can be combined.
			return nil, invalid
		}
		rest = strings.TrimSpace(strings.TrimPrefix(rest, "AND "))
	}
	return func(inst *compute.Instance) bool {
		for _, t := range terms {
			var got string
			var has bool
			switch t.field {
			case "name":
				got, has = inst.Name, true
			case "status":
				got, has = inst.Status, true
			default:
				got, has = inst.Labels[strings.TrimPrefix(t.field, "labels.")]
			}
			var ok bool
			switch t.op {
			case ":":
				ok = has && (t.value == "*" || got == t.value)
			case "=":
				ok = got == t.value
			default:
				ok = got != t.value
			}
			if !ok {
				return false
			}
		}
		return true
	}, nil
}

func (s *Server) zoneGet(w http.ResponseWriter, r *http.Request) {
	project, zone := r.PathValue("project"), r.PathValue("zone")
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.begin(CallZoneGet); f != nil {
		writeError(w, f.code, f.reason, f.message)
		return
	}
	if !s.zones[zone] {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s' was not found", project, zone))
		return
	}
	writeJSON(w, http.StatusOK, fakeZone(project, zone))
}

func (s *Server) zoneList(w http.ResponseWriter, r *http.Request) {
	project := r.PathValue("project")
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.begin(CallZoneList); f != nil {
		writeError(w, f.code, f.reason, f.message)
		return
	}
	writeJSON(w, http.StatusOK, &compute.ZoneList{
		Kind:     "compute#zoneList",
		Id:       "projects/" + project + "/zones",
		Items:    []*compute.Zone{fakeZone(project, "us-central1-a")},
		SelfLink: selfLinkBase + "projects/" + project + "/zones",
	})
}

func (s *Server) firewallList(w http.ResponseWriter, r *http.Request) {
	project := r.PathValue("project")
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.begin(CallFirewallList); f != nil {
		writeError(w, f.code, f.reason, f.message)
		return
	}
	writeJSON(w, http.StatusOK, &compute.FirewallList{
		Kind:     "compute#firewallList",
		Id:       "projects/" + project + "/global/firewalls",
		Items:    s.firewalls[project],
		SelfLink: selfLinkBase + "projects/" + project + "/global/firewalls",
	})
}

func fakeZone(project, zone string) *compute.Zone {
	region := zone
	if i := strings.LastIndex(zone, "-"); i > 0 {
		region = zone[:i]
	}
	return &compute.Zone{
		Kind:     "compute#zone",
		Name:     zone,
		Status:   "UP",
		Region:   selfLinkBase + "projects/" + project + "/regions/" + region,
		SelfLink: selfLinkBase + "projects/" + project + "/zones/" + zone,
	}
}

// errorBody is the JSON error envelope of Google REST APIs.
type errorBody struct {
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Errors  []struct {
			Message string `json:"message"`
			Domain  string `json:"domain"`
			Reason  string `json:"reason"`
		} `json:"errors"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, code int, reason, message string) {
	var b errorBody
	b.Error.Code = code
	b.Error.Message = message
	if reason != "" {
		domain := "global"
		if reason == "rateLimitExceeded" || reason == "userRateLimitExceeded" || reason == "quotaExceeded" {
			domain = "usageLimits"
		}
		b.Error.Errors = append(b.Error.Errors, struct {
			Message string `json:"message"`
			Domain  string `json:"domain"`
			Reason  string `json:"reason"`
		}{message, domain, reason})
	}
	writeJSON(w, code, &b)
}

func writeNotFound(w http.ResponseWriter, project, zone, name string) {
	writeError(w, http.StatusNotFound, "notFound",
		fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", project, zone, name))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func key(project, zone, name string) string { return project + "/" + zone + "/" + name }

func now() string { return time.Now().UTC().Format("2006-01-02T15:04:05.000-07:00") }

// clone deep-copies through JSON, the same path the wire takes.
func clone(inst *compute.Instance) *compute.Instance {
	b, err := json.Marshal(inst)
	if err != nil {
		panic(err)
	}
	var out compute.Instance
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return &out
}
