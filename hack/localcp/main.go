// Command localcp runs the operator locally: a control plane from the
// envtest binaries, the manager binary with its webhooks over TLS, and the
// sample objects applied through those webhooks. It prints the admitted
// objects and, unless -once is given, keeps running until interrupted.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	"crawl.example.com/proxy-operator/test/envtestutil"
	"crawl.example.com/proxy-operator/test/localcp"
)

func main() {
	manager := flag.String("manager", "bin/manager", "Manager binary.")
	stateDir := flag.String("state-dir", "bin/local", "Directory for the kubeconfig and manager log.")
	samples := flag.String("samples", filepath.Join(envtestutil.Root(), "config", "samples"), "Directory of sample manifests to apply; empty applies none.")
	once := flag.Bool("once", false, "Exit after applying the samples instead of running until interrupted.")
	flag.Parse()
	if err := run(*manager, *stateDir, *samples, *once); err != nil {
		fmt.Fprintln(os.Stderr, "localcp:", err)
		os.Exit(1)
	}
}

func run(manager, stateDir, samples string, once bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	cp, err := localcp.Start(stateDir)
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	fmt.Printf("control plane up; kubeconfig: %s\n", cp.Kubeconfig)

	logPath := filepath.Join(stateDir, "manager.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	m, err := cp.StartManager(ctx, manager, logFile)
	if err != nil {
		return fmt.Errorf("%w (log: %s)", err, logPath)
	}
	defer func() { _ = m.Stop() }()
	fmt.Printf("manager ready (webhooks on TLS port %d); log: %s\n", cp.Env.WebhookInstallOptions.LocalServingPort, logPath)

	if samples != "" {
		c, err := client.New(cp.Config, client.Options{})
		if err != nil {
			return err
		}
		if err := applyDir(ctx, c, samples); err != nil {
			return err
		}
	}

	if once {
		return nil
	}
	fmt.Printf("\nrunning; try: KUBECONFIG=%s kubectl get kvmhosts,kvmimages,proxies -A\nCtrl-C stops the manager and the control plane.\n", cp.Kubeconfig)
	select {
	case <-ctx.Done():
	case <-m.Done():
		return fmt.Errorf("manager exited; see %s", logPath)
	}
	return nil
}

// applyDir creates every object of every YAML file in dir (kustomization.yaml
// excluded), through the admission webhooks, and prints what was admitted.
func applyDir(ctx context.Context, c client.Client, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if err := c.Create(ctx, u); err != nil {
				return fmt.Errorf("%s: create %s %s: %w", f, u.GetKind(), u.GetName(), err)
			}
			if u.GetAPIVersion() == "crawl.example.com/v1alpha1" {
				spec, _ := sigsyaml.Marshal(u.Object["spec"])
				fmt.Printf("\nadmitted %s %s (spec after defaulting):\n%s", u.GetKind(), u.GetName(), spec)
			}
		}
	}
	return nil
}
