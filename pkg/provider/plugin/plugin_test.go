package plugin_test

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// stub is a plug-in named name placing in domain.
type stub struct {
	name   string
	domain plugin.Domain
}

func (s stub) Name() string                                         { return s.name }
func (s stub) Domain() plugin.Domain                                { return s.domain }
func (stub) HostOf(*crawlv1.Proxy) string                           { return "" }
func (stub) Default(*crawlv1.ProxySpec)                             {}
func (stub) Validate(*crawlv1.Proxy, plugin.Policy) field.ErrorList { return nil }
func (stub) Machines(client.Reader) plugin.Machines                 { return plugin.GivenImage{} }

func TestListLooksUpByNameInOrder(t *testing.T) {
	l := plugin.List{stub{"vm", plugin.Hosts}, stub{"pods", plugin.Nodes}, stub{"cloud", plugin.Zones}, stub{"other-vm", plugin.Hosts}}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := l.Names(); !slices.Equal(got, []string{"vm", "pods", "cloud", "other-vm"}) {
		t.Errorf("Names = %v, want the list order", got)
	}
	if got := l.NamesIn(plugin.Hosts); !slices.Equal(got, []string{"vm", "other-vm"}) {
		t.Errorf("NamesIn(Hosts) = %v", got)
	}
	if p := l.Get("cloud"); p == nil || p.Name() != "cloud" {
		t.Errorf("Get(cloud) = %v", p)
	}
	if p := l.Get("azure"); p != nil {
		t.Errorf("Get(azure) = %v, want none", p)
	}
	if d := l.DomainOf("pods"); d != plugin.Nodes {
		t.Errorf("DomainOf(pods) = %q", d)
	}
	if d := l.DomainOf("azure"); d != "" {
		t.Errorf("DomainOf(azure) = %q, want none", d)
	}
}

func TestListValidateRefusesWhatGenericCodeCannotUse(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    plugin.List
		want string
	}{
		{"empty", nil, "no provider plug-ins"},
		{"nil plug-in", plugin.List{nil}, "plug-in 0 is nil"},
		{"no name", plugin.List{stub{"", plugin.Zones}}, "has no name"},
		{"two for one name", plugin.List{stub{"vm", plugin.Hosts}, stub{"vm", plugin.Zones}}, `two plug-ins serve provider "vm"`},
		{"unknown domain", plugin.List{stub{"vm", "racks"}}, `plug-in "vm": unknown domain "racks"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.l.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
