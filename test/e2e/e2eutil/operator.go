package e2eutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"crawl.example.com/proxy-operator/internal/proxyaccess"
	"crawl.example.com/proxy-operator/test/localcp"
)

// Operator is a running proxy-operator and the API server it serves: a local
// control plane with the manager binary as a child process, or an existing
// cluster with the operator deployed (kind).
type Operator interface {
	Client() client.Client
	// Kubeconfig is a kubeconfig file for the API server.
	Kubeconfig() string
	// Alive fails when the manager is gone or has restarted since Start.
	Alive(ctx context.Context) error
	// LogTail returns the last n lines of the manager's log.
	LogTail(ctx context.Context, n int) string
	// LogPath is where the whole manager log is, if it is a file.
	LogPath() string
	// Metrics returns the manager's Prometheus metrics (local manager only).
	Metrics(ctx context.Context) (string, error)
	// SecretNamespace is the manager's namespace, the only one it reads
	// KVMHosts' SSH Secrets from.
	SecretNamespace() string
	Stop()
}

// ProxyProbeInterval is the manager's --proxy-probe-interval in these runs.
const ProxyProbeInterval = 15 * time.Second

// ManagerArgs are the manager flags for a run against c: the kvm provider
// only, health checks every CheckInterval, Ready meaning a request through
// squid to the probe URL, an empty --ssh-key-dir (the KVMHost names its
// Secret, in namespace, which the manager then reads Secrets from), a tag
// of its own for the orphan sweep, and the grant of the run's destination
// exception (Access) when it lies where only the operator may open it
// (loopback, link-local: a probe server there).
func ManagerArgs(c Config, sshKeyDir, namespace, tag string) []string {
	args := []string{
		"--manager-namespace=" + namespace,
		"--providers=kvm",
		"--provider-check-interval=" + c.CheckInterval.String(),
		"--ssh-key-dir=" + sshKeyDir,
		"--proxy-probe-url=" + orStr(c.EchoURL, c.ProbeURL),
		"--proxy-probe-interval=" + ProxyProbeInterval.String(),
		"--provision-poll-interval=2s",
		"--address-timeout=" + c.ProxyReadyTimeout.String(),
		"--instance-tag=" + tag,
		"--zap-log-level=" + orStr(c.ManagerLogLevel, "info"),
		// Sub-second times: the Ready-lag figures are read against the
		// observer's timeline from this log.
		"--zap-time-encoding=rfc3339nano",
	}
	if c.GCInterval > 0 {
		args = append(args, "--gc-interval="+c.GCInterval.String())
	}
	// A bad probe URL fails NewObjects, which calls Access too.
	if a, err := Access(c); err == nil {
		if grants := proxyaccess.NeedsGrant(a); len(grants) > 0 {
			args = append(args, proxyaccess.GrantFlag+"="+strings.Join(grants, ","))
		}
	}
	return args
}

// LocalOperator is the envtest control plane with the manager binary.
type LocalOperator struct {
	CP      *localcp.ControlPlane
	Manager *localcp.Manager
	Dir     string
	logPath string
	logFile *os.File
	client  client.Client
	// secretNamespace is the --manager-namespace given in args.
	secretNamespace string
	// bin and args start the manager again after Kill.
	bin  string
	args []string
	// restarts counts Restart calls.
	restarts int
}

// StartLocal starts a control plane (state in dir) and the manager binary
// with args; the manager's output goes to dir/manager.log.
func StartLocal(ctx context.Context, dir, managerBin string, args []string) (*LocalOperator, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if _, err := os.Stat(managerBin); err != nil {
		return nil, fmt.Errorf("manager binary: %w (make build)", err)
	}
	cp, err := localcp.Start(dir)
	if err != nil {
		return nil, err
	}
	o := &LocalOperator{CP: cp, Dir: dir, logPath: filepath.Join(dir, "manager.log"), secretNamespace: "proxy-operator-system",
		bin: managerBin, args: args}
	for _, a := range args {
		if ns, ok := strings.CutPrefix(a, "--manager-namespace="); ok {
			o.secretNamespace = ns
		}
	}
	o.logFile, err = os.Create(o.logPath)
	if err != nil {
		_ = cp.Stop()
		return nil, err
	}
	o.Manager, err = cp.StartManager(ctx, managerBin, o.logFile, args...)
	if err != nil {
		o.Stop()
		return nil, fmt.Errorf("%w (log: %s)", err, o.logPath)
	}
	o.client, err = client.New(cp.Config, client.Options{Scheme: Scheme})
	if err != nil {
		o.Stop()
		return nil, err
	}
	return o, nil
}

func (o *LocalOperator) Client() client.Client   { return o.client }
func (o *LocalOperator) Kubeconfig() string      { return o.CP.Kubeconfig }
func (o *LocalOperator) LogPath() string         { return o.logPath }
func (o *LocalOperator) SecretNamespace() string { return o.secretNamespace }

func (o *LocalOperator) Alive(context.Context) error {
	select {
	case <-o.Manager.Done():
		return fmt.Errorf("manager (pid %d) exited; see %s", o.Manager.Cmd.Process.Pid, o.logPath)
	default:
		return nil
	}
}

func (o *LocalOperator) LogTail(_ context.Context, n int) string { return Tail(o.logPath, n) }

// Kill ends the manager with SIGKILL, as a node failure or an OOM kill
// would: no shutdown, no status written on the way out. Alive fails until
// Restart.
func (o *LocalOperator) Kill() error {
	if o.Manager == nil {
		return errors.New("no manager running")
	}
	if err := syscall.Kill(-o.Manager.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("SIGKILL manager (pid %d): %w", o.Manager.Cmd.Process.Pid, err)
	}
	select {
	case <-o.Manager.Done():
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("manager (pid %d) still running 30 s after SIGKILL", o.Manager.Cmd.Process.Pid)
	}
}

// Restart starts the manager binary again with the same flags against the
// same control plane, its output appended to the same log, and waits until
// it is ready. Alive then watches the new process.
func (o *LocalOperator) Restart(ctx context.Context) error {
	select {
	case <-o.Manager.Done():
	default:
		return fmt.Errorf("manager (pid %d) is still running", o.Manager.Cmd.Process.Pid)
	}
	o.restarts++
	fmt.Fprintf(o.logFile, "\n===== e2e: manager restart %d at %s =====\n", o.restarts, time.Now().Format(time.RFC3339Nano))
	m, err := o.CP.StartManager(ctx, o.bin, o.logFile, o.args...)
	if err != nil {
		return fmt.Errorf("%w (log: %s)", err, o.logPath)
	}
	o.Manager = m
	return nil
}

// Bin is the manager binary this operator runs.
func (o *LocalOperator) Bin() string { return o.bin }

// PID is the running manager's process id.
func (o *LocalOperator) PID() int { return o.Manager.Cmd.Process.Pid }

func (o *LocalOperator) Metrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+o.Manager.MetricsAddr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return string(b), err
}

// Stop stops the manager, then the control plane.
func (o *LocalOperator) Stop() {
	if o.Manager != nil {
		_ = o.Manager.Stop()
	}
	if o.logFile != nil {
		_ = o.logFile.Close()
	}
	if o.CP != nil {
		_ = o.CP.Stop()
	}
}

// ClusterOperator is an operator deployed in an existing cluster (kind): the
// manager pods are found by label in Namespace.
type ClusterOperator struct {
	Path      string
	Namespace string
	Selector  string
	client    client.Client
	clientset kubernetes.Interface
	restarts  int32
}

// ConnectCluster uses the cluster of kubeconfig, where the operator runs in
// namespace (pods labelled selector).
func ConnectCluster(ctx context.Context, kubeconfig, namespace, selector string) (*ClusterOperator, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	return newClusterOperator(ctx, cfg, kubeconfig, namespace, selector)
}

func newClusterOperator(ctx context.Context, cfg *rest.Config, path, namespace, selector string) (*ClusterOperator, error) {
	c, err := client.New(cfg, client.Options{Scheme: Scheme})
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	o := &ClusterOperator{Path: path, Namespace: namespace, Selector: selector, client: c, clientset: cs}
	pod, err := o.managerPod(ctx)
	if err != nil {
		return nil, err
	}
	o.restarts = restarts(pod)
	return o, nil
}

func (o *ClusterOperator) Client() client.Client   { return o.client }
func (o *ClusterOperator) Kubeconfig() string      { return o.Path }
func (o *ClusterOperator) LogPath() string         { return "" }
func (o *ClusterOperator) SecretNamespace() string { return o.Namespace }
func (o *ClusterOperator) Stop()                   {}

func (o *ClusterOperator) Metrics(context.Context) (string, error) {
	return "", errors.New("the metrics of a manager in a cluster are not read by the suite")
}

func (o *ClusterOperator) managerPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := o.clientset.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: o.Selector})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].Status.Phase == corev1.PodRunning {
			return &pods.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no running manager pod in %s with labels %s", o.Namespace, o.Selector)
}

func (o *ClusterOperator) Alive(ctx context.Context) error {
	pod, err := o.managerPod(ctx)
	if err != nil {
		return err
	}
	if r := restarts(pod); r != o.restarts {
		return fmt.Errorf("manager pod %s restarted (%d → %d)", pod.Name, o.restarts, r)
	}
	return nil
}

func (o *ClusterOperator) LogTail(ctx context.Context, n int) string {
	pod, err := o.managerPod(ctx)
	if err != nil {
		return err.Error()
	}
	lines := int64(n)
	rc, err := o.clientset.CoreV1().Pods(o.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "manager", TailLines: &lines}).Stream(ctx)
	if err != nil {
		return err.Error()
	}
	defer rc.Close()
	b, _ := io.ReadAll(io.LimitReader(rc, 4<<20))
	return string(b)
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// StartFromEnv connects to E2E_KUBECONFIG's cluster when it is set (the
// operator must be deployed there), or starts the local control plane with
// the manager binary E2E_MANAGER (default bin/manager under root) in dir.
func StartFromEnv(ctx context.Context, c Config, root, dir, tag string) (Operator, error) {
	if kc := os.Getenv("E2E_KUBECONFIG"); kc != "" {
		return ConnectCluster(ctx, kc, envOr("E2E_OPERATOR_NAMESPACE", "proxy-operator-system"),
			envOr("E2E_OPERATOR_SELECTOR", "control-plane=controller-manager"))
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, errors.New("KUBEBUILDER_ASSETS is not set: export KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh), or set E2E_KUBECONFIG to use a cluster with the operator deployed")
	}
	keyDir := filepath.Join(dir, "empty-ssh-key-dir")
	if err := os.MkdirAll(keyDir, 0o700); err != nil {
		return nil, err
	}
	bin := envOr("E2E_MANAGER", filepath.Join(root, "bin", "manager"))
	// The suite's objects (NewObjects) live in a namespace named like tag.
	return StartLocal(ctx, dir, bin, ManagerArgs(c, keyDir, tag, tag))
}

// CounterSum adds up every sample of a Prometheus counter whose labels
// contain all of labels (e.g. `controller="proxy"`), in text exposition.
func CounterSum(metrics, name string, labels ...string) float64 {
	var sum float64
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		match := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				match = false
			}
		}
		f := strings.Fields(rest)
		if !match || len(f) < 2 {
			continue
		}
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// Seconds formats d as seconds with one decimal.
func Seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
}

// Indent prefixes every line of s.
func Indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix) + "\n"
}
