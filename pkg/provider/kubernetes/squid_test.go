package kubernetes

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
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

// podRun is a squid running what Create put in the API, as the pod runs
// it; its ConfigMap directory can be brought up to date (sync) as the
// kubelet does when the ConfigMap changes.
type podRun struct {
	*squidtest.Squid
	config *squidtest.KubeletDir
	volume *corev1.ConfigMapVolumeSource
}

// runPod runs what Create put in the API for m the way the pod runs it:
// the container's command line (squid behind its reloader); the
// ConfigMap at ConfigDir as the kubelet mounts it (a directory whose files
// change all at once) and the Secret's password file under AuthDir
// (root-owned, read-only, the Secret as the kubelet writes it with
// fsGroup 13: root:13, 0440); the state emptyDir the only writable path on
// a read-only root; uid and gid SquidUID with no capabilities and
// no_new_privs. extra mounts go on top (an image's file replaced).
func runPod(t *testing.T, c client.Client, m *provider.Machine, extra ...squidtest.Mount) *podRun {
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
	// etc stands for the image's /etc/squid, with the mounts in it.
	dir := squidtest.TempDir(t)
	etc, state := filepath.Join(dir, "etc-squid"), filepath.Join(dir, "state")
	for _, d := range []string{etc, filepath.Join(etc, filepath.Base(ConfigDir)), filepath.Join(etc, "auth"), state} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	uid := int(SquidUID)
	if err := os.Chown(state, uid, uid); err != nil {
		t.Fatal(err)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, vm := range pod.Spec.Containers[0].VolumeMounts {
		mounts[vm.MountPath] = vm
	}
	run := &podRun{volume: configMapVolume(t, &pod, mounts[ConfigDir].Name), config: &squidtest.KubeletDir{Dir: filepath.Join(etc, filepath.Base(ConfigDir))}}
	run.project(t, &cm)
	var secret corev1.Secret
	if err := c.Get(ctx, k, &secret); err == nil {
		if _, ok := mounts[AuthDir]; !ok {
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
	if vm, ok := mounts[ConfigDir]; !ok || vm.SubPath != "" || mounts[StateDir].Name == "" {
		t.Fatalf("the pod mounts %v, want the ConfigMap as the directory %s, and %s", mounts, ConfigDir, StateDir)
	}
	if filepath.Dir(ConfigDir) != filepath.Dir(AuthDir) || filepath.Dir(ConfigPath) != ConfigDir {
		t.Fatalf("the layout changed: %s, %s and %s are not where etc is mounted", ConfigDir, AuthDir, ConfigPath)
	}
	run.Squid = squidtest.Start(t, squidtest.Options{
		Dir:      dir,
		Command:  pod.Spec.Containers[0].Command,
		Parse:    []string{"squid", "-k", "parse", "-f", ConfigPath},
		ConfPath: ConfigPath,
		Mounts: append([]squidtest.Mount{
			{Source: etc, Target: filepath.Dir(ConfigDir), ReadOnly: true},
			{Source: state, Target: StateDir},
		}, extra...),
		ReadOnlyRoot: true,
		User:         &squidtest.Credential{UID: uid, GID: uid},
		AccessLog:    "stdout",
		Listen:       fmt.Sprintf("127.0.0.1:%d", port(m)),
	})
	return run
}

func configFiles(cm *corev1.ConfigMap) map[string][]byte {
	files := map[string][]byte{}
	for k, v := range cm.Data {
		files[k] = []byte(v)
	}
	return files
}

// configMapVolume is the pod's ConfigMap volume called name.
func configMapVolume(t *testing.T, pod *corev1.Pod, name string) *corev1.ConfigMapVolumeSource {
	t.Helper()
	for _, v := range pod.Spec.Volumes {
		if v.Name == name && v.ConfigMap != nil {
			return v.ConfigMap
		}
	}
	t.Fatalf("the pod has no ConfigMap volume %q: %+v", name, pod.Spec.Volumes)
	return nil
}

// project lays out cm's files as the kubelet projects the pod's volume:
// its items only when it lists some (a listed key cm lacks fails the
// mount), each with its item's mode, else the volume's default mode,
// else 0644.
func (r *podRun) project(t *testing.T, cm *corev1.ConfigMap) {
	t.Helper()
	all := configFiles(cm)
	files, modes := all, map[string]os.FileMode{}
	mode := os.FileMode(0o644)
	if r.volume.DefaultMode != nil {
		mode = os.FileMode(*r.volume.DefaultMode)
	}
	if len(r.volume.Items) > 0 {
		files = map[string][]byte{}
		for _, item := range r.volume.Items {
			data, ok := all[item.Key]
			if !ok {
				t.Fatalf("the pod projects key %q, which the ConfigMap lacks: the kubelet would not mount it", item.Key)
			}
			files[item.Path] = data
			if item.Mode != nil {
				modes[item.Path] = os.FileMode(*item.Mode)
			}
		}
	}
	if err := r.config.SwapModes(files, func(key string) os.FileMode {
		if m, ok := modes[key]; ok {
			return m
		}
		return mode
	}); err != nil {
		t.Fatal(err)
	}
}

// sync brings the mounted ConfigMap up to what the API holds, as the
// kubelet does some time after it changed.
func (r *podRun) sync(t *testing.T, c client.Client, m *provider.Machine) {
	t.Helper()
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), podKey(m), &cm); err != nil {
		t.Fatal(err)
	}
	r.project(t, &cm)
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

	squidtest.CheckManagedPolicy(t, s.Squid, squidtest.Policy{
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
		squidtest.RequireRefusedBeforeConnecting(t, s.Squid, s.Request(t, squidClient, http.MethodGet, dst, ""), http.MethodGet, dst)
	}
	squidtest.RequireRefusedBeforeConnecting(t, s.Squid, s.Request(t, squidClient, http.MethodConnect, "192.0.2.1:22", ""), http.MethodConnect, "192.0.2.1:22")
	if r := s.Request(t, squidStranger, http.MethodGet, "http://192.0.2.1/", ""); r.Status != http.StatusForbidden {
		t.Errorf("client outside the ranges: %d, want 403", r.Status)
	}
	requireContainerContract(t, s)
}

// requireContainerContract: squid runs as the unprivileged user without
// capabilities, wrote its pid file to the state directory, logged no
// problem, and stops on SIGTERM well inside the pod's grace period.
func requireContainerContract(t *testing.T, s *podRun) {
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

// clusterOrigins listen on port 80 at addresses of issue 25's cluster
// (gkeCluster) and at a global address outside it, each put on lo in the
// test's network namespace, so whatever squid lets through stays on this
// machine and is counted.
func clusterOrigins(t *testing.T) map[string]*squidtest.Origin {
	t.Helper()
	origins := map[string]*squidtest.Origin{}
	for _, a := range []string{
		"34.118.224.1",        // the kubernetes Service (ServiceCIDR 34.118.224.0/20)
		"34.118.0.5",          // a pod in n2's global pod range
		"2600:1900:4000:1::5", // a pod in n2's IPv6 pod range
		"35.0.0.5",            // n1's external address
		"34.118.16.1",         // none of the cluster's: must stay reachable
	} {
		addr := netip.MustParseAddr(a)
		squidtest.AddLoopbackAddress(t, addr)
		origins[a] = squidtest.NewOrigin(t, netip.AddrPortFrom(addr, 80).String())
	}
	return origins
}

// clusterMachine is a managed Proxy for the loopback client, with nothing
// of its own that would refuse the cluster's global ranges.
func clusterMachine() *provider.Machine {
	m := machine()
	m.Squid = &squid.Config{
		AllowedSourceCIDRs: []string{squidClient + "/32"},
		Auth:               squid.Auth{Type: squid.AuthBasic, Username: squidUser, Password: squidPassword},
	}
	return m
}

func discovered(t *testing.T, c client.Client) *ClusterRanges {
	t.Helper()
	r := NewClusterRanges(c, c)
	if _, _, _, err := r.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// Issue 25: on a cluster whose Service range (34.118.224.0/20, the API
// server at 34.118.224.1) and pod ranges (Class E, global IPv4 and IPv6)
// are not private, the squid the provider ships refuses them all, and the
// nodes' addresses, before connecting (403), and no origin there is
// reached; a global address outside the cluster is. The global ranges are
// in no default list: only discovery refuses them.
func TestSquidRefusesTheDiscoveredClusterRanges(t *testing.T) {
	origins := clusterOrigins(t)
	c := newFake(t, gkeCluster()...)
	m := clusterMachine()
	if _, err := New(c, Options{ClusterRanges: discovered(t, c)}).Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	s := runPod(t, c, m)
	creds := squidUser + ":" + squidPassword

	if r := s.Request(t, squidClient, http.MethodGet, "http://34.118.16.1/", creds); r.Status != http.StatusNoContent || len(origins["34.118.16.1"].Requests()) != 1 {
		t.Fatalf("a global address outside the cluster: %d %s, want 204 from its origin", r.Status, r.SquidError)
	}
	for _, tc := range []struct{ method, target string }{
		{http.MethodGet, "http://34.118.224.1/"},
		{http.MethodConnect, "34.118.224.1:443"}, // the API server, through its ClusterIP
		{http.MethodGet, "http://34.118.230.17/"},
		{http.MethodGet, "http://34.118.0.5/"},
		{http.MethodGet, "http://240.16.0.5/"},
		{http.MethodGet, "http://[2600:1900:4000:1::5]/"},
		{http.MethodGet, "http://35.0.0.5/"},
		{http.MethodGet, "http://10.128.0.5/"},
		{http.MethodGet, "http://[64:ff9b::2276:e001]/"}, // 34.118.224.1 behind NAT64
	} {
		squidtest.RequireRefusedBeforeConnecting(t, s.Squid, s.Request(t, squidClient, tc.method, tc.target, creds), tc.method, tc.target)
	}
	for a, o := range origins {
		if n := len(o.Requests()); a != "34.118.16.1" && n != 0 {
			t.Errorf("origin at %s reached %d times", a, n)
		}
	}
	requireContainerContract(t, s)
}

// The ranges change while the pod runs (a node with a global pod range
// joins): the provider rewrites the ConfigMap and the NetworkPolicy, not
// the pod; once the kubelet has updated the mounted files, the squid in
// the pod re-reads them by itself (its reloader) and refuses the new
// range, still running as the same process.
func TestClusterRangesReachARunningSquid(t *testing.T) {
	origins := clusterOrigins(t)
	objs, joining := gkeClusterBefore("n2")
	c := newFake(t, objs...)
	ranges := discovered(t, c)
	p := New(c, Options{ClusterRanges: ranges}).(*Provider)
	m := clusterMachine()
	ctx := context.Background()
	if _, err := p.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	var before corev1.Pod
	if err := c.Get(ctx, podKey(m), &before); err != nil {
		t.Fatal(err)
	}
	s := runPod(t, c, m)
	creds := squidUser + ":" + squidPassword
	pid := s.Pid()
	for _, target := range []string{"http://34.118.0.5/", "http://[2600:1900:4000:1::5]/"} {
		if r := s.Request(t, squidClient, http.MethodGet, target, creds); r.Status != http.StatusNoContent {
			t.Fatalf("%s before the node joined: %d %s, want 204", target, r.Status, r.SquidError)
		}
	}

	if err := c.Create(ctx, joining); err != nil {
		t.Fatal(err)
	}
	now, changed, _, err := ranges.Refresh(ctx)
	if err != nil || !changed {
		t.Fatalf("Refresh: changed %v (%v)", changed, err)
	}
	if _, err := p.applyClusterRanges(ctx, now); err != nil {
		t.Fatal(err)
	}
	var after corev1.Pod
	if err := c.Get(ctx, podKey(m), &after); err != nil || after.UID != before.UID {
		t.Fatalf("the pod was replaced (%v)", err)
	}
	s.sync(t, c, m)
	s.WaitListening(t, s.Stderr, 2) // the reloader had squid reconfigure
	if s.Pid() != pid {
		t.Fatal("squid was restarted, not reconfigured")
	}
	reached := len(origins["34.118.0.5"].Requests()) + len(origins["2600:1900:4000:1::5"].Requests())
	for _, target := range []string{"http://34.118.0.5/", "http://[2600:1900:4000:1::5]/"} {
		squidtest.RequireRefusedBeforeConnecting(t, s.Squid, s.Request(t, squidClient, http.MethodGet, target, creds), http.MethodGet, target)
	}
	if n := len(origins["34.118.0.5"].Requests()) + len(origins["2600:1900:4000:1::5"].Requests()); n != reached {
		t.Errorf("the new range's origins reached %d times after the reload", n-reached)
	}
	if !strings.Contains(s.ReadStderr(), "squid-reloader: the configuration changed") {
		t.Errorf("the reloader did not say why squid reconfigured:\n%s", s.Output())
	}
	requireContainerContract(t, s)
}
