package e2eutil

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
)

// NVRAMDir is where libvirt keeps the per-domain UEFI variable stores
// (<domain>_VARS.fd) on a Debian host.
const NVRAMDir = "/var/lib/libvirt/qemu/nvram"

// Inventory is everything on the hypervisor the operator could create,
// leak or touch: domains, the volumes of some pools, NVRAM files.
type Inventory struct {
	Domains map[string]DomainRecord
	// Volumes lists each pool's volume names.
	Volumes map[string][]string
	// NVRAM lists the file names in NVRAMDir.
	NVRAM []string
}

// DomainRecord is one domain as the inventory saw it.
type DomainRecord struct {
	Name, UUID, State string
	// Metadata is the operator's metadata element, when the domain has one.
	Metadata *domxml.Metadata
}

// inventoryScript prints every domain (marker line, state, XML), the
// volumes of the pools named in its arguments and the NVRAM files, in one
// round trip to the host.
const inventoryScript = `
v() { virsh -q -c qemu:///system "$@"; }
# An unanswered list must not read as an empty host.
doms=$(v list --all --name) || { echo "@@error virsh list failed" >&2; exit 1; }
for d in $doms; do
	echo "@@domain $d"
	echo "@@state $(v domstate "$d" 2>/dev/null | head -n1)"
	v dumpxml "$d" 2>/dev/null
done
for p in "$@"; do
	echo "@@pool $p"
	v pool-refresh "$p" >/dev/null 2>&1
	vols=$(v vol-list "$p") || { echo "@@error vol-list $p failed" >&2; exit 1; }
	echo "$vols" | awk 'NF { print "@@vol " $1 }'
done
echo "@@nvram"
ls -1 ` + NVRAMDir + ` 2>/dev/null | sed 's/^/@@file /'
echo "@@end"
`

// TakeInventory reads the host's domains, the volumes of pools and the
// NVRAM files.
func TakeInventory(ctx context.Context, h Host, pools ...string) (Inventory, error) {
	out, err := h.Run(ctx, append([]string{"sh", "-c", inventoryScript, "inventory"}, pools...)...)
	if err != nil {
		return Inventory{}, err
	}
	return parseInventory(out)
}

var uuidRE = regexp.MustCompile(`<uuid>([0-9a-f-]{36})</uuid>`)

func parseInventory(out string) (Inventory, error) {
	inv := Inventory{Domains: map[string]DomainRecord{}, Volumes: map[string][]string{}}
	var dom *DomainRecord
	var xml strings.Builder
	pool := ""
	flush := func() {
		if dom == nil {
			return
		}
		doc := xml.String()
		if m := uuidRE.FindStringSubmatch(doc); m != nil {
			dom.UUID = m[1]
		}
		if md, found, err := domxml.MetadataFromDomainXML(doc); err == nil && found {
			dom.Metadata = &md
		}
		inv.Domains[dom.Name] = *dom
		dom = nil
		xml.Reset()
	}
	ended := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "@@domain "):
			flush()
			dom = &DomainRecord{Name: strings.TrimPrefix(line, "@@domain ")}
		case strings.HasPrefix(line, "@@state "):
			if dom != nil {
				dom.State = strings.TrimSpace(strings.TrimPrefix(line, "@@state "))
			}
		case strings.HasPrefix(line, "@@pool "):
			flush()
			pool = strings.TrimPrefix(line, "@@pool ")
			inv.Volumes[pool] = []string{}
		case strings.HasPrefix(line, "@@vol "):
			inv.Volumes[pool] = append(inv.Volumes[pool], strings.TrimPrefix(line, "@@vol "))
		case line == "@@nvram":
			flush()
		case strings.HasPrefix(line, "@@file "):
			inv.NVRAM = append(inv.NVRAM, strings.TrimPrefix(line, "@@file "))
		case line == "@@end":
			ended = true
		case dom != nil:
			xml.WriteString(line)
			xml.WriteByte('\n')
		}
	}
	if !ended {
		return inv, fmt.Errorf("inventory output incomplete:\n%s", out)
	}
	return inv, nil
}

// ProxyRef is a Proxy that exists, in any install.
type ProxyRef struct {
	Domain string
	UID    string
}

// ProxyRefs lists the Proxies of one API server.
func ProxyRefs(ctx context.Context, c client.Client) ([]ProxyRef, error) {
	var list crawlv1.ProxyList
	if err := c.List(ctx, &list); err != nil {
		return nil, err
	}
	refs := make([]ProxyRef, 0, len(list.Items))
	for _, p := range list.Items {
		refs = append(refs, ProxyRef{Domain: domxml.DomainName(p.Namespace, p.Name), UID: string(p.UID)})
	}
	return refs, nil
}

// Foreign is what was put on the host by hand, outside every install: it
// must stay exactly as it was.
type Foreign struct {
	// Domains maps a domain's name to the UUID and state it must keep.
	Domains map[string]DomainRecord
	// Volumes maps a pool to volumes that must stay.
	Volumes map[string][]string
}

// Audit is what an inventory holds beyond what the Proxies that exist
// account for, and what of the foreign objects changed.
type Audit struct {
	// Leaked domains (an operator domain whose Proxy is gone, or any
	// unexplained domain), volumes (a per-VM volume of no Proxy, an image
	// volume without its marker, i.e. never verified, or a marker without
	// its volume) and NVRAM files of no domain.
	LeakedDomains, LeakedVolumes, LeakedNVRAM []string
	// ForeignTouched names each foreign object that is gone or changed.
	ForeignTouched []string
}

// Leaks is the number of leaked objects.
func (a Audit) Leaks() int { return len(a.LeakedDomains) + len(a.LeakedVolumes) + len(a.LeakedNVRAM) }

// String summarises the audit for a results row.
func (a Audit) String() string {
	part := func(what string, names []string) string {
		if len(names) == 0 {
			return "0 " + what
		}
		return fmt.Sprintf("%d %s (%s)", len(names), what, strings.Join(names, ", "))
	}
	return part("instances", a.LeakedDomains) + ", " + part("volumes", a.LeakedVolumes) + ", " + part("NVRAM", a.LeakedNVRAM)
}

// ForeignString summarises the foreign objects touched.
func (a Audit) ForeignString() string {
	if len(a.ForeignTouched) == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", len(a.ForeignTouched), strings.Join(a.ForeignTouched, "; "))
}

// DomainsOf names the domains whose metadata carries uid, sorted.
func (inv Inventory) DomainsOf(uid string) []string {
	var out []string
	for name, d := range inv.Domains {
		if d.Metadata != nil && d.Metadata.UID == uid {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Audit compares the inventory with the Proxies that exist (of every
// install sharing the host) and the foreign objects.
func (inv Inventory) Audit(proxies []ProxyRef, foreign Foreign) Audit {
	var a Audit
	uids := map[string]string{} // UID -> domain name
	for _, p := range proxies {
		uids[p.UID] = p.Domain
	}
	inv.auditDomains(&a, uids, foreign)
	for pool, vols := range inv.Volumes {
		for _, v := range vols {
			if slices.Contains(foreign.Volumes[pool], v) {
				continue
			}
			if why, leaked := volumeLeak(v, vols, uids); leaked {
				a.LeakedVolumes = append(a.LeakedVolumes, pool+"/"+v+why)
			}
		}
		for _, v := range foreign.Volumes[pool] {
			if !slices.Contains(vols, v) {
				a.ForeignTouched = append(a.ForeignTouched, "volume "+pool+"/"+v+": gone")
			}
		}
	}
	for _, f := range inv.NVRAM {
		if d, ok := strings.CutSuffix(f, "_VARS.fd"); ok {
			if _, defined := inv.Domains[d]; defined {
				continue
			}
		}
		a.LeakedNVRAM = append(a.LeakedNVRAM, f)
	}
	for _, s := range [][]string{a.LeakedDomains, a.LeakedVolumes, a.LeakedNVRAM, a.ForeignTouched} {
		sort.Strings(s)
	}
	return a
}

// auditDomains adds to a the domains no Proxy (uids: UID -> its domain's
// name) or foreign record explains, and the foreign ones changed or gone.
func (inv Inventory) auditDomains(a *Audit, uids map[string]string, foreign Foreign) {
	for name, d := range inv.Domains {
		if want, ok := foreign.Domains[name]; ok {
			if d.UUID != want.UUID || d.State != want.State {
				a.ForeignTouched = append(a.ForeignTouched, fmt.Sprintf("domain %s: %s %s, was %s %s", name, d.UUID, d.State, want.UUID, want.State))
			}
			continue
		}
		if d.Metadata != nil && uids[d.Metadata.UID] == name {
			continue
		}
		a.LeakedDomains = append(a.LeakedDomains, name)
	}
	for name := range foreign.Domains {
		if _, ok := inv.Domains[name]; !ok {
			a.ForeignTouched = append(a.ForeignTouched, "domain "+name+": gone")
		}
	}
}

// volumeLeak reports whether v, a volume of a pool holding vols and no
// foreign volume, is leaked, and why when its name does not say.
func volumeLeak(v string, vols []string, uids map[string]string) (why string, leaked bool) {
	switch {
	case isImageVolume(v):
		return " (no marker: never verified)", !slices.Contains(vols, v+".sha256")
	case isImageMarker(v):
		return " (marker without its volume)", !slices.Contains(vols, strings.TrimSuffix(v, ".sha256"))
	case isImageClaim(v):
		// An install's claim on a cached image (installs sharing a
		// pool): accounted for while its image is there. One left
		// without it outlived the prune that should have taken it, or a
		// failed upload whose KVMImage is gone.
		return " (claim without its image)", !slices.Contains(vols, imageClaimRE.FindStringSubmatch(v)[1])
	}
	uid, ok := domxml.VolumeOwnerUID(v)
	return "", !ok || uids[uid] == ""
}

// Image volumes are image-sha256_<64 hex>.<format>; markers add .sha256.
var imageVolumeRE = regexp.MustCompile(`^image-sha256_[0-9a-f]{64}\.(qcow2|raw)$`)

func isImageVolume(v string) bool { return imageVolumeRE.MatchString(v) }

// Claims are <image volume>.held-by-<install id> (pkg/provider/kvm/image).
var imageClaimRE = regexp.MustCompile(`^(image-sha256_[0-9a-f]{64}\.(?:qcow2|raw))\.held-by-[^/]+$`)

func isImageClaim(v string) bool { return imageClaimRE.MatchString(v) }

func isImageMarker(v string) bool {
	base, ok := strings.CutSuffix(v, ".sha256")
	return ok && isImageVolume(base)
}
