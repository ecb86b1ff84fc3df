package e2eutil

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// Scheme knows the core kinds and ours.
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := crawlv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// ProxyPort is the port the operator's managed squid listens on.
const ProxyPort = 3128

// Objects are the API objects one run creates.
type Objects struct {
	Namespace *corev1.Namespace
	Secret    *corev1.Secret
	Host      *crawlv1.KVMHost
	Image     *crawlv1.KVMImage
	Proxy     *crawlv1.Proxy

	access *crawlv1.ProxyAccess
	// proxyReadyTimeout is the run's bound on a boot (NewPool's
	// startupTimeout).
	proxyReadyTimeout time.Duration
}

// RunID returns a short random id; cluster-scoped names carry it so runs
// against a shared cluster never collide.
func RunID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NewObjects builds the objects for one proxy on the configured hypervisor:
// prefix names the namespace, the KVMHost, its Secret and the KVMImage. The
// Secret goes into secretNamespace, the manager's (Operator.SecretNamespace).
func NewObjects(c Config, prefix, secretNamespace, imageURL, imageChecksum string) (*Objects, error) {
	access, err := Access(c)
	if err != nil {
		return nil, err
	}
	ns := prefix
	o := &Objects{
		access:            access,
		proxyReadyTimeout: c.ProxyReadyTimeout,
		Namespace:         &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		Secret: &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: prefix + "-ssh", Namespace: secretNamespace},
			Data: map[string][]byte{
				crawlv1.SSHPrivateKeyKey: c.PrivateKey,
				crawlv1.KnownHostsKey:    c.KnownHosts,
			},
		},
		Host: &crawlv1.KVMHost{
			ObjectMeta: metav1.ObjectMeta{Name: prefix + "-hv"},
			Spec: crawlv1.KVMHostSpec{
				Address:         c.Address,
				User:            c.User,
				SSHKeySecretRef: &crawlv1.SecretReference{Name: prefix + "-ssh", Namespace: secretNamespace},
				SocketPath:      c.SocketPath,
				StoragePool:     c.Pool,
				Network:         c.Network,
				NetworkMode:     crawlv1.NetworkMode(c.NetworkMode),
				DomainType:      crawlv1.DomainType(c.DomainType),
				CheckInterval:   &metav1.Duration{Duration: c.CheckInterval},
				CheckTimeout:    &metav1.Duration{Duration: c.CheckTimeout},
			},
		},
		Image: &crawlv1.KVMImage{
			ObjectMeta: metav1.ObjectMeta{Name: prefix + "-squid"},
			Spec: crawlv1.KVMImageSpec{
				URL:      imageURL,
				Checksum: imageChecksum,
				Format:   crawlv1.ImageFormatQCOW2,
				Firmware: crawlv1.FirmwareUEFI,
			},
		},
	}
	o.Proxy = o.NewProxy("squid-1", 2, "1Gi")
	return o, nil
}

// NewProxy is a Proxy in the run's namespace on the run's KVMHost and
// KVMImage, with no cloud-init of its own: the operator's managed squid,
// a generated credential and Access. Every Proxy the suites create is
// built here, so a change of what a Proxy needs is made once. cpus and
// memory size the guest (the main e2e measured its timings with 2 vCPU and
// 1Gi under TCG; fault specs use 1 vCPU).
func (o *Objects) NewProxy(name string, cpus int32, memory string) *crawlv1.Proxy {
	return &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.Namespace.Name},
		Spec: crawlv1.ProxySpec{
			Provider:  crawlv1.ProviderKVM,
			Placement: crawlv1.ProxyPlacement{Host: o.Host.Name, Image: o.Image.Name},
			Resources: crawlv1.ProxyResources{
				CPUs:   cpus,
				Memory: ptr.To(resource.MustParse(memory)),
				Disk:   ptr.To(resource.MustParse("4Gi")),
			},
			InstallGuestAgent: ptr.To(true),
			Port:              ProxyPort,
			Access:            o.access.DeepCopy(),
		},
	}
}

// Access admits only the test's own address inside the hypervisor's
// namespace (where the suite and the manager run, the gateway of the
// guests' network) and lets squid reach the probe server there: the probe
// target is a private address, refused by the built-in deny list unless
// excepted, as a user whose targets are internal would do. Ports: 80, 443
// and the probe server's.
func Access(c Config) (*crawlv1.ProxyAccess, error) {
	u, err := url.Parse(c.ProbeURL)
	if err != nil {
		return nil, fmt.Errorf("probe URL %q: %w", c.ProbeURL, err)
	}
	ip, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return nil, fmt.Errorf("probe URL %q: its host must be an IP address: %w", c.ProbeURL, err)
	}
	ports := []int32{80, 443}
	if p, err := strconv.Atoi(u.Port()); err == nil && p != 80 && p != 443 {
		ports = append(ports, int32(p))
	}
	self := netip.PrefixFrom(ip, ip.BitLen()).String()
	return &crawlv1.ProxyAccess{
		AllowedSourceCIDRs:           []string{self},
		AllowedDestinationExceptions: []string{self},
		AllowedPorts:                 ports,
	}, nil
}

// ProxyVia is how the test reaches Proxy p through its published endpoint,
// with the credential the operator published for it
// (status.credentialsSecretRef), as a crawler would.
func ProxyVia(ctx context.Context, c client.Reader, p *crawlv1.Proxy) (Via, error) {
	return ProxyViaAddress(ctx, c, p, p.Status.Address)
}

// ProxyViaAddress is ProxyVia for an address the test found on its own
// (the observer reads the DHCP lease, independently of the manager).
func ProxyViaAddress(ctx context.Context, c client.Reader, p *crawlv1.Proxy, address string) (Via, error) {
	via := Via{Endpoint: "http://" + net.JoinHostPort(address, strconv.Itoa(int(p.Spec.Port)))}
	if p.Spec.Access == nil || p.Spec.Access.Auth != nil && p.Spec.Access.Auth.Type == crawlv1.ProxyAuthNone {
		return via, nil
	}
	user, err := ProxyCredentials(ctx, c, p)
	if err != nil {
		return via, err
	}
	via.Credentials = user
	return via, nil
}

// ProxyCredentials reads the credential the operator published for p.
func ProxyCredentials(ctx context.Context, c client.Reader, p *crawlv1.Proxy) (*url.Userinfo, error) {
	ref := p.Status.CredentialsSecretRef
	if ref == nil {
		return nil, fmt.Errorf("proxy %s/%s has no status.credentialsSecretRef yet", p.Namespace, p.Name)
	}
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: ref.Name}, sec); err != nil {
		return nil, fmt.Errorf("credential Secret of proxy %s/%s: %w", p.Namespace, p.Name, err)
	}
	user, pass := sec.Data[crawlv1.CredentialsUsernameKey], sec.Data[crawlv1.CredentialsPasswordKey]
	if len(user) == 0 || len(pass) == 0 {
		return nil, fmt.Errorf("credential Secret %s/%s lacks %s or %s", p.Namespace, ref.Name,
			crawlv1.CredentialsUsernameKey, crawlv1.CredentialsPasswordKey)
	}
	return url.UserPassword(string(user), string(pass)), nil
}
