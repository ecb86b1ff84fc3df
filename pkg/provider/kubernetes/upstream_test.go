package kubernetes

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/proxyprobe"
	"crawl.example.com/proxy-operator/pkg/squid"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

var statsCredential = squid.Auth{Type: squid.AuthBasic, Username: "proxy-operator-stats", Password: "stats-" + squidPassword}

// statsMachine is a managed Proxy's Machine with the operator's Stats
// credential, as the Proxy controller attaches it: squid.conf may run the
// upstream counter.
func statsMachine() *provider.Machine {
	m := machine()
	m.Squid = &squid.Config{
		AllowedSourceCIDRs: []string{"10.0.0.0/8"},
		Auth:               squid.Auth{Type: squid.AuthBasic, Username: squidUser, Password: squidPassword},
		Stats:              statsCredential,
	}
	return m
}

// oldTemplate is pod as the provider made it before it delivered the
// counter: the whole ConfigMap projected with the default mode.
func oldTemplate(pod *corev1.Pod) *corev1.Pod {
	pod = pod.DeepCopy()
	for i := range pod.Spec.Volumes {
		if v := &pod.Spec.Volumes[i]; v.Name == "config" {
			v.ConfigMap.Items = nil
		}
	}
	return pod
}

const daemonLine = "\nlogfile_daemon " + CounterPath + "\n"

// counterWatch is a fake API that checks, at every write, the order the
// counter needs: a ConfigMap whose squid.conf runs the counter is written
// only while every live pod of the Proxy has it, and every pod is created
// with it.
func counterWatch(t *testing.T, objs ...client.Object) client.WithWatch {
	t.Helper()
	check := func(ctx context.Context, c client.WithWatch, obj client.Object) {
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			if !strings.Contains(o.Data[ConfigKey], daemonLine) {
				return
			}
			var pods corev1.PodList
			if err := c.List(ctx, &pods, client.InNamespace(o.Namespace), client.MatchingLabels{LabelProxyUID: o.Labels[LabelProxyUID]}); err != nil {
				t.Error(err)
			}
			for i := range pods.Items {
				if pod := &pods.Items[i]; pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodFailed && !runsCounter(pod) {
					t.Errorf("squid.conf running the counter written while pod %s, which lacks it, reads it", pod.Name)
				}
			}
		case *corev1.Pod:
			if !runsCounter(o) {
				t.Errorf("pod %s created without the counter", o.Name)
			}
		}
	}
	return fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			check(ctx, c, obj)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			check(ctx, c, obj)
			return c.Update(ctx, obj, opts...)
		},
	}).Build()
}

func getConfigMap(t *testing.T, c client.Client, m *provider.Machine) *corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), podKey(m), &cm); err != nil {
		t.Fatal(err)
	}
	return &cm
}

// A new pod projects the counter from its ConfigMap, executable, at the
// path its squid.conf runs; squid.conf and the cluster's ranges keep the
// default mode, and the pod keeps the restricted level.
func TestPodRunsTheUpstreamCounterFromItsConfigMap(t *testing.T) {
	c := counterWatch(t)
	m := statsMachine()
	if _, err := newProvider(c).Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	cm := getConfigMap(t, c, m)
	if cm.Data[CounterKey] != string(squid.UpstreamCounter) {
		t.Errorf("ConfigMap key %s is not squid.UpstreamCounter", CounterKey)
	}
	conf := cm.Data[ConfigKey]
	if !strings.Contains(conf, daemonLine) || !strings.Contains(conf, fmt.Sprintf("access_log daemon:/127.0.0.1:%d ", squid.UpstreamCountsPort(int(m.Port)))) {
		t.Errorf("squid.conf does not run the counter at %s:\n%s", CounterPath, conf)
	}

	var pod corev1.Pod
	if err := c.Get(context.Background(), podKey(m), &pod); err != nil {
		t.Fatal(err)
	}
	podMeetsRestricted(t, &pod)
	var mounted bool
	for _, vm := range pod.Spec.Containers[0].VolumeMounts {
		mounted = mounted || vm.Name == "config" && vm.MountPath == ConfigDir && vm.ReadOnly && vm.SubPath == ""
	}
	if !mounted {
		t.Errorf("the config volume is not mounted read-only as the directory %s: %+v", ConfigDir, pod.Spec.Containers[0].VolumeMounts)
	}
	v := configMapVolume(t, &pod, "config")
	if v.Name != podKey(m).Name || v.DefaultMode != nil || v.Optional != nil {
		t.Errorf("config volume %+v: want ConfigMap %s, default mode, not optional", v, podKey(m).Name)
	}
	want := map[string]int32{ConfigKey: -1, ClusterRangesKey: -1, CounterKey: 0o755}
	for _, item := range v.Items {
		mode := int32(-1)
		if item.Mode != nil {
			mode = *item.Mode
		}
		if w, ok := want[item.Key]; !ok || item.Path != item.Key || mode != w {
			t.Errorf("item %s -> %s mode %o; want each key at its own name, the counter 0755, the rest the default", item.Key, item.Path, mode)
		}
		delete(want, item.Key)
	}
	if len(want) > 0 {
		t.Errorf("the pod does not project %v", want)
	}
	if ConfigDir+"/"+CounterKey != CounterPath {
		t.Errorf("CounterPath %s is not where the volume projects %s", CounterPath, CounterKey)
	}
	if !runsCounter(&pod) || runsCounter(oldTemplate(&pod)) {
		t.Error("runsCounter does not tell the pod from one of the old template")
	}
}

// squid.conf runs the counter only once no live pod of the Proxy lacks
// it: a pod of the old template (made before the operator delivered the
// counter, which re-reads its ConfigMap in place) keeps a squid.conf
// without it, as a Proxy whose squid cannot count; the pod replacing it
// has the counter, and squid.conf runs it from then on. counterWatch fails
// any write out of that order.
func TestSquidConfRunsTheCounterOnlyOnceThePodsHaveIt(t *testing.T) {
	ctx := context.Background()
	m := statsMachine()
	old := oldTemplate(newProvider(newFake(t)).pod(m, podKey(m), 0, true))
	old.Status.Phase = corev1.PodRunning
	c := counterWatch(t, old)
	p := newProvider(c)
	m.ProviderID = FormatProviderID(old.Namespace, old.Name)

	for range 2 { // the second Create changes nothing
		if _, err := p.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		cm := getConfigMap(t, c, m)
		if strings.Contains(cm.Data[ConfigKey], "logfile_daemon") || strings.Contains(cm.Data[ConfigKey], "upstream") {
			t.Fatalf("squid.conf runs the counter while the old pod reads it:\n%s", cm.Data[ConfigKey])
		}
		if cm.Data[CounterKey] != string(squid.UpstreamCounter) {
			t.Errorf("the ConfigMap lacks %s", CounterKey)
		}
	}

	// The old pod is gone for good (evicted): Create replaces it.
	old.Status.Phase = corev1.PodFailed
	if err := c.Status().Update(ctx, old); err != nil {
		t.Fatal(err)
	}
	inst, err := p.Create(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Name == old.Name {
		t.Fatalf("Create kept the failed pod %s", old.Name)
	}
	if !strings.Contains(getConfigMap(t, c, m).Data[ConfigKey], daemonLine) {
		t.Error("squid.conf does not run the counter once the pods have it")
	}
	var pod corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: inst.Name}, &pod); err != nil {
		t.Fatal(err)
	}
	if !runsCounter(&pod) {
		t.Error("the replacement pod has no counter")
	}
}

// Without the Stats credential (an unmanaged Proxy, or one made before
// the operator read counters) nothing reads the counter: squid.conf does
// not run it, though the pod has it.
func TestSquidConfRunsNoCounterWithoutTheStatsCredential(t *testing.T) {
	noStats := statsMachine()
	noStats.Squid.Stats = squid.Auth{}
	for name, m := range map[string]*provider.Machine{"unmanaged": machine(), "managed without stats": noStats} {
		t.Run(name, func(t *testing.T) {
			c := counterWatch(t)
			if _, err := newProvider(c).Create(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			cm := getConfigMap(t, c, m)
			if strings.Contains(cm.Data[ConfigKey], "logfile_daemon") || !bytes.Equal([]byte(cm.Data[CounterKey]), squid.UpstreamCounter) {
				t.Errorf("squid.conf runs a counter nothing reads, or the ConfigMap lacks it:\n%s", cm.Data[ConfigKey])
			}
		})
	}
}

// countingPod runs, as the pod does (runPod, with extra mounts), what
// Create stored for a managed Proxy with the Stats credential whose
// clients are 127.0.0.1 and whose allowed destination is an origin on
// originAddr answering the status each path names.
func countingPod(t *testing.T, originAddr string, extra ...squidtest.Mount) (*podRun, *provider.Machine, *squidtest.Origin) {
	t.Helper()
	origin := squidtest.NewOrigin(t, originAddr)
	c := newFake(t)
	m := managedMachine(origin)
	m.Squid.Stats = statsCredential
	if _, err := newProvider(c).Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return runPod(t, c, m, extra...), m, origin
}

// TestUpstreamCounterAsThePodRunsIt runs what Create stored for a managed
// Proxy with the Stats credential, as the pod mounts and runs it
// (runPod: the ConfigMap projected as the pod's volume says, ..data
// symlinks, the counter's mode from the pod; uid 13 on a read-only root),
// against Debian's squid: the target sites' answers are counted by class
// and read with the operator's own reader (proxyprobe.HTTPStats, as the
// Proxy controller reads them), squid's own refusals are not counted, and
// only the Stats credential reads the counts. A counter the pod does not
// project executable stops squid: the test fails then.
func TestUpstreamCounterAsThePodRunsIt(t *testing.T) {
	s, m, origin := countingPod(t, "127.0.0.45:0")
	if !strings.Contains(readFile(t, s, ConfigKey), daemonLine) {
		t.Fatalf("the mounted squid.conf does not run the counter")
	}

	answers := map[int]int{200: 3, 204: 1, 302: 2, 404: 1, 403: 2, 429: 3, 503: 1}
	var want squid.UpstreamCounts
	for code, n := range answers {
		for range n {
			url := fmt.Sprintf("http://%s/%d", origin.HostPort(), code)
			if r := s.Request(t, squidClient, http.MethodGet, url, squidUser+":"+squidPassword); r.Status != code {
				t.Fatalf("GET %s through squid: %d", url, r.Status)
			}
			want.Add(code)
		}
	}
	// squid's own answers are not the sites': no credential, a refused
	// destination.
	if r := s.Request(t, squidClient, http.MethodGet, "http://"+origin.HostPort()+"/200", ""); r.Status != http.StatusProxyAuthRequired {
		t.Fatalf("without a credential: %d, want 407", r.Status)
	}
	if r := s.Request(t, squidClient, http.MethodGet, "http://10.1.2.3/200", squidUser+":"+squidPassword); r.Status != http.StatusForbidden {
		t.Fatalf("to a denied destination: %d, want 403", r.Status)
	}

	target := proxyprobe.Target{Address: squidClient, Port: port(m), Username: statsCredential.Username, Password: statsCredential.Password}
	reader := proxyprobe.HTTPStats{Timeout: 5 * time.Second}
	var got squid.UpstreamCounts
	var err error
	// squid hands log lines to its daemon in batches.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got, err = reader.ReadUpstream(context.Background(), target); err == nil && got == want {
			break
		}
	}
	if err != nil || got != want {
		t.Fatalf("the operator read %v (err %v), want %v (classes %v)\n%s", got, err, want, squid.UpstreamClasses, s.Output())
	}
	if got.BanSignals() != 5 {
		t.Errorf("ban signals %d, want 5", got.BanSignals())
	}
	countsPort := squid.UpstreamCountsPort(int(port(m)))
	for _, tc := range []struct {
		who, creds string
		want       int
	}{
		{"a crawler", squidUser + ":" + squidPassword, http.StatusForbidden},
		{"no credential", "", http.StatusProxyAuthRequired},
	} {
		if r := s.Request(t, squidClient, http.MethodGet, squid.UpstreamURL(countsPort), tc.creds); r.Status != tc.want {
			t.Errorf("%s reading the upstream counts: %d, want %d", tc.who, r.Status, tc.want)
		}
	}
	// The counter listens on 127.0.0.1 alone, not on every address.
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.2", strconv.Itoa(countsPort)), time.Second); err == nil {
		conn.Close()
		t.Errorf("the counter accepts connections on 127.0.0.2:%d", countsPort)
	}
	requireContainerContract(t, s)
}

// readFile reads a file of the pod's ConfigMap directory.
func readFile(t *testing.T, s *podRun, key string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(s.config.Dir, key))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// An image without perl (the squid image is the user's choice): squid
// still starts and serves with the squid.conf that runs the counter, the
// container's log says why nothing is counted, and the operator's read
// fails (the classes stay unknown) rather than reading zeros. perl is
// replaced, in the pod's view of the image, by one that fails as a
// missing command does.
func TestSquidWithoutPerlServesAndSaysWhy(t *testing.T) {
	noPerl := filepath.Join(squidtest.TempDir(t), "perl")
	if err := os.WriteFile(noPerl, []byte("#!/bin/sh\necho \"sh: perl: not found\" >&2\nexit 127\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, m, origin := countingPod(t, "127.0.0.46:0", squidtest.Mount{Source: noPerl, Target: "/usr/bin/perl", ReadOnly: true})

	url := "http://" + origin.HostPort() + "/429"
	if r := s.Request(t, squidClient, http.MethodGet, url, squidUser+":"+squidPassword); r.Status != http.StatusTooManyRequests {
		t.Fatalf("GET %s through squid: %d", url, r.Status)
	}
	const why = "upstream-counter: this image has no perl (perl-base) on PATH"
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(s.ReadStderr(), why) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(s.ReadStderr(), why) {
		t.Errorf("the container's log does not say why nothing is counted:\n%s", s.Output())
	}
	target := proxyprobe.Target{Address: squidClient, Port: port(m), Username: statsCredential.Username, Password: statsCredential.Password}
	if u, err := (proxyprobe.HTTPStats{Timeout: 5 * time.Second}).ReadUpstream(context.Background(), target); err == nil {
		t.Errorf("the operator read counts %v from a squid without its counter", u)
	}
	// Still serving after a reconfigure, which starts the daemon again.
	if r := s.Request(t, squidClient, http.MethodGet, "http://10.1.2.3/200", squidUser+":"+squidPassword); r.Status != http.StatusForbidden {
		t.Fatalf("to a denied destination: %d, want 403", r.Status)
	}
	s.Reconfigure(t, s.Stderr)
	if r := s.Request(t, squidClient, http.MethodGet, url, squidUser+":"+squidPassword); r.Status != http.StatusTooManyRequests {
		t.Fatalf("after a reconfigure: %d", r.Status)
	}
	requireContainerContract(t, s)
}
