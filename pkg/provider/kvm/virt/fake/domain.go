package fake

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

const guestAgentChannel = "org.qemu.guest_agent.0"

// definition is one parsed domain XML, as libvirt keeps a live and a
// persistent one per domain.
type definition struct {
	dom   *libvirtxml.Domain // canonical: uuid, MACs, metadata filled in
	meta  []*xnode
	nvram bool // has UEFI variables: firmware='efi', <nvram> or a pflash loader
	agent bool // has the guest agent channel
	nics  []nic
}

type nic struct {
	mac     string // lower case
	network string // source network, "" for other interface types
	dev     string // target device (vnetN), set on the live definition
}

type domain struct {
	name   string
	uuid   libvirt.UUID
	config *definition // persistent definition; nil once undefined while running
	live   *definition // running definition; nil while shut off
	state  libvirt.DomainState
	reason int32
	id     int32 // -1 while shut off
}

func (d *domain) handle() libvirt.Domain {
	return libvirt.Domain{Name: d.name, UUID: d.uuid, ID: d.id}
}

func (d *domain) active() bool { return d.state != libvirt.DomainShutoff }

// current returns the definition libvirt's "current" means: live if running.
func (d *domain) current() *definition {
	if d.live != nil {
		return d.live
	}
	return d.config
}

type agentState struct {
	connected *bool                     // nil: follow WithAgentAutoConnect
	ifaces    []libvirt.DomainInterface // nil: derive from DHCP leases
}

func (f *Fake) agent(name string) *agentState {
	a := f.agents[name]
	if a == nil {
		a = &agentState{}
		f.agents[name] = a
	}
	return a
}

// parseDomain parses and canonicalises XML the way virDomainDefineXML does
// for the parts callers can observe.
func parseDomain(doc string) (*definition, error) {
	root, meta, err := parseDomainDoc(doc)
	if err != nil {
		return nil, lverr(libvirt.ErrXMLDetail, "(domain_definition):1: %v", err)
	}
	if root != "domain" {
		return nil, lverr(libvirt.ErrXMLError, "unexpected root element <%s>, expecting <domain>", root)
	}
	dom := &libvirtxml.Domain{}
	if err := dom.Unmarshal(doc); err != nil {
		return nil, lverr(libvirt.ErrXMLError, "%v", err)
	}
	if dom.Name == "" {
		return nil, virt.NewError(libvirt.ErrNoName, "missing name information")
	}
	if err := canonicalUUID(dom); err != nil {
		return nil, err
	}
	dom.ID = nil
	dom.Metadata = metadataElement(meta)
	def := &definition{dom: dom, meta: meta, nvram: defineNVRAM(dom)}
	if dom.Devices != nil {
		def.agent = hasGuestAgent(dom.Devices)
		def.nics = defineNICs(dom.Devices)
	}
	return def, nil
}

// canonicalUUID gives dom a UUID when it has none and writes the one it
// has in canonical form.
func canonicalUUID(dom *libvirtxml.Domain) error {
	if dom.UUID == "" {
		dom.UUID = virt.FormatUUID(virt.NewUUID())
		return nil
	}
	u, err := virt.ParseUUID(dom.UUID)
	if err != nil {
		return lverr(libvirt.ErrInternalError, "malformed uuid element")
	}
	dom.UUID = virt.FormatUUID(u)
	return nil
}

// metadataElement is <metadata> holding the sanitized children; nil
// without any.
func metadataElement(meta []*xnode) *libvirtxml.DomainMetadata {
	if len(meta) == 0 {
		return nil
	}
	var b strings.Builder
	for _, m := range meta {
		b.WriteString(m.String())
	}
	return &libvirtxml.DomainMetadata{XML: b.String()}
}

// defineNVRAM reports whether dom has UEFI variables and, as libvirt does
// at define time, names their file when dom does not.
func defineNVRAM(dom *libvirtxml.Domain) bool {
	os := dom.OS
	if os == nil {
		return false
	}
	nvram := os.Firmware == "efi" || os.NVRam != nil || (os.Loader != nil && os.Loader.Type == "pflash")
	if nvram && os.NVRam == nil {
		os.NVRam = &libvirtxml.DomainNVRam{NVRam: "/var/lib/libvirt/qemu/nvram/" + dom.Name + "_VARS.fd"}
	}
	return nvram
}

func hasGuestAgent(devs *libvirtxml.DomainDeviceList) bool {
	for _, ch := range devs.Channels {
		if ch.Target != nil && ch.Target.VirtIO != nil && ch.Target.VirtIO.Name == guestAgentChannel {
			return true
		}
	}
	return false
}

// defineNICs returns devs' interfaces, giving each without a MAC a random
// one as libvirt does.
func defineNICs(devs *libvirtxml.DomainDeviceList) []nic {
	var nics []nic
	for i := range devs.Interfaces {
		ifc := &devs.Interfaces[i]
		if ifc.MAC == nil || ifc.MAC.Address == "" {
			ifc.MAC = &libvirtxml.DomainInterfaceMAC{Address: randomMAC()}
		}
		n := nic{mac: strings.ToLower(ifc.MAC.Address)}
		if ifc.Source != nil && ifc.Source.Network != nil {
			n.network = ifc.Source.Network.Network
		}
		if ifc.Target != nil {
			n.dev = ifc.Target.Dev
		}
		nics = append(nics, n)
	}
	return nics
}

// randomMAC returns an address in QEMU's 52:54:00 range, as libvirt assigns.
func randomMAC() string {
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", rand.IntN(256), rand.IntN(256), rand.IntN(256))
}

// liveCopy returns the definition a domain runs with: the persistent one
// with target devices assigned, as libvirt fills them in on start.
func (f *Fake) liveCopy(def *definition) *definition {
	live := *def
	live.nics = slices.Clone(def.nics)
	if def.dom.Devices != nil && len(def.dom.Devices.Interfaces) > 0 {
		dom := *def.dom
		devs := *dom.Devices
		devs.Interfaces = slices.Clone(devs.Interfaces)
		for i := range devs.Interfaces {
			if live.nics[i].dev == "" {
				live.nics[i].dev = fmt.Sprintf("vnet%d", f.nextVnet)
				f.nextVnet++
			}
			devs.Interfaces[i].Target = &libvirtxml.DomainInterfaceTarget{Dev: live.nics[i].dev}
		}
		dom.Devices = &devs
		live.dom = &dom
	}
	return &live
}

// lookup resolves a domain handle the way the daemon does: by UUID.
func (f *Fake) lookup(h libvirt.Domain) (*domain, error) {
	for _, d := range f.domains {
		if d.uuid == h.UUID {
			return d, nil
		}
	}
	return nil, errNoDomainUUID(h.UUID, h.Name)
}

// ConnectListAllDomains implements virt.Client. Filter groups (active/
// inactive, persistent/transient, running/paused/shutoff/other) apply as in
// libvirt: no flag of a group means no filtering by it.
func (c *Conn) ConnectListAllDomains(needResults int32, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, uint32, error) {
	type res struct {
		doms []libvirt.Domain
		n    uint32
	}
	r, err := do(c, virt.RPCConnectListAllDomains, func(f *Fake) (res, error) {
		names := slices.Sorted(maps.Keys(f.domains))
		var out []libvirt.Domain
		for _, name := range names {
			if d := f.domains[name]; matchFlags(d, flags) {
				out = append(out, d.handle())
			}
		}
		n := uint32(len(out))
		if needResults == 0 {
			out = nil // the protocol returns only the count
		}
		return res{out, n}, nil
	})
	return r.doms, r.n, err
}

func matchFlags(d *domain, fl libvirt.ConnectListAllDomainsFlags) bool {
	group := func(yes, no libvirt.ConnectListAllDomainsFlags, is bool) bool {
		if fl&(yes|no) == 0 || fl&(yes|no) == yes|no {
			return true
		}
		return (is && fl&yes != 0) || (!is && fl&no != 0)
	}
	if !group(libvirt.ConnectListDomainsActive, libvirt.ConnectListDomainsInactive, d.active()) ||
		!group(libvirt.ConnectListDomainsPersistent, libvirt.ConnectListDomainsTransient, d.config != nil) {
		return false
	}
	const states = libvirt.ConnectListDomainsRunning | libvirt.ConnectListDomainsPaused |
		libvirt.ConnectListDomainsShutoff | libvirt.ConnectListDomainsOther
	if fl&states == 0 {
		return true
	}
	switch d.state {
	case libvirt.DomainRunning:
		return fl&libvirt.ConnectListDomainsRunning != 0
	case libvirt.DomainPaused:
		return fl&libvirt.ConnectListDomainsPaused != 0
	case libvirt.DomainShutoff:
		return fl&libvirt.ConnectListDomainsShutoff != 0
	default:
		return fl&libvirt.ConnectListDomainsOther != 0
	}
}

// DomainLookupByName implements virt.Client.
func (c *Conn) DomainLookupByName(name string) (libvirt.Domain, error) {
	return do(c, virt.RPCDomainLookupByName, func(f *Fake) (libvirt.Domain, error) {
		d := f.domains[name]
		if d == nil {
			return libvirt.Domain{}, lverr(libvirt.ErrNoDomain, "no domain with matching name '%s'", name)
		}
		return d.handle(), nil
	})
}

// DomainLookupByUUID implements virt.Client.
func (c *Conn) DomainLookupByUUID(uuid libvirt.UUID) (libvirt.Domain, error) {
	return do(c, virt.RPCDomainLookupByUUID, func(f *Fake) (libvirt.Domain, error) {
		for _, d := range f.domains {
			if d.uuid == uuid {
				return d.handle(), nil
			}
		}
		return libvirt.Domain{}, lverr(libvirt.ErrNoDomain, "no domain with matching uuid '%s'", virt.FormatUUID(uuid))
	})
}

// DomainDefineXMLFlags implements virt.Client with virDomainObjListAdd's
// rules: a UUID without a <uuid> is random, so redefining an existing name
// without its UUID fails; the same name and UUID updates the definition (for
// a running domain only the persistent one: the live domain keeps running
// with the old definition, metadata included, until it is restarted).
func (c *Conn) DomainDefineXMLFlags(xml string, flags libvirt.DomainDefineFlags) (libvirt.Domain, error) {
	return do(c, virt.RPCDomainDefineXMLFlags, func(f *Fake) (libvirt.Domain, error) {
		return f.define(xml)
	})
}

func (f *Fake) define(xml string) (libvirt.Domain, error) {
	def, err := parseDomain(xml)
	if err != nil {
		return libvirt.Domain{}, err
	}
	uuid, _ := virt.ParseUUID(def.dom.UUID)
	name := def.dom.Name
	for _, d := range f.domains {
		if d.uuid == uuid && d.name != name {
			return libvirt.Domain{}, lverr(libvirt.ErrOperationFailed, "domain '%s' is already defined with uuid %s", d.name, def.dom.UUID)
		}
	}
	if d := f.domains[name]; d != nil {
		if d.uuid != uuid {
			return libvirt.Domain{}, lverr(libvirt.ErrOperationFailed, "domain '%s' already exists with uuid %s", name, virt.FormatUUID(d.uuid))
		}
		detail := libvirt.DomainEventDefinedUpdated
		if d.config == nil { // a transient domain made persistent again
			detail = libvirt.DomainEventDefinedAdded
		}
		d.config = def
		f.emit(d, libvirt.DomainEventDefined, int32(detail))
		return d.handle(), nil
	}
	d := &domain{name: name, uuid: uuid, config: def, state: libvirt.DomainShutoff,
		reason: int32(libvirt.DomainShutoffUnknown), id: -1}
	f.domains[name] = d
	f.emit(d, libvirt.DomainEventDefined, int32(libvirt.DomainEventDefinedAdded))
	return d.handle(), nil
}

// DomainCreate implements virt.Client.
func (c *Conn) DomainCreate(dom libvirt.Domain) error {
	return do0(c, virt.RPCDomainCreate, func(f *Fake) error {
		d, err := f.lookup(dom)
		if err != nil {
			return err
		}
		if d.active() {
			return lverr(libvirt.ErrOperationInvalid, "domain is already running")
		}
		f.start(d)
		return nil
	})
}

func (f *Fake) start(d *domain) {
	d.live = f.liveCopy(d.config)
	d.state, d.reason = libvirt.DomainRunning, int32(libvirt.DomainRunningBooted)
	d.id = f.nextID
	f.nextID++
	f.emit(d, libvirt.DomainEventStarted, int32(libvirt.DomainEventStartedBooted))
	// libvirt reports an agent channel already connected when the process
	// starts with reason "domain started"; a later connect says "channel".
	if f.agentConnected(d) {
		f.emitAgent(d, libvirt.ConnectDomainEventAgentLifecycleStateConnected, libvirt.ConnectDomainEventAgentLifecycleReasonDomainStarted)
	}
}

// agentConnected reports whether d's guest agent is connected. Caller holds f.mu.
func (f *Fake) agentConnected(d *domain) bool {
	if d.state != libvirt.DomainRunning || !d.live.agent {
		return false
	}
	if a := f.agents[d.name]; a != nil && a.connected != nil {
		return *a.connected
	}
	return f.agentAuto
}

// DomainResume implements virt.Client like qemu's driver: a paused domain
// runs again, a running one is left as is, a shut-off one is refused.
func (c *Conn) DomainResume(dom libvirt.Domain) error {
	return do0(c, virt.RPCDomainResume, func(f *Fake) error {
		d, err := f.lookup(dom)
		if err != nil {
			return err
		}
		switch {
		case !d.active():
			return errNotRunning()
		case d.state == libvirt.DomainPmsuspended:
			return lverr(libvirt.ErrOperationInvalid, "domain is pmsuspended")
		case d.state == libvirt.DomainPaused && d.reason == int32(libvirt.DomainPausedPostcopy):
			return lverr(libvirt.ErrOperationInvalid, "cannot resume domain which is in post-copy migration")
		case d.state == libvirt.DomainPaused:
			d.state, d.reason = libvirt.DomainRunning, int32(libvirt.DomainRunningUnpaused)
			f.emit(d, libvirt.DomainEventResumed, int32(libvirt.DomainEventResumedUnpaused))
		}
		return nil
	})
}

// Pause makes a running domain paused for reason, as libvirt does on its
// own (an I/O error such as ENOSPC, a watchdog) or on `virsh suspend`.
func (f *Fake) Pause(name string, reason libvirt.DomainPausedReason) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.domains[name]
	if d == nil || d.state != libvirt.DomainRunning {
		return fmt.Errorf("fake: domain %q is not running", name)
	}
	d.state, d.reason = libvirt.DomainPaused, int32(reason)
	detail := libvirt.DomainEventSuspendedPaused
	if reason == libvirt.DomainPausedIoerror {
		detail = libvirt.DomainEventSuspendedIoerror
	}
	f.emit(d, libvirt.DomainEventSuspended, int32(detail))
	return nil
}

// DomainDestroyFlags implements virt.Client. A domain undefined while
// running (transient) disappears here.
func (c *Conn) DomainDestroyFlags(dom libvirt.Domain, flags libvirt.DomainDestroyFlagsValues) error {
	return do0(c, virt.RPCDomainDestroyFlags, func(f *Fake) error {
		d, err := f.lookup(dom)
		if err != nil {
			return err
		}
		if !d.active() {
			return errNotRunning()
		}
		f.stop(d, libvirt.DomainShutoffDestroyed, libvirt.DomainEventStoppedDestroyed)
		return nil
	})
}

func (f *Fake) stop(d *domain, reason libvirt.DomainShutoffReason, detail libvirt.DomainEventStoppedDetailType) {
	d.live = nil
	d.state, d.reason, d.id = libvirt.DomainShutoff, int32(reason), -1
	f.emit(d, libvirt.DomainEventStopped, int32(detail))
	if d.config == nil {
		delete(f.domains, d.name)
	}
}

// DomainUndefineFlags implements virt.Client. A UEFI domain needs
// DomainUndefineNvram (variables deleted, see NVRAMRemoved) or
// DomainUndefineKeepNvram. Undefining a running domain makes it transient:
// it keeps running and disappears when it stops.
func (c *Conn) DomainUndefineFlags(dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error {
	return do0(c, virt.RPCDomainUndefineFlags, func(f *Fake) error {
		d, err := f.lookup(dom)
		if err != nil {
			return err
		}
		if flags&libvirt.DomainUndefineNvram != 0 && flags&libvirt.DomainUndefineKeepNvram != 0 {
			return lverr(libvirt.ErrInvalidArg, "Flags 'VIR_DOMAIN_UNDEFINE_NVRAM' and 'VIR_DOMAIN_UNDEFINE_KEEP_NVRAM' are mutually exclusive")
		}
		if d.config == nil {
			return lverr(libvirt.ErrOperationInvalid, "cannot undefine transient domain")
		}
		if d.current().nvram {
			switch {
			case flags&libvirt.DomainUndefineNvram != 0:
				f.nvramGone[d.name] = true
			case flags&libvirt.DomainUndefineKeepNvram == 0:
				return lverr(libvirt.ErrOperationInvalid, "cannot undefine domain with nvram")
			}
		}
		d.config = nil
		f.emit(d, libvirt.DomainEventUndefined, int32(libvirt.DomainEventUndefinedRemoved))
		if !d.active() {
			delete(f.domains, d.name)
		}
		return nil
	})
}

// DomainGetState implements virt.Client.
func (c *Conn) DomainGetState(dom libvirt.Domain, flags uint32) (int32, int32, error) {
	type res struct{ state, reason int32 }
	r, err := do(c, virt.RPCDomainGetState, func(f *Fake) (res, error) {
		d, err := f.lookup(dom)
		if err != nil {
			return res{}, err
		}
		return res{int32(d.state), d.reason}, nil
	})
	return r.state, r.reason, err
}

// DomainGetXMLDesc implements virt.Client: the canonical definition (uuid,
// MACs, sanitized metadata), live with id and target devices while running,
// the persistent one with DomainXMLInactive.
func (c *Conn) DomainGetXMLDesc(dom libvirt.Domain, flags libvirt.DomainXMLFlags) (string, error) {
	return do(c, virt.RPCDomainGetXMLDesc, func(f *Fake) (string, error) {
		d, err := f.lookup(dom)
		if err != nil {
			return "", err
		}
		def := d.current()
		if flags&libvirt.DomainXMLInactive != 0 && d.config != nil {
			def = d.config
		}
		out := *def.dom
		if def == d.live {
			id := int(d.id)
			out.ID = &id
		}
		s, err := out.Marshal()
		if err != nil {
			return "", lverr(libvirt.ErrInternalError, "%v", err)
		}
		return s, nil
	})
}

// DomainGetMetadata implements virt.Client like libvirt 11: the element for
// uri without its namespace prefix or declaration.
func (c *Conn) DomainGetMetadata(dom libvirt.Domain, typ int32, uri libvirt.OptString, flags libvirt.DomainModificationImpact) (string, error) {
	return do(c, virt.RPCDomainGetMetadata, func(f *Fake) (string, error) {
		d, err := f.lookup(dom)
		if err != nil {
			return "", err
		}
		var def *definition
		switch {
		case flags&libvirt.DomainAffectLive != 0 && flags&libvirt.DomainAffectConfig != 0:
			return "", lverr(libvirt.ErrInvalidArg, "Flags 'VIR_DOMAIN_AFFECT_LIVE' and 'VIR_DOMAIN_AFFECT_CONFIG' are mutually exclusive")
		case flags&libvirt.DomainAffectLive != 0:
			if d.live == nil {
				return "", errNotRunning()
			}
			def = d.live
		case flags&libvirt.DomainAffectConfig != 0:
			if d.config == nil {
				return "", lverr(libvirt.ErrOperationInvalid, "transient domains do not have any persistent config")
			}
			def = d.config
		default:
			def = d.current()
		}
		notPresent := lverr(libvirt.ErrNoDomainMetadata, "Requested metadata element is not present")
		switch libvirt.DomainMetadataType(typ) {
		case libvirt.DomainMetadataDescription:
			if def.dom.Description == "" {
				return "", notPresent
			}
			return def.dom.Description, nil
		case libvirt.DomainMetadataTitle:
			if def.dom.Title == "" {
				return "", notPresent
			}
			return def.dom.Title, nil
		case libvirt.DomainMetadataElement:
			if len(uri) == 0 {
				return "", lverr(libvirt.ErrInvalidArg, "uri in virDomainGetMetadata must not be NULL")
			}
			for _, m := range def.meta {
				if m.uri == uri[0] {
					return m.extract(uri[0]), nil
				}
			}
			return "", notPresent
		default:
			return "", lverr(libvirt.ErrInvalidArg, "unknown metadata type '%d'", typ)
		}
	})
}

// DomainInterfaceAddresses implements virt.Client for the three sources:
//
//   - agent: the guest agent's view, "lo" first as a real agent reports it;
//     SetAgentAddresses or, by default, eth0.. with the DHCP-leased IPs;
//   - lease: the libvirt network's DHCP leases for the domain's MACs;
//   - arp: the host's neighbour table (SetARP) for the domain's MACs.
func (c *Conn) DomainInterfaceAddresses(dom libvirt.Domain, source uint32, flags uint32) ([]libvirt.DomainInterface, error) {
	return do(c, virt.RPCDomainInterfaceAddresses, func(f *Fake) ([]libvirt.DomainInterface, error) {
		d, err := f.lookup(dom)
		if err != nil {
			return nil, err
		}
		if !d.active() {
			return nil, errNotRunning()
		}
		switch libvirt.DomainInterfaceAddressesSource(source) {
		case libvirt.DomainInterfaceAddressesSrcAgent:
			return f.agentAddresses(d)
		case libvirt.DomainInterfaceAddressesSrcLease:
			var out []libvirt.DomainInterface
			for _, n := range d.live.nics {
				if ip, ok := f.leaseIP(n); ok {
					out = append(out, iface(n.dev, n.mac, ip))
				}
			}
			return out, nil
		case libvirt.DomainInterfaceAddressesSrcArp:
			var out []libvirt.DomainInterface
			for _, n := range d.live.nics {
				if ip, ok := f.arp[n.mac]; ok {
					out = append(out, iface(n.dev, n.mac, ip))
				}
			}
			return out, nil
		default:
			return nil, lverr(libvirt.ErrArgumentUnsupported, "Unknown IP address data source %d", source)
		}
	})
}

func (f *Fake) agentAddresses(d *domain) ([]libvirt.DomainInterface, error) {
	// qemuDomainAgentAvailable: running, then connected, else configured?
	if d.state != libvirt.DomainRunning {
		return nil, errNotRunning()
	}
	a := f.agents[d.name]
	if !f.agentConnected(d) {
		if d.live.agent {
			return nil, lverr(libvirt.ErrAgentUnresponsive, "QEMU guest agent is not connected")
		}
		return nil, lverr(libvirt.ErrArgumentUnsupported, "QEMU guest agent is not configured")
	}
	out := []libvirt.DomainInterface{{
		Name:   "lo",
		Hwaddr: libvirt.OptString{"00:00:00:00:00:00"},
		Addrs: []libvirt.DomainIPAddr{
			{Type: int32(libvirt.IPAddrTypeIpv4), Addr: "127.0.0.1", Prefix: 8},
			{Type: int32(libvirt.IPAddrTypeIpv6), Addr: "::1", Prefix: 128},
		},
	}}
	if a != nil && a.ifaces != nil {
		return append(out, cloneIfaces(a.ifaces)...), nil
	}
	for i, n := range d.live.nics {
		if ip, ok := f.leaseIP(n); ok {
			out = append(out, iface(fmt.Sprintf("eth%d", i), n.mac, ip))
		}
	}
	return out, nil
}

func iface(name, mac, ip string) libvirt.DomainInterface {
	typ, prefix := int32(libvirt.IPAddrTypeIpv4), uint32(24)
	if strings.Contains(ip, ":") {
		typ, prefix = int32(libvirt.IPAddrTypeIpv6), 64
	}
	return libvirt.DomainInterface{
		Name:   name,
		Hwaddr: libvirt.OptString{mac},
		Addrs:  []libvirt.DomainIPAddr{{Type: typ, Addr: ip, Prefix: prefix}},
	}
}

func cloneIfaces(in []libvirt.DomainInterface) []libvirt.DomainInterface {
	out := slices.Clone(in)
	for i := range out {
		out[i].Hwaddr = slices.Clone(out[i].Hwaddr)
		out[i].Addrs = slices.Clone(out[i].Addrs)
	}
	return out
}

// Test controls and inspection for domains.

// AddDomain defines (and optionally starts) a domain directly, bypassing
// fault injection and call counters, e.g. to seed a foreign domain. Events
// are emitted as for the RPCs.
func (f *Fake) AddDomain(xml string, running bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, err := f.define(xml)
	if err != nil {
		return err
	}
	if d := f.domains[h.Name]; running && !d.active() {
		f.start(d)
	}
	return nil
}

// GuestShutdown powers a running domain off from inside the guest.
func (f *Fake) GuestShutdown(name string) error {
	return f.stopByName(name, libvirt.DomainShutoffShutdown, libvirt.DomainEventStoppedShutdown)
}

// Crash makes a running domain crash (with on_crash=destroy).
func (f *Fake) Crash(name string) error {
	return f.stopByName(name, libvirt.DomainShutoffCrashed, libvirt.DomainEventStoppedCrashed)
}

func (f *Fake) stopByName(name string, reason libvirt.DomainShutoffReason, detail libvirt.DomainEventStoppedDetailType) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.domains[name]
	if d == nil {
		return lverr(libvirt.ErrNoDomain, "no domain with matching name '%s'", name)
	}
	if !d.active() {
		return errNotRunning()
	}
	f.stop(d, reason, detail)
	return nil
}

// SetAgentConnected overrides whether name's guest agent is connected while
// the domain runs. It may be called before the domain exists. A change on a
// running domain with an agent channel emits the agent lifecycle event
// (reason "channel"), as libvirt does when the guest opens or closes it.
func (f *Fake) SetAgentConnected(name string, connected bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.domains[name]
	was := d != nil && f.agentConnected(d)
	f.agent(name).connected = &connected
	if d == nil || was == f.agentConnected(d) {
		return
	}
	state := libvirt.ConnectDomainEventAgentLifecycleStateDisconnected
	if connected {
		state = libvirt.ConnectDomainEventAgentLifecycleStateConnected
	}
	f.emitAgent(d, state, libvirt.ConnectDomainEventAgentLifecycleReasonChannel)
}

// SetAgentAddresses sets what name's guest agent reports besides "lo"
// (nil restores the default: the DHCP-leased addresses as eth0, eth1, ...).
func (f *Fake) SetAgentAddresses(name string, ifaces []libvirt.DomainInterface) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.agent(name).ifaces = cloneIfaces(ifaces)
}

// DomainInfo is a snapshot of a domain for assertions.
type DomainInfo struct {
	Name       string
	UUID       libvirt.UUID
	ID         int32
	State      libvirt.DomainState
	Reason     int32
	Persistent bool
	// ConfigXML is the persistent definition ("" if transient).
	ConfigXML string
}

// Domain returns a snapshot of the named domain.
func (f *Fake) Domain(name string) (DomainInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.domains[name]
	if d == nil {
		return DomainInfo{}, false
	}
	info := DomainInfo{Name: d.name, UUID: d.uuid, ID: d.id, State: d.state, Reason: d.reason, Persistent: d.config != nil}
	if d.config != nil {
		info.ConfigXML, _ = d.config.dom.Marshal()
	}
	return info, true
}

// DomainNames returns the names of all domains, sorted.
func (f *Fake) DomainNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.domains))
}

// NVRAMRemoved reports whether a domain of that name was undefined with
// DomainUndefineNvram, deleting its UEFI variables.
func (f *Fake) NVRAMRemoved(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nvramGone[name]
}
