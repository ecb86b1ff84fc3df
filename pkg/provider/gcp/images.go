package gcp

import "strings"

// imageProjectsWithoutCloudInit are Google's public image projects whose
// images run google-guest-agent and no cloud-init: the agent honours only
// startup-script metadata, so user-data would be written and never run.
// (Debian's GCE images install cloud-init for EC2 only; Google's EL and
// Windows images never had it.) Ubuntu (ubuntu-os-cloud, ubuntu-os-pro-cloud)
// and Container-Optimized OS (cos-cloud) run cloud-init from user-data.
var imageProjectsWithoutCloudInit = map[string]string{
	"debian-cloud":      "Debian",
	"centos-cloud":      "CentOS",
	"rhel-cloud":        "RHEL",
	"rocky-linux-cloud": "Rocky Linux",
	"windows-cloud":     "Windows",
}

// CloudInitUnsupported says why image cannot apply cloud-init user-data,
// or "" when it can (or is not known not to). image is a source image as
// Proxy spec.placement.image takes it.
func CloudInitUnsupported(image string) string {
	if distro, project := imageDistro(image, imageProjectsWithoutCloudInit); distro != "" {
		return distro + " images from " + project + " run no cloud-init (only the guest agent's startup-script), so cloudInit would never be applied; use an image with cloud-init, e.g. " + DefaultImage
	}
	return ""
}

// imageProjectsWithoutApt are Google's public image projects whose images
// cannot run the managed squid's startup script, which installs Debian's
// squid with apt-get and writes Debian's paths: EL (dnf, other paths),
// Windows, and Container-Optimized OS (no package manager).
var imageProjectsWithoutApt = map[string]string{
	"centos-cloud":      "CentOS",
	"rhel-cloud":        "RHEL",
	"rocky-linux-cloud": "Rocky Linux",
	"windows-cloud":     "Windows",
	"cos-cloud":         "Container-Optimized OS",
}

// ManagedSquidUnsupported says why image cannot run the operator-managed
// squid, or "" when it can (Debian and Ubuntu images, or not known not to).
func ManagedSquidUnsupported(image string) string {
	if distro, project := imageDistro(image, imageProjectsWithoutApt); distro != "" {
		return distro + " images from " + project + " cannot run the managed squid (its startup script installs Debian's squid with apt-get); use a Debian or Ubuntu image, e.g. " + DefaultImage
	}
	return ""
}

// imageDistro looks the image's project up in projects.
func imageDistro(image string, projects map[string]string) (distro, project string) {
	for _, prefix := range []string{"https://www.googleapis.com/compute/v1/", "https://compute.googleapis.com/compute/v1/"} {
		image = strings.TrimPrefix(image, prefix)
	}
	rest, ok := strings.CutPrefix(image, "projects/")
	if !ok {
		return "", ""
	}
	project, _, _ = strings.Cut(rest, "/")
	return projects[project], project
}
