package gcp

import (
	"encoding/base64"
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/gcp/gcptest"
	"crawl.example.com/proxy-operator/pkg/provider/guestsquid"
	"crawl.example.com/proxy-operator/pkg/squid"
)

const squidPassword = "correct-horse-battery-staple-42"

func managedMachine() *provider.Machine {
	m := machine()
	m.Squid = &squid.Config{
		AllowedSourceCIDRs: []string{"198.51.100.0/24"},
		Auth:               squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: squidPassword},
	}
	return m
}

// The managed squid travels in startup-script (guestsquid's final stage);
// user-data stays the user's, byte for byte; the password is in no
// metadata value in clear.
func TestCreateDeliversTheManagedSquidAsStartupScript(t *testing.T) {
	srv := newServer(t)
	m := managedMachine()
	if _, err := newProvider(t, srv).Create(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	got, ok := srv.Instance(project, zone, InstanceName(m.Namespace, m.Name, m.UID))
	if !ok {
		t.Fatal("instance not created")
	}
	if ud := metadata(got, MetadataUserData); ud == nil || *ud != string(m.UserData) {
		t.Errorf("user-data not byte for byte: %v", ud)
	}
	script := metadata(got, MetadataStartupScript)
	if script == nil || !strings.HasPrefix(*script, "#!/bin/sh\n") || !strings.Contains(*script, "stage=final\n") {
		t.Fatalf("startup-script = %v, want guestsquid's final stage", script)
	}
	files, _, err := guestsquid.Render(m)
	if err != nil {
		t.Fatal(err)
	}
	// The same squid.conf, base64 in 76-column lines (the password
	// file's salt differs per render).
	enc := base64.StdEncoding.EncodeToString(files.Conf)
	if !strings.Contains(*script, "install_file \"$root/etc/squid/squid.conf\" 0644 root <<'PROXY_OPERATOR_EOF' || return 1\n"+enc[:76]+"\n") ||
		!strings.Contains(*script, "\n"+enc[(len(enc)-1)/76*76:]+"\nPROXY_OPERATOR_EOF\n") {
		t.Error("startup-script does not carry the managed squid.conf")
	}
	for _, it := range got.Metadata.Items {
		if it.Value != nil && strings.Contains(*it.Value, squidPassword) {
			t.Errorf("metadata %s holds the password in clear", it.Key)
		}
	}

	if strings.Contains(*script, guestsquid.CounterPath) {
		t.Error("without the operator's Stats credential the startup-script writes the upstream counter")
	}

	// Unmanaged: no startup-script.
	srv2 := newServer(t)
	if _, err := newProvider(t, srv2).Create(ctx(t), machine()); err != nil {
		t.Fatal(err)
	}
	got, _ = srv2.Instance(project, zone, InstanceName(m.Namespace, m.Name, m.UID))
	if metadata(got, MetadataStartupScript) != nil {
		t.Error("unmanaged instance got a startup-script")
	}
}

// With the operator's Stats credential, the startup script also writes the
// upstream counter squid.conf runs, executable, before squid.conf.
func TestStartupScriptDeliversTheUpstreamCounter(t *testing.T) {
	srv := newServer(t)
	m := managedMachine()
	// One bcrypt hash, not two: slow under the race detector.
	m.Squid.Auth = squid.Auth{Type: squid.AuthNone}
	m.Squid.Stats = squid.Auth{Type: squid.AuthBasic, Username: "proxy-operator-stats", Password: squidPassword + "-stats"}
	if _, err := newProvider(t, srv).Create(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	got, _ := srv.Instance(project, zone, InstanceName(m.Namespace, m.Name, m.UID))
	script := metadata(got, MetadataStartupScript)
	if script == nil {
		t.Fatal("no startup-script")
	}
	enc := base64.StdEncoding.EncodeToString(squid.UpstreamCounter)
	counter := strings.Index(*script, "install_file \"$root"+guestsquid.CounterPath+"\" 0755 root <<'PROXY_OPERATOR_EOF' || return 1\n"+enc[:76]+"\n")
	conf := strings.Index(*script, "install_file \"$root/etc/squid/squid.conf\"")
	if counter < 0 || conf < counter {
		t.Errorf("startup-script: counter written at %d (executable, the embedded program), squid.conf at %d: want the counter first", counter, conf)
	}
}

// The startup script runs on Debian's images too (google-guest-agent runs
// it), so a managed Proxy without user-data may use them; images without
// apt-get are refused, naming the field, before anything is inserted.
func TestManagedSquidImages(t *testing.T) {
	for image, wantRefused := range map[string]bool{
		DefaultImage: false,
		"projects/debian-cloud/global/images/family/debian-12":                          false,
		"projects/cos-cloud/global/images/family/cos-stable":                            true,
		"https://compute.googleapis.com/compute/v1/projects/rhel-cloud/global/images/x": true,
	} {
		srv := newServer(t)
		m := managedMachine()
		m.Image.URL, m.UserData = image, nil
		_, err := newProvider(t, srv).Create(ctx(t), m)
		switch {
		case wantRefused && (provider.Class(err) != provider.ClassPermanent || !strings.Contains(err.Error(), "spec.placement.image") || !strings.Contains(err.Error(), "apt-get")):
			t.Errorf("%s: %v, want a permanent error naming spec.placement.image", image, err)
		case wantRefused && srv.Count(gcptest.CallInsert) != 0:
			t.Errorf("%s: inserted anyway", image)
		case !wantRefused && err != nil:
			t.Errorf("%s: %v", image, err)
		}
	}
}

func TestInvalidManagedSquidIsPermanent(t *testing.T) {
	srv := newServer(t)
	m := managedMachine()
	m.Squid.Auth.Password = "short"
	_, err := newProvider(t, srv).Create(ctx(t), m)
	wantClass(t, err, provider.ClassPermanent)
	if !strings.Contains(err.Error(), "spec.access.auth.password") || strings.Contains(err.Error(), "short\"") {
		t.Errorf("error %q: want it to name the field and not show the password", err)
	}
	if srv.Count(gcptest.CallInsert) != 0 {
		t.Error("inserted anyway")
	}
}
