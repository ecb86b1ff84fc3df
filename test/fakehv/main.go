// Command fakehv runs many in-memory KVM hosts in a process of their own,
// each as the kvm provider reaches a real one: an SSH server on a loopback
// port (public-key login, a host key of its own) that forwards
// direct-streamlocal channels to libvirt's socket path, behind which the
// in-memory libvirt (virt/fake) is served over libvirt's remote protocol
// (fake.Serve). A manager pointed at them dials, authenticates, forwards
// and speaks go-libvirt exactly as to libvirtd, so benchmarks can read the
// manager's memory and CPU apart from its hypervisors'. It plays the
// guests too: a domain that starts gets a guest agent address at once.
//
// It writes into -dir: known_hosts (one line per host) and hosts.json
// (name, SSH address), then prints "ready" on stdout. It serves statistics
// as JSON on the unix socket -dir/control.sock (GET /stats), and exits on
// SIGTERM, SIGINT or when its stdin closes (its parent went away).
//
// It is a test tool: it is not built into the manager's image.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn/sshtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/remote"
)

// Host is one entry of hosts.json.
type Host struct {
	Name    string `json:"name"`
	Address string `json:"address"` // SSH, host:port
}

// Stats is what GET /stats returns.
type Stats struct {
	Hosts   int `json:"hosts"`
	Domains int `json:"domains"`
	// Calls counts libvirt calls served, by RPC name (virt.RPC*), over
	// every host, including the subscriptions fakehv's own guest player
	// makes (one lifecycle registration per host).
	Calls      map[string]int `json:"calls"`
	TotalCalls int            `json:"totalCalls"`
	// Booted counts domains given a guest agent address.
	Booted int64 `json:"booted"`
}

func main() {
	var cfg config
	flag.IntVar(&cfg.hosts, "hosts", 50, "Number of hosts.")
	flag.StringVar(&cfg.prefix, "name-prefix", "fakehv", "Host names are <prefix>-000, <prefix>-001, ...")
	flag.StringVar(&cfg.dir, "dir", "", "Directory for known_hosts, hosts.json, the libvirt sockets and control.sock (required; keep it short: unix socket paths are limited to ~100 bytes).")
	authorizedKey := flag.String("authorized-key", "", "File with the OpenSSH public key allowed to log in (required).")
	flag.IntVar(&cfg.maxStored, "max-stored-bytes", 0, "Volume content kept per volume (beyond it only size and digest); 0 keeps none, so the hosts' memory stays small.")
	flag.IntVar(&cfg.maxRequests, "max-client-requests", 5, "Calls in flight per libvirt connection, as libvirtd's max_client_requests (its default is 5).")
	flag.IntVar(&cfg.cpus, "host-cpus", fake.DefaultCPUs, "Logical CPUs each host reports.")
	flag.IntVar(&cfg.memoryGiB, "host-memory-gib", fake.DefaultMemoryBytes>>30, "Memory each host reports, GiB.")
	flag.BoolVar(&cfg.bootGuests, "boot-guests", true, "Give each domain that starts a guest agent address, as a booted guest's agent reports.")
	flag.Parse()
	if err := run(cfg, *authorizedKey); err != nil {
		fmt.Fprintln(os.Stderr, "fakehv:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	hosts, maxStored, maxRequests, cpus, memoryGiB int
	prefix, dir                                    string
	bootGuests                                     bool
	clientKey                                      ssh.PublicKey
}

func run(cfg config, authorizedKey string) error {
	if cfg.dir == "" || authorizedKey == "" {
		return errors.New("-dir and -authorized-key are required")
	}
	keyText, err := os.ReadFile(authorizedKey)
	if err != nil {
		return err
	}
	if cfg.clientKey, _, _, _, err = ssh.ParseAuthorizedKey(keyText); err != nil {
		return fmt.Errorf("%s: %w", authorizedKey, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() { // the parent's end of stdin closes when it exits
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	fl, err := start(ctx, cfg)
	if err != nil {
		return err
	}
	defer fl.close()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	if err := out.Flush(); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// fleet is the running hosts.
type fleet struct {
	fakes   []*fake.Fake
	hosts   []Host
	booter  guestPlayer
	closers []func()
}

func (fl *fleet) close() {
	for i := len(fl.closers) - 1; i >= 0; i-- {
		fl.closers[i]()
	}
}

// start serves cfg.hosts hosts until ctx ends or close, and writes
// known_hosts and hosts.json into cfg.dir.
func start(ctx context.Context, cfg config) (_ *fleet, err error) {
	fl := &fleet{}
	defer func() {
		if err != nil {
			fl.close()
		}
	}()
	var known []byte
	for i := range cfg.hosts {
		name := fmt.Sprintf("%s-%03d", cfg.prefix, i)
		f := kvmtest.NewHost(fake.WithHostname(name), fake.WithMaxStoredBytes(cfg.maxStored),
			fake.WithHostSize(int32(cfg.cpus), uint64(cfg.memoryGiB)<<30))
		sock := filepath.Join(cfg.dir, fmt.Sprintf("h%03d.sock", i))
		ln, err := net.Listen("unix", sock)
		if err != nil {
			return nil, err
		}
		lv := fake.Serve(f, ln, remote.Options{MaxClientRequests: cfg.maxRequests})
		fl.closers = append(fl.closers, lv.Close)
		srv, err := sshtest.Start(sshtest.Config{
			AuthorizedKeys: []ssh.PublicKey{cfg.clientKey},
			// sshd forwards to the path the client asks for; only
			// libvirt's is here.
			Forward: func(path string) (net.Conn, error) {
				if path != crawlv1.DefaultLibvirtSocket {
					return nil, fmt.Errorf("%s: no such file or directory", path)
				}
				return net.Dial("unix", sock)
			},
		})
		if err != nil {
			return nil, err
		}
		fl.closers = append(fl.closers, srv.Close)
		fl.fakes = append(fl.fakes, f)
		fl.hosts = append(fl.hosts, Host{Name: name, Address: srv.Addr()})
		known = append(known, srv.KnownHosts()...)
		if cfg.bootGuests {
			events, err := f.Connect().LifecycleEvents(ctx)
			if err != nil {
				return nil, err
			}
			go fl.booter.play(f, events)
		}
	}
	if err := os.WriteFile(filepath.Join(cfg.dir, "known_hosts"), known, 0o600); err != nil {
		return nil, err
	}
	hostsJSON, err := json.Marshal(fl.hosts)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(cfg.dir, "hosts.json"), hostsJSON, 0o600); err != nil {
		return nil, err
	}
	ctl, err := net.Listen("unix", filepath.Join(cfg.dir, "control.sock"))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(fl.stats())
	})
	hs := &http.Server{Handler: mux}
	go func() { _ = hs.Serve(ctl) }()
	fl.closers = append(fl.closers, func() { _ = hs.Close() })
	return fl, nil
}

func (fl *fleet) stats() Stats {
	s := Stats{Hosts: len(fl.fakes), Calls: map[string]int{}, Booted: fl.booter.booted.Load()}
	for _, f := range fl.fakes {
		s.Domains += len(f.DomainNames())
		for _, rpc := range virt.RPCNames {
			if n := f.Calls(rpc); n > 0 {
				s.Calls[rpc] += n
			}
		}
		s.TotalCalls += f.TotalCalls()
	}
	return s
}

// guestPlayer gives every domain that starts an agent address, unique over
// all hosts, as its guest agent reports once the guest has booted.
type guestPlayer struct {
	next   atomic.Int64
	booted atomic.Int64
}

func (g *guestPlayer) play(f *fake.Fake, events <-chan libvirt.DomainEventLifecycleMsg) {
	for ev := range events {
		if libvirt.DomainEventType(ev.Event) != libvirt.DomainEventStarted {
			continue
		}
		n := g.next.Add(1)
		f.SetAgentAddresses(ev.Dom.Name, []libvirt.DomainInterface{{Name: "eth0", Addrs: []libvirt.DomainIPAddr{{
			Type: int32(libvirt.IPAddrTypeIpv4), Addr: fmt.Sprintf("10.%d.%d.%d", n/62500%250, n/250%250, n%250+1), Prefix: 8}}}})
		g.booted.Add(1)
	}
}
