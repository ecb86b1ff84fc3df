package v1alpha1

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

const goodSum = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

func TestDefaultKVMHost(t *testing.T) {
	cases := []struct {
		name        string
		spec        crawlv1.KVMHostSpec
		wantAddr    string
		wantTimeout *time.Duration
	}{
		{"port added", crawlv1.KVMHostSpec{Address: "hv1.lan"}, "hv1.lan:22", nil},
		{"port kept", crawlv1.KVMHostSpec{Address: "hv1.lan:2222"}, "hv1.lan:2222", nil},
		{"bare ipv6", crawlv1.KVMHostSpec{Address: "fd00::1"}, "[fd00::1]:22", nil},
		{"bracketed ipv6", crawlv1.KVMHostSpec{Address: "[fd00::1]"}, "[fd00::1]:22", nil},
		{"interval 12s derives 12s", crawlv1.KVMHostSpec{Address: "h:22", CheckInterval: dur(12 * time.Second)}, "h:22", ptr.To(12 * time.Second)},
		{"interval 1m derives 15s", crawlv1.KVMHostSpec{Address: "h:22", CheckInterval: dur(time.Minute)}, "h:22", ptr.To(15 * time.Second)},
		{"timeout 0 derives", crawlv1.KVMHostSpec{Address: "h:22", CheckInterval: dur(time.Minute), CheckTimeout: dur(0)}, "h:22", ptr.To(15 * time.Second)},
		{"explicit timeout kept", crawlv1.KVMHostSpec{Address: "h:22", CheckInterval: dur(time.Minute), CheckTimeout: dur(5 * time.Second)}, "h:22", ptr.To(5 * time.Second)},
		{"no interval leaves timeout to the manager", crawlv1.KVMHostSpec{Address: "h:22"}, "h:22", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := &crawlv1.KVMHost{Spec: tc.spec}
			DefaultKVMHost(h)
			if h.Spec.Address != tc.wantAddr {
				t.Errorf("address = %q, want %q", h.Spec.Address, tc.wantAddr)
			}
			if h.Spec.SocketPath != crawlv1.DefaultLibvirtSocket {
				t.Errorf("socketPath = %q", h.Spec.SocketPath)
			}
			if h.Spec.DomainType != crawlv1.DomainTypeKVM || h.Spec.NetworkMode != crawlv1.NetworkModeNetwork {
				t.Errorf("domainType/networkMode not defaulted: %q %q", h.Spec.DomainType, h.Spec.NetworkMode)
			}
			switch {
			case tc.wantTimeout == nil && h.Spec.CheckTimeout != nil:
				t.Errorf("checkTimeout = %v, want unset", h.Spec.CheckTimeout.Duration)
			case tc.wantTimeout != nil && (h.Spec.CheckTimeout == nil || h.Spec.CheckTimeout.Duration != *tc.wantTimeout):
				t.Errorf("checkTimeout = %v, want %v", h.Spec.CheckTimeout, *tc.wantTimeout)
			}
			if errs := ValidateKVMHost(h); len(errs) != 0 {
				t.Errorf("defaulted host is invalid: %v", errs.ToAggregate())
			}
		})
	}
}

func TestValidateKVMHost(t *testing.T) {
	cases := []struct {
		name    string
		spec    crawlv1.KVMHostSpec
		wantErr string // substring of the aggregate error; "" means valid
	}{
		{"valid", crawlv1.KVMHostSpec{Address: "hv:22", SocketPath: "/run/libvirt/libvirt-sock"}, ""},
		{"interval alone is valid", crawlv1.KVMHostSpec{Address: "hv:22", CheckInterval: dur(12 * time.Second)}, ""},
		{"timeout equal to interval", crawlv1.KVMHostSpec{Address: "hv:22", CheckInterval: dur(10 * time.Second), CheckTimeout: dur(10 * time.Second)}, ""},
		{"timeout exceeds interval", crawlv1.KVMHostSpec{Address: "hv:22", CheckInterval: dur(10 * time.Second), CheckTimeout: dur(20 * time.Second)}, "spec.checkTimeout: Invalid value: \"20s\": must not exceed checkInterval (10s)"},
		{"negative interval", crawlv1.KVMHostSpec{Address: "hv:22", CheckInterval: dur(-time.Second)}, "spec.checkInterval"},
		{"missing address", crawlv1.KVMHostSpec{}, "spec.address: Required value"},
		{"bad port", crawlv1.KVMHostSpec{Address: "hv:99999"}, "spec.address: Invalid value"},
		{"port not a number", crawlv1.KVMHostSpec{Address: "hv:ssh"}, "port must be a number"},
		{"relative socket", crawlv1.KVMHostSpec{Address: "hv:22", SocketPath: "libvirt-sock"}, "spec.socketPath: Invalid value"},
		{"secret without namespace", crawlv1.KVMHostSpec{Address: "hv:22", SSHKeySecretRef: &crawlv1.SecretReference{Name: "k"}}, "spec.sshKeySecretRef.namespace: Required value"},
		{"bad domain type", crawlv1.KVMHostSpec{Address: "hv:22", DomainType: "xen"}, "spec.domainType: Unsupported value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateKVMHost(&crawlv1.KVMHost{Spec: tc.spec})
			checkErrs(t, errs.ToAggregate(), tc.wantErr)
		})
	}
}

func TestValidateKVMHostUpdate(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(*crawlv1.KVMHost)
		wantErr string
	}{
		{"check interval may change", func(h *crawlv1.KVMHost) { h.Spec.CheckInterval = dur(time.Minute) }, ""},
		{"address", func(h *crawlv1.KVMHost) { h.Spec.Address = "hv2:22" }, "spec.address: Forbidden: address is immutable"},
		{"storage pool", func(h *crawlv1.KVMHost) { h.Spec.StoragePool = "fast" }, "spec.storagePool: Forbidden: storagePool is immutable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old := &crawlv1.KVMHost{Spec: crawlv1.KVMHostSpec{Address: "hv1:22", StoragePool: "default"}}
			h := old.DeepCopy()
			tc.mutate(h)
			_, err := (&KVMHostWebhook{}).ValidateUpdate(context.Background(), old, h)
			checkErrs(t, err, tc.wantErr)
		})
	}
}

func TestKVMImage(t *testing.T) {
	img := &crawlv1.KVMImage{Spec: crawlv1.KVMImageSpec{URL: "https://img.example/debian.qcow2", Checksum: goodSum}}
	DefaultKVMImage(img)
	if img.Spec.Firmware != crawlv1.FirmwareUEFI || img.Spec.Format != crawlv1.ImageFormatQCOW2 {
		t.Fatalf("defaults: firmware=%q format=%q", img.Spec.Firmware, img.Spec.Format)
	}
	cases := []struct {
		name    string
		mutate  func(*crawlv1.KVMImageSpec)
		wantErr string
	}{
		{"valid", func(*crawlv1.KVMImageSpec) {}, ""},
		{"bios raw", func(s *crawlv1.KVMImageSpec) { s.Firmware, s.Format = "bios", "raw" }, ""},
		{"ftp scheme", func(s *crawlv1.KVMImageSpec) { s.URL = "ftp://x/y" }, "spec.url: Invalid value: \"ftp://x/y\": scheme must be http or https"},
		{"no host", func(s *crawlv1.KVMImageSpec) { s.URL = "http:///y" }, "URL has no host"},
		{"md5 checksum", func(s *crawlv1.KVMImageSpec) { s.Checksum = "md5:abcd" }, "spec.checksum: Invalid value"},
		{"short sha", func(s *crawlv1.KVMImageSpec) { s.Checksum = "sha256:abcd" }, "64 hex digits"},
		{"missing checksum", func(s *crawlv1.KVMImageSpec) { s.Checksum = "" }, "spec.checksum: Required value"},
		{"bad firmware", func(s *crawlv1.KVMImageSpec) { s.Firmware = "coreboot" }, "spec.firmware: Unsupported value"},
		{"bad format", func(s *crawlv1.KVMImageSpec) { s.Format = "vmdk" }, "spec.format: Unsupported value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := img.DeepCopy()
			tc.mutate(&c.Spec)
			checkErrs(t, ValidateKVMImage(c).ToAggregate(), tc.wantErr)
		})
	}
}

func kvmProxy() *crawlv1.Proxy {
	p := &crawlv1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "crawl"},
		Spec: crawlv1.ProxySpec{
			Provider:  crawlv1.ProviderKVM,
			Placement: crawlv1.ProxyPlacement{Host: "hv1", Image: "debian-12"},
			Access:    &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"10.244.0.0/16"}},
		},
	}
	proxyWebhook(false).DefaultProxy(p)
	return p
}

func TestDefaultProxy(t *testing.T) {
	p := kvmProxy()
	if !*p.Spec.InstallGuestAgent || p.Spec.Port != 3128 || p.Spec.Resources.CPUs != 1 {
		t.Errorf("defaults: agent=%v port=%d cpus=%d", *p.Spec.InstallGuestAgent, p.Spec.Port, p.Spec.Resources.CPUs)
	}
	if p.Spec.Placement.Firmware != "" {
		t.Errorf("a KVMImage reference must not get a firmware default, got %q", p.Spec.Placement.Firmware)
	}
	u := &crawlv1.Proxy{Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderKVM, Placement: crawlv1.ProxyPlacement{Image: "https://x/y.qcow2"}, InstallGuestAgent: ptr.To(false)}}
	proxyWebhook(false).DefaultProxy(u)
	if u.Spec.Placement.Firmware != crawlv1.FirmwareUEFI || u.Spec.Placement.ImageFormat != crawlv1.ImageFormatQCOW2 {
		t.Errorf("URL image defaults: firmware=%q format=%q", u.Spec.Placement.Firmware, u.Spec.Placement.ImageFormat)
	}
	if *u.Spec.InstallGuestAgent {
		t.Errorf("an explicit installGuestAgent=false was overwritten")
	}
}

func TestValidateProxy(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(*crawlv1.Proxy)
		wantErr string
	}{
		{"valid kvm", func(*crawlv1.Proxy) {}, ""},
		{"valid selector", func(p *crawlv1.Proxy) {
			p.Spec.Placement.Host = ""
			p.Spec.Placement.HostSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "a"}}
		}, ""},
		{"valid url image", func(p *crawlv1.Proxy) {
			p.Spec.Placement.Image, p.Spec.Placement.ImageChecksum, p.Spec.Placement.Firmware = "http://img/x.qcow2", goodSum, "bios"
		}, ""},
		{"valid kubernetes", func(p *crawlv1.Proxy) {
			p.Spec.Provider = crawlv1.ProviderKubernetes
			p.Spec.Placement = crawlv1.ProxyPlacement{}
		}, ""},
		{"kvm without host", func(p *crawlv1.Proxy) { p.Spec.Placement.Host = "" }, "spec.placement.host: Required value"},
		{"host and selector", func(p *crawlv1.Proxy) { p.Spec.Placement.HostSelector = &metav1.LabelSelector{} }, "spec.placement.hostSelector: Forbidden"},
		{"kvm without image", func(p *crawlv1.Proxy) { p.Spec.Placement.Image = "" }, "spec.placement.image: Required value"},
		{"url without checksum", func(p *crawlv1.Proxy) { p.Spec.Placement.Image = "https://img/x.qcow2" }, "spec.placement.imageChecksum: Required value"},
		{"file url", func(p *crawlv1.Proxy) {
			p.Spec.Placement.Image, p.Spec.Placement.ImageChecksum = "file:///x.qcow2", goodSum
		}, "spec.placement.image: Invalid value: \"file:///x.qcow2\": scheme must be http or https"},
		{"kvmimage with firmware", func(p *crawlv1.Proxy) { p.Spec.Placement.Firmware = "bios" }, "spec.placement.firmware: Forbidden"},
		{"bad image name", func(p *crawlv1.Proxy) { p.Spec.Placement.Image = "Debian_12" }, "spec.placement.image: Invalid value"},
		{"name not a dns label", func(p *crawlv1.Proxy) { p.Name = "a.b" }, "metadata.name: Invalid value"},
		{"name too long for a hostname", func(p *crawlv1.Proxy) { p.Name = strings.Repeat("a", 64) }, "metadata.name"},
		{"unknown provider", func(p *crawlv1.Proxy) { p.Spec.Provider = "azure" }, "spec.provider: Unsupported value"},
		{"gcp with host", func(p *crawlv1.Proxy) { p.Spec.Provider = crawlv1.ProviderGCP }, "spec.placement.host: Forbidden"},
		{"tiny memory", func(p *crawlv1.Proxy) { p.Spec.Resources.Memory = ptr.To(resource.MustParse("64Mi")) }, "spec.resources.memory"},
		{"tiny disk", func(p *crawlv1.Proxy) { p.Spec.Resources.Disk = ptr.To(resource.MustParse("100Mi")) }, "spec.resources.disk"},
		{"both user-data fields", func(p *crawlv1.Proxy) {
			p.Spec.CloudInit.UserData, p.Spec.CloudInit.UserDataBase64 = "#cloud-config\n", []byte{0x1f, 0x8b}
		}, "spec.cloudInit.userDataBase64: Forbidden"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := kvmProxy()
			tc.mutate(p)
			checkErrs(t, proxyWebhook(true).ValidateProxy(p).ToAggregate(), tc.wantErr)
		})
	}
}

func TestValidateProxyUpdate(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(*crawlv1.Proxy)
		wantErr string
	}{
		{"resources may change", func(p *crawlv1.Proxy) { p.Spec.Resources.CPUs = 2 }, ""},
		{"provider", func(p *crawlv1.Proxy) { p.Spec.Provider = crawlv1.ProviderGCP }, "spec.provider: Forbidden: provider is immutable"},
		{"port", func(p *crawlv1.Proxy) { p.Spec.Port = 8080 }, "spec.port: Forbidden: port is immutable"},
		{"host", func(p *crawlv1.Proxy) { p.Spec.Placement.Host = "hv2" }, "spec.placement.host: Forbidden"},
		{"image", func(p *crawlv1.Proxy) { p.Spec.Placement.Image = "ubuntu" }, "spec.placement.image: Forbidden"},
		{"firmware", func(p *crawlv1.Proxy) { p.Spec.Placement.Firmware = "bios" }, "spec.placement.firmware: Forbidden"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old := kvmProxy()
			p := old.DeepCopy()
			tc.mutate(p)
			checkErrs(t, ValidateProxyUpdate(old, p).ToAggregate(), tc.wantErr)
		})
	}
}

func checkErrs(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Fatalf("no error, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q does not contain %q", err, want)
	}
}

func TestGCEUserDataOverTheMetadataLimitIsRefusedAtAdmission(t *testing.T) {
	gcp := func(ci crawlv1.ProxyCloudInit) *crawlv1.Proxy {
		p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "g1", Namespace: "crawl"},
			Spec: crawlv1.ProxySpec{Provider: crawlv1.ProviderGCP, CloudInit: ci,
				Access: &crawlv1.ProxyAccess{AllowedSourceCIDRs: []string{"198.51.100.0/24"}}}}
		proxyWebhook(false).DefaultProxy(p)
		return p
	}
	limit := crawlv1.GCEMaxMetadataValue
	notUTF8 := bytes.Repeat([]byte{0xff}, limit*3/4+1) // base64 makes it > limit
	cases := []struct {
		name    string
		p       *crawlv1.Proxy
		wantErr string
	}{
		{"at the limit", gcp(crawlv1.ProxyCloudInit{UserData: strings.Repeat("x", limit)}), ""},
		{"over the limit", gcp(crawlv1.ProxyCloudInit{UserData: strings.Repeat("x", limit+1)}), fmt.Sprintf("spec.cloudInit.userData: Invalid value: \"<%d bytes>\": is %d bytes as instance metadata, over Compute Engine's limit of %d", limit+1, limit+1, limit)},
		{"over the limit once base64", gcp(crawlv1.ProxyCloudInit{UserDataBase64: notUTF8}), "spec.cloudInit.userDataBase64: Invalid value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := proxyWebhook(false).ValidateCreate(context.Background(), tc.p)
			checkErrs(t, err, tc.wantErr)
			if err != nil && strings.Contains(err.Error(), "xxxx") {
				t.Error("the error repeats the user-data")
			}
		})
	}
	// kvm has no such limit.
	p := kvmProxy()
	p.Spec.CloudInit.UserData = strings.Repeat("x", limit+1)
	if errs := proxyWebhook(true).ValidateProxy(p); len(errs) != 0 {
		t.Errorf("kvm Proxy with large user-data refused: %v", errs.ToAggregate())
	}
}
