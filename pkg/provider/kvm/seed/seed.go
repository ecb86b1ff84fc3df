// Package seed builds the cloud-init NoCloud seed ISO a proxy VM boots with.
//
// The ISO is a plain ISO 9660 volume labelled "cidata" holding meta-data,
// user-data, vendor-data and, for a static address, network-config at its
// root, the files NoCloud reads (user-data and meta-data are required, the
// others optional).
//
// github.com/kdomanski/iso9660 v0.4 writes neither Joliet nor Rock Ridge, so
// the guest sees the ISO 9660 identifiers themselves. Its writer lower-cases
// names and keeps '-' (a d1-character), recording "meta-data;1"; Linux isofs,
// with its default map=normal, drops the ";1" (fs/isofs/dir.c,
// isofs_name_translate), so cloud-init finds "meta-data" where NoCloud looks.
// blkid reports LABEL="cidata" from the primary volume descriptor. Tests pin
// the names down with the library's reader and, where installed, isoinfo;
// libisofs (xorriso) reads the same names.
//
// User content is never parsed or rewritten: user-data lands in the ISO byte
// for byte, whatever its format.
package seed

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/kdomanski/iso9660"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// VolumeLabel is the ISO volume identifier NoCloud looks for; cloud-init
// matches it as "cidata" or "CIDATA".
const VolumeLabel = "cidata"

// Names of the files at the root of the seed.
const (
	MetaDataFile   = "meta-data"
	UserDataFile   = "user-data"
	VendorDataFile = "vendor-data"
)

// Input is what goes into a seed.
type Input struct {
	// InstanceID is meta-data's instance-id: the Proxy UID. cloud-init runs
	// its per-instance work again whenever it changes.
	InstanceID string
	// Hostname is meta-data's local-hostname: the Proxy name. Optional.
	Hostname string
	// UserData is written byte for byte; empty is allowed (the file is still
	// written because NoCloud requires user-data to exist).
	UserData []byte
	// VendorData is written byte for byte; see VendorData to compose it.
	VendorData []byte
	// NetworkConfig, when not empty, is written as network-config (see
	// NetworkConfig); without it the guest's cloud-init falls back to DHCP
	// on its first NIC.
	NetworkConfig []byte
}

// ForMachine returns the seed input for a Machine: instance-id is its UID,
// local-hostname its name, user-data the user's byte for byte, vendor-data
// the user's plus the managed squid's parts and, when asked, the
// guest-agent installer (MachineVendorData). An invalid managed squid
// config is a permanent error.
func ForMachine(m *provider.Machine) (Input, error) {
	vd, err := MachineVendorData(m)
	if err != nil {
		return Input{}, err
	}
	return Input{
		InstanceID: m.UID,
		Hostname:   m.Name,
		UserData:   m.UserData,
		VendorData: vd,
	}, nil
}

// Build returns the seed ISO image for in.
//
// The iso9660 writer stages the files in a fresh directory under
// os.TempDir() (so $TMPDIR decides where; the library offers no other way to
// place it) and Build removes it before returning, whatever happens. Staging
// needs about the size of the files; the image itself is built in memory.
// Errors are classified: bad input is permanent, I/O is transient.
func Build(in Input) (iso []byte, err error) {
	if in.InstanceID == "" {
		return nil, provider.Permanentf("seed: instance-id is empty")
	}

	w, err := iso9660.NewWriter()
	if err != nil {
		return nil, provider.Transientf("seed: creating staging directory in %s: %w", os.TempDir(), err)
	}
	defer func() {
		// A leaked staging directory would slowly fill the manager's small
		// /tmp, so a failed cleanup is an error even when the image is fine.
		if cerr := w.Cleanup(); cerr != nil {
			iso = nil
			err = errors.Join(err, provider.Transientf("seed: removing staging directory: %w", cerr))
		}
	}()

	files := []struct {
		name string
		data []byte
	}{
		{MetaDataFile, MetaData(in.InstanceID, in.Hostname)},
		{UserDataFile, in.UserData},
		{VendorDataFile, in.VendorData},
	}
	if len(in.NetworkConfig) > 0 {
		files = append(files, struct {
			name string
			data []byte
		}{NetworkConfigFile, in.NetworkConfig})
	}
	for _, f := range files {
		if err := w.AddFile(bytes.NewReader(f.data), f.name); err != nil {
			return nil, provider.Transientf("seed: staging %s: %w", f.name, err)
		}
	}

	var buf bytes.Buffer
	if err := w.WriteTo(&buf, VolumeLabel); err != nil {
		return nil, provider.Transientf("seed: writing ISO image: %w", err)
	}
	return buf.Bytes(), nil
}

// MetaData returns the NoCloud meta-data document. Values are YAML
// double-quoted scalars: strconv.Quote only emits escapes YAML shares (\" \\
// \n \t \xNN \uNNNN ...), so any name, however odd, stays valid YAML and
// cannot inject keys.
func MetaData(instanceID, hostname string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "instance-id: %s\n", strconv.Quote(instanceID))
	if hostname != "" {
		fmt.Fprintf(&b, "local-hostname: %s\n", strconv.Quote(hostname))
	}
	return b.Bytes()
}
