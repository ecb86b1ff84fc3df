//go:build integration

// Package integration tests the KVM provider alone, without Kubernetes,
// against a real libvirt host over SSH with the real connection pool:
// Create → Get (until the guest agent reports an address) → Delete.
//
// It is opt-in: without KVM_TEST_ADDRESS, KVM_TEST_KEY and
// KVM_TEST_KNOWN_HOSTS it skips, saying so. `make test-integration-kvm`
// (test/integration/run.sh) brings up the test hypervisor of
// test/e2e/infra/hypervisor.sh and sets them, so it never skips there.
//
// Variables (hypervisor.sh env prints them): KVM_TEST_ADDRESS, KVM_TEST_USER
// (root), KVM_TEST_KEY, KVM_TEST_KNOWN_HOSTS, KVM_TEST_SOCKET, KVM_TEST_POOL
// (default), KVM_TEST_NETWORK (default), KVM_TEST_NETWORK_MODE (network),
// KVM_TEST_DOMAIN_TYPE (kvm); the image: KVM_TEST_IMAGE (a qcow2 file this
// test serves on 127.0.0.1) or KVM_TEST_IMAGE_URL + KVM_TEST_IMAGE_CHECKSUM.
// KVM_TEST_ADDRESS_TIMEOUT bounds the wait for the address (default 10m).
package integration

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr/testr"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/squid"
	"crawl.example.com/proxy-operator/test/e2e/e2eutil"
)

const hostName = "itest-hv"

// staticHosts is a kvm.HostSource of one host described by the environment,
// its SSH material read from files.
type staticHosts struct {
	spec kvm.HostSpec
}

func (s staticHosts) Host(_ context.Context, name string) (kvm.HostSpec, error) {
	if name != s.spec.Conn.Name {
		return kvm.HostSpec{}, provider.Permanent(fmt.Errorf("host %q: %w", name, conn.ErrHostNotConfigured))
	}
	return s.spec, nil
}

func (s staticHosts) List(context.Context) ([]string, error) {
	return []string{s.spec.Conn.Name}, nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func TestKVMProviderCreateGetDelete(t *testing.T) {
	var missing []string
	for _, v := range []string{"KVM_TEST_ADDRESS", "KVM_TEST_KEY", "KVM_TEST_KNOWN_HOSTS"} {
		if os.Getenv(v) == "" {
			missing = append(missing, v)
		}
	}
	if os.Getenv("KVM_TEST_IMAGE") == "" && (os.Getenv("KVM_TEST_IMAGE_URL") == "" || os.Getenv("KVM_TEST_IMAGE_CHECKSUM") == "") {
		missing = append(missing, "KVM_TEST_IMAGE (or KVM_TEST_IMAGE_URL + KVM_TEST_IMAGE_CHECKSUM)")
	}
	if len(missing) > 0 {
		t.Skipf("opt-in test of the KVM provider against a real libvirt host: %s not set. "+
			"`make test-integration-kvm` starts a local test hypervisor and sets them; "+
			"or point them at your own host (see the package comment)", strings.Join(missing, ", "))
	}

	addressTimeout := 10 * time.Minute
	if v := os.Getenv("KVM_TEST_ADDRESS_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("KVM_TEST_ADDRESS_TIMEOUT: %v", err)
		}
		addressTimeout = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), addressTimeout+10*time.Minute)
	defer cancel()

	keyFile, khFile := os.Getenv("KVM_TEST_KEY"), os.Getenv("KVM_TEST_KNOWN_HOSTS")
	material := func(context.Context) (*conn.Material, error) {
		key, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, provider.Transient(err)
		}
		kh, err := os.ReadFile(khFile)
		if err != nil {
			return nil, provider.Transient(err)
		}
		return conn.ParseMaterial(key, kh)
	}
	pool := env("KVM_TEST_POOL", "default")
	hosts := staticHosts{spec: kvm.HostSpec{
		Conn: conn.HostConfig{
			Name:       hostName,
			Address:    os.Getenv("KVM_TEST_ADDRESS"),
			User:       env("KVM_TEST_USER", "root"),
			SocketPath: os.Getenv("KVM_TEST_SOCKET"),
		},
		Material:   material,
		Pool:       pool,
		Network:    domxml.Network{Type: env("KVM_TEST_NETWORK_MODE", domxml.NetworkTypeNetwork), Name: env("KVM_TEST_NETWORK", "default")},
		DomainType: env("KVM_TEST_DOMAIN_TYPE", domxml.DomainTypeKVM),
	}}

	img := provider.Image{
		Name:     "itest-squid",
		URL:      os.Getenv("KVM_TEST_IMAGE_URL"),
		Checksum: os.Getenv("KVM_TEST_IMAGE_CHECKSUM"),
		Format:   "qcow2",
		Firmware: "uefi",
	}
	if path := os.Getenv("KVM_TEST_IMAGE"); path != "" {
		srv, err := e2eutil.ServeImage(path, "127.0.0.1:0", "")
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		img.URL, img.Checksum = srv.URL, srv.Checksum
	}

	connPool := conn.New(conn.Options{Logger: testr.New(t)})
	defer connPool.Close()
	p := kvm.New(kvm.Options{Hosts: hosts, Pool: connPool, Logger: testr.New(t)})

	health, err := p.Probe(ctx, hostName)
	if err != nil {
		t.Fatalf("probe %s (%s): reason %s: %v", hostName, hosts.spec.Conn.Address, kvm.Reason(err), err)
	}
	t.Logf("host: libvirt %s on %s, pool %s %d bytes free", health.LibvirtVersion, health.Hostname, health.Pool.Name, health.Pool.Available)

	m := &provider.Machine{
		Namespace:   "itest",
		Name:        "kvm-" + e2eutil.RunID(),
		UID:         uuid(t),
		Tag:         "integration-" + e2eutil.RunID(),
		Host:        hostName,
		Image:       img,
		CPUs:        2,
		MemoryBytes: 1 << 30,
		DiskBytes:   4 << 30,
		// The operator's managed squid, as the Proxy controller passes it.
		Squid: &squid.Config{Port: e2eutil.ProxyPort, AllowedSourceCIDRs: []string{"127.0.0.1/32"},
			Auth: squid.Auth{Type: squid.AuthBasic, Username: "itest", Password: squid.GeneratePassword()}},
		InstallGuestAgent: true,
		Port:              e2eutil.ProxyPort,
	}
	deleted := false
	defer func() {
		if !deleted { // the VM must not outlive a failed test
			dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer dcancel()
			if err := p.Delete(dctx, m); err != nil {
				t.Errorf("cleanup: Delete: %v", err)
			}
		}
	}()

	// Create: downloads and caches the image, makes the overlay and seed,
	// defines and starts the domain.
	start := time.Now()
	inst, err := p.Create(ctx, m)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Logf("Create → %s in %s", inst.ProviderID, time.Since(start).Round(time.Millisecond))
	h, uuidStr, err := provider.ParseKVMProviderID(inst.ProviderID)
	if err != nil || h != hostName {
		t.Fatalf("providerID %q: host %q, err %v", inst.ProviderID, h, err)
	}
	m.ProviderID = inst.ProviderID

	// Create again is idempotent: the same domain.
	again, err := p.Create(ctx, m)
	if err != nil || again.ProviderID != inst.ProviderID {
		t.Fatalf("second Create: %v, providerID %q (want %q)", err, again.ProviderID, inst.ProviderID)
	}

	// Get until the guest agent reports an address.
	var got *provider.Instance
	deadline := time.Now().Add(addressTimeout)
	lastMsg := ""
	for {
		got, err = p.Get(ctx, m)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if got.State == provider.StateRunning && got.Address != "" {
			break
		}
		if got.Message != lastMsg {
			lastMsg = got.Message
			t.Logf("Get after %s: %s, %s", time.Since(start).Round(time.Second), got.State, got.Message)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address within %s: state %s: %s", addressTimeout, got.State, got.Message)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(2 * time.Second):
		}
	}
	t.Logf("Get → %s, address %s from %s, %s after Create", got.State, got.Address, got.AddressSource, time.Since(start).Round(time.Second))
	fmt.Printf("INTEGRATION-TIMING create_to_address=%.1fs address=%s source=%s\n", time.Since(start).Seconds(), got.Address, got.AddressSource)
	if got.ProviderID != inst.ProviderID || got.Owner.UID != m.UID {
		t.Errorf("Get: providerID %q owner %+v; want %q, UID %s", got.ProviderID, got.Owner, inst.ProviderID, m.UID)
	}
	if got.AddressSource != provider.AddressSourceAgent && got.AddressSource != provider.AddressSourceLease {
		t.Errorf("address source %q", got.AddressSource)
	}

	// The orphan sweep's view: the domain carries our tag.
	listed, err := p.ListByTag(ctx, m.Tag)
	if err != nil || len(listed) != 1 || listed[0].ProviderID != inst.ProviderID {
		t.Errorf("ListByTag(%s) = %+v, %v; want just %s", m.Tag, listed, err, inst.ProviderID)
	}

	// Delete: the domain, its NVRAM and the per-VM volumes go; the image stays.
	if err := p.Delete(ctx, m); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	deleted = true
	if _, err := p.Get(ctx, m); provider.Class(err) != provider.ClassNotFound {
		t.Errorf("Get after Delete: %v, want a not-found error", err)
	}
	if err := p.Delete(ctx, m); err != nil {
		t.Errorf("second Delete: %v (want success: already gone)", err)
	}
	if listed, err := p.ListByTag(ctx, m.Tag); err != nil || len(listed) != 0 {
		t.Errorf("ListByTag after Delete = %+v, %v; want none", listed, err)
	}
	// Looked up on the host directly, over the same pooled connection.
	err = connPool.Do(ctx, hostName, func(c virt.Client) error {
		domain := domxml.DomainName(m.Namespace, m.Name)
		switch _, err := c.DomainLookupByName(domain); {
		case err == nil:
			return fmt.Errorf("domain %s still defined after Delete", domain)
		case !virt.IsCode(err, libvirt.ErrNoDomain):
			return fmt.Errorf("domain lookup after Delete: %w (want no domain)", err)
		}
		sp, err := c.StoragePoolLookupByName(pool)
		if err != nil {
			return err
		}
		if err := c.StoragePoolRefresh(sp, 0); err != nil {
			return err
		}
		var errs []error
		for _, v := range []string{domxml.DiskVolumeName(m.UID), domxml.SeedVolumeName(m.UID)} {
			switch _, err := c.StorageVolLookupByName(sp, v); {
			case err == nil:
				errs = append(errs, fmt.Errorf("volume %s still exists after Delete", v))
			case !virt.IsCode(err, libvirt.ErrNoStorageVol):
				errs = append(errs, fmt.Errorf("volume %s after Delete: %w (want none)", v, err))
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Error(err)
	}
	t.Logf("deleted %s (%s)", domxml.DomainName(m.Namespace, m.Name), uuidStr)
}

func uuid(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
