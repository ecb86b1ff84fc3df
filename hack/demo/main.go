// Command demo shows the operator end to end on the local test hypervisor
// (test/e2e/infra/hypervisor.sh): a local control plane with the manager
// binary, one KVMHost, one KVMImage and a ProxyPool of two; it waits for the
// pool to be Available, prints what it publishes for crawlers (proxies.txt,
// passwords masked) and proves each entry with a request through it.
//
// Run it with hack/demo/demo.sh (`make demo`), which prepares the hypervisor
// and starts this program inside the hypervisor's network namespace, where
// the guests' addresses are. With -once (DEMO_ONCE=1 or CI=true) it deletes
// the pool, checks its VMs are gone and exits; otherwise it keeps running
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
		"Delete the ProxyPool and exit once each of its proxies has served a request (default with DEMO_ONCE=1 or CI=true).")
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
			dumpDiagnostics(filepath.Join(dir, "failure.txt"), op, hv, objs)
		}
	}()

	if err := createHostAndImage(ctx, c, cfg, objs); err != nil {
		return err
	}
	if err := waitHostReady(ctx, c, cfg, objs); err != nil {
		return err
	}
	if err := waitImageCached(ctx, c, cfg, objs); err != nil {
		return err
	}

	pool := objs.NewPool("crawl", 2)
	if err := c.Create(ctx, pool); err != nil {
		return fmt.Errorf("create ProxyPool: %w", err)
	}
	key := client.ObjectKeyFromObject(pool)
	say("created ProxyPool %s: 2 replicas of %d vCPU, %s, rolled with maxSurge 1 / maxUnavailable 0; %s guests boot (minutes under TCG)",
		key, e2eutil.PoolReplicaCPUs, e2eutil.PoolReplicaMemory, cfg.DomainType)
	var seen []e2eutil.ProxyRef
	defer func() {
		// Interrupted or done: the pool goes, and with it its VMs.
		if err := deletePool(op, hv, cfg.Pool, pool, seen); err != nil {
			reterr = errors.Join(reterr, err)
		}
	}()

	t := time.Now()
	replicas, lines, err := waitPoolServing(ctx, c, cfg, objs, pool, t, &seen)
	if err != nil {
		return err
	}
	if err := showAndProve(ctx, cfg, key, time.Since(t), replicas, lines); err != nil {
		return err
	}

	if once {
		say("DEMO_ONCE: deleting the ProxyPool and exiting")
		return nil
	}
	printTryIt(cfg, op, key)
	select {
	case <-ctx.Done():
		say("interrupted: cleaning up")
	case <-op.Manager.Done():
		return fmt.Errorf("the manager exited; see %s", op.LogPath())
	}
	return nil
}

// dumpDiagnostics writes what the manager, the cluster and the hypervisor
// show into path, for a run that failed.
func dumpDiagnostics(path string, op *e2eutil.LocalOperator, hv e2eutil.Host, objs *e2eutil.Objects) {
	f, err := os.Create(path)
	if err != nil {
		return
	}
	e2eutil.Dump(context.Background(), f, op, hv, objs, "")
	_ = f.Close()
	say("diagnostics in %s", path)
}

// createHostAndImage creates the namespace, the SSH Secret, the KVMHost and
// the KVMImage.
func createHostAndImage(ctx context.Context, c client.Client, cfg e2eutil.Config, objs *e2eutil.Objects) error {
	for _, o := range []client.Object{objs.Namespace, objs.Secret, objs.Host, objs.Image} {
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	say("created KVMHost %s (ssh %s@%s, pool %s, network %s, domain type %s) and KVMImage %s",
		objs.Host.Name, cfg.User, cfg.Address, cfg.Pool, cfg.Network, cfg.DomainType, objs.Image.Name)
	return nil
}

func waitHostReady(ctx context.Context, c client.Client, cfg e2eutil.Config, objs *e2eutil.Objects) error {
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
	return nil
}

// waitImageCached waits for the image to be verified on the host, printing
// the download's progress.
func waitImageCached(ctx context.Context, c client.Client, cfg e2eutil.Config, objs *e2eutil.Objects) error {
	t := time.Now()
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
	return nil
}

// waitPoolServing waits for the pool to publish both replicas, printing its
// status (time since start) as it changes; every replica it ever had is
// added to seen.
func waitPoolServing(ctx context.Context, c client.Client, cfg e2eutil.Config, objs *e2eutil.Objects, pool *crawlv1.ProxyPool,
	start time.Time, seen *[]e2eutil.ProxyRef) (replicas []crawlv1.Proxy, lines []string, err error) {
	key := client.ObjectKeyFromObject(pool)
	last := ""
	err = e2eutil.Poll(ctx, cfg.ProxyReadyTimeout+time.Minute, time.Second, func(ctx context.Context) (err error) {
		var got *crawlv1.ProxyPool
		got, replicas, lines, err = e2eutil.PoolServing(ctx, c, key, 2, objs.Host.Name)
		if reps, lerr := e2eutil.PoolReplicas(ctx, c, pool); lerr == nil {
			*seen = remember(*seen, reps)
		}
		if got != nil {
			st := got.Status
			if s := fmt.Sprintf("%d replicas, %d ready, %d available; Available %s", st.Replicas, st.ReadyReplicas, st.AvailableReplicas,
				conditions.GetReason(got, crawlv1.PoolAvailableCondition)); s != last {
				last = s
				say("  [+%s] %s", e2eutil.Seconds(time.Since(start)), s)
			}
		}
		return err
	})
	return replicas, lines, err
}

// showAndProve prints the replicas and the published list (passwords
// masked) and proves each entry with a request through it.
func showAndProve(ctx context.Context, cfg e2eutil.Config, key client.ObjectKey, ttr time.Duration, replicas []crawlv1.Proxy, lines []string) error {
	fmt.Printf("\ndemo: ProxyPool %s is Available after %s: every replica Ready and published\n", key, e2eutil.Seconds(ttr))
	for _, p := range replicas {
		fmt.Printf("demo:   replica %-14s %-9s %s (from the %s) on %s\n", p.Name, p.Status.Phase, p.Status.Endpoint,
			sourceName(p.Status.AddressSource), p.Status.Host)
	}
	fmt.Printf("demo: Secret %s/%s, %s (what a crawler reads; passwords masked here):\n", key.Namespace, crawlv1.PublishedName(key.Name), crawlv1.ProxiesTextKey)
	for _, l := range lines {
		fmt.Printf("demo:   %s\n", e2eutil.MaskURL(l))
	}
	for _, l := range lines {
		via, err := e2eutil.ViaURL(l)
		if err != nil {
			return err
		}
		var took time.Duration
		if err := e2eutil.Poll(ctx, time.Minute, 2*time.Second, func(ctx context.Context) (err error) {
			took, err = e2eutil.Want204(ctx, via, cfg.ProbeURL)
			return err
		}); err != nil {
			return err
		}
		fmt.Printf("demo:   proven: GET %s through %s → 204 in %s\n", cfg.ProbeURL, via.Endpoint, took.Round(time.Millisecond))
	}
	fmt.Println()
	return nil
}

// printTryIt tells how to reach the running demo.
func printTryIt(cfg e2eutil.Config, op *e2eutil.LocalOperator, key client.ObjectKey) {
	fmt.Printf(`demo: try it (the guest network exists only in the hypervisor's namespace):
demo:   ip netns exec %[1]s kubectl --kubeconfig %[2]s -n %[3]s get proxypools,proxies
demo:   ip netns exec %[1]s kubectl --kubeconfig %[2]s -n %[3]s get secret %[4]s -o jsonpath='{.data.proxies\.txt}' | base64 -d
demo:   ip netns exec %[1]s kubectl --kubeconfig %[2]s -n %[3]s scale proxypool %[5]s --replicas=3
demo: running; Ctrl-C deletes the ProxyPool (and its VMs) and stops the control plane.
demo: afterwards, `+"`make demo-down`"+` stops the test hypervisor.
`, cfg.NetNS, op.Kubeconfig(), key.Namespace, crawlv1.PublishedName(key.Name), key.Name)
}

// remember adds the replicas not seen yet, so the check after deletion
// covers every VM the pool ever had.
func remember(seen []e2eutil.ProxyRef, reps []crawlv1.Proxy) []e2eutil.ProxyRef {
	for _, p := range reps {
		r := e2eutil.ProxyRef{Domain: domxml.DomainName(p.Namespace, p.Name), UID: string(p.UID)}
		if !slices.Contains(seen, r) {
			seen = append(seen, r)
		}
	}
	return seen
}

// deletePool deletes the pool, waits for it and its replicas to go, and
// checks the hypervisor holds no domain, volume or NVRAM file of any
// replica seen. It runs after an interrupt, so it has its own bounded
// context.
func deletePool(op *e2eutil.LocalOperator, hv e2eutil.Host, storagePool string, pool *crawlv1.ProxyPool, seen []e2eutil.ProxyRef) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := op.Client()
	if reps, err := e2eutil.PoolReplicas(ctx, c, pool); err == nil {
		seen = remember(seen, reps)
	}
	t := time.Now()
	if err := client.IgnoreNotFound(c.Delete(ctx, pool.DeepCopy())); err != nil {
		return fmt.Errorf("delete ProxyPool: %w", err)
	}
	// The pool unpublishes, deletes its replicas (each its VM) and goes
	// last: no garbage collector needed.
	if err := e2eutil.Poll(ctx, 4*time.Minute, time.Second, func(ctx context.Context) error {
		return e2eutil.Gone(ctx, c, pool.DeepCopy())
	}); err != nil {
		return fmt.Errorf("ProxyPool deletion: %w (manager log: %s)", err, op.LogPath())
	}
	say("ProxyPool deleted: its list unpublished, then its replicas and their VMs")
	if err := e2eutil.Poll(ctx, 4*time.Minute, time.Second, func(ctx context.Context) error {
		reps, err := e2eutil.PoolReplicas(ctx, c, pool)
		if err == nil && len(reps) > 0 {
			return fmt.Errorf("%d replicas still exist", len(reps))
		}
		return err
	}); err != nil {
		return fmt.Errorf("replicas' deletion: %w (manager log: %s)", err, op.LogPath())
	}
	left, audit, err := e2eutil.PoolLeftovers(ctx, hv, c, storagePool, seen)
	if err != nil {
		return fmt.Errorf("inventory of the hypervisor: %w", err)
	}
	if len(left) > 0 || audit.Leaks() > 0 {
		return fmt.Errorf("after the ProxyPool's deletion the hypervisor still holds %v; audit: %s", left, audit)
	}
	say("ProxyPool and its %d replicas deleted in %s; none of their domains, volumes or NVRAM files is left on the hypervisor", len(seen), e2eutil.Seconds(time.Since(t)))
	return nil
}

func sourceName(s string) string {
	if s == "agent" {
		return "guest agent"
	}
	return s
}
