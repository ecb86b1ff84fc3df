package kvm

import (
	"context"
	"strings"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// DomainEvent says a domain that may be a Proxy's changed state.
type DomainEvent struct {
	Host string
	// Namespace and Name of the Proxy the domain name maps to.
	Namespace string
	Name      string
	// Event is libvirt's lifecycle event type (started, stopped, ...).
	Event libvirt.DomainEventType
}

// Events delivers lifecycle events of domains named like Proxies. When the
// consumer falls behind, events are dropped: the periodic resync covers them.
func (p *Provider) Events() <-chan DomainEvent { return p.events }

// OnConnect subscribes to libvirt lifecycle events on a new connection and
// forwards them until the connection drops; the pool calls it again after
// each reconnect, which re-subscribes. Pass it as conn.Options.OnConnect.
func (p *Provider) OnConnect(host string, c virt.Client, disconnected <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-disconnected
		cancel()
	}()
	log := p.opts.Logger.WithValues("host", host)
	ch, err := c.LifecycleEvents(ctx)
	if err != nil {
		log.Error(err, "subscribing to libvirt lifecycle events; relying on periodic resync")
		return
	}
	log.V(1).Info("subscribed to libvirt lifecycle events")
	for ev := range ch {
		ns, name, ok := splitDomainName(ev.Dom.Name)
		if !ok {
			continue
		}
		log.V(1).Info("libvirt lifecycle event", "domain", ev.Dom.Name, "event", libvirt.DomainEventType(ev.Event))
		select {
		case p.events <- DomainEvent{Host: host, Namespace: ns, Name: name, Event: libvirt.DomainEventType(ev.Event)}:
		default:
		}
	}
}

// splitDomainName inverts domxml.DomainName: "<namespace>.<name>". Names
// without a dot are not Proxies'. Ownership is checked later, by UID.
func splitDomainName(s string) (namespace, name string, ok bool) {
	namespace, name, ok = strings.Cut(s, ".")
	return namespace, name, ok && namespace != "" && name != ""
}
