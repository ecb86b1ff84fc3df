package seed

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/guestsquid"
)

// scriptPathLine makes sure qemu-ga is found where Debian installs it
// (/usr/sbin) even when cloud-init runs us without sbin in PATH. Tests swap
// this exact line for a sandbox PATH.
const scriptPathLine = `PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/sbin:/sbin"; export PATH`

// GuestAgentScript is the vendor-data part that makes sure qemu-guest-agent
// runs in the guest, so the operator can read the VM's addresses from it.
//
// cloud-init runs it once per instance (scripts_vendor, in the final stage,
// once networking is up). It installs the agent only when the image lacks it,
// with whichever package manager the image has, bounds every package
// operation in time, and always exits 0: an offline guest or an unknown
// distro boots anyway and the operator falls back to DHCP leases.
const GuestAgentScript = `#!/bin/sh
# proxy-operator: make sure qemu-guest-agent is installed and running.
# Never fails the boot: it only logs what it could not do.
` + scriptPathLine + `

log() { echo "proxy-operator: $*" >&2; }

have_agent() {
	command -v qemu-ga >/dev/null 2>&1 && return 0
	if command -v dpkg-query >/dev/null 2>&1; then
		case "$(dpkg-query -W -f='${Status}' qemu-guest-agent 2>/dev/null)" in
		*" installed") return 0 ;;
		esac
	fi
	if command -v rpm >/dev/null 2>&1 && rpm -q qemu-guest-agent >/dev/null 2>&1; then
		return 0
	fi
	return 1
}

# bounded keeps a dead mirror from holding the boot for long.
bounded() {
	if command -v timeout >/dev/null 2>&1; then
		timeout 300 "$@"
	else
		"$@"
	fi
}

install_agent() {
	if command -v apt-get >/dev/null 2>&1; then
		DEBIAN_FRONTEND=noninteractive
		export DEBIAN_FRONTEND
		# A partly failed update (one dead repository) must not stop the
		# install; the install's own status is what counts.
		bounded apt-get -q -o DPkg::Lock::Timeout=120 update
		bounded apt-get -q -y -o DPkg::Lock::Timeout=120 install --no-install-recommends qemu-guest-agent
	elif command -v dnf >/dev/null 2>&1; then
		bounded dnf -q -y install qemu-guest-agent
	elif command -v yum >/dev/null 2>&1; then
		bounded yum -q -y install qemu-guest-agent
	elif command -v zypper >/dev/null 2>&1; then
		bounded zypper --non-interactive --quiet install qemu-guest-agent
	elif command -v apk >/dev/null 2>&1; then
		bounded apk add qemu-guest-agent
	else
		log "no known package manager"
		return 1
	fi
}

start_agent() {
	if command -v systemctl >/dev/null 2>&1; then
		# Debian's unit has no [Install] section (udev starts it when the
		# virtio port appears), so enable may refuse; start is what matters.
		systemctl enable qemu-guest-agent >/dev/null 2>&1
		systemctl start qemu-guest-agent
	elif command -v rc-service >/dev/null 2>&1; then
		rc-update add qemu-guest-agent default >/dev/null 2>&1
		rc-service qemu-guest-agent start
	elif command -v service >/dev/null 2>&1; then
		service qemu-guest-agent start
	else
		log "no service manager found"
		return 1
	fi
}

if have_agent; then
	log "qemu-guest-agent is installed"
elif install_agent; then
	log "qemu-guest-agent installed"
else
	log "could not install qemu-guest-agent (offline?); continuing without it"
	exit 0
fi
start_agent || log "could not start qemu-guest-agent"
exit 0
`

// part is one vendor-data part the operator adds.
type part struct {
	// contentType is text/x-shellscript (final stage, once per instance)
	// or text/cloud-boothook (init stage, every boot).
	contentType string
	filename    string
	body        string
}

var guestAgentPart = part{"text/x-shellscript", "proxy-operator-guest-agent.sh", GuestAgentScript}

// squidParts deliver the managed squid (see guestsquid): a boothook that
// writes the files in cloud-init's init stage, before Debian's
// squid.service may start (it is ordered after network-online.target, which
// that stage comes before), and a final-stage script that installs squid
// when the image lacks it and starts it once. The boothook's body keeps
// its own shebang: cloud-init strips the "#cloud-boothook" line and runs
// the rest as a program.
func squidParts(f guestsquid.Files) []part {
	return []part{
		{"text/cloud-boothook", "proxy-operator-squid-files.sh", "#cloud-boothook\n" + guestsquid.Script(f, guestsquid.Early)},
		{"text/x-shellscript", "proxy-operator-squid.sh", guestsquid.Script(f, guestsquid.Final)},
	}
}

// VendorData returns the vendor-data for a Proxy whose squid the user's
// cloud-init owns: the guest-agent installer (with installGuestAgent) and
// the user's vendor-data; see compose.
func VendorData(installGuestAgent bool, userVendorData []byte) []byte {
	var parts []part
	if installGuestAgent {
		parts = append(parts, guestAgentPart)
	}
	return compose(parts, userVendorData)
}

// MachineVendorData is the vendor-data of m: for a managed squid
// (m.Squid) its parts first, then the guest-agent installer when asked,
// then the user's vendor-data. Errors (an invalid managed config) are
// permanent.
func MachineVendorData(m *provider.Machine) ([]byte, error) {
	files, managed, err := guestsquid.Render(m)
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	var parts []part
	if managed {
		// cloud-init's final stage runs the scripts sorted by file name:
		// the guest agent's before squid's, so the address is known while
		// squid installs where it must.
		parts = squidParts(files)
	}
	if m.InstallGuestAgent {
		parts = append(parts, guestAgentPart)
	}
	return compose(parts, m.VendorData), nil
}

// compose returns the operator's parts and the user's vendor-data as one
// document.
//
// Without parts it is exactly userVendorData (nil when empty). One part and
// no user vendor-data is that part's body alone (cloud-init recognises it
// by its first line). Otherwise all travel as a MIME multipart/mixed
// document that cloud-init splits into its parts, the operator's first;
// the user's part means to cloud-init what it would mean on its own (see
// userPart). Like all vendor-data, the parts are skipped when the user's
// user-data disables vendor-data (vendor_data: {enabled: false});
// user-data itself is never touched.
func compose(parts []part, userVendorData []byte) []byte {
	switch {
	case len(parts) == 0 && len(userVendorData) == 0:
		return nil
	case len(parts) == 0:
		return userVendorData
	case len(parts) == 1 && len(userVendorData) == 0:
		return []byte(parts[0].body)
	}

	var user []byte
	if len(userVendorData) > 0 {
		user = userPart(userVendorData)
	}
	boundary := boundaryFor(parts, user)

	var b bytes.Buffer
	// cloud-init treats vendor-data as MIME only when "mime-version:" occurs
	// in its first 4096 bytes (user_data.convert_string), so it comes first.
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=%q\n", boundary)
	b.WriteString("MIME-Version: 1.0\n")
	for _, p := range parts {
		fmt.Fprintf(&b, "\n--%s\n", boundary)
		fmt.Fprintf(&b, "Content-Type: %s; charset=\"us-ascii\"\n", p.contentType)
		b.WriteString("Content-Transfer-Encoding: 7bit\n")
		fmt.Fprintf(&b, "Content-Disposition: attachment; filename=%q\n\n", p.filename)
		// The line break before a delimiter belongs to the delimiter (RFC
		// 2046 5.1.1; Python's feedparser strips exactly one), so each body
		// keeps its own final newline.
		b.WriteString(p.body)
	}
	if user != nil {
		fmt.Fprintf(&b, "\n--%s\n", boundary)
		b.Write(user)
	}
	fmt.Fprintf(&b, "\n--%s--\n", boundary)
	return b.Bytes()
}

// userPart returns the user's vendor-data as one MIME entity (headers, blank
// line, body) that cloud-init reads back as exactly the user's bytes and
// handles as it would the same vendor-data on its own ("Vendor-data is
// handled exactly like user-data", cloud-init doc/rtd/explanation/
// vendordata.rst). From cloud-init's source (cloudinit/user_data.py,
// handlers/__init__.py, util.py; same in 22.4 and 2026 main):
//
//   - UserDataProcessor._process_msg re-sniffs a part whose type is in
//     TYPE_NEEDED ("text/plain", "text/x-not-multipart") with
//     handlers.type_from_starts_with, which maps a leading "#cloud-config",
//     "#!", "## template: jinja", "#include", "#cloud-boothook",
//     "#part-handler", ... (INCLUSION_TYPES_MAP) to its handler, exactly as
//     for a bare document. So the user's part is declared text/plain, never
//     a type we guessed.
//   - A document cloud-init would itself read as MIME (convert_string:
//     "mime-version:" in the first 4096 bytes) is embedded verbatim as a
//     nested entity, headers included: msg.walk() descends into it and
//     is_skippable() passes over multipart containers, so each of the
//     user's parts is processed as if it stood alone.
//   - gzip is declared application/x-gzip, one of DECOMP_TYPES: cloud-init
//     gunzips the part, then sniffs the result as text/plain.
//
// Bodies travel raw when they are plain 7-bit text (printable ASCII, tabs,
// LF). Anything else is base64: convert_string decodes the whole document as
// UTF-8 before parsing, and Python's email get_payload(decode=True) then
// hands an 8bit non-ASCII body back re-encoded with raw-unicode-escape,
// which corrupts UTF-8 text ("é" arrives as "\udce9"), whereas a base64 body
// is decoded by that same call (util.fully_decoded_payload) to the exact
// bytes. Checked by running cloud-init's parser on this output (see
// cloudinit_test.go, build tag cloudinit).
func userPart(data []byte) []byte {
	var b bytes.Buffer
	switch {
	case isGzip(data):
		b.WriteString("Content-Type: application/x-gzip\n")
		b.WriteString("Content-Transfer-Encoding: base64\n\n")
		writeBase64(&b, data)
	case isMIME(data):
		b.Write(data)
	case isPlain7bit(data):
		b.WriteString("Content-Type: text/plain; charset=\"us-ascii\"\n")
		b.WriteString("Content-Transfer-Encoding: 7bit\n\n")
		b.Write(data)
	default:
		b.WriteString("Content-Type: text/plain; charset=\"utf-8\"\n")
		b.WriteString("Content-Transfer-Encoding: base64\n\n")
		writeBase64(&b, data)
	}
	return b.Bytes()
}

func isGzip(data []byte) bool {
	return len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b
}

// isMIME mirrors cloud-init's own test in user_data.convert_string.
func isMIME(data []byte) bool {
	head := data[:min(len(data), 4096)]
	return bytes.Contains(bytes.ToLower(head), []byte("mime-version:"))
}

func isPlain7bit(data []byte) bool {
	for _, c := range data {
		if c != '\t' && c != '\n' && (c < 0x20 || c > 0x7e) {
			return false
		}
	}
	return true
}

// writeBase64 writes data in 76-column lines (RFC 2045 6.8).
func writeBase64(b *bytes.Buffer, data []byte) {
	enc := base64.StdEncoding.EncodeToString(data)
	for len(enc) > 76 {
		b.WriteString(enc[:76])
		b.WriteByte('\n')
		enc = enc[76:]
	}
	b.WriteString(enc)
}

// boundaryFor returns a MIME boundary that occurs in no part. It is
// derived from the content, so the same input always yields the same
// vendor-data and seed contents.
func boundaryFor(parts []part, user []byte) string {
	sum := sha256.New()
	bodies := [][]byte{user}
	for _, p := range parts {
		sum.Write([]byte(p.body))
		bodies = append(bodies, []byte(p.body))
	}
	sum.Write(user)
	return pickBoundary(hex.EncodeToString(sum.Sum(nil))[:32], bodies...)
}

func pickBoundary(seed string, bodies ...[]byte) string {
	for i := 0; ; i++ {
		boundary := "==proxy-operator-" + seed + "-" + strconv.Itoa(i) + "=="
		clash := false
		for _, b := range bodies {
			clash = clash || bytes.Contains(b, []byte(boundary))
		}
		if !clash {
			return boundary
		}
	}
}
