package e2eutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// Signals an Observer records. Each is a series of changes of one value.
const (
	// SigReady is the Proxy's Ready condition status ("True", "False",
	// "Unknown", "" before it has one); the change's detail is the reason.
	SigReady = "ready"
	// SigAddress is status.address as the manager published it.
	SigAddress = "status.address"
	// SigProviderID is status.providerID.
	SigProviderID = "status.providerID"
	// SigServing is the test's own request through the proxy: "ok" (204),
	// "fail" (detail: the error or status), "no-address".
	SigServing = "serving"
	// SigAnswered is the same requests' outcomes at the moment each
	// answer (or error) came back, in the order they came: "serving" says
	// from when a request would have been served, "answered" from when a
	// client could know it was.
	SigAnswered = "answered"
	// SigDomain is the domain's state read from libvirt ("running",
	// "shutoff", "paused", ..., "missing"); detail is its UUID.
	SigDomain = "domain"
	// SigLease is the domain's address in its DHCP lease, read from
	// libvirt by the test (the last one seen: it is not cleared while the
	// guest is down).
	SigLease = "lease"
	// SigAgent is "up" when the guest agent answers guest-ping, else "down".
	SigAgent = "agent"
	// SigEvent is every libvirt lifecycle event of the domain ("defined",
	// "started", "stopped", "undefined", ...); repeated values are kept.
	SigEvent = "libvirt-event"
)

// ObserverConfig says what an Observer watches.
type ObserverConfig struct {
	Client client.Client
	Proxy  client.ObjectKey
	// Target is the URL requested through the proxy; it must answer 204.
	Target string
	// LibvirtSocket is the host's libvirt socket as a path on this machine
	// (the local test hypervisor's, see LocalHost.LocalPath); empty: no
	// domain view, and requests go to status.address.
	LibvirtSocket string
	// Domain is the Proxy's domain name.
	Domain string
	// Interval between two looks of each loop (default 250 ms).
	Interval time.Duration
	// RequestTimeout bounds one request through the proxy (default 5 s:
	// a TCG guest's squid on a loaded machine answers in seconds). A
	// request starts every Interval whatever the ones in flight do (at
	// most maxInFlight at once), and each is recorded at its start.
	RequestTimeout time.Duration
}

// Change is one value a signal took, from At on.
type Change struct {
	At     time.Time
	Value  string
	Detail string
}

// Observer watches one Proxy from outside the manager, independently of its
// probe: the Proxy's status through the API server, the test's own
// requests through the proxy, and (with a libvirt socket) the domain's
// state, DHCP lease, guest agent and lifecycle events over a libvirt
// connection of its own. Three loops run apart, so a hung request or a
// wedged libvirtd stalls only its own view. Requests go to the address in
// the DHCP lease when libvirt is watched (so "first served" does not wait
// for the manager to publish an address), else to status.address.
type Observer struct {
	cfg    ObserverConfig
	start  time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	series map[string][]Change
	// served holds every request's outcome by its start; Timeline orders
	// them into the SigServing series (requests overlap and end out of
	// order).
	served []Change
	// answered: the same outcomes at their ends (SigAnswered).
	answered []Change
	proxy    *crawlv1.Proxy // last read
	lease    string
	conn     net.Conn // the libvirt connection, closed by Stop
}

// maxInFlight bounds the observer's concurrent requests through the proxy.
const maxInFlight = 8

// Observe starts watching; Stop ends it.
func Observe(ctx context.Context, cfg ObserverConfig) *Observer {
	if cfg.Interval <= 0 {
		cfg.Interval = 250 * time.Millisecond
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(ctx)
	o := &Observer{cfg: cfg, start: time.Now(), cancel: cancel, series: map[string][]Change{}}
	o.wg.Add(2)
	go o.statusLoop(ctx)
	go o.requestLoop(ctx)
	if cfg.LibvirtSocket != "" {
		o.wg.Add(1)
		go o.libvirtLoop(ctx)
	}
	return o
}

// Stop ends the loops and waits for them (a wedged libvirtd included: its
// connection is closed under it).
func (o *Observer) Stop() {
	o.cancel()
	o.mu.Lock()
	if o.conn != nil {
		_ = o.conn.Close()
	}
	o.mu.Unlock()
	o.wg.Wait()
}

// Started is when Observe was called.
func (o *Observer) Started() time.Time { return o.start }

// Requests is how many requests through the proxy the observer sent and
// saw end.
func (o *Observer) Requests() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, c := range o.served {
		if c.Value != "no-address" {
			n++
		}
	}
	return n
}

func (o *Observer) record(sig, value, detail string, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.series[sig]
	if sig != SigEvent && len(s) > 0 && s[len(s)-1].Value == value {
		return
	}
	o.series[sig] = append(s, Change{At: at, Value: value, Detail: detail})
}

// Timeline returns a copy of what was recorded so far.
func (o *Observer) Timeline() Timeline {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := Timeline{Start: o.start, Series: map[string][]Change{}}
	for k, v := range o.series {
		t.Series[k] = slices.Clone(v)
	}
	for sig, outcomes := range map[string][]Change{SigServing: o.served, SigAnswered: o.answered} {
		outcomes = slices.Clone(outcomes)
		slices.SortStableFunc(outcomes, func(a, b Change) int { return a.At.Compare(b.At) })
		var series []Change
		for _, c := range outcomes {
			if len(series) == 0 || series[len(series)-1].Value != c.Value {
				series = append(series, c)
			}
		}
		if len(series) > 0 {
			t.Series[sig] = series
		}
	}
	return t
}

func (o *Observer) sleep(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(o.cfg.Interval):
		return true
	}
}

func (o *Observer) statusLoop(ctx context.Context) {
	defer o.wg.Done()
	for {
		p := &crawlv1.Proxy{}
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := o.cfg.Client.Get(gctx, o.cfg.Proxy, p)
		cancel()
		now := time.Now()
		if err == nil {
			o.mu.Lock()
			o.proxy = p
			o.mu.Unlock()
			status, reason := "", ""
			if c := conditions.Get(p, crawlv1.ReadyCondition); c != nil {
				status, reason = string(c.Status), c.Reason
			}
			o.record(SigReady, status, reason, now)
			o.record(SigAddress, p.Status.Address, string(p.Status.AddressSource), now)
			o.record(SigProviderID, p.Status.ProviderID, "", now)
		} else if client.IgnoreNotFound(err) == nil {
			o.record(SigReady, "", "Proxy not found", now)
		}
		if !o.sleep(ctx) {
			return
		}
	}
}

func (o *Observer) requestLoop(ctx context.Context) {
	defer o.wg.Done()
	var inflight sync.WaitGroup
	defer inflight.Wait()
	slots := make(chan struct{}, maxInFlight)
	for {
		o.mu.Lock()
		p, addr := o.proxy, o.lease
		if o.cfg.LibvirtSocket == "" && p != nil {
			addr = p.Status.Address
		}
		o.mu.Unlock()
		now := time.Now()
		if p == nil || addr == "" {
			o.serve(Change{At: now, Value: "no-address"}, time.Time{})
		} else {
			select {
			case slots <- struct{}{}:
				inflight.Add(1)
				go func() {
					defer func() { <-slots; inflight.Done() }()
					via, err := ProxyViaAddress(ctx, o.cfg.Client, p, addr)
					code := 0
					if err == nil {
						via.Timeout = o.cfg.RequestTimeout
						code, _, err = via.Get(ctx, o.cfg.Target)
					}
					switch {
					case ctx.Err() != nil:
					case err != nil:
						o.serve(Change{At: now, Value: "fail", Detail: fmt.Sprintf("%s: %v", addr, err)}, time.Now())
					case code != http.StatusNoContent:
						o.serve(Change{At: now, Value: "fail", Detail: fmt.Sprintf("%s: status %d", addr, code)}, time.Now())
					default:
						o.serve(Change{At: now, Value: "ok", Detail: addr}, time.Now())
					}
				}()
			default: // maxInFlight requests hang: this tick is skipped
			}
		}
		if !o.sleep(ctx) {
			return
		}
	}
}

// serve records a request's outcome c (At: when it was sent) and, for a
// request that was sent, its outcome at end, when it came back (zero: no
// request was sent).
func (o *Observer) serve(c Change, end time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.served = append(o.served, c)
	if !end.IsZero() {
		o.answered = append(o.answered, Change{At: end, Value: c.Value, Detail: c.Detail})
	}
}

// libvirtLoop keeps a libvirt connection of its own (redialing after the
// daemon restarts) and polls the domain.
func (o *Observer) libvirtLoop(ctx context.Context) {
	defer o.wg.Done()
	for ctx.Err() == nil {
		l, err := o.dialLibvirt(ctx)
		if err != nil {
			if !o.sleep(ctx) {
				return
			}
			continue
		}
		o.watchDomain(ctx, l)
	}
}

func (o *Observer) dialLibvirt(ctx context.Context) (*libvirt.Libvirt, error) {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := d.DialContext(dctx, "unix", o.cfg.LibvirtSocket)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	if ctx.Err() != nil {
		o.mu.Unlock()
		_ = c.Close()
		return nil, ctx.Err()
	}
	o.conn = c
	o.mu.Unlock()
	l := libvirt.NewWithDialer(dialers.NewAlreadyConnected(c))
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		_ = c.Close()
		return nil, err
	}
	return l, nil
}

// watchDomain polls until the connection breaks or ctx ends.
func (o *Observer) watchDomain(ctx context.Context, l *libvirt.Libvirt) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer func() {
		o.mu.Lock()
		_ = o.conn.Close()
		o.mu.Unlock()
	}()
	if evs, err := l.LifecycleEvents(ctx); err == nil {
		go func() {
			for ev := range evs {
				if ev.Dom.Name == o.cfg.Domain {
					o.record(SigEvent, eventName(libvirt.DomainEventType(ev.Event)), virt.FormatUUID(ev.Dom.UUID), time.Now())
				}
			}
		}()
	}
	for {
		now := time.Now()
		dom, err := l.DomainLookupByName(o.cfg.Domain)
		switch {
		case virt.IsCode(err, libvirt.ErrNoDomain):
			o.record(SigDomain, "missing", "", now)
			o.record(SigAgent, "down", "no domain", now)
		case err != nil:
			return // transport: redial
		default:
			if !o.lookAt(l, dom, now) {
				return
			}
		}
		select {
		case <-l.Disconnected():
			return
		default:
		}
		if !o.sleep(ctx) {
			return
		}
	}
}

// lookAt records dom's state, lease and agent; false when the connection
// failed.
func (o *Observer) lookAt(l *libvirt.Libvirt, dom libvirt.Domain, now time.Time) bool {
	state, _, err := l.DomainGetState(dom, 0)
	if virt.IsCode(err, libvirt.ErrNoDomain) {
		o.record(SigDomain, "missing", "", now)
		return true
	}
	if err != nil {
		_, isLibvirt := virt.ErrorCode(err)
		return isLibvirt
	}
	name := domainStateName(libvirt.DomainState(state))
	o.record(SigDomain, name, virt.FormatUUID(dom.UUID), now)
	if name != "running" {
		o.record(SigAgent, "down", name, now)
		return true
	}
	ifaces, err := l.DomainInterfaceAddresses(dom, uint32(libvirt.DomainInterfaceAddressesSrcLease), 0)
	if addr := firstIPv4(ifaces); err == nil && addr != "" {
		o.setLease(addr, now)
	}
	_, err = l.QEMUDomainAgentCommand(dom, `{"execute":"guest-ping"}`, 1, 0)
	if err == nil {
		o.record(SigAgent, "up", "", now)
	} else {
		o.record(SigAgent, "down", err.Error(), now)
	}
	return true
}

// setLease records a leased address. It is kept while the guest is down or
// gone: requests go on to the last address, as a client's would, and fail.
func (o *Observer) setLease(addr string, now time.Time) {
	o.mu.Lock()
	o.lease = addr
	o.mu.Unlock()
	o.record(SigLease, addr, "", now)
}

func firstIPv4(ifaces []libvirt.DomainInterface) string {
	for _, i := range ifaces {
		for _, a := range i.Addrs {
			if a.Type == int32(libvirt.IPAddrTypeIpv4) {
				if ip := net.ParseIP(a.Addr).To4(); ip != nil && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
					return ip.String()
				}
			}
		}
	}
	return ""
}

func domainStateName(s libvirt.DomainState) string {
	switch s {
	case libvirt.DomainRunning:
		return "running"
	case libvirt.DomainBlocked:
		return "running" // blocked on I/O: running for every purpose here
	case libvirt.DomainPaused:
		return "paused"
	case libvirt.DomainShutdown:
		return "shutting-down"
	case libvirt.DomainShutoff:
		return "shutoff"
	case libvirt.DomainCrashed:
		return "crashed"
	case libvirt.DomainPmsuspended:
		return "pmsuspended"
	}
	return fmt.Sprintf("state-%d", s)
}

func eventName(t libvirt.DomainEventType) string {
	switch t {
	case libvirt.DomainEventDefined:
		return "defined"
	case libvirt.DomainEventUndefined:
		return "undefined"
	case libvirt.DomainEventStarted:
		return "started"
	case libvirt.DomainEventSuspended:
		return "suspended"
	case libvirt.DomainEventResumed:
		return "resumed"
	case libvirt.DomainEventStopped:
		return "stopped"
	case libvirt.DomainEventShutdown:
		return "shutdown"
	case libvirt.DomainEventPmsuspended:
		return "pmsuspended"
	case libvirt.DomainEventCrashed:
		return "crashed"
	}
	return fmt.Sprintf("event-%d", t)
}

// Timeline is what an Observer recorded: per signal, its changes in order.
type Timeline struct {
	Start  time.Time
	Series map[string][]Change
}

// First returns the first change of sig to a value pred accepts at or
// after from.
func (t Timeline) First(sig string, from time.Time, pred func(Change) bool) (Change, bool) {
	for _, c := range t.Series[sig] {
		if !c.At.Before(from) && pred(c) {
			return c, true
		}
	}
	return Change{}, false
}

// FirstValue is First for one value.
func (t Timeline) FirstValue(sig, value string, from time.Time) (time.Time, bool) {
	c, ok := t.First(sig, from, func(c Change) bool { return c.Value == value })
	return c.At, ok
}

// ValueAt is sig's value at time at ("" before its first change).
func (t Timeline) ValueAt(sig string, at time.Time) string {
	v := ""
	for _, c := range t.Series[sig] {
		if c.At.After(at) {
			break
		}
		v = c.Value
	}
	return v
}

// Overlap is how long, within [from, to], sig a had value av while sig b
// had value bv. Values change at the sampled instants.
func (t Timeline) Overlap(a, av, b, bv string, from, to time.Time) time.Duration {
	cuts := []time.Time{from, to}
	for _, sig := range []string{a, b} {
		for _, c := range t.Series[sig] {
			if c.At.After(from) && c.At.Before(to) {
				cuts = append(cuts, c.At)
			}
		}
	}
	slices.SortFunc(cuts, func(x, y time.Time) int { return x.Compare(y) })
	var total time.Duration
	for i := 0; i+1 < len(cuts); i++ {
		if t.ValueAt(a, cuts[i]) == av && t.ValueAt(b, cuts[i]) == bv {
			total += cuts[i+1].Sub(cuts[i])
		}
	}
	return total
}

// FirstBoth is the first moment at or after from when sig a has value av
// and sig b has value bv (e.g. Ready and serving: really back).
func (t Timeline) FirstBoth(a, av, b, bv string, from time.Time) (time.Time, bool) {
	cuts := []time.Time{from}
	for _, sig := range []string{a, b} {
		for _, c := range t.Series[sig] {
			if c.At.After(from) {
				cuts = append(cuts, c.At)
			}
		}
	}
	slices.SortFunc(cuts, func(x, y time.Time) int { return x.Compare(y) })
	for _, at := range cuts {
		if t.ValueAt(a, at) == av && t.ValueAt(b, at) == bv {
			return at, true
		}
	}
	return time.Time{}, false
}

// Left returns the changes of sig, after the moment after, to anything but
// value: none when sig kept value from then on (Ready never flapped).
func (t Timeline) Left(sig, value string, after time.Time) []Change {
	var out []Change
	for _, c := range t.Series[sig] {
		if c.At.After(after) && c.Value != value {
			out = append(out, c)
		}
	}
	return out
}

// Held is how long, within [from, to], sig had value.
func (t Timeline) Held(sig, value string, from, to time.Time) time.Duration {
	return t.Overlap(sig, value, sig, value, from, to)
}

// Write prints every change as "+SECONDS signal value (detail)", in time
// order, relative to the timeline's start.
func (t Timeline) Write(w io.Writer) {
	type line struct {
		at  time.Time
		txt string
	}
	var lines []line
	for sig, cs := range t.Series {
		for _, c := range cs {
			txt := fmt.Sprintf("%-17s %s", sig, orStr(c.Value, `""`))
			if c.Detail != "" {
				txt += " (" + strings.TrimSpace(c.Detail) + ")"
			}
			lines = append(lines, line{c.At, txt})
		}
	}
	slices.SortStableFunc(lines, func(x, y line) int { return x.at.Compare(y.at) })
	for _, l := range lines {
		fmt.Fprintf(w, "+%8.3fs %s\n", l.at.Sub(t.Start).Seconds(), l.txt)
	}
}

// Since formats at relative to the timeline's start ("+12.3s").
func (t Timeline) Since(at time.Time) string { return "+" + Seconds(at.Sub(t.Start)) }

// errNotSeen says a timeline lacks an expected change.
var errNotSeen = errors.New("not seen")

// Need returns the time of the first change of sig to value at or after
// from, or an error naming what the observer did not see.
func (t Timeline) Need(sig, value string, from time.Time) (time.Time, error) {
	if at, ok := t.FirstValue(sig, value, from); ok {
		return at, nil
	}
	return time.Time{}, fmt.Errorf("%s=%q after %s: %w", sig, value, t.Since(from), errNotSeen)
}

// BootTimes are the moments of one boot of a Proxy's guest as an Observer
// saw them, each measured from From (the Proxy's creation, or the fault
// that made the guest boot again); zero when not seen.
type BootTimes struct {
	From time.Time
	// Defined and Started: the domain's libvirt lifecycle events (or the
	// first look that found it defined / running).
	Defined, Started time.Duration
	// Agent: the guest agent first answered guest-ping after Started.
	Agent time.Duration
	// Lease: the DHCP lease, read by the test; Address: status.address,
	// published by the manager.
	Lease, Address time.Duration
	// FirstServed: the test's first request through the proxy that got
	// its 204, when it was sent; FirstAnswer: when the first 204 came back
	// (a freshly started squid in a TCG guest took seconds for its first
	// answers). Ready: Ready=True, as the API server returned it.
	FirstServed, FirstAnswer, Ready time.Duration
}

// Boot reads one boot from the timeline, everything at or after from.
func (t Timeline) Boot(from time.Time) BootTimes {
	b := BootTimes{From: from}
	since := func(at time.Time, ok bool) time.Duration {
		if !ok {
			return 0
		}
		return max(at.Sub(from), time.Nanosecond)
	}
	nonEmpty := func(c Change) bool { return c.Value != "" }
	if at, ok := t.FirstValue(SigEvent, "defined", from); ok {
		b.Defined = since(at, true)
	} else if c, ok := t.First(SigDomain, from, func(c Change) bool { return c.Value != "missing" }); ok {
		b.Defined = since(c.At, true)
	}
	started, ok := t.FirstValue(SigEvent, "started", from)
	if !ok {
		started, ok = t.FirstValue(SigDomain, "running", from)
	}
	b.Started = since(started, ok)
	if ok {
		b.Agent = since(t.FirstValue(SigAgent, "up", started))
	}
	c, ok := t.First(SigLease, from, nonEmpty)
	b.Lease = since(c.At, ok)
	c, ok = t.First(SigAddress, from, nonEmpty)
	b.Address = since(c.At, ok)
	b.FirstServed = since(t.FirstValue(SigServing, "ok", from))
	b.FirstAnswer = since(t.FirstValue(SigAnswered, "ok", from))
	b.Ready = since(t.FirstValue(SigReady, "True", from))
	return b
}

// BootToAgent is Started → the guest agent's first answer.
func (b BootTimes) BootToAgent() time.Duration {
	if b.Agent == 0 || b.Started == 0 {
		return 0
	}
	return b.Agent - b.Started
}

// Lag is Ready − FirstServed: how long the proxy served before the
// manager said so (negative: Ready came first); 0 when either is unseen.
// It includes the first answer's own latency, which no probe can avoid.
func (b BootTimes) Lag() time.Duration { return lagAfter(b.Ready, b.FirstServed) }

// AnswerLag is Ready − FirstAnswer: how long after a client could know the
// proxy served the manager said so.
func (b BootTimes) AnswerLag() time.Duration { return lagAfter(b.Ready, b.FirstAnswer) }

// lagAfter is ready − since, 1ns for a tie and 0 when either is unseen.
func lagAfter(ready, since time.Duration) time.Duration {
	if ready == 0 || since == 0 {
		return 0
	}
	if d := ready - since; d != 0 {
		return d
	}
	return time.Nanosecond
}

// String lists the moments ("-" for what was not seen).
func (b BootTimes) String() string {
	s := func(d time.Duration) string {
		if d == 0 {
			return "-"
		}
		return Seconds(d)
	}
	return fmt.Sprintf("defined +%s, started +%s, agent +%s (boot-to-agent %s), lease +%s, status.address +%s, first served +%s (answered +%s), Ready +%s, lag %s (after the answer %s)",
		s(b.Defined), s(b.Started), s(b.Agent), s(b.BootToAgent()), s(b.Lease), s(b.Address), s(b.FirstServed), s(b.FirstAnswer), s(b.Ready), s(b.Lag()), s(b.AnswerLag()))
}
