package fake_test

import (
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

const (
	uuidA = "0b5a3c3e-6f0e-4d5c-9a53-0c1f0d6b2a11"
	uuidB = "7d4e1f42-2a1b-4c6e-8f00-5e9d2b3c4a22"
)

func TestDomainLifecycleErrors(t *testing.T) {
	tests := []struct {
		name string
		// setup prepares the fake; op is the call under test.
		setup func(t *testing.T, f *fake.Fake)
		op    func(f *fake.Fake) error
		code  libvirt.ErrorNumber
		msg   string
	}{
		{
			name: "define new",
			op: func(f *fake.Fake) error {
				_, err := f.DomainDefineXMLFlags(dom{name: "a", uuid: uuidA}.xml(), 0)
				return err
			},
		},
		{
			name:  "redefine same name and uuid updates",
			setup: func(t *testing.T, f *fake.Fake) { mustDefine(t, f, dom{name: "a", uuid: uuidA}) },
			op: func(f *fake.Fake) error {
				_, err := f.DomainDefineXMLFlags(dom{name: "a", uuid: uuidA}.xml(), 0)
				return err
			},
		},
		{
			name:  "redefine name with other uuid",
			setup: func(t *testing.T, f *fake.Fake) { mustDefine(t, f, dom{name: "a", uuid: uuidA}) },
			op: func(f *fake.Fake) error {
				_, err := f.DomainDefineXMLFlags(dom{name: "a", uuid: uuidB}.xml(), 0)
				return err
			},
			code: libvirt.ErrOperationFailed,
			msg:  "operation failed: domain 'a' already exists with uuid " + uuidA,
		},
		{
			name:  "redefine name without uuid gets a random one and fails",
			setup: func(t *testing.T, f *fake.Fake) { mustDefine(t, f, dom{name: "a", uuid: uuidA}) },
			op:    func(f *fake.Fake) error { _, err := f.DomainDefineXMLFlags(dom{name: "a"}.xml(), 0); return err },
			code:  libvirt.ErrOperationFailed,
			msg:   "already exists with uuid " + uuidA,
		},
		{
			name:  "uuid reused under another name",
			setup: func(t *testing.T, f *fake.Fake) { mustDefine(t, f, dom{name: "a", uuid: uuidA}) },
			op: func(f *fake.Fake) error {
				_, err := f.DomainDefineXMLFlags(dom{name: "b", uuid: uuidA}.xml(), 0)
				return err
			},
			code: libvirt.ErrOperationFailed,
			msg:  "domain 'a' is already defined with uuid " + uuidA,
		},
		{
			name: "define malformed xml",
			op:   func(f *fake.Fake) error { _, err := f.DomainDefineXMLFlags("<domain><name>x", 0); return err },
			code: libvirt.ErrXMLDetail,
		},
		{
			name: "define without name",
			op:   func(f *fake.Fake) error { _, err := f.DomainDefineXMLFlags("<domain type='kvm'/>", 0); return err },
			code: libvirt.ErrNoName,
			msg:  "missing name information",
		},
		{
			name: "define wrong root",
			op:   func(f *fake.Fake) error { _, err := f.DomainDefineXMLFlags("<volume/>", 0); return err },
			code: libvirt.ErrXMLError,
			msg:  "unexpected root element <volume>, expecting <domain>",
		},
		{
			name: "lookup missing name",
			op:   func(f *fake.Fake) error { _, err := f.DomainLookupByName("nope"); return err },
			code: libvirt.ErrNoDomain,
			msg:  "Domain not found: no domain with matching name 'nope'",
		},
		{
			name: "lookup missing uuid",
			op: func(f *fake.Fake) error {
				u, _ := virt.ParseUUID(uuidB)
				_, err := f.DomainLookupByUUID(u)
				return err
			},
			code: libvirt.ErrNoDomain,
			msg:  "no domain with matching uuid '" + uuidB + "'",
		},
		{
			name:  "create running domain",
			setup: func(t *testing.T, f *fake.Fake) { must(t, f.AddDomain(dom{name: "a", uuid: uuidA}.xml(), true)) },
			op: func(f *fake.Fake) error {
				h, _ := f.DomainLookupByName("a")
				return f.DomainCreate(h)
			},
			code: libvirt.ErrOperationInvalid,
			msg:  "Requested operation is not valid: domain is already running",
		},
		{
			name:  "destroy shut-off domain",
			setup: func(t *testing.T, f *fake.Fake) { must(t, f.AddDomain(dom{name: "a", uuid: uuidA}.xml(), false)) },
			op: func(f *fake.Fake) error {
				h, _ := f.DomainLookupByName("a")
				return f.DomainDestroyFlags(h, 0)
			},
			code: libvirt.ErrOperationInvalid,
			msg:  "domain is not running",
		},
		{
			name:  "stale handle after undefine",
			setup: func(t *testing.T, f *fake.Fake) { must(t, f.AddDomain(dom{name: "a", uuid: uuidA}.xml(), false)) },
			op: func(f *fake.Fake) error {
				h, _ := f.DomainLookupByName("a")
				if err := f.DomainUndefineFlags(h, 0); err != nil {
					return err
				}
				_, _, err := f.DomainGetState(h, 0)
				return err
			},
			code: libvirt.ErrNoDomain,
			msg:  "no domain with matching uuid '" + uuidA + "' (a)",
		},
		{
			name: "handle of a recreated name is stale (lookups go by uuid)",
			setup: func(t *testing.T, f *fake.Fake) {
				must(t, f.AddDomain(dom{name: "a", uuid: uuidA}.xml(), false))
			},
			op: func(f *fake.Fake) error {
				old, _ := f.DomainLookupByName("a")
				_ = f.DomainUndefineFlags(old, 0)
				if _, err := f.DomainDefineXMLFlags(dom{name: "a", uuid: uuidB}.xml(), 0); err != nil {
					return err
				}
				return f.DomainCreate(old)
			},
			code: libvirt.ErrNoDomain,
		},
		{
			name:  "undefine transient",
			setup: func(t *testing.T, f *fake.Fake) { must(t, f.AddDomain(dom{name: "a", uuid: uuidA}.xml(), true)) },
			op: func(f *fake.Fake) error {
				h, _ := f.DomainLookupByName("a")
				_ = f.DomainUndefineFlags(h, 0)
				return f.DomainUndefineFlags(h, 0)
			},
			code: libvirt.ErrOperationInvalid,
			msg:  "cannot undefine transient domain",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			if tt.setup != nil {
				tt.setup(t, f)
			}
			err := tt.op(f)
			wantErr(t, err, tt.code, tt.msg)
			if tt.code != 0 && !virt.IsCode(err, tt.code) {
				t.Fatalf("virt.IsCode(%v, %v) = false", err, tt.code)
			}
		})
	}
}

func TestDomainStates(t *testing.T) {
	f := newFake(t)
	h := mustDefine(t, f, dom{name: "a", uuid: uuidA})
	if h.ID != -1 {
		t.Errorf("inactive domain id = %d, want -1", h.ID)
	}
	state := func() libvirt.DomainState {
		s, _, err := f.DomainGetState(h, 0)
		must(t, err)
		return libvirt.DomainState(s)
	}
	if got := state(); got != libvirt.DomainShutoff {
		t.Fatalf("after define: %v", got)
	}
	must(t, f.DomainCreate(h))
	if s, r, _ := f.DomainGetState(h, 0); libvirt.DomainState(s) != libvirt.DomainRunning || libvirt.DomainRunningReason(r) != libvirt.DomainRunningBooted {
		t.Fatalf("after create: state %d reason %d", s, r)
	}
	if h2, _ := f.DomainLookupByName("a"); h2.ID <= 0 {
		t.Errorf("running domain id = %d", h2.ID)
	}
	must(t, f.DomainDestroyFlags(h, libvirt.DomainDestroyGraceful))
	if s, r, _ := f.DomainGetState(h, 0); libvirt.DomainState(s) != libvirt.DomainShutoff || libvirt.DomainShutoffReason(r) != libvirt.DomainShutoffDestroyed {
		t.Fatalf("after destroy: state %d reason %d", s, r)
	}
	must(t, f.DomainCreate(h))
	must(t, f.GuestShutdown("a"))
	if _, r, _ := f.DomainGetState(h, 0); libvirt.DomainShutoffReason(r) != libvirt.DomainShutoffShutdown {
		t.Fatalf("after guest shutdown: reason %d", r)
	}
}

func TestUndefineNVRAM(t *testing.T) {
	tests := []struct {
		name        string
		d           dom
		flags       libvirt.DomainUndefineFlagsValues
		code        libvirt.ErrorNumber
		msg         string
		wantRemoved bool
	}{
		{name: "bios, no flags", d: dom{name: "a"}},
		{name: "bios, nvram flag is harmless", d: dom{name: "a"}, flags: libvirt.DomainUndefineNvram},
		{name: "efi without flag", d: dom{name: "a", efi: true}, code: libvirt.ErrOperationInvalid,
			msg: "Requested operation is not valid: cannot undefine domain with nvram"},
		{name: "pflash nvram without flag", d: dom{name: "a", nvramElem: true}, code: libvirt.ErrOperationInvalid,
			msg: "cannot undefine domain with nvram"},
		{name: "efi with nvram flag", d: dom{name: "a", efi: true}, flags: libvirt.DomainUndefineNvram, wantRemoved: true},
		{name: "efi keeping nvram", d: dom{name: "a", efi: true}, flags: libvirt.DomainUndefineKeepNvram},
		{name: "both flags", d: dom{name: "a", efi: true}, flags: libvirt.DomainUndefineNvram | libvirt.DomainUndefineKeepNvram,
			code: libvirt.ErrInvalidArg, msg: "mutually exclusive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			h := mustDefine(t, f, tt.d)
			wantErr(t, f.DomainUndefineFlags(h, tt.flags), tt.code, tt.msg)
			_, exists := f.Domain("a")
			if exists != (tt.code != 0) {
				t.Errorf("domain exists = %v after undefine (err code %v)", exists, tt.code)
			}
			if got := f.NVRAMRemoved("a"); got != tt.wantRemoved {
				t.Errorf("NVRAMRemoved = %v, want %v", got, tt.wantRemoved)
			}
		})
	}
}

// Undefining a running domain is allowed: it turns transient, keeps running
// and disappears when destroyed (libvirt's behaviour).
func TestUndefineRunningDomainBecomesTransient(t *testing.T) {
	f := newFake(t)
	must(t, f.AddDomain(dom{name: "a", uuid: uuidA}.xml(), true))
	h, _ := f.DomainLookupByName("a")
	must(t, f.DomainUndefineFlags(h, 0))

	info, ok := f.Domain("a")
	if !ok || info.Persistent || info.State != libvirt.DomainRunning {
		t.Fatalf("after undefine: %+v, exists %v", info, ok)
	}
	doms, _, err := f.ConnectListAllDomains(1, libvirt.ConnectListDomainsTransient)
	must(t, err)
	if len(doms) != 1 {
		t.Fatalf("transient domains = %v", doms)
	}
	must(t, f.DomainDestroyFlags(h, 0))
	if _, err := f.DomainLookupByName("a"); !virt.IsNotFound(err) {
		t.Fatalf("transient domain still there after destroy: %v", err)
	}
}

func TestListAllDomainsFlags(t *testing.T) {
	f := newFake(t)
	must(t, f.AddDomain(dom{name: "off"}.xml(), false))
	must(t, f.AddDomain(dom{name: "on"}.xml(), true))
	must(t, f.AddDomain(dom{name: "transient"}.xml(), true))
	h, _ := f.DomainLookupByName("transient")
	must(t, f.DomainUndefineFlags(h, 0))

	tests := []struct {
		flags libvirt.ConnectListAllDomainsFlags
		want  string
	}{
		{0, "off on transient"},
		{libvirt.ConnectListDomainsActive, "on transient"},
		{libvirt.ConnectListDomainsInactive, "off"},
		{libvirt.ConnectListDomainsActive | libvirt.ConnectListDomainsInactive, "off on transient"},
		{libvirt.ConnectListDomainsPersistent, "off on"},
		{libvirt.ConnectListDomainsActive | libvirt.ConnectListDomainsPersistent, "on"},
		{libvirt.ConnectListDomainsShutoff, "off"},
		{libvirt.ConnectListDomainsRunning, "on transient"},
	}
	for _, tt := range tests {
		doms, n, err := f.ConnectListAllDomains(1, tt.flags)
		must(t, err)
		var names []string
		for _, d := range doms {
			names = append(names, d.Name)
		}
		if got := strings.Join(names, " "); got != tt.want || int(n) != len(doms) {
			t.Errorf("flags %d: got %q (n=%d), want %q", tt.flags, got, n, tt.want)
		}
	}
	if doms, n, _ := f.ConnectListAllDomains(0, 0); doms != nil || n != 3 {
		t.Errorf("needResults=0: got %v, %d", doms, n)
	}
}

func TestGetXMLDescCanonicalises(t *testing.T) {
	f := newFake(t)
	h := mustDefine(t, f, dom{name: "a", mac: "auto", efi: true}) // no uuid, no MAC
	x, err := f.DomainGetXMLDesc(h, 0)
	must(t, err)
	var d libvirtxml.Domain
	must(t, d.Unmarshal(x))
	if d.UUID != virt.FormatUUID(h.UUID) {
		t.Errorf("uuid in XML %q, handle %s", d.UUID, virt.FormatUUID(h.UUID))
	}
	if d.ID != nil {
		t.Errorf("inactive domain has id %d", *d.ID)
	}
	mac := d.Devices.Interfaces[0].MAC
	if mac == nil || !strings.HasPrefix(mac.Address, "52:54:00:") {
		t.Errorf("MAC not assigned: %+v", mac)
	}
	if d.OS.NVRam == nil {
		t.Errorf("efi domain has no nvram path")
	}

	must(t, f.DomainCreate(h))
	x, err = f.DomainGetXMLDesc(h, 0)
	must(t, err)
	d = libvirtxml.Domain{} // Unmarshal appends to slices
	must(t, d.Unmarshal(x))
	if d.ID == nil || *d.ID <= 0 {
		t.Errorf("running domain XML has no id")
	}
	if tg := d.Devices.Interfaces[0].Target; tg == nil || !strings.HasPrefix(tg.Dev, "vnet") {
		t.Errorf("running domain NIC has no target dev: %+v", tg)
	}
	x, err = f.DomainGetXMLDesc(h, libvirt.DomainXMLInactive)
	must(t, err)
	if strings.Contains(x, "vnet") || strings.Contains(x, " id=") {
		t.Errorf("inactive XML carries live state:\n%s", x)
	}
}

func TestGetMetadata(t *testing.T) {
	tests := []struct {
		name     string
		d        dom
		typ      libvirt.DomainMetadataType
		uri      string
		want     string
		code     libvirt.ErrorNumber
		contains string
	}{
		{
			name: "prefixed element loses prefix and declaration",
			d:    dom{metadata: `<proxy:instance xmlns:proxy="` + ns + `"><proxy:uid>u-1</proxy:uid><proxy:gen>3</proxy:gen></proxy:instance>`},
			typ:  libvirt.DomainMetadataElement, uri: ns,
			want: `<instance><uid>u-1</uid><gen>3</gen></instance>`,
		},
		{
			name: "indented input comes back compact",
			d:    dom{metadata: "\n    <proxy:instance xmlns:proxy=\"" + ns + "\">\n      <proxy:uid>u-1</proxy:uid>\n    </proxy:instance>\n  "},
			typ:  libvirt.DomainMetadataElement, uri: ns,
			want: `<instance><uid>u-1</uid></instance>`,
		},
		{
			name: "default namespace declaration is removed too",
			d:    dom{metadata: `<instance xmlns="` + ns + `"><uid>u-1</uid></instance>`},
			typ:  libvirt.DomainMetadataElement, uri: ns,
			want: `<instance><uid>u-1</uid></instance>`,
		},
		{
			name: "prefix declared on <domain> is found",
			d:    dom{rootNS: ` xmlns:proxy="` + ns + `"`, metadata: `<proxy:instance><proxy:uid>u-1</proxy:uid></proxy:instance>`},
			typ:  libvirt.DomainMetadataElement, uri: ns,
			want: `<instance><uid>u-1</uid></instance>`,
		},
		{
			name: "attributes and escaping survive",
			d:    dom{metadata: `<p:instance xmlns:p="` + ns + `" v="1"><p:note>a &amp; b &lt;c&gt;</p:note><p:empty/></p:instance>`},
			typ:  libvirt.DomainMetadataElement, uri: ns,
			want: `<instance v="1"><note>a &amp; b &lt;c&gt;</note><empty/></instance>`,
		},
		{
			name: "other namespaces inside keep their prefix",
			d:    dom{metadata: `<p:instance xmlns:p="` + ns + `" xmlns:o="urn:other"><o:x>1</o:x></p:instance>`},
			typ:  libvirt.DomainMetadataElement, uri: ns,
			want: `<instance xmlns:o="urn:other"><o:x>1</o:x></instance>`,
		},
		{
			name: "picks the element of the uri among others",
			d:    dom{metadata: `<o:other xmlns:o="urn:other"/><p:instance xmlns:p="` + ns + `"><p:uid>u</p:uid></p:instance>`},
			typ:  libvirt.DomainMetadataElement, uri: ns,
			want: `<instance><uid>u</uid></instance>`,
		},
		{
			name: "second element of a namespace is dropped at define",
			d:    dom{metadata: `<p:instance xmlns:p="` + ns + `"><p:uid>first</p:uid></p:instance><p:instance xmlns:p="` + ns + `"><p:uid>second</p:uid></p:instance>`},
			typ:  libvirt.DomainMetadataElement, uri: ns,
			want: `<instance><uid>first</uid></instance>`,
		},
		{
			name: "missing namespace",
			d:    dom{metadata: `<o:other xmlns:o="urn:other"/>`},
			typ:  libvirt.DomainMetadataElement, uri: ns,
			code: libvirt.ErrNoDomainMetadata, contains: "metadata not found: Requested metadata element is not present",
		},
		{
			name: "no metadata at all",
			typ:  libvirt.DomainMetadataElement, uri: ns,
			code: libvirt.ErrNoDomainMetadata,
		},
		{
			name: "element without namespace is dropped at define",
			d:    dom{metadata: `<instance><uid>u</uid></instance>`},
			typ:  libvirt.DomainMetadataElement, uri: "",
			code: libvirt.ErrNoDomainMetadata,
		},
		{
			name: "missing title",
			typ:  libvirt.DomainMetadataTitle,
			code: libvirt.ErrNoDomainMetadata,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			tt.d.name = "a"
			h := mustDefine(t, f, tt.d)
			got, err := f.DomainGetMetadata(h, int32(tt.typ), libvirt.OptString{tt.uri}, libvirt.DomainAffectCurrent)
			wantErr(t, err, tt.code, tt.contains)
			if err == nil && got != tt.want {
				t.Errorf("metadata\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// Redefining a running domain changes only its persistent definition: the
// "current" (live) metadata stays old until the domain restarts.
func TestRedefineRunningDomainKeepsLiveMetadata(t *testing.T) {
	f := newFake(t)
	md := func(gen string) string {
		return `<p:instance xmlns:p="` + ns + `"><p:gen>` + gen + `</p:gen></p:instance>`
	}
	must(t, f.AddDomain(dom{name: "a", uuid: uuidA, metadata: md("1")}.xml(), true))
	h := mustDefine(t, f, dom{name: "a", uuid: uuidA, metadata: md("2")})
	get := func(flags libvirt.DomainModificationImpact) string {
		s, err := f.DomainGetMetadata(h, int32(libvirt.DomainMetadataElement), libvirt.OptString{ns}, flags)
		must(t, err)
		return s
	}
	if got := get(libvirt.DomainAffectCurrent); !strings.Contains(got, ">1<") {
		t.Errorf("current metadata = %s, want gen 1", got)
	}
	if got := get(libvirt.DomainAffectConfig); !strings.Contains(got, ">2<") {
		t.Errorf("config metadata = %s, want gen 2", got)
	}
	must(t, f.DomainDestroyFlags(h, 0))
	must(t, f.DomainCreate(h))
	if got := get(libvirt.DomainAffectCurrent); !strings.Contains(got, ">2<") {
		t.Errorf("after restart metadata = %s, want gen 2", got)
	}
}

func TestResumeLikeQemu(t *testing.T) {
	f := newFake(t)
	h := mustDefine(t, f, dom{name: "a", uuid: uuidA})
	wantErr(t, f.DomainResume(h), libvirt.ErrOperationInvalid, "domain is not running")
	must(t, f.DomainCreate(h))
	must(t, f.DomainResume(h)) // running: nothing to do

	must(t, f.Pause("a", libvirt.DomainPausedIoerror))
	state, reason, err := f.DomainGetState(h, 0)
	must(t, err)
	if libvirt.DomainState(state) != libvirt.DomainPaused || libvirt.DomainPausedReason(reason) != libvirt.DomainPausedIoerror {
		t.Fatalf("state = %d/%d, want paused/ioerror", state, reason)
	}
	wantErr(t, f.DomainCreate(h), libvirt.ErrOperationInvalid, "domain is already running")
	must(t, f.DomainResume(h))
	state, reason, _ = f.DomainGetState(h, 0)
	if libvirt.DomainState(state) != libvirt.DomainRunning || libvirt.DomainRunningReason(reason) != libvirt.DomainRunningUnpaused {
		t.Fatalf("state = %d/%d after resume, want running/unpaused", state, reason)
	}

	must(t, f.Pause("a", libvirt.DomainPausedPostcopy))
	wantErr(t, f.DomainResume(h), libvirt.ErrOperationInvalid, "post-copy migration")
}
