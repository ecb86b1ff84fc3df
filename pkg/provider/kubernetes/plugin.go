package kubernetes

import (
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/plugin"
)

// Plugin is the kubernetes provider's part in the operator's generic code
// (see package plugin): squid pods the provider spreads over nodes itself.
type Plugin struct{}

var _ plugin.Plugin = Plugin{}

func (Plugin) Name() string { return Name }

func (Plugin) Domain() plugin.Domain { return plugin.Nodes }

func (Plugin) HostOf(*crawlv1.Proxy) string { return "" }

func (Plugin) Machines(client.Reader) plugin.Machines { return plugin.GivenImage{} }

func (Plugin) Default(*crawlv1.ProxySpec) {}

// Validate refuses an image: every pod runs the manager's squid image.
func (Plugin) Validate(p *crawlv1.Proxy, _ plugin.Policy) field.ErrorList {
	if p.Spec.Placement.Image != "" {
		return field.ErrorList{field.Forbidden(field.NewPath("spec", "placement", "image"), "the kubernetes provider runs the manager's --kubernetes-squid-image")}
	}
	return nil
}
