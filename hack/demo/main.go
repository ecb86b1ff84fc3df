// Command demo shows the operator end to end on the local test hypervisor
// (test/e2e/infra/hypervisor.sh): a local control plane with the manager
// binary, one KVMHost, one KVMImage and one Proxy; it waits for the Proxy to
// be Ready, prints its endpoint and proves it with a request through it.
//
// Run it with hack/demo/demo.sh (`make demo`), which prepares the hypervisor
// and starts this program inside the hypervisor's network namespace, where
// the guests' addresses are. With -once (DEMO_ONCE=1 or CI=true) it deletes
// the Proxy, checks its VM is gone and exits; otherwise it keeps running
// until interrupted, then does the same.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

func main() {
	root := envtestutil.Root()
	manager := flag.String("manager", filepath.Join(root, "bin", "manager"), "Manager binary.")
	dir := flag.String("dir", filepath.Join(root, "bin", "demo", "run"), "Directory for the kubeconfig and the manager log.")
	once := flag.Bool("once", os.Getenv("DEMO_ONCE") == "1" || os.Getenv("CI") == "true",
		"Delete the Proxy and exit once it has served a request (default with DEMO_ONCE=1 or CI=true).")
	flag.Parse()
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.WarnLevel)))
	if err := run(*manager, *dir, *once); err != nil {
		fmt.Fprintln(os.Stderr, "demo: error:", err)
		os.Exit(1)
	}
}

func say(format string, a ...any) { fmt.Printf("demo: "+format+"\n", a...) }

func run(manager, dir string, once bool) (reterr error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg, err := e2eutil.FromEnv()
	if err != nil {
		return err
	}
	if err := cfg.CheckReachability(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	url, sum := cfg.ImageURL, cfg.ImageChecksum
	if cfg.ImagePath != "" {
		srv, err := e2eutil.ServeImage(cfg.ImagePath, cfg.ImageListen, cfg.ImageHost)
		if err != nil {
			return err
		}
		defer srv.Close()
		url, sum = srv.URL, srv.Checksum
	}

	keyDir := filepath.Join(dir, "empty-ssh-key-dir")
	if err := os.MkdirAll(keyDir, 0o700); err != nil {
		return err
	}
	say("starting a local control plane and the manager (%s)", manager)
	op, err := e2eutil.StartLocal(ctx, dir, manager, e2eutil.ManagerArgs(cfg, keyDir, "demo", "demo-"+e2eutil.RunID()))
	if err != nil {
		return err
	}
	defer op.Stop()
	say("manager running; log %s", op.LogPath())
	c := op.Client()
	hv := e2eutil.NewHost(cfg)
	objs, err := e2eutil.NewObjects(cfg, "demo", op.SecretNamespace(), url, sum)
	if err != nil {
		return err
	}
	defer func() {
		if reterr != nil {
			path := filepath.Join(dir, "failure.txt")
			if f, err := os.Create(path); err == nil {
				e2eutil.Dump(context.Background(), f, op, hv, objs, "")
				_ = f.Close()
				say("diagnostics in %s", path)
			}
		}
	}()

	for _, o := range []client.Object{objs.Namespace, objs.Secret, objs.Host, objs.Image} {
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	say("created KVMHost %s (ssh %s@%s, pool %s, network %s, domain type %s) and KVMImage %s",
		objs.Host.Name, cfg.User, cfg.Address, cfg.Pool, cfg.Network, cfg.DomainType, objs.Image.Name)

	t := time.Now()
	var h *crawlv1.KVMHost
	if err := e2eutil.Poll(ctx, cfg.HostReadyTimeout, time.Second, func(ctx context.Context) (err error) {
		h, err = e2eutil.HostReady(ctx, c, objs.Host.Name)
		return err
	}); err != nil {
		return err
	}
	say("KVMHost Ready after %s: libvirt %s, pool %s with %s free", e2eutil.Seconds(time.Since(t)),
		h.Status.LibvirtVersion, h.Status.Pool.Name, h.Status.Pool.Available)

	t = time.Now()
	lastBytes := int64(-1)
	if err := e2eutil.Poll(ctx, cfg.ImageTimeout, 2*time.Second, func(ctx context.Context) error {
		img, err := e2eutil.ImageVerified(ctx, c, objs.Image.Name, objs.Host.Name)
		if err != nil && img != nil {
			if hs := img.Status.HostStatus(objs.Host.Name); hs != nil && hs.Bytes != lastBytes {
				lastBytes = hs.Bytes
				say("  image %s: %d/%d bytes", hs.Phase, hs.Bytes, hs.TotalBytes)
			}
		}
		return err
	}); err != nil {
		return err
	}
	say("KVMImage verified (sha256) and cached on the host after %s", e2eutil.Seconds(time.Since(t)))

	if err := c.Create(ctx, objs.Proxy); err != nil {
		return err
	}
	key := client.ObjectKeyFromObject(objs.Proxy)
	say("created Proxy %s; a %s guest boots (minutes under TCG)", key, cfg.DomainType)
	defer func() {
		// Interrupted or done: the Proxy goes, and with it the VM.
		if err := deleteProxy(op, hv, objs); err != nil {
			reterr = errors.Join(reterr, err)
		}
	}()

	t = time.Now()
	var p *crawlv1.Proxy
	last := ""
	if err := e2eutil.Poll(ctx, cfg.ProxyReadyTimeout, time.Second, func(ctx context.Context) (err error) {
		p, err = e2eutil.ProxyReady(ctx, c, key, objs.Host.Name)
		if p != nil && p.Status.Phase != "" {
			if s := string(p.Status.Phase) + " " + conditions.GetReason(p, crawlv1.ReadyCondition); s != last {
				last = s
				say("  [+%s] %s: %s", e2eutil.Seconds(time.Since(t)), p.Status.Phase, e2eutil.CondString(p, crawlv1.ReadyCondition))
			}
		}
		return err
	}); err != nil {
		return err
	}
	ttr := time.Since(t)

	var took time.Duration
	if err := e2eutil.Poll(ctx, time.Minute, 2*time.Second, func(ctx context.Context) (err error) {
		via, err := e2eutil.ProxyVia(ctx, c, p)
		if err != nil {
			return err
		}
		took, err = e2eutil.Want204(ctx, via, cfg.ProbeURL)
		return err
	}); err != nil {
		return err
	}
	fmt.Printf(`
demo: Proxy %s is Ready after %s
demo:   provider ID  %s
demo:   address      %s (from the %s)
demo:   endpoint     %s
demo:   proven       GET %s through it → 204 in %s
demo:   health       %s

`, key, e2eutil.Seconds(ttr), p.Status.ProviderID, p.Status.Address, sourceName(p.Status.AddressSource),
		p.Status.Endpoint, cfg.ProbeURL, took.Round(time.Millisecond), e2eutil.CondString(p, crawlv1.ProxyHealthyCondition))

	if once {
		say("DEMO_ONCE: deleting the Proxy and exiting")
		return nil
	}
	fmt.Printf(`demo: try it (the guest network exists only in the hypervisor's namespace):
demo:   ip netns exec %s curl -sS -o /dev/null -w '%%{http_code}\n' -x %s %s
demo:   ip netns exec %s kubectl --kubeconfig %s get kvmhosts,kvmimages,proxies -A
demo: running; Ctrl-C deletes the Proxy (and its VM) and stops the control plane.
demo: afterwards, `+"`make demo-down`"+` stops the test hypervisor.
`, cfg.NetNS, p.Status.Endpoint, cfg.ProbeURL, cfg.NetNS, op.Kubeconfig())
	select {
	case <-ctx.Done():
		say("interrupted: cleaning up")
	case <-op.Manager.Done():
		return fmt.Errorf("the manager exited; see %s", op.LogPath())
	}
	return nil
}

// deleteProxy deletes the Proxy, waits for the manager to release it, and
// checks the VM is gone from the hypervisor. It runs after an interrupt, so
// it has its own bounded context.
func deleteProxy(op *e2eutil.LocalOperator, hv e2eutil.Host, objs *e2eutil.Objects) error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := op.Client()
	t := time.Now()
	if err := client.IgnoreNotFound(c.Delete(ctx, objs.Proxy.DeepCopy())); err != nil {
		return fmt.Errorf("delete Proxy: %w", err)
	}
	if err := e2eutil.Poll(ctx, 3*time.Minute, time.Second, func(ctx context.Context) error {
		return e2eutil.Gone(ctx, c, objs.Proxy.DeepCopy())
	}); err != nil {
		return fmt.Errorf("Proxy deletion: %w (manager log: %s)", err, op.LogPath())
	}
	dom := domxml.DomainName(objs.Proxy.Namespace, objs.Proxy.Name)
	doms, err := e2eutil.Domains(ctx, hv)
	if err != nil {
		return fmt.Errorf("listing domains: %w", err)
	}
	if slices.Contains(doms, dom) {
		return fmt.Errorf("domain %s still exists after its Proxy was deleted", dom)
	}
	say("Proxy deleted in %s; domain %s is gone from the hypervisor", e2eutil.Seconds(time.Since(t)), dom)
	return nil
}

func sourceName(s string) string {
	if s == "agent" {
		return "guest agent"
	}
	return s
}
