// Package infra_test checks the e2e guest image's recipe (guest-image.sh)
// without building it: what can be checked against a real tool on the build
// machine, so a mistake fails `make test` instead of showing up as a warning
// in a guest's log.
package infra_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// imageCloudConfigs returns every cloud.cfg.d file guest-image.sh writes
// into the image (from its `cat >".../etc/cloud/cloud.cfg.d/NAME" <<'EOF'`
// here-documents), keyed by name.
func imageCloudConfigs(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("guest-image.sh")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	configs := map[string]string{}
	var name string
	var body strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case name != "" && line == "EOF":
			configs[name] = body.String()
			name = ""
			body.Reset()
		case name != "":
			body.WriteString(line + "\n")
		case strings.Contains(line, "/etc/cloud/cloud.cfg.d/") && strings.HasSuffix(line, "<<'EOF'"):
			i := strings.Index(line, "/etc/cloud/cloud.cfg.d/") + len("/etc/cloud/cloud.cfg.d/")
			name = strings.TrimRight(strings.Fields(line[i:])[0], `"`)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if name != "" {
		t.Fatalf("guest-image.sh: here-document for %s has no closing EOF", name)
	}
	return configs
}

// The guest's cloud-init validates its merged config against its schema
// and, on an error, only logs "Invalid cloud-config provided" and goes on:
// a key it then ignores, or a value it reads differently, is never
// reported. So the image's own files must pass Debian's cloud-init (the
// version the image installs, from hack/test-deps.sh) `schema` check.
func TestGuestImageCloudConfigIsValid(t *testing.T) {
	cloudInit, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Fatal("cloud-init not found: apt-get install cloud-init (hack/test-deps.sh installs it)")
	}
	configs := imageCloudConfigs(t)
	if !strings.Contains(configs["90-e2e-image.cfg"], "datasource_list:") {
		t.Fatalf("guest-image.sh: no 90-e2e-image.cfg with a datasource_list found (found %d cloud.cfg.d files)", len(configs))
	}
	for name, body := range configs {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), name)
			if err := os.WriteFile(path, []byte("#cloud-config\n"+body), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(cloudInit, "schema", "--config-file", path).CombinedOutput()
			if err != nil {
				t.Errorf("cloud-init schema rejects the image's %s: %v\n%s\n%s", name, err, out, body)
			}
		})
	}
}
