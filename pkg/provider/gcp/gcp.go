// Package gcp is the Compute Engine provider: one Proxy is one VM instance
// with an external IP, booted from a public image and configured by
// cloud-init from the Proxy's user-data.
//
// Identity. The instance name is derived from the Proxy (InstanceName), and
// the instance carries labels with the tag contract (managed-by, proxy-tag,
// proxy-uid, proxy-namespace, proxy-name). The proxy-uid label is the
// identity: Get and Delete refuse an instance whose label differs from the
// Machine's UID with a *provider.IdentityError and never delete it. Labels
// are set at insert time and nothing else writes them, so the label is as
// trustworthy as the numeric instance id would be, without needing the id
// before the instance exists. Once a provider ID is recorded its
// project/zone/name are used instead of re-deriving them.
//
// Cloud-init. User-data needs an image that runs cloud-init (Ubuntu, COS;
// DefaultImage): Google's Debian, EL and Windows images run only the guest
// agent, which ignores it, and are refused with user-data
// (CloudInitUnsupported; the Proxy webhook refuses them too).
// Compute Engine's cloud-init datasource reads only the
// instance metadata keys "user-data" and "user-data-encoding". User-data is
// written to "user-data" byte for byte when it is UTF-8 (metadata values are
// JSON strings, which cannot carry other bytes); otherwise it is sent
// base64-encoded with user-data-encoding=base64, which cloud-init decodes
// back to the same bytes. Machine.VendorData is NOT delivered: the GCE
// datasource has no vendor-data key, and merging it into user-data would
// break byte-for-byte delivery. Everything the user's guest needs must be
// in UserData.
//
// Managed squid (Machine.Squid). The operator's squid.conf and bcrypt
// password file travel in the "startup-script" metadata key, as the
// final-stage script of package guestsquid, which google-guest-agent runs
// at every boot once the network is up (Ubuntu's and Debian's images have
// the agent): it writes the files (root:proxy 0640 for the password file),
// installs squid if the image lacks it without letting the package start
// it, then starts squid once; later boots find the same files and leave
// the running squid alone. Squid is never started by us before its files
// are in place. The user's user-data is untouched and still applied by
// cloud-init. Metadata is readable by whoever may get the instance and by
// every process on the VM (the metadata server), so the password is only
// there as its bcrypt hash. The script needs apt-get (Debian, Ubuntu):
// images of the projects in imageProjectsWithoutApt are refused.
//
// Long-running operations (insert, delete, start) are waited for with
// zoneOperations.wait, bounded by Options.OperationTimeout; an operation
// still running at the bound is a transient error, and the next call, being
// idempotent, picks up where this one stopped.
//
// Networking. The instance gets one NIC on Options.Network with an
// ephemeral external IP (ONE_TO_ONE_NAT), reported as the Address once the
// instance runs. With Options.NoExternalIP it gets none (an organisation
// policy may forbid them): egress then goes through a Cloud NAT (Check
// makes sure one serves the subnetwork), so every proxy of the region
// shares the NAT's addresses; clients in the VPC reach the proxy on its
// internal IP, which is the Address. It gets the network tags in Options.NetworkTags; the
// firewall rule admitting clients to the proxy port is the platform's, not
// this provider's (an open forward proxy on the Internet is abused within
// hours, so who may connect is a decision for whoever owns the VPC). No
// service account is attached: the proxy needs no Google API access.
//
// Machine fields not used here: CPUs and MemoryBytes (the machine type
// decides; Machine.MachineType or Options.MachineType), Host and the KVM
// image fields. Port matters for a managed squid only (the user's
// user-data configures an unmanaged one). Tags are compared as GCE label values (LabelValue), so tags
// that differ only in case or punctuation are the same tag here.
package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/api/compute/v1"
	"google.golang.org/api/option"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/guestsquid"
)

// Name is the value of Proxy.spec.provider this provider serves.
const Name = "gcp"

// Defaults applied by New.
const (
	DefaultMachineType = "e2-small"
	// DefaultImage runs cloud-init from user-data, which is how a Proxy's
	// cloudInit configures squid here (Debian's GCE images do not).
	DefaultImage            = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
	DefaultNetwork          = "global/networks/default"
	DefaultNetworkTag       = "proxy-operator"
	DefaultOperationTimeout = 5 * time.Minute
	DefaultPollInterval     = 2 * time.Second
)

// maxMetadataValue is Compute Engine's limit for one metadata value.
const maxMetadataValue = crawlv1.GCEMaxMetadataValue

// Options configures the provider. Project and Zone are defaults a Machine
// may override.
type Options struct {
	// InstallID names this operator install (provider.ValidateInstallID):
	// the LabelInstall label of every instance, and ListByTag returns only
	// instances carrying it.
	InstallID string

	Project     string
	Zone        string
	MachineType string // default DefaultMachineType
	// Image is the source image, e.g. DefaultImage. A Machine's Image.URL
	// overrides it when it names a Compute Engine image.
	Image string
	// Network and Subnetwork are resource paths or URLs. Network defaults to
	// DefaultNetwork; Subnetwork is needed for custom-mode VPCs.
	Network    string
	Subnetwork string
	// NetworkTags are set on every instance for firewall rules; nil means
	// [DefaultNetworkTag], an empty non-nil slice none.
	NetworkTags []string
	// NoExternalIP gives instances no external address: the Address is
	// the internal one, egress needs Cloud NAT on the subnetwork.
	NoExternalIP bool
	// ProxyPort is the port Check expects a firewall rule to admit;
	// default 3128 (the Proxy default).
	ProxyPort int32

	// CredentialsJSON or CredentialsFile hold a credential document
	// (service_account, authorized_user, external_account or
	// impersonated_service_account). With neither, Application Default
	// Credentials are used (e.g. GKE workload identity).
	CredentialsJSON []byte
	CredentialsFile string

	// Endpoint overrides the API base URL, e.g. gcptest.Server.Endpoint().
	Endpoint string
	// HTTPClient, when set, is used as-is: it must add authentication
	// itself (or talk to a fake), and credentials are ignored.
	HTTPClient *http.Client
	// WithoutAuthentication sends unauthenticated requests (fakes, emulators).
	WithoutAuthentication bool

	// OperationTimeout bounds the wait for one long-running operation;
	// default DefaultOperationTimeout.
	OperationTimeout time.Duration
	// PollInterval is the pause between zoneOperations.wait calls that
	// return before the operation is done; default DefaultPollInterval.
	PollInterval time.Duration
}

// Provider implements provider.Provider on Compute Engine.
type Provider struct {
	svc  *compute.Service
	opts Options
}

var _ provider.Provider = (*Provider)(nil)

// New builds the provider. It never panics or exits on bad configuration:
// a missing credentials file is a transient error, credentials that cannot
// be parsed a permanent one, so the caller can keep running and retry.
// No API call is made; use Check for that.
func New(ctx context.Context, opts Options) (provider.Provider, error) {
	if opts.MachineType == "" {
		opts.MachineType = DefaultMachineType
	}
	if opts.Image == "" {
		opts.Image = DefaultImage
	}
	if opts.Network == "" {
		opts.Network = DefaultNetwork
	}
	if opts.NetworkTags == nil {
		opts.NetworkTags = []string{DefaultNetworkTag}
	}
	if opts.OperationTimeout <= 0 {
		opts.OperationTimeout = DefaultOperationTimeout
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.ProxyPort <= 0 {
		opts.ProxyPort = 3128
	}

	var copts []option.ClientOption
	if opts.Endpoint != "" {
		copts = append(copts, option.WithEndpoint(opts.Endpoint))
	}
	switch {
	case opts.HTTPClient != nil:
		copts = append(copts, option.WithHTTPClient(opts.HTTPClient))
	case opts.WithoutAuthentication:
		copts = append(copts, option.WithoutAuthentication())
	default:
		co, err := credentialsOption(opts)
		if err != nil {
			return nil, err
		}
		if co != nil {
			copts = append(copts, co)
		}
	}
	// The client may keep ctx for token refreshes; a caller's short
	// construction deadline must not break every later call.
	svc, err := compute.NewService(context.WithoutCancel(ctx), copts...)
	if err != nil {
		// Left: Application Default Credentials not found, or an
		// environment problem. Both can be fixed without touching our input.
		return nil, provider.Transientf("gcp: build Compute client: %w", err)
	}
	return &Provider{svc: svc, opts: opts}, nil
}

// Name implements provider.Provider.
func (p *Provider) Name() string { return Name }

// target is where a Machine's instance lives.
type target struct{ project, zone, name string }

func (t target) String() string { return t.project + "/" + t.zone + "/" + t.name }

// target resolves a Machine: the recorded provider ID wins, so a changed
// spec or default never loses track of an existing instance.
func (p *Provider) target(m *provider.Machine) (target, error) {
	if m.ProviderID != "" {
		project, zone, name, err := ParseProviderID(m.ProviderID)
		if err != nil {
			return target{}, provider.Permanentf("gcp: recorded %w", err)
		}
		return target{project, zone, name}, nil
	}
	t := target{project: m.Project, zone: m.Zone, name: InstanceName(m.Namespace, m.Name, m.UID)}
	if t.project == "" {
		t.project = p.opts.Project
	}
	if t.zone == "" {
		t.zone = p.opts.Zone
	}
	if t.project == "" || t.zone == "" {
		return target{}, provider.Permanentf("gcp: Proxy %s/%s: no project or zone (set them on the Proxy or the provider)", m.Namespace, m.Name)
	}
	return t, nil
}

// Create inserts the instance, waits for the insert to finish, and starts an
// existing instance of ours that is stopped. A same-named instance with
// another proxy-uid is an IdentityError.
func (p *Provider) Create(ctx context.Context, m *provider.Machine) (*provider.Instance, error) {
	if m.UID == "" {
		return nil, provider.Permanentf("gcp: Proxy %s/%s has no UID", m.Namespace, m.Name)
	}
	t, err := p.target(m)
	if err != nil {
		return nil, err
	}
	spec, err := p.instanceSpec(m, t)
	if err != nil {
		return nil, err
	}
	op, err := p.svc.Instances.Insert(t.project, t.zone, spec).Context(ctx).Do()
	switch {
	case err == nil:
		if err := p.wait(ctx, t, op); err != nil {
			if provider.Class(err) == provider.ClassNotFound {
				// A referenced resource (image, network, zone) is missing:
				// not "instance not found", so drop that class.
				return nil, provider.Permanentf("%v", err)
			}
			return nil, err
		}
	case isAlreadyExists(err):
		// Ours from an earlier call, or someone else's: checkOwner decides.
	default:
		err = classify(err, "insert instance "+t.String())
		if provider.Class(err) == provider.ClassNotFound {
			// insert answers 404 for what the request references (an
			// image or family gone, an unknown zone or network), never
			// for the instance it is about to make: that will not fix
			// itself, and is not "instance missing".
			return nil, provider.Permanentf("%v", err)
		}
		return nil, err
	}

	inst, err := p.svc.Instances.Get(t.project, t.zone, t.name).Context(ctx).Do()
	if err != nil {
		if err = classify(err, "get instance "+t.String()); provider.Class(err) == provider.ClassNotFound {
			// Inserted (or reported existing) yet gone: deleted meanwhile.
			return nil, provider.Transientf("gcp: instance %s vanished right after insert", t)
		}
		return nil, err
	}
	if err := checkOwner(inst, m); err != nil {
		return nil, err
	}

	switch inst.Status {
	case "TERMINATED", "STOPPED":
		op, err = p.svc.Instances.Start(t.project, t.zone, t.name).Context(ctx).Do()
	case "SUSPENDED":
		op, err = p.svc.Instances.Resume(t.project, t.zone, t.name).Context(ctx).Do()
	default:
		return p.instance(t.project, inst), nil
	}
	if err != nil {
		return nil, classify(err, "start instance "+t.String())
	}
	if err := p.wait(ctx, t, op); err != nil {
		return nil, err
	}
	return p.Get(ctx, m)
}

// Get reports the instance; ErrNotFound when it does not exist.
func (p *Provider) Get(ctx context.Context, m *provider.Machine) (*provider.Instance, error) {
	t, err := p.target(m)
	if err != nil {
		return nil, err
	}
	inst, err := p.svc.Instances.Get(t.project, t.zone, t.name).Context(ctx).Do()
	if err != nil {
		return nil, classify(err, "get instance "+t.String())
	}
	if err := checkOwner(inst, m); err != nil {
		return nil, err
	}
	return p.instance(t.project, inst), nil
}

// Delete deletes the instance (its boot disk goes with it: autoDelete) after
// checking its proxy-uid label, and waits for the deletion. Gone is success.
func (p *Provider) Delete(ctx context.Context, m *provider.Machine) error {
	t, err := p.target(m)
	if err != nil {
		return err
	}
	inst, err := p.svc.Instances.Get(t.project, t.zone, t.name).Context(ctx).Do()
	if err != nil {
		return ignoreNotFound(classify(err, "get instance "+t.String()))
	}
	if err := checkOwner(inst, m); err != nil {
		return err
	}
	op, err := p.svc.Instances.Delete(t.project, t.zone, t.name).Context(ctx).Do()
	if err != nil {
		return ignoreNotFound(classify(err, "delete instance "+t.String()))
	}
	return ignoreNotFound(p.wait(ctx, t, op))
}

// ListByTag lists the instances labelled proxy_tag=<tag>,
// proxy_install=<Options.InstallID> and managed_by=proxy-operator in every
// zone of Options.Project. Instances created in another project through a
// Machine override are not seen.
func (p *Provider) ListByTag(ctx context.Context, tag string) ([]provider.Instance, error) {
	if p.opts.Project == "" {
		return nil, provider.Permanentf("gcp: ListByTag needs a default project")
	}
	want := LabelValue(tag)
	var out []provider.Instance
	err := p.svc.Instances.AggregatedList(p.opts.Project).Filter(ListFilter(tag, p.opts.InstallID)).
		Pages(ctx, func(page *compute.InstanceAggregatedList) error {
			for _, scoped := range page.Items {
				for _, inst := range scoped.Instances {
					// The server filtered already; checking again keeps
					// the "never an untagged instance" promise even if a
					// filter is misread.
					if inst.Labels[LabelTag] != want || inst.Labels[LabelManagedBy] != ManagedBy || inst.Labels[LabelInstall] != p.opts.InstallID {
						continue
					}
					out = append(out, *p.instance(p.opts.Project, inst))
				}
			}
			return nil
		})
	if err != nil {
		return nil, classify(err, "list instances in "+p.opts.Project)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ProviderID < out[j].ProviderID })
	return out, nil
}

// Check proves what every Create needs: credentials, the project and the
// default zone (one zones.get; zones.list without a default zone), a
// firewall rule admitting the proxy port to our instances, and, without
// external IPs, a Cloud NAT for their egress (checkNAT). Without the rule
// or the NAT every Proxy would boot and then only ever report PortClosed.
func (p *Provider) Check(ctx context.Context) error {
	if p.opts.Project == "" {
		return provider.Permanentf("gcp: no project configured")
	}
	var err error
	if p.opts.Zone != "" {
		_, err = p.svc.Zones.Get(p.opts.Project, p.opts.Zone).Context(ctx).Do()
		err = classify(err, "get zone "+p.opts.Project+"/"+p.opts.Zone)
	} else {
		_, err = p.svc.Zones.List(p.opts.Project).MaxResults(1).Context(ctx).Do()
		err = classify(err, "list zones of "+p.opts.Project)
	}
	if provider.Class(err) == provider.ClassNotFound {
		// A project or zone that does not exist is misconfiguration.
		return provider.Permanentf("%v (check --gcp-project and --gcp-zone)", err)
	}
	if err != nil {
		return err
	}
	// Both named at once: each is the platform owner's to fix.
	errs := []error{p.checkFirewall(ctx)}
	if p.opts.NoExternalIP {
		errs = append(errs, p.checkNAT(ctx))
	}
	return errors.Join(errs...)
}

// checkFirewall looks for an enabled ingress rule on our network that
// allows tcp:ProxyPort to instances with one of our network tags (or to all
// instances). Which sources it admits is the VPC owner's choice; they are
// not judged here.
func (p *Provider) checkFirewall(ctx context.Context) error {
	network := lastSegment(p.opts.Network)
	var found bool
	err := p.svc.Firewalls.List(p.opts.Project).Context(ctx).Pages(ctx, func(page *compute.FirewallList) error {
		for _, fw := range page.Items {
			if !found && p.admits(fw, network) {
				found = true
			}
		}
		return nil
	})
	if err != nil {
		return classify(err, "list firewall rules of "+p.opts.Project)
	}
	if !found {
		return provider.Permanentf("gcp: no firewall rule in project %s admits tcp:%d to instances tagged %s on network %s; clients cannot reach the proxies (create one with --target-tags and the clients' --source-ranges)",
			p.opts.Project, p.opts.ProxyPort, strings.Join(p.opts.NetworkTags, ","), network)
	}
	return nil
}

// admits reports whether fw lets clients reach the proxies: an enabled
// ingress rule of network, applying to the proxies' instances, allowing
// TCP to the proxy port.
func (p *Provider) admits(fw *compute.Firewall, network string) bool {
	if fw.Disabled || (fw.Direction != "" && fw.Direction != "INGRESS") || lastSegment(fw.Network) != network {
		return false
	}
	if !p.targetsProxies(fw) {
		return false
	}
	return slices.ContainsFunc(fw.Allowed, func(a *compute.FirewallAllowed) bool {
		return allowsTCPPort(a, int(p.opts.ProxyPort))
	})
}

// targetsProxies reports whether fw applies to the proxies' instances:
// every instance, or one of their network tags. A rule by service
// account never does: we attach none.
func (p *Provider) targetsProxies(fw *compute.Firewall) bool {
	if len(fw.TargetServiceAccounts) > 0 {
		return false
	}
	return len(fw.TargetTags) == 0 || slices.ContainsFunc(fw.TargetTags, func(t string) bool {
		return slices.Contains(p.opts.NetworkTags, t)
	})
}

// allowsTCPPort reports whether a allows TCP to port.
func allowsTCPPort(a *compute.FirewallAllowed, port int) bool {
	if a.IPProtocol != "tcp" && a.IPProtocol != "all" && a.IPProtocol != "6" {
		return false
	}
	return len(a.Ports) == 0 || slices.ContainsFunc(a.Ports, func(r string) bool { return portInRange(r, port) })
}

// portInRange reports whether r, a firewall rule's port ("3128") or port
// range ("3000-4000"), includes port.
func portInRange(r string, port int) bool {
	lo, hi, _ := strings.Cut(r, "-")
	if hi == "" {
		hi = lo
	}
	l, err1 := strconv.Atoi(lo)
	h, err2 := strconv.Atoi(hi)
	return err1 == nil && err2 == nil && port >= l && port <= h
}

// wait blocks until op is DONE, then returns its classified error.
func (p *Provider) wait(ctx context.Context, t target, op *compute.Operation) error {
	ctx, cancel := context.WithTimeout(ctx, p.opts.OperationTimeout)
	defer cancel()
	zone := t.zone
	if op.Zone != "" {
		zone = lastSegment(op.Zone)
	}
	for op.Status != "DONE" {
		next, err := p.svc.ZoneOperations.Wait(t.project, zone, op.Name).Context(ctx).Do()
		if err != nil {
			if ctx.Err() != nil {
				return provider.Transientf("gcp: operation %s on %s not done after %s", op.Name, t, p.opts.OperationTimeout)
			}
			return classify(err, "wait for operation "+op.Name)
		}
		op = next
		if op.Status == "DONE" {
			break
		}
		// wait returns early on the server's own deadline; do not spin
		// if it (or a fake) answers at once.
		select {
		case <-ctx.Done():
			return provider.Transientf("gcp: operation %s on %s not done after %s", op.Name, t, p.opts.OperationTimeout)
		case <-time.After(p.opts.PollInterval):
		}
	}
	return operationError(op)
}

// instanceSpec is the insert request body for m.
func (p *Provider) instanceSpec(m *provider.Machine, t target) (*compute.Instance, error) {
	image, err := p.image(m)
	if err != nil {
		return nil, err
	}
	machineType := m.MachineType
	if machineType == "" {
		machineType = p.opts.MachineType
	}
	if !strings.Contains(machineType, "/") {
		machineType = "zones/" + t.zone + "/machineTypes/" + machineType
	}

	labels := map[string]string{
		LabelManagedBy: ManagedBy,
		LabelTag:       LabelValue(m.Tag),
		LabelUID:       LabelValue(m.UID),
		LabelNamespace: LabelValue(m.Namespace),
		LabelName:      LabelValue(m.Name),
	}
	if p.opts.InstallID != "" {
		labels[LabelInstall] = p.opts.InstallID
	}
	items := []*compute.MetadataItems{
		{Key: MetadataNamespace, Value: ptr(m.Namespace)},
		{Key: MetadataName, Value: ptr(m.Name)},
	}
	if len(m.UserData) > 0 {
		if why := CloudInitUnsupported(image); why != "" {
			field := "spec.placement.image"
			if m.Image.URL == "" && m.Image.Name == "" {
				field = "--gcp-image"
			}
			return nil, provider.Permanentf("gcp: %s %q: %s", field, image, why)
		}
		ud, enc := crawlv1.GCEUserDataValue(m.UserData)
		if len(ud) > maxMetadataValue {
			return nil, provider.Permanentf("gcp: user-data is %d bytes as metadata, over Compute Engine's %d", len(ud), maxMetadataValue)
		}
		items = append(items, &compute.MetadataItems{Key: MetadataUserData, Value: ptr(ud)})
		if enc != "" {
			items = append(items, &compute.MetadataItems{Key: MetadataUserDataEncoding, Value: ptr(enc)})
		}
	}

	squidFiles, managed, err := guestsquid.Render(m)
	if err != nil {
		return nil, provider.Permanentf("gcp: %w", err)
	}
	if managed {
		if why := ManagedSquidUnsupported(image); why != "" {
			field := "spec.placement.image"
			if m.Image.URL == "" && m.Image.Name == "" {
				field = "--gcp-image"
			}
			return nil, provider.Permanentf("gcp: %s %q: %s", field, image, why)
		}
		script := guestsquid.Script(squidFiles, guestsquid.Final)
		if len(script) > maxMetadataValue {
			return nil, provider.Permanentf("gcp: the managed squid's startup script is %d bytes, over Compute Engine's %d (fewer allowedSourceCIDRs or ports?)", len(script), maxMetadataValue)
		}
		items = append(items, &compute.MetadataItems{Key: MetadataStartupScript, Value: ptr(script)})
	}

	disk := &compute.AttachedDisk{
		Boot:       true,
		AutoDelete: true,
		Type:       "PERSISTENT",
		InitializeParams: &compute.AttachedDiskInitializeParams{
			SourceImage: image,
			Labels:      labels,
		},
	}
	if m.DiskBytes > 0 {
		const gib = 1 << 30
		disk.InitializeParams.DiskSizeGb = (m.DiskBytes + gib - 1) / gib
	}

	nic := &compute.NetworkInterface{Network: p.opts.Network, Subnetwork: p.opts.Subnetwork}
	if !p.opts.NoExternalIP {
		nic.AccessConfigs = []*compute.AccessConfig{{Name: "External NAT", Type: "ONE_TO_ONE_NAT"}}
	}
	return &compute.Instance{
		Name:              t.name,
		Description:       fmt.Sprintf("Proxy %s/%s (uid %s), managed by proxy-operator", m.Namespace, m.Name, m.UID),
		MachineType:       machineType,
		Labels:            labels,
		Metadata:          &compute.Metadata{Items: items},
		Disks:             []*compute.AttachedDisk{disk},
		NetworkInterfaces: []*compute.NetworkInterface{nic},
		Tags:              &compute.Tags{Items: p.opts.NetworkTags},
	}, nil
}

// image picks the source image: the Machine's when it has one (Proxy
// spec.image, which the controller may carry as Image.URL or Image.Name),
// else the provider default. An image that is not a Compute Engine image
// (a KVMImage name, a qcow2 URL) cannot boot here and is refused rather
// than silently replaced.
func (p *Provider) image(m *provider.Machine) (string, error) {
	u := m.Image.URL
	if u == "" {
		u = m.Image.Name
	}
	switch {
	case u == "":
		return p.opts.Image, nil
	case strings.HasPrefix(u, "projects/"), strings.HasPrefix(u, "global/images/"),
		strings.HasPrefix(u, "https://www.googleapis.com/compute/"),
		strings.HasPrefix(u, "https://compute.googleapis.com/compute/"):
		return u, nil
	default:
		return "", provider.Permanentf("gcp: image %q is not a Compute Engine image (want projects/<p>/global/images/...)", provider.RedactURL(u))
	}
}

// instance maps a Compute instance to the provider-neutral view.
func (p *Provider) instance(project string, inst *compute.Instance) *provider.Instance {
	zone := lastSegment(inst.Zone)
	out := &provider.Instance{
		ProviderID: FormatProviderID(project, zone, inst.Name),
		Name:       inst.Name,
		Host:       zone,
		Message:    inst.StatusMessage,
		Owner:      owner(inst),
		InstallID:  inst.Labels[LabelInstall],
	}
	// Statuses: https://cloud.google.com/compute/docs/instances/instance-life-cycle
	switch inst.Status {
	case "PROVISIONING", "STAGING":
		out.State = provider.StatePending
		if out.Message == "" {
			out.Message = "Compute Engine is " + strings.ToLower(inst.Status) + " the instance"
		}
	case "PENDING":
		out.State = provider.StatePending
		if out.Message == "" {
			out.Message = "waiting for Compute Engine capacity"
		}
	case "REPAIRING":
		out.State = provider.StatePending
		if out.Message == "" {
			out.Message = "Compute Engine is repairing the instance"
		}
	case "RUNNING":
		out.State = provider.StateRunning
		ip, what := natIP(inst), "external"
		if p.opts.NoExternalIP {
			ip, what = internalIP(inst), "internal"
		}
		if ip != "" {
			out.Address, out.AddressSource = ip, provider.AddressSourceNIC
		} else if out.Message == "" {
			out.Message = "no " + what + " IP assigned yet"
		}
	case "STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED", "PENDING_STOP", "DEPROVISIONING":
		// DEPROVISIONING releases resources on the way to TERMINATED,
		// SUSPENDED or deletion: not running, and nothing to do but wait
		// (Create starts it once it has stopped).
		out.State = provider.StateStopped
		if out.Message == "" {
			out.Message = "instance is " + inst.Status
		}
	default:
		out.State = provider.StateUnknown
		if out.Message == "" {
			out.Message = "unknown instance status " + inst.Status
		}
	}
	return out
}

// natIP is the first external IPv4 of the instance.
func natIP(inst *compute.Instance) string {
	for _, nic := range inst.NetworkInterfaces {
		for _, ac := range nic.AccessConfigs {
			if ac.NatIP != "" {
				return ac.NatIP
			}
		}
	}
	return ""
}

// internalIP is the first NIC's internal IPv4.
func internalIP(inst *compute.Instance) string {
	for _, nic := range inst.NetworkInterfaces {
		if nic.NetworkIP != "" {
			return nic.NetworkIP
		}
	}
	return ""
}

// owner reads the Proxy recorded on the instance: exact names from
// metadata, falling back to the (lossy) labels.
func owner(inst *compute.Instance) provider.Owner {
	o := provider.Owner{
		Namespace: inst.Labels[LabelNamespace],
		Name:      inst.Labels[LabelName],
		UID:       inst.Labels[LabelUID],
	}
	if inst.Metadata != nil {
		for _, it := range inst.Metadata.Items {
			if it.Value == nil {
				continue
			}
			switch it.Key {
			case MetadataNamespace:
				o.Namespace = *it.Value
			case MetadataName:
				o.Name = *it.Value
			}
		}
	}
	return o
}

// checkOwner refuses an instance that is not m's.
func checkOwner(inst *compute.Instance, m *provider.Machine) error {
	got, ok := inst.Labels[LabelUID]
	switch {
	case !ok:
		return &provider.IdentityError{Kind: "instance", Name: inst.Name, Mismatch: "no " + LabelUID + " label"}
	case got != LabelValue(m.UID):
		return &provider.IdentityError{Kind: "instance", Name: inst.Name, Mismatch: fmt.Sprintf("%s %q != Proxy uid %q", LabelUID, got, m.UID)}
	}
	return nil
}

func ignoreNotFound(err error) error {
	if provider.Class(err) == provider.ClassNotFound {
		return nil
	}
	return err
}

func ptr[T any](v T) *T { return &v }
