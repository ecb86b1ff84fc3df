//go:build e2e

// Package cluster installs the operator into a real one-node Kubernetes
// cluster the way users install it, and checks what only a real cluster
// shows: the manager as a Deployment under restricted Pod Security with its
// generated RBAC, the webhooks through their Service, /metrics behind
// TokenReview and SubjectAccessReview, kubernetes-provider Proxies served
// by real squid pods, and ProxyPool deletion with the garbage collector.
//
// test/e2e/cluster/run.sh (make test-e2e-cluster) builds the node
// (node.sh: kubelet, containerd, runc and the control plane as processes in
// namespaces of their own, images built and imported, none pulled) and runs
// this suite inside the node's network namespace, where node, pod and
// Service addresses are reachable.
package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
)

// env is what run.sh and node.sh env hand the suite.
type env struct {
	Artifacts    string // E2E_ARTIFACTS
	Repo         string // CLUSTER_REPO: the checkout whose config/ is installed
	ManagerImage string // CLUSTER_MANAGER_IMAGE, as config/manager names it
	SquidImage   string // CLUSTER_SQUID_IMAGE, by digest
	Kubeconfig   string // NODE_KUBECONFIG (cluster-admin)
	NodeIP       string // NODE_IP
	NodeName     string // NODE_NAME
	PodCIDR      string // NODE_POD_CIDR
	NodeSH       string // NODE_SH
	StateDir     string // NODE_STATE_DIR
	// LinkNode is the node's end of the veth pair to the test hypervisor
	// (CLUSTER_LINK_NODE): where the suite's requests to its guests come
	// from.
	LinkNode string
	// KVM is the test hypervisor as the manager pods reach it (the
	// KVM_TEST_* variables of hypervisor.sh env, its address and
	// known_hosts those of the veth's far end).
	KVM e2eutil.Config
}

var (
	cfg env
	// k8s watches too: the failover spec records every change it makes.
	k8s client.WithWatch
	// origin is the test's web server on originIP, port 80: the
	// destination of every request through a proxy (the manager's probe
	// too): / answers 204, /ip the caller's address.
	origin *http.Server
	scheme = runtime.NewScheme()
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(crawlv1.AddToScheme(scheme))
}

func TestCluster(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "proxy-operator installed into a real cluster")
}

var _ = BeforeSuite(func() {
	var missing []string
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			missing = append(missing, name)
		}
		return v
	}
	cfg = env{
		Artifacts: get("E2E_ARTIFACTS"), Repo: get("CLUSTER_REPO"),
		ManagerImage: get("CLUSTER_MANAGER_IMAGE"), SquidImage: get("CLUSTER_SQUID_IMAGE"),
		Kubeconfig: get("NODE_KUBECONFIG"), NodeIP: get("NODE_IP"), NodeName: get("NODE_NAME"),
		PodCIDR: get("NODE_POD_CIDR"), NodeSH: get("NODE_SH"), StateDir: get("NODE_STATE_DIR"),
		LinkNode: get("CLUSTER_LINK_NODE"),
	}
	Expect(missing).To(BeEmpty(), "`make test-e2e-cluster` (test/e2e/cluster/run.sh) provides these")
	var err error
	cfg.KVM, err = e2eutil.FromEnv()
	Expect(err).NotTo(HaveOccurred(), "the test hypervisor (run.sh: hypervisor.sh env, with the veth's address)")
	_, err = exec.LookPath("kubectl")
	Expect(err).NotTo(HaveOccurred(), "kubectl on PATH (run.sh puts the node's own first)")

	// The user's commands (steps.go) and kubectl below talk to this cluster.
	Expect(os.Setenv("KUBECONFIG", cfg.Kubeconfig)).To(Succeed())
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.NewWithWatch(rc, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	addNodeAddress(originIP)
	ln, err := net.Listen("tcp", net.JoinHostPort(originIP, "80"))
	Expect(err).NotTo(HaveOccurred(), "the origin server listens on its own address (inside the node's netns)")
	origin = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ip" {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			fmt.Fprint(w, host)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = origin.Serve(ln) }()
	DeferCleanup(origin.Close)
})

// kubectl runs kubectl (KUBECONFIG: cluster-admin) in dir, logged as run does.
func kubectl(ctx context.Context, dir string, args ...string) (string, error) {
	return run(ctx, dir, "kubectl", args...)
}

// step runs one of the user's commands (steps.go) in dir.
func step(ctx context.Context, dir string, argv []string) (string, error) {
	return run(ctx, dir, argv[0], argv[1:]...)
}

// run runs a command as a user would type it (cwd dir), logging the command
// and its output to the spec and to E2E_ARTIFACTS/commands.log.
func run(ctx context.Context, dir, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	shown := strings.Join(append([]string{name}, args...), " ")
	logged := out.String()
	if err == nil && strings.Contains(shown, " create token ") {
		logged = "(a token: not logged)" // credentials stay out of logs, the suite's too
	}
	entry := fmt.Sprintf("$ %s   # in %s, %.1fs, err=%v\n%s\n", shown, dir, time.Since(start).Seconds(), err, logged)
	GinkgoWriter.Print(entry)
	if f, ferr := os.OpenFile(filepath.Join(cfg.Artifacts, "commands.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); ferr == nil {
		_, _ = f.WriteString(entry)
		_ = f.Close()
	}
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w: %s", shown, err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// record reports a measured duration in the spec report and appends it to
// E2E_ARTIFACTS/timings.txt, as the other e2e suites do.
func record(name string, d time.Duration) {
	AddReportEntry(name, e2eutil.Seconds(d))
	line := fmt.Sprintf("CLUSTER-TIMING %s=%.1fs", name, d.Seconds())
	fmt.Fprintln(os.Stdout, line)
	if f, err := os.OpenFile(filepath.Join(cfg.Artifacts, "timings.txt"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintln(f, line)
		_ = f.Close()
	}
}

// nodeSH runs node.sh for this node (kubelet stop|start, exec).
func nodeSH(ctx context.Context, args ...string) (string, error) {
	return run(ctx, cfg.Repo, cfg.NodeSH, append([]string{args[0], cfg.StateDir}, args[1:]...)...)
}

// dumpCluster writes what a post-mortem needs into E2E_ARTIFACTS.
func dumpCluster(ctx context.Context) {
	dir := filepath.Join(cfg.Artifacts, "dump")
	_ = os.MkdirAll(dir, 0o755)
	for name, args := range map[string][]string{
		"all.txt":      {"get", "nodes,pods,deployments,services,endpointslices,leases,networkpolicies,proxies,proxypools", "-A", "-o", "wide"},
		"events.txt":   {"get", "events", "-A", "--sort-by=.lastTimestamp"},
		"proxies.yaml": {"get", "proxies,proxypools", "-A", "-o", "yaml"},
		"pods.yaml":    {"get", "pods", "-A", "-o", "yaml"},
		"manager.log":  {"-n", managerNS, "logs", "-l", "control-plane=controller-manager", "--all-containers", "--prefix", "--tail=-1"},
	} {
		out, err := kubectl(ctx, cfg.Repo, args...)
		if err != nil {
			out += "\n" + err.Error()
		}
		_ = os.WriteFile(filepath.Join(dir, name), []byte(out), 0o644)
	}
}
