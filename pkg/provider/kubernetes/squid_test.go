package kubernetes

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/squid"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// The package's tests run in a network namespace holding only lo: the
// squid tests below ask for private destinations and check the refusal.
func TestMain(m *testing.M) { squidtest.Main(m) }

func TestRunsInIsolatedNetworkNamespace(t *testing.T) { squidtest.RequireOnlyLoopback(t) }

const (
	squidClient   = "127.0.0.1"
	squidStranger = "127.0.0.2"
	squidUser     = "Crawler"
	squidPassword = "correct-horse-battery-staple-42"
)

// managedMachine is machine() with a managed squid for loopback clients:
// 127.0.0.1 may use it with the credential, origin is an allowed
// destination (exception and port).
func managedMachine(origin *squidtest.Origin) *provider.Machine {
	m := machine()
	m.Squid = &squid.Config{
		AllowedSourceCIDRs:           []string{squidClient + "/32"},
		Auth:                         squid.Auth{Type: squid.AuthBasic, Username: squidUser, Password: squidPassword},
		AllowedPorts:                 []int{80, 443, origin.Port()},
		AllowedDestinationExceptions: []string{origin.Host() + "/32"},
	}
	return m
}

// runPod runs what Create put in the API for m the way the pod runs it:
// the container's command line; the ConfigMap's squid.conf at ConfigPath
// and the Secret's password file under AuthDir (root-owned, read-only,
// the Secret as the kubelet writes it with fsGroup 13: root:13, 0440);
// the state emptyDir the only writable path on a read-only root; uid and
// gid SquidUID with no capabilities and no_new_privs.
func runPod(t *testing.T, c client.Client, m *provider.Machine) *squidtest.Squid {
	t.Helper()
	ctx := context.Background()
	k := podKey(m)
	var pod corev1.Pod
	var cm corev1.ConfigMap
	for _, obj := range []client.Object{&pod, &cm} {
		if err := c.Get(ctx, k, obj); err != nil {
			t.Fatal(err)
		}
	}
	dir := squidtest.TempDir(t)
	etc, state := filepath.Join(dir, "etc-squid"), filepath.Join(dir, "state")
	for _, d := range []string{etc, filepath.Join(etc, "auth"), state} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	uid := int(SquidUID)
	if err := os.Chown(state, uid, uid); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, filepath.Base(ConfigPath)), []byte(cm.Data[ConfigKey]), 0o444); err != nil {
		t.Fatal(err)
	}
	mounts := map[string]bool{}
	for _, vm := range pod.Spec.Containers[0].VolumeMounts {
		mounts[vm.MountPath] = true
	}
	var secret corev1.Secret
	if err := c.Get(ctx, k, &secret); err == nil {
		if !mounts[AuthDir] {
			t.Fatalf("the pod does not mount the Secret at %s: %+v", AuthDir, pod.Spec.Containers[0].VolumeMounts)
		}
		pw := filepath.Join(etc, "auth", PasswordKey)
		if err := os.WriteFile(pw, secret.Data[PasswordKey], 0o440); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(pw, 0, uid); err != nil {
			t.Fatal(err)
		}
	}
	if !mounts[ConfigPath] || !mounts[StateDir] {
		t.Fatalf("the pod mounts %v, want %s and %s", mounts, ConfigPath, StateDir)
	}
	return squidtest.Start(t, squidtest.Options{
		Dir:      dir,
		Command:  pod.Spec.Containers[0].Command,
		ConfPath: ConfigPath,
		Mounts: []squidtest.Mount{
			{Source: etc, Target: filepath.Dir(ConfigPath), ReadOnly: true},
			{Source: state, Target: StateDir},
		},
		ReadOnlyRoot: true,
		User:         &squidtest.Credential{UID: uid, GID: uid},
		AccessLog:    "stdout",
		Listen:       fmt.Sprintf("127.0.0.1:%d", port(m)),
	})
}

// TestManagedSquidAsThePodRunsIt proves the managed squid.conf and
// password file Create stores, as the pod mounts and runs them, against
// Debian's squid: the access policy of issue 14 (squidtest.CheckManagedPolicy)
// and the container contract of docs/providers.md.
func TestManagedSquidAsThePodRunsIt(t *testing.T) {
	origin := squidtest.NewOrigin(t, "127.0.0.44:0")
	c := newFake(t)
	m := managedMachine(origin)
	if _, err := newProvider(c).Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	s := runPod(t, c, m)

	squidtest.CheckManagedPolicy(t, s, squidtest.Policy{
		Client: squidClient, Stranger: squidStranger, Username: squidUser, Password: squidPassword, Origin: origin,
	})
	requireContainerContract(t, s)
}

// TestUnmanagedSquidKeepsTheBuiltInPolicy runs an unmanaged Proxy's
// config (no credential, the provider's client ranges) the same way: no
// 407, clients outside the ranges and private destinations refused.
func TestUnmanagedSquidKeepsTheBuiltInPolicy(t *testing.T) {
	c := newFake(t)
	m := machine()
	if _, err := New(c, Options{AllowedClientCIDRs: []string{squidClient + "/32"}}).Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	s := runPod(t, c, m)
	for _, dst := range []string{"http://10.1.2.3/", "http://169.254.169.254/", "http://127.0.0.1:9/"} {
		squidtest.RequireRefusedBeforeConnecting(t, s, s.Request(t, squidClient, http.MethodGet, dst, ""), http.MethodGet, dst)
	}
	squidtest.RequireRefusedBeforeConnecting(t, s, s.Request(t, squidClient, http.MethodConnect, "192.0.2.1:22", ""), http.MethodConnect, "192.0.2.1:22")
	if r := s.Request(t, squidStranger, http.MethodGet, "http://192.0.2.1/", ""); r.Status != http.StatusForbidden {
		t.Errorf("client outside the ranges: %d, want 403", r.Status)
	}
	requireContainerContract(t, s)
}

// requireContainerContract: squid runs as the unprivileged user without
// capabilities, wrote its pid file to the state directory, logged no
// problem, and stops on SIGTERM well inside the pod's grace period.
func requireContainerContract(t *testing.T, s *squidtest.Squid) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		f := strings.Fields(l)
		if len(f) > 1 && (f[0] == "Uid:" && f[1] != fmt.Sprint(SquidUID) || f[0] == "CapEff:" && f[1] != "0000000000000000") {
			t.Errorf("squid runs with %s", l)
		}
	}
	if !strings.Contains(s.ReadStdout(), "TCP_DENIED/403") {
		t.Errorf("the access log did not reach stdout:\n%s", s.Output())
	}
	if _, err := os.Stat(filepath.Join(s.Dir, "state", "squid.pid")); err != nil {
		t.Errorf("no pid file in the state directory: %v", err)
	}
	grace := 10 * time.Second // the pod's terminationGracePeriodSeconds
	d := s.Stop(t, grace)
	t.Logf("squid stopped %s after SIGTERM", d.Round(100*time.Millisecond))
	var problems []string
	for _, p := range squidtest.Problems(s.ReadStderr()) {
		// Unprivileged squid tries to regain root before starting each
		// auth helper, as a matter of course; nothing is wrong.
		if !strings.Contains(p, "WARNING: no_suid: setuid(0): (1) Operation not permitted") {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		t.Errorf("squid logged problems:\n%s", strings.Join(problems, "\n"))
	}
}
