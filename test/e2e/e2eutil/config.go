// Package e2eutil is what the real-hypervisor e2e suite (test/e2e), the demo
// (hack/demo) and the kind e2e share: the hypervisor's facts read from the
// KVM_TEST_* variables (test/e2e/infra/hypervisor.sh env), the objects they
// create, an HTTP server for the guest image, the local control plane with
// the manager binary, bounded waits, host-side checks (virsh, NVRAM files,
// sshd outages) and the diagnostics dumped on failure.
package e2eutil

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Defaults of the tunables (E2E_* variables).
const (
	DefaultCheckInterval     = 5 * time.Second
	DefaultCheckTimeout      = 5 * time.Second
	DefaultHostReadyTimeout  = 2 * time.Minute
	DefaultImageTimeout      = 10 * time.Minute
	DefaultProxyReadyTimeout = 10 * time.Minute
	DefaultDeleteTimeout     = 3 * time.Minute
	// InNetNSSSHAddress is the hypervisor's sshd as seen from inside its
	// network namespace (hypervisor.sh: ListenAddress 127.0.0.1:22).
	InNetNSSSHAddress = "127.0.0.1:22"
)

// Config is the hypervisor the test drives, and the test's tunables.
type Config struct {
	// Address is host[:port] of the hypervisor's sshd as the operator dials
	// it. Inside the hypervisor's netns it is 127.0.0.1:22.
	Address string
	User    string
	// KeyFile is the SSH private key; PrivateKey its content.
	KeyFile    string
	PrivateKey []byte
	// KnownHosts is known_hosts content matching Address.
	KnownHosts []byte
	SocketPath string
	Pool       string
	Network    string
	// NetworkMode is "network" or "bridge".
	NetworkMode string
	// DomainType is "kvm" or "qemu".
	DomainType string
	// ProbeURL answers 204 and is reachable from the guests.
	ProbeURL string
	// EchoURL answers 200 with the caller's address as its body, reachable
	// from the guests (KVM_TEST_ECHO_URL): the manager's probe URL when
	// set, so the proxy's egress address is recorded. Same host and port
	// as ProbeURL (one allowed destination).
	EchoURL string

	// NetNS is the hypervisor's network namespace (hypervisor.sh only);
	// InNetNS says this process runs inside it, so guests are reachable.
	NetNS   string
	InNetNS bool
	// StateDir and HypervisorSH drive the local test hypervisor
	// (hypervisor.sh exec/stop-sshd/start-sshd). Empty for a remote host.
	StateDir     string
	HypervisorSH string

	// ImagePath is the guest qcow2 the test serves itself (checksum from
	// ImagePath.sha256 when present). ImageURL/ImageChecksum name an image
	// served elsewhere instead.
	ImagePath     string
	ImageURL      string
	ImageChecksum string
	// ImageListen is the address the image server listens on and
	// ImageHost the host name put in its URL (the listener's when empty).
	ImageListen string
	ImageHost   string

	// CheckInterval and CheckTimeout go into the KVMHost spec.
	CheckInterval time.Duration
	CheckTimeout  time.Duration

	// ManagerLogLevel is the manager's --zap-log-level (info; the fault
	// suite runs it at debug, which logs each libvirt event received).
	ManagerLogLevel string

	// GCInterval is the manager's --gc-interval (0: its default). The
	// fault suite shortens it to see several orphan sweeps per fault.
	GCInterval time.Duration

	HostReadyTimeout  time.Duration
	ImageTimeout      time.Duration
	ProxyReadyTimeout time.Duration
	DeleteTimeout     time.Duration

	// SSHDStopCmd/SSHDStartCmd (sh -c) make a remote host unreachable over
	// SSH and reachable again, where hypervisor.sh is not available.
	SSHDStopCmd  string
	SSHDStartCmd string
}

// FromEnv reads the configuration. Inside the hypervisor's network namespace
// (KVM_TEST_NETNS, entered with `ip netns exec`) the SSH address becomes the
// namespace's own sshd, 127.0.0.1:22, with a known_hosts line made from the
// host key in KVM_TEST_STATE_DIR: hypervisor.sh's KVM_TEST_ADDRESS and
// KVM_TEST_KNOWN_HOSTS name the loopback forwarder of the root namespace.
func FromEnv() (Config, error) {
	c := Config{
		Address:         os.Getenv("KVM_TEST_ADDRESS"),
		User:            envOr("KVM_TEST_USER", "root"),
		KeyFile:         os.Getenv("KVM_TEST_KEY"),
		SocketPath:      os.Getenv("KVM_TEST_SOCKET"),
		Pool:            envOr("KVM_TEST_POOL", "default"),
		Network:         envOr("KVM_TEST_NETWORK", "default"),
		NetworkMode:     envOr("KVM_TEST_NETWORK_MODE", "network"),
		DomainType:      envOr("KVM_TEST_DOMAIN_TYPE", "kvm"),
		ProbeURL:        os.Getenv("KVM_TEST_PROBE_URL"),
		EchoURL:         os.Getenv("KVM_TEST_ECHO_URL"),
		NetNS:           os.Getenv("KVM_TEST_NETNS"),
		StateDir:        os.Getenv("KVM_TEST_STATE_DIR"),
		HypervisorSH:    os.Getenv("KVM_TEST_HYPERVISOR_SH"),
		ImagePath:       os.Getenv("KVM_TEST_IMAGE"),
		ImageURL:        os.Getenv("KVM_TEST_IMAGE_URL"),
		ImageChecksum:   os.Getenv("KVM_TEST_IMAGE_CHECKSUM"),
		ImageListen:     envOr("E2E_IMAGE_LISTEN", "127.0.0.1:0"),
		ImageHost:       os.Getenv("E2E_IMAGE_HOST"),
		SSHDStopCmd:     os.Getenv("KVM_TEST_SSHD_STOP_CMD"),
		SSHDStartCmd:    os.Getenv("KVM_TEST_SSHD_START_CMD"),
		ManagerLogLevel: envOr("E2E_MANAGER_LOG_LEVEL", "info"),
	}
	errs := c.readTimings()
	errs = append(errs, c.readSSH()...)
	if c.ProbeURL == "" {
		errs = append(errs, errors.New("KVM_TEST_PROBE_URL is not set (a URL answering 204, reachable from the guests)"))
	}
	if c.ImagePath == "" && (c.ImageURL == "" || c.ImageChecksum == "") {
		errs = append(errs, errors.New("set KVM_TEST_IMAGE (a guest qcow2, see test/e2e/infra/guest-image.sh) or KVM_TEST_IMAGE_URL and KVM_TEST_IMAGE_CHECKSUM"))
	}
	return c, errors.Join(errs...)
}

// readTimings reads the E2E_* durations into c.
func (c *Config) readTimings() []error {
	var errs []error
	dur := func(name string, def time.Duration) time.Duration {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a positive duration like 5s", name, v))
			return def
		}
		return d
	}
	c.CheckInterval = dur("E2E_CHECK_INTERVAL", DefaultCheckInterval)
	c.CheckTimeout = dur("E2E_CHECK_TIMEOUT", DefaultCheckTimeout)
	c.HostReadyTimeout = dur("E2E_HOST_READY_TIMEOUT", DefaultHostReadyTimeout)
	c.ImageTimeout = dur("E2E_IMAGE_TIMEOUT", DefaultImageTimeout)
	c.ProxyReadyTimeout = dur("E2E_PROXY_READY_TIMEOUT", DefaultProxyReadyTimeout)
	c.DeleteTimeout = dur("E2E_DELETE_TIMEOUT", DefaultDeleteTimeout)
	if os.Getenv("E2E_GC_INTERVAL") != "" {
		c.GCInterval = dur("E2E_GC_INTERVAL", 0)
	}
	if c.CheckTimeout > c.CheckInterval {
		errs = append(errs, fmt.Errorf("E2E_CHECK_TIMEOUT %s exceeds E2E_CHECK_INTERVAL %s", c.CheckTimeout, c.CheckInterval))
	}
	return errs
}

// readSSH settles how the hypervisor's sshd is reached (inside its network
// namespace or through KVM_TEST_ADDRESS) and reads the key and known_hosts.
func (c *Config) readSSH() []error {
	var errs []error
	if c.NetNS != "" {
		in, err := InNetNS(c.NetNS)
		if err != nil {
			errs = append(errs, err)
		}
		c.InNetNS = in
	}
	if c.InNetNS {
		if c.StateDir == "" {
			errs = append(errs, errors.New("KVM_TEST_STATE_DIR is not set (eval \"$(test/e2e/infra/hypervisor.sh env STATE_DIR)\")"))
		} else {
			kh, err := NetNSKnownHosts(c.StateDir)
			if err != nil {
				errs = append(errs, err)
			}
			c.Address, c.KnownHosts = InNetNSSSHAddress, kh
		}
	} else if f := os.Getenv("KVM_TEST_KNOWN_HOSTS"); f != "" {
		kh, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("KVM_TEST_KNOWN_HOSTS: %w", err))
		}
		c.KnownHosts = kh
	}

	if c.Address == "" {
		errs = append(errs, errors.New("KVM_TEST_ADDRESS is not set (the hypervisor's SSH host[:port])"))
	}
	if c.KeyFile == "" {
		errs = append(errs, errors.New("KVM_TEST_KEY is not set (the SSH private key file)"))
	} else if key, err := os.ReadFile(c.KeyFile); err != nil {
		errs = append(errs, fmt.Errorf("KVM_TEST_KEY: %w", err))
	} else {
		c.PrivateKey = key
	}
	if len(bytes.TrimSpace(c.KnownHosts)) == 0 && c.Address != "" {
		errs = append(errs, errors.New("no known_hosts for the hypervisor: set KVM_TEST_KNOWN_HOSTS (a file with its host key line)"))
	}
	return errs
}

// Local says the hypervisor is the local test hypervisor of hypervisor.sh.
func (c Config) Local() bool { return c.HypervisorSH != "" && c.StateDir != "" }

// CheckReachability fails when the guests' addresses are not reachable from
// this process: the local hypervisor's guests live in its namespace.
func (c Config) CheckReachability() error {
	if c.NetNS != "" && !c.InNetNS {
		return fmt.Errorf("guests of the test hypervisor are reachable only inside its network namespace: run this under `ip netns exec %s ...` (test/e2e/run.sh does)", c.NetNS)
	}
	return nil
}

// InNetNS reports whether this process runs in the named network namespace
// (/run/netns/NAME, made by `ip netns add`).
func InNetNS(name string) (bool, error) {
	var self, ns syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &self); err != nil {
		return false, fmt.Errorf("reading own network namespace: %w", err)
	}
	if err := syscall.Stat(filepath.Join("/run/netns", name), &ns); err != nil {
		return false, fmt.Errorf("network namespace %q: %w", name, err)
	}
	return self.Dev == ns.Dev && self.Ino == ns.Ino, nil
}

// NetNSKnownHosts returns the known_hosts line for the hypervisor's sshd as
// reached inside its namespace: port 22, so the plain "127.0.0.1 <key>" form
// (hypervisor.sh's own known_hosts names the "[127.0.0.1]:PORT" forwarder).
func NetNSKnownHosts(stateDir string) ([]byte, error) {
	pub, err := os.ReadFile(filepath.Join(stateDir, "ssh_host_ed25519_key.pub"))
	if err != nil {
		return nil, fmt.Errorf("host public key of the test hypervisor: %w", err)
	}
	f := strings.Fields(string(pub))
	if len(f) < 2 {
		return nil, fmt.Errorf("%s/ssh_host_ed25519_key.pub: not a public key line", stateDir)
	}
	return []byte("127.0.0.1 " + f[0] + " " + f[1] + "\n"), nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
