package e2eutil

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Internet is what the egress e2e calls the internet: a network namespace
// of the test's own, joined to the namespace the test runs in (the test
// hypervisor's) by a veth pair, with an address-echo server in it. The
// echo answers every request with the address it came from, as
// api.ipify.org does, and records it: a request that left a proxy through
// libvirt's NAT arrives from the hypervisor's side of the veth; one from a
// VM with a routed static address arrives from that address.
//
// The namespace has no name and no process: a thread of the test process
// enters it, opens a handle on it and, once the veth is configured, the
// echo's listener, and ends; the handle and the listener keep it alive
// until Close, and it (with the veth pair) is gone when they close or the
// test process exits.
type Internet struct {
	// HostAddress is the hypervisor's side of the veth: the source of
	// whatever the hypervisor's NAT sends out.
	HostAddress string
	// EchoURL is the echo server, http://ADDRESS/ (port 80).
	EchoURL string

	ns       *os.File
	hostLink string
	srv      *http.Server

	mu      sync.Mutex
	sources map[string]int
}

// StartInternet makes the namespace and the veth pair: host (in the
// current namespace) and far (in the new one) are the two ends' addresses
// in one prefix; the new namespace routes everything back through host.
// It needs root (CAP_NET_ADMIN).
func StartInternet(ctx context.Context, host, far netip.Prefix) (*Internet, error) {
	if host.Bits() != far.Bits() || !host.Masked().Contains(far.Addr()) {
		return nil, fmt.Errorf("internet: %s and %s are not in one prefix", host, far)
	}
	// A thread enters the new namespace and stays there until the veth is
	// configured, then opens the echo's listener on its address in it.
	type entered struct {
		ns  *os.File
		l   net.Listener
		err error
	}
	ch := make(chan entered, 1)
	configured := make(chan bool)
	go func() {
		// Never unlocked: the thread is in another namespace, so it must
		// end with this goroutine rather than run other goroutines.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- entered{err: fmt.Errorf("internet: unshare the network namespace: %w", err)}
			return
		}
		ns, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		ch <- entered{ns: ns, err: err}
		if err != nil || !<-configured {
			return
		}
		l, err := net.Listen("tcp4", net.JoinHostPort(far.Addr().String(), "80"))
		if err != nil {
			err = fmt.Errorf("internet: echo listener: %w", err)
		}
		ch <- entered{l: l, err: err}
	}()
	e := <-ch
	if e.err != nil {
		return nil, e.err
	}
	id := RunID()
	in := &Internet{
		HostAddress: host.Addr().String(),
		EchoURL:     "http://" + far.Addr().String() + "/",
		ns:          e.ns,
		hostLink:    "pxi" + id + "h",
		sources:     map[string]int{},
	}
	nsPath := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), e.ns.Fd())
	farLink := "pxi" + id + "f"
	steps := [][]string{
		{"ip", "link", "add", in.hostLink, "type", "veth", "peer", "name", farLink},
		{"ip", "link", "set", farLink, "netns", nsPath},
		{"ip", "addr", "add", host.String(), "dev", in.hostLink},
		{"ip", "link", "set", in.hostLink, "up"},
		{"nsenter", "--net=" + nsPath, "ip", "link", "set", "lo", "up"},
		{"nsenter", "--net=" + nsPath, "ip", "addr", "add", far.String(), "dev", farLink},
		{"nsenter", "--net=" + nsPath, "ip", "link", "set", farLink, "up"},
		{"nsenter", "--net=" + nsPath, "ip", "route", "add", "default", "via", host.Addr().String()},
	}
	for _, argv := range steps {
		if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
			configured <- false
			in.Close()
			return nil, fmt.Errorf("internet: %s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
		}
	}
	configured <- true
	if e = <-ch; e.err != nil {
		in.Close()
		return nil, e.err
	}
	in.srv = &http.Server{Handler: in, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = in.srv.Serve(e.l) }()
	return in, nil
}

// ServeHTTP answers with the request's source address, as an echo
// endpoint the operator accepts does (a bare address and a newline).
func (in *Internet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	source, _, _ := net.SplitHostPort(r.RemoteAddr)
	in.mu.Lock()
	in.sources[source]++
	in.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain")
	_, _ = fmt.Fprintln(w, source)
}

// Sources are the distinct addresses requests came from so far, sorted.
func (in *Internet) Sources() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Sorted(maps.Keys(in.sources))
}

// Close stops the echo and lets the namespace go; the veth pair goes with
// it (the host's end is deleted too, in case something still holds the
// namespace).
func (in *Internet) Close() {
	if in.srv != nil {
		_ = in.srv.Close()
	}
	_ = exec.Command("ip", "link", "del", in.hostLink).Run()
	if in.ns != nil {
		_ = in.ns.Close()
	}
}

// Bridge is a Linux bridge in the current namespace with an address, for
// guests that take static addresses routed to the hypervisor (no NAT): the
// address is their gateway.
type Bridge struct {
	Name string
}

// AddBridge creates bridge name with address gw (e.g. 203.0.113.1/28) and
// brings it up.
func AddBridge(ctx context.Context, name string, gw netip.Prefix) (*Bridge, error) {
	b := &Bridge{Name: name}
	for _, argv := range [][]string{
		{"ip", "link", "add", name, "type", "bridge"},
		{"ip", "addr", "add", gw.String(), "dev", name},
		{"ip", "link", "set", name, "up"},
	} {
		if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
			b.Delete()
			return nil, fmt.Errorf("bridge %s: %s: %w: %s", name, strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return b, nil
}

// Delete removes the bridge (a no-op once gone).
func (b *Bridge) Delete() {
	_ = exec.Command("ip", "link", "del", b.Name).Run()
}

// ErrNoEcho: an echo answer that is not one address.
var ErrNoEcho = errors.New("echo answer is not one address")

// EchoThrough asks the echo at url through via and returns the address it
// saw.
func EchoThrough(ctx context.Context, via Via, url string) (string, error) {
	code, body, _, err := via.Fetch(ctx, url)
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("echo through %s: status %d", via.Endpoint, code)
	}
	a, err := netip.ParseAddr(strings.TrimSpace(string(body)))
	if err != nil {
		return "", fmt.Errorf("%w: %q", ErrNoEcho, body)
	}
	return a.String(), nil
}
