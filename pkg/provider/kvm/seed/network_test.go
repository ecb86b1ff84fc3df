package seed

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"crawl.example.com/proxy-operator/pkg/provider"
)

func staticV4() Network {
	return Network{
		Address:     netip.MustParsePrefix("203.0.113.5/28"),
		Gateway:     netip.MustParseAddr("203.0.113.1"),
		MAC:         "02:00:5E:10:00:05",
		Nameservers: []netip.Addr{netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("2001:db8::53")},
	}
}

// v2NIC is the part of a network-config v2 document the tests read.
type v2NIC struct {
	Match struct {
		MACAddress string `json:"macaddress"`
	} `json:"match"`
	SetName     string   `json:"set-name"`
	DHCP4       *bool    `json:"dhcp4"`
	DHCP6       *bool    `json:"dhcp6"`
	Addresses   []string `json:"addresses"`
	Gateway4    string   `json:"gateway4"`
	Gateway6    string   `json:"gateway6"`
	Nameservers struct {
		Addresses []string `json:"addresses"`
	} `json:"nameservers"`
}

type v2Doc struct {
	Version   int              `json:"version"`
	Ethernets map[string]v2NIC `json:"ethernets"`
}

func parseV2(t *testing.T, b []byte) v2NIC {
	t.Helper()
	var d v2Doc
	if err := yaml.UnmarshalStrict(b, &d); err != nil {
		t.Fatalf("network-config is not the v2 document expected: %v\n%s", err, b)
	}
	if d.Version != 2 || len(d.Ethernets) != 1 {
		t.Fatalf("version %d with %d ethernets, want version 2 with one:\n%s", d.Version, len(d.Ethernets), b)
	}
	nic, ok := d.Ethernets[NICName]
	if !ok {
		t.Fatalf("no ethernets.%s:\n%s", NICName, b)
	}
	return nic
}

func TestNetworkConfigRendersTheStaticAddress(t *testing.T) {
	v6 := Network{
		Address:     netip.MustParsePrefix("2001:db8:1::10/64"),
		Gateway:     netip.MustParseAddr("2001:db8:1::1"),
		MAC:         "52:54:00:aa:bb:cc",
		Nameservers: []netip.Addr{netip.MustParseAddr("2001:db8::53")},
	}
	noGateway := staticV4()
	noGateway.Gateway = netip.Addr{}
	cases := []struct {
		name                        string
		in                          Network
		address, gateway4, gateway6 string
		mac                         string
		nameservers                 []string
	}{
		{"ipv4", staticV4(), "203.0.113.5/28", "203.0.113.1", "", "02:00:5e:10:00:05", []string{"192.0.2.53", "2001:db8::53"}},
		{"ipv6", v6, "2001:db8:1::10/64", "", "2001:db8:1::1", "52:54:00:aa:bb:cc", []string{"2001:db8::53"}},
		{"no gateway: no default route", noGateway, "203.0.113.5/28", "", "", "02:00:5e:10:00:05", []string{"192.0.2.53", "2001:db8::53"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NetworkConfig(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			nic := parseV2(t, b)
			if nic.Match.MACAddress != tc.mac || nic.SetName != NICName {
				t.Errorf("match %q set-name %q, want %q %q", nic.Match.MACAddress, nic.SetName, tc.mac, NICName)
			}
			if nic.DHCP4 == nil || *nic.DHCP4 || nic.DHCP6 == nil || *nic.DHCP6 {
				t.Errorf("dhcp4 %v dhcp6 %v, want both false", nic.DHCP4, nic.DHCP6)
			}
			if len(nic.Addresses) != 1 || nic.Addresses[0] != tc.address {
				t.Errorf("addresses %v, want [%s]", nic.Addresses, tc.address)
			}
			if nic.Gateway4 != tc.gateway4 || nic.Gateway6 != tc.gateway6 {
				t.Errorf("gateway4 %q gateway6 %q, want %q %q", nic.Gateway4, nic.Gateway6, tc.gateway4, tc.gateway6)
			}
			if strings.Join(nic.Nameservers.Addresses, ",") != strings.Join(tc.nameservers, ",") {
				t.Errorf("nameservers %v, want %v", nic.Nameservers.Addresses, tc.nameservers)
			}
		})
	}
}

func TestNetworkConfigRefusesWhatCannotWork(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Network)
		want   string
	}{
		{"no address", func(n *Network) { n.Address = netip.Prefix{} }, "no valid address"},
		{"bad MAC", func(n *Network) { n.MAC = "02:00:5e:10:00" }, `MAC "02:00:5e:10:00" is not a 48-bit MAC address`},
		{"EUI-64 MAC", func(n *Network) { n.MAC = "02:00:5e:10:00:05:06:07" }, "not a 48-bit MAC"},
		{"MAC with YAML in it", func(n *Network) { n.MAC = "02:00:5e:10:00:05\"\n  x: y" }, "not a 48-bit MAC"},
		{"no nameservers", func(n *Network) { n.Nameservers = nil }, "no nameservers"},
		{"gateway outside the prefix", func(n *Network) { n.Gateway = netip.MustParseAddr("198.51.100.1") }, "gateway 198.51.100.1 is not another address inside 203.0.113.0/28"},
		{"gateway of the other family", func(n *Network) { n.Gateway = netip.MustParseAddr("2001:db8::1") }, "gateway 2001:db8::1 is not another address inside"},
		{"gateway is the address", func(n *Network) { n.Gateway = n.Address.Addr() }, "is not another address"},
		{"invalid nameserver", func(n *Network) { n.Nameservers = []netip.Addr{{}} }, "nameserver"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := staticV4()
			tc.mutate(&n)
			_, err := NetworkConfig(n)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if provider.Class(err) != provider.ClassPermanent {
				t.Errorf("class %v, want permanent: retrying cannot fix the input", provider.Class(err))
			}
		})
	}
}

func TestBuildWritesNetworkConfigOnlyWhenGiven(t *testing.T) {
	cfg, err := NetworkConfig(staticV4())
	if err != nil {
		t.Fatal(err)
	}
	iso, err := Build(Input{InstanceID: "uid-net", Hostname: "p", NetworkConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	_, files := readISO(t, iso)
	if string(files[NetworkConfigFile]) != string(cfg) {
		t.Errorf("network-config in the ISO = %q, want %q", files[NetworkConfigFile], cfg)
	}
	iso, err = Build(Input{InstanceID: "uid-dhcp", Hostname: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if _, files := readISO(t, iso); files[NetworkConfigFile] != nil {
		t.Errorf("a seed without a static address has a network-config (%q): cloud-init would not fall back to DHCP", files[NetworkConfigFile])
	}
}

// TestNetworkConfigThroughDebianCloudInit hands the rendered
// network-config to Debian 12's cloud-init (`cloud-init devel
// net-convert`, `make test` installs it: hack/test-deps.sh) and reads what
// each renderer a Debian guest may use writes: ENI when ifupdown is
// installed, netplan on Debian's cloud images, networkd. Each must give the
// NIC with the configured MAC the static address, the default route via
// the gateway and the nameservers, and no DHCP.
func TestNetworkConfigThroughDebianCloudInit(t *testing.T) {
	ci, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Fatal("cloud-init not on PATH (apt-get install cloud-init, or make test-deps)")
	}
	cfg, err := NetworkConfig(staticV4())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	in := filepath.Join(dir, NetworkConfigFile)
	if err := os.WriteFile(in, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	convert := func(renderer string) map[string]string {
		t.Helper()
		out := filepath.Join(dir, renderer)
		cmd := exec.Command(ci, "devel", "net-convert", "-p", in, "-k", "yaml", "-d", out, "-D", "debian", "-O", renderer)
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cloud-init devel net-convert -O %s: %v\n%s", renderer, err, msg)
		}
		files := map[string]string{}
		err := filepath.WalkDir(out, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			rel, _ := filepath.Rel(out, path)
			files[rel] = string(b)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	want := func(renderer string, files map[string]string, file string, lines ...string) {
		t.Helper()
		got, ok := files[file]
		if !ok {
			t.Errorf("%s: no %s among %v", renderer, file, keys(files))
			return
		}
		for _, l := range lines {
			if !strings.Contains(got, l) {
				t.Errorf("%s: %s lacks %q:\n%s", renderer, file, l, got)
			}
		}
	}

	eni := convert("eni")
	want("eni", eni, "etc/network/interfaces.d/50-cloud-init",
		"auto eth0\n", "iface eth0 inet static\n", "address 203.0.113.5/28\n", "gateway 203.0.113.1\n", "dns-nameservers 192.0.2.53 2001:db8::53\n")
	want("eni", eni, "etc/udev/rules.d/70-persistent-net.rules", `ATTR{address}=="02:00:5e:10:00:05", NAME="eth0"`)
	if strings.Contains(eni["etc/network/interfaces.d/50-cloud-init"], "dhcp") {
		t.Errorf("eni: DHCP configured:\n%s", eni["etc/network/interfaces.d/50-cloud-init"])
	}

	networkd := convert("networkd")
	want("networkd", networkd, "etc/systemd/network/10-cloud-init-eth0.network",
		"MACAddress=02:00:5e:10:00:05\n", "Name=eth0\n", "DHCP=no\n", "Address=203.0.113.5/28\n", "Gateway=203.0.113.1\n", "DNS=192.0.2.53 2001:db8::53\n")

	netplan := convert("netplan")
	var doc struct {
		Network v2Doc `json:"network"`
	}
	np := netplan["etc/netplan/50-cloud-init.yaml"]
	if err := yaml.Unmarshal([]byte(np), &doc); err != nil {
		t.Fatalf("netplan: %v\n%s", err, np)
	}
	nic, ok := doc.Network.Ethernets[NICName]
	if !ok || doc.Network.Version != 2 || nic.Match.MACAddress != "02:00:5e:10:00:05" || nic.Gateway4 != "203.0.113.1" ||
		strings.Join(nic.Addresses, ",") != "203.0.113.5/28" || strings.Join(nic.Nameservers.Addresses, ",") != "192.0.2.53,2001:db8::53" {
		t.Errorf("netplan did not pass the configuration through:\n%s", np)
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
