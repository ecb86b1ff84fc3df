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
	// Event is libvirt's lifecycle event type (started, stopped, ...); zero
	// for a guest agent event.
	Event libvirt.DomainEventType
	// AgentConnected says the guest agent just connected: its addresses can
	// be read now rather than at the next provision poll.
	AgentConnected bool
	// HostAnswers says the host answers its health check again after the
	// Proxy was turned away while it did not (provider.UnavailableError):
	// its instance can be read again now.
	HostAnswers bool
	// SlotFree says the Proxy's call was refused because its host had
	// all its calls in flight (provider.ErrBusy), and asking again can be
	// answered now: a call slot freed, or the host was found not
	// answering (and the next call is refused at once as such).
	SlotFree bool
}

// Events delivers lifecycle events of domains named like Proxies. When the
// consumer falls behind, events are dropped: the periodic resync covers them.
func (p *Provider) Events() <-chan DomainEvent { return p.events }

// OnConnect subscribes to libvirt lifecycle events, and to the guest agent's
// lifecycle events, on a new connection and forwards them until the
// connection drops; the pool calls it again after each reconnect, which
// re-subscribes. Pass it as conn.Options.OnConnect.
func (p *Provider) OnConnect(host string, c virt.Client, disconnected <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-disconnected
		cancel()
	}()
	log := p.opts.Logger.WithValues("host", host)
	agentDone := make(chan struct{})
	defer func() { <-agentDone }()
	go func() {
		defer close(agentDone)
		p.forwardAgentEvents(ctx, host, c)
	}()
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
		p.send(DomainEvent{Host: host, Namespace: ns, Name: name, Event: libvirt.DomainEventType(ev.Event)})
	}
}

// forwardAgentEvents forwards "guest agent connected" until ctx ends or the
// connection drops. Without it the address waits for the provision poll.
func (p *Provider) forwardAgentEvents(ctx context.Context, host string, c virt.Client) {
	log := p.opts.Logger.WithValues("host", host)
	ch, err := c.SubscribeEvents(ctx, libvirt.DomainEventIDAgentLifecycle, nil)
	if err != nil {
		log.Error(err, "subscribing to guest agent lifecycle events; relying on the provision poll")
		return
	}
	log.V(1).Info("subscribed to guest agent lifecycle events")
	for raw := range ch { // drained to the end: go-libvirt blocks on it
		ev, ok := raw.(*libvirt.DomainEventCallbackAgentLifecycleMsg)
		if !ok {
			continue
		}
		ns, name, ok := splitDomainName(ev.Dom.Name)
		if !ok {
			continue
		}
		state := libvirt.ConnectDomainEventAgentLifecycleState(ev.State)
		log.V(1).Info("guest agent lifecycle event", "domain", ev.Dom.Name, "state", state,
			"reason", libvirt.ConnectDomainEventAgentLifecycleReason(ev.Reason))
		if state == libvirt.ConnectDomainEventAgentLifecycleStateConnected {
			p.send(DomainEvent{Host: host, Namespace: ns, Name: name, AgentConnected: true})
		}
	}
}

// send drops the event when the consumer falls behind: the resync covers it.
func (p *Provider) send(ev DomainEvent) {
	select {
	case p.events <- ev:
	default:
	}
}

// splitDomainName inverts domxml.DomainName: "<namespace>.<name>". Names
// without a dot are not Proxies'. Ownership is checked later, by UID.
func splitDomainName(s string) (namespace, name string, ok bool) {
	namespace, name, ok = strings.Cut(s, ".")
	return namespace, name, ok && namespace != "" && name != ""
}
