package e2eutil

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

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

// ProxyUserData is the Proxy's own cloud-config: squid is in the image; this
// admits only the test hypervisor's own network (the bridge and its guests,
// where the suite and the manager run), never every client. The image's
// squid.conf already has
// `http_port 3128` (repeating it makes squid fail to listen), includes
// conf.d before its final deny, and the image has only the C.UTF-8 locale.
const ProxyUserData = `#cloud-config
locale: C.UTF-8
write_files:
  - path: /etc/squid/conf.d/e2e.conf
    content: |
      # proxy-operator e2e: only the test network may use this proxy.
      acl e2e_clients src 10.77.0.0/24
      http_access allow e2e_clients
      # A restart need not wait the default 30 s for clients to finish.
      shutdown_lifetime 1 seconds
runcmd:
  - [systemctl, restart, squid]
`

// ProxyPort is squid's port in the guest image.
const ProxyPort = 3128

// Objects are the API objects one run creates.
type Objects struct {
	Namespace *corev1.Namespace
	Secret    *corev1.Secret
	Host      *crawlv1.KVMHost
	Image     *crawlv1.KVMImage
	Proxy     *crawlv1.Proxy
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
func NewObjects(c Config, prefix, secretNamespace, imageURL, imageChecksum string) *Objects {
	ns := prefix
	o := &Objects{
		Namespace: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
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
	return o
}

// NewProxy is a Proxy in the run's namespace on the run's KVMHost and
// KVMImage, with the e2e's cloud-config: every Proxy the suites create is
// built here, so a change of what a Proxy needs (e.g. access settings) is
// made once. cpus and memory size the guest (the main e2e measured its
// timings with 2 vCPU and 1Gi under TCG; fault specs use 1 vCPU).
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
			CloudInit:         crawlv1.ProxyCloudInit{UserData: ProxyUserData},
			InstallGuestAgent: ptr.To(true),
			Port:              ProxyPort,
		},
	}
}

// ProxyVia is how the test reaches Proxy p through its published endpoint.
// Today without credentials: the e2e's squid admits the test network by
// source address (ProxyUserData). A Proxy with managed access adds its
// credential here, the one place requests through a proxy get theirs.
func ProxyVia(p *crawlv1.Proxy) Via {
	return ProxyViaAddress(p, p.Status.Address)
}

// ProxyViaAddress is ProxyVia for an address the test found on its own
// (the observer reads the DHCP lease, independently of the manager).
func ProxyViaAddress(p *crawlv1.Proxy, address string) Via {
	return Via{Endpoint: "http://" + net.JoinHostPort(address, strconv.Itoa(int(p.Spec.Port)))}
}
