package e2eutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider"
)

// The checks below look once and return nil when the state is reached, or
// an error saying what was seen. Gomega's Eventually(...).WithTimeout() and
// Poll bound them in time.

// Poll runs check every interval until it returns nil, ctx ends, or timeout
// passes; the error then names the timeout and check's last answer.
func Poll(ctx context.Context, timeout, interval time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, max(interval, 30*time.Second))
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %s: %w", timeout, last)
		case <-time.After(interval):
		}
	}
}

// HostReady: the KVMHost is Ready and reports libvirt's version and its
// pool's free space.
func HostReady(ctx context.Context, c client.Client, name string) (*crawlv1.KVMHost, error) {
	h := &crawlv1.KVMHost{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, h); err != nil {
		return nil, err
	}
	switch {
	case !conditions.IsTrue(h, crawlv1.ReadyCondition):
		return h, fmt.Errorf("KVMHost %s not Ready: %s", name, condString(h, crawlv1.ReadyCondition))
	case h.Status.LibvirtVersion == "":
		return h, fmt.Errorf("KVMHost %s Ready without status.libvirtVersion", name)
	case h.Status.Pool == nil || h.Status.Pool.AvailableBytes <= 0 || h.Status.Pool.Available == "":
		return h, fmt.Errorf("KVMHost %s Ready without pool free space: %+v", name, h.Status.Pool)
	}
	return h, nil
}

// HostReason: the KVMHost's Ready condition has status and reason.
func HostReason(ctx context.Context, c client.Client, name string, status metav1.ConditionStatus, reason string) (*crawlv1.KVMHost, error) {
	h := &crawlv1.KVMHost{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, h); err != nil {
		return nil, err
	}
	cond := conditions.Get(h, crawlv1.ReadyCondition)
	if cond == nil || cond.Status != status || cond.Reason != reason {
		return h, fmt.Errorf("KVMHost %s Ready is %s, want %s/%s", name, condString(h, crawlv1.ReadyCondition), status, reason)
	}
	return h, nil
}

// ImageVerified: the KVMImage is verified on host.
func ImageVerified(ctx context.Context, c client.Client, name, host string) (*crawlv1.KVMImage, error) {
	img := &crawlv1.KVMImage{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, img); err != nil {
		return nil, err
	}
	hs := img.Status.HostStatus(host)
	switch {
	case hs == nil:
		return img, fmt.Errorf("KVMImage %s has no entry for host %s yet (Ready: %s)", name, host, condString(img, crawlv1.ReadyCondition))
	case hs.Phase != crawlv1.ImageHostVerified || !hs.Verified:
		return img, fmt.Errorf("KVMImage %s on %s: phase %s, %d/%d bytes, %s", name, host, hs.Phase, hs.Bytes, hs.TotalBytes, hs.Message)
	case hs.Volume == "":
		return img, fmt.Errorf("KVMImage %s verified on %s without a volume name", name, host)
	}
	return img, nil
}

// ProxyReady: the Proxy is Ready with a kvm providerID on host, an address
// reported by the guest agent, and a healthy probe that went through squid.
func ProxyReady(ctx context.Context, c client.Client, key client.ObjectKey, host string) (*crawlv1.Proxy, error) {
	p := &crawlv1.Proxy{}
	if err := c.Get(ctx, key, p); err != nil {
		return nil, err
	}
	if p.Status.Phase != crawlv1.ProxyReady {
		return p, fmt.Errorf("Proxy %s is %s: %s", key, orStr(string(p.Status.Phase), "(no phase)"), condString(p, crawlv1.ReadyCondition))
	}
	return p, CheckReadyProxy(p, host)
}

// CheckReadyProxy checks what a Ready KVM Proxy on the test hypervisor's
// NAT network must report: the lease is its address's source, the host's
// view, published before the guest agent's.
func CheckReadyProxy(p *crawlv1.Proxy, host string) error {
	return CheckReadyProxyFrom(p, host, provider.AddressSourceLease)
}

// CheckReadyProxyFrom checks what a Ready KVM Proxy must report, its
// address known from addressSource (the agent's, on a bridge: no lease).
func CheckReadyProxyFrom(p *crawlv1.Proxy, host, addressSource string) error {
	var errs []error
	h, uuid, err := provider.ParseKVMProviderID(p.Status.ProviderID)
	if err != nil || h != host || uuid == "" {
		errs = append(errs, fmt.Errorf("providerID %q is not kvm://%s/<uuid>", p.Status.ProviderID, host))
	}
	if p.Status.Address == "" {
		errs = append(errs, errors.New("no status.address"))
	}
	if p.Status.AddressSource != addressSource {
		errs = append(errs, fmt.Errorf("addressSource %q, want %q", p.Status.AddressSource, addressSource))
	}
	if want := fmt.Sprintf("http://%s:%d", p.Status.Address, p.Spec.Port); p.Status.Endpoint != want {
		errs = append(errs, fmt.Errorf("endpoint %q, want %q", p.Status.Endpoint, want))
	}
	if r := conditions.GetReason(p, crawlv1.ProxyHealthyCondition); !conditions.IsTrue(p, crawlv1.ProxyHealthyCondition) || r != crawlv1.ProxyProbeSucceededReason {
		errs = append(errs, fmt.Errorf("ProxyHealthy is %s, want True/%s (a request through squid)", condString(p, crawlv1.ProxyHealthyCondition), crawlv1.ProxyProbeSucceededReason))
	}
	return errors.Join(errs...)
}

// Gone: the object no longer exists.
func Gone(ctx context.Context, c client.Client, obj client.Object) error {
	err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return err
	}
	return fmt.Errorf("%s %s still exists (deletionTimestamp %v, finalizers %v)", obj.GetObjectKind().GroupVersionKind().Kind,
		client.ObjectKeyFromObject(obj), obj.GetDeletionTimestamp(), obj.GetFinalizers())
}

// Via is how a request reaches a proxy: its endpoint (http://ADDR:PORT, as
// in Proxy.status.endpoint) and, for a squid that demands them, the
// credentials sent as Proxy-Authorization (Basic). Every request the e2e
// sends through a proxy goes through Via.Get.
type Via struct {
	Endpoint    string
	Credentials *url.Userinfo
	// Source, when set, is the local address the connection to the proxy
	// is bound to (a client outside the proxy's allowed sources).
	Source string
	// Timeout bounds one request (default 10 s).
	Timeout time.Duration
}

// ViaEndpoint is a Via without credentials.
func ViaEndpoint(endpoint string) Via { return Via{Endpoint: endpoint} }

// Get sends GET target through the proxy on a fresh connection and returns
// the status code and the latency.
func (v Via) Get(ctx context.Context, target string) (int, time.Duration, error) {
	code, _, took, err := v.Fetch(ctx, target)
	return code, took, err
}

// Fetch is Get that also returns the body (at most 1 MiB).
func (v Via) Fetch(ctx context.Context, target string) (int, []byte, time.Duration, error) {
	pu, err := url.Parse(v.Endpoint)
	if err != nil {
		return 0, nil, 0, err
	}
	if v.Credentials != nil {
		pu.User = v.Credentials
	}
	tr := &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true}
	if v.Source != "" {
		ip := net.ParseIP(v.Source)
		if ip == nil {
			return 0, nil, 0, fmt.Errorf("source address %q is not an IP address", v.Source)
		}
		tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).DialContext
	}
	defer tr.CloseIdleConnections()
	return fetch(ctx, tr, target, v.Timeout)
}

// fetch GETs target through tr within timeout (10 s when 0) and returns
// the status code, the body (at most 1 MiB, read to its end so a kept-alive
// connection serves the next request) and the latency.
func fetch(ctx context.Context, tr http.RoundTripper, target string, timeout time.Duration) (int, []byte, time.Duration, error) {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return 0, nil, 0, err
	}
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, nil, time.Since(start), err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	took := time.Since(start)
	_ = resp.Body.Close()
	return resp.StatusCode, body, took, err
}

// WantStatus is Via.Get that fails unless the answer is code.
func WantStatus(ctx context.Context, via Via, target string, code int) (time.Duration, error) {
	got, took, err := via.Get(ctx, target)
	if err != nil {
		return took, fmt.Errorf("GET %s through %s: %w", target, via.Endpoint, err)
	}
	if got != code {
		return took, fmt.Errorf("GET %s through %s: status %d, want %d", target, via.Endpoint, got, code)
	}
	return took, nil
}

// Want204 is Via.Get that fails unless the answer is 204.
func Want204(ctx context.Context, via Via, target string) (time.Duration, error) {
	return WantStatus(ctx, via, target, http.StatusNoContent)
}

type conditioned interface {
	GetConditions() []metav1.Condition
}

func condString(o conditioned, t string) string {
	for _, c := range o.GetConditions() {
		if c.Type == t {
			return fmt.Sprintf("%s/%s (%s)", c.Status, c.Reason, strings.TrimSpace(c.Message))
		}
	}
	return "(no " + t + " condition)"
}

// CondString renders condition t of o as "Status/Reason (message)".
func CondString(o conditioned, t string) string { return condString(o, t) }

func orStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
