// Package localcp runs a local control plane (envtest's kube-apiserver and
// etcd) with the project's CRDs and webhook configurations, and the real
// manager binary as a separate process serving the webhooks over TLS. It
// backs `make run-local` and the e2e suite.
package localcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"crawl.example.com/proxy-operator/test/envtestutil"
)

// ControlPlane is a running envtest API server with our CRDs and webhooks.
type ControlPlane struct {
	Env        *envtest.Environment
	Config     *rest.Config
	Kubeconfig string // path of an admin kubeconfig
	Dir        string // state directory (kubeconfig, logs)
}

// Start starts the control plane, writing its kubeconfig into dir.
func Start(dir string) (*ControlPlane, error) {
	env, err := envtestutil.New(true)
	if err != nil {
		return nil, err
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	cp := &ControlPlane{Env: env, Config: cfg, Dir: dir}
	user, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("add admin user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(cp.Kubeconfig, kc, 0o600); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return cp, nil
}

// Stop stops the control plane.
func (cp *ControlPlane) Stop() error { return cp.Env.Stop() }

// Manager is the manager binary running as a child process.
type Manager struct {
	Cmd         *exec.Cmd
	MetricsAddr string
	ProbeAddr   string
	done        chan struct{}
	err         error
}

// StartManager runs binary against cp with webhooks on the port and certs
// envtest prepared, extra flags appended. Output goes to out.
func (cp *ControlPlane) StartManager(ctx context.Context, binary string, out io.Writer, extra ...string) (*Manager, error) {
	wh := cp.Env.WebhookInstallOptions
	// The webhook port is fixed for the control plane's life; while no
	// manager runs (a restart after a kill) it is free, and the kernel may
	// hand it out again here: then the webhook server cannot bind.
	metrics, err := freeAddrExcept(freeAddr, wh.LocalServingPort)
	if err != nil {
		return nil, err
	}
	_, metricsPort, _ := net.SplitHostPort(metrics)
	mp, _ := strconv.Atoi(metricsPort)
	probe, err := freeAddrExcept(freeAddr, wh.LocalServingPort, mp)
	if err != nil {
		return nil, err
	}
	args := append([]string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--webhook-port=" + strconv.Itoa(wh.LocalServingPort),
		"--webhook-cert-dir=" + wh.LocalServingCertDir,
		"--metrics-bind-address=" + metrics,
		// Loopback only, read by tests without a token: the one place plain
		// HTTP metrics are chosen explicitly.
		"--metrics-secure=false",
		"--health-probe-bind-address=" + probe,
	}, extra...)
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group, so Stop ends the manager and nothing else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start manager: %w", err)
	}
	m := &Manager{Cmd: cmd, MetricsAddr: metrics, ProbeAddr: probe, done: make(chan struct{})}
	go func() { m.err = cmd.Wait(); close(m.done) }()
	if err := m.waitReady(ctx, 60*time.Second); err != nil {
		_ = m.Stop()
		return nil, err
	}
	return m, nil
}

// waitReady waits for the manager's readiness endpoint, which reports the
// webhook server started.
func (m *Manager) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-m.done:
			if m.err == nil {
				return errors.New("manager exited (status 0) before becoming ready")
			}
			return fmt.Errorf("manager exited before becoming ready: %w", m.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if ok, _ := httpOK("http://" + m.ProbeAddr + "/readyz"); ok {
			return nil
		}
	}
	return errors.New("manager not ready within " + limit.String())
}

// Done is closed when the manager process exits.
func (m *Manager) Done() <-chan struct{} { return m.done }

// Stop sends SIGTERM to the manager's process group and waits, then kills.
func (m *Manager) Stop() error {
	select {
	case <-m.done:
		return nil
	default:
	}
	_ = syscall.Kill(-m.Cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-m.Cmd.Process.Pid, syscall.SIGKILL)
		<-m.done
	}
	return nil
}

// freeAddrExcept returns an address from pick whose port is none of
// taken, trying a bounded number of times.
func freeAddrExcept(pick func() (string, error), taken ...int) (string, error) {
	var last string
	for range 20 {
		addr, err := pick()
		if err != nil {
			return "", err
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return "", err
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return "", err
		}
		if !slices.Contains(taken, p) {
			return addr, nil
		}
		last = addr
	}
	return "", fmt.Errorf("no free port but %s, which is taken (ports %v)", last, taken)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

func httpOK(url string) (bool, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK, nil
}
