package virt

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// CallClass groups RPCs by how long a daemon that works may take to answer
// them, which is what each RPC's deadline is sized to. A libvirtd that
// stops answering (SIGSTOP, a hung storage backend) while SSH stays up
// never fails a call: without a deadline of its own, one RPC would hold its
// caller for as long as the caller's whole operation may last.
type CallClass int

const (
	// CallQuery reads what the daemon holds in memory: lookups, state,
	// metadata, XML, lists, leases, host and pool figures, event
	// registration. A working daemon answers in milliseconds.
	CallQuery CallClass = iota
	// CallChange changes a definition or a volume: define, undefine,
	// volume create and delete, pool refresh. It may wait for the
	// domain's job lock, which libvirt itself gives up on after 30 s.
	CallChange
	// CallLifecycle starts, resumes or stops a guest: libvirt waits on
	// the job lock (30 s) and on QEMU (its monitor, 30 s; a destroy
	// escalates from SIGTERM to SIGKILL over several seconds).
	CallLifecycle
	// CallStream is an upload. It is bounded by progress, not by its
	// length: an image may take minutes to copy over a slow link.
	CallStream
)

func (c CallClass) String() string {
	switch c {
	case CallQuery:
		return "query"
	case CallChange:
		return "change"
	case CallLifecycle:
		return "lifecycle"
	case CallStream:
		return "stream"
	}
	return fmt.Sprintf("CallClass(%d)", int(c))
}

// callClasses gives every RPC of Client its class; a test keeps it
// complete.
var callClasses = map[string]CallClass{
	RPCConnectGetLibVersion:                  CallQuery,
	RPCConnectGetHostname:                    CallQuery,
	RPCConnectListAllDomains:                 CallQuery,
	RPCNodeGetInfo:                           CallQuery,
	RPCNodeGetMemoryStats:                    CallQuery,
	RPCConnectGetAllDomainStats:              CallQuery,
	RPCDomainLookupByName:                    CallQuery,
	RPCDomainLookupByUUID:                    CallQuery,
	RPCDomainGetState:                        CallQuery,
	RPCDomainGetXMLDesc:                      CallQuery,
	RPCDomainGetMetadata:                     CallQuery,
	RPCDomainInterfaceAddresses:              CallQuery,
	RPCStoragePoolLookupByName:               CallQuery,
	RPCStoragePoolGetInfo:                    CallQuery,
	RPCStoragePoolListAllVolumes:             CallQuery,
	RPCStorageVolLookupByName:                CallQuery,
	RPCStorageVolGetPath:                     CallQuery,
	RPCStorageVolGetInfo:                     CallQuery,
	RPCStorageVolGetXMLDesc:                  CallQuery,
	RPCNetworkLookupByName:                   CallQuery,
	RPCNetworkGetDHCPLeases:                  CallQuery,
	RPCConnectDomainEventRegisterAny:         CallQuery,
	RPCConnectDomainEventCallbackRegisterAny: CallQuery,
	RPCDomainDefineXMLFlags:                  CallChange,
	RPCDomainUndefineFlags:                   CallChange,
	RPCStorageVolCreateXML:                   CallChange,
	RPCStorageVolDelete:                      CallChange,
	RPCStoragePoolRefresh:                    CallChange,
	RPCDomainCreate:                          CallLifecycle,
	RPCDomainResume:                          CallLifecycle,
	RPCDomainDestroyFlags:                    CallLifecycle,
	RPCStorageVolUpload:                      CallStream,
}

// ClassOf returns rpc's class; ok is false for a name that is not one of
// RPCNames.
func ClassOf(rpc string) (class CallClass, ok bool) {
	class, ok = callClasses[rpc]
	return class, ok
}

// The default deadlines, one per class. A call that runs out is abandoned
// with a transient DeadlineError and retried by its caller's backoff, so a
// bound that is a little short costs a retry, and one that is long costs a
// worker held that long on a host that does not answer.
const (
	// DefaultQueryDeadline: a hundred times what a loaded daemon needs.
	DefaultQueryDeadline = 10 * time.Second
	// DefaultChangeDeadline lets libvirt give up on a busy job lock (30 s)
	// and say so before the caller gives up on libvirt.
	DefaultChangeDeadline = 30 * time.Second
	// DefaultLifecycleDeadline covers the job lock and QEMU's monitor
	// timeouts (30 s each) with room to spare.
	DefaultLifecycleDeadline = 2 * time.Minute
	// DefaultStreamStall is how long an upload may go without libvirt
	// taking a byte, and how long the daemon may take to confirm the
	// finished stream (it syncs the file to disk). Like
	// image.DefaultStallTimeout on the download side.
	DefaultStreamStall = 2 * time.Minute
)

// Deadlines bound each RPC Instrument issues by its class. A zero field
// takes its Default; a negative one leaves that class bounded by the
// caller's context only.
type Deadlines struct {
	Query     time.Duration
	Change    time.Duration
	Lifecycle time.Duration
	// StreamStall bounds the time libvirt holds an upload without taking
	// bytes: from the call to the first read of the body, between two
	// reads, and from the end of the body to the daemon's answer. Time
	// spent reading the body (the image download) is the body's own.
	StreamStall time.Duration
	// Clock times the deadlines; the real clock when nil. Tests inject a
	// fake one to step past a deadline instead of waiting it out.
	Clock clock.Clock
}

// DefaultDeadlines are the production deadlines.
var DefaultDeadlines = Deadlines{
	Query:       DefaultQueryDeadline,
	Change:      DefaultChangeDeadline,
	Lifecycle:   DefaultLifecycleDeadline,
	StreamStall: DefaultStreamStall,
}

// For returns the deadline of class after defaults: 0 means none.
func (d Deadlines) For(class CallClass) time.Duration {
	var v, def time.Duration
	switch class {
	case CallQuery:
		v, def = d.Query, DefaultQueryDeadline
	case CallChange:
		v, def = d.Change, DefaultChangeDeadline
	case CallLifecycle:
		v, def = d.Lifecycle, DefaultLifecycleDeadline
	case CallStream:
		v, def = d.StreamStall, DefaultStreamStall
	}
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func (d Deadlines) forRPC(rpc string) time.Duration {
	class, ok := ClassOf(rpc)
	if !ok {
		class = CallQuery
	}
	return d.For(class)
}

func (d Deadlines) clock() clock.Clock {
	if d.Clock == nil {
		return clock.RealClock{}
	}
	return d.Clock
}

// noDeadlines leaves every class to the caller's context.
var noDeadlines = Deadlines{Query: -1, Change: -1, Lifecycle: -1, StreamStall: -1}

// DeadlineError is the error of an RPC abandoned at its own deadline. It
// is transient (provider.ErrTransient) and matches
// context.DeadlineExceeded, so classifiers, metrics (ErrorCodeName) and the
// connection pool treat it like any abandoned call: retried, counted as
// DeadlineExceeded, and the link is kept (the daemon may answer the other
// RPCs multiplexed on it; a dead link is caught by keepalives).
type DeadlineError struct {
	RPC string
	// Host is the host the client was bound to (WithHost); may be empty.
	Host  string
	Class CallClass
	// Limit is the deadline that ran out: for a stream, the time without
	// progress.
	Limit time.Duration
}

func (e *DeadlineError) Error() string {
	on := ""
	if e.Host != "" {
		on = " on host " + e.Host
	}
	if e.Class == CallStream {
		return fmt.Sprintf("libvirt %s%s made no progress for %s", e.RPC, on, e.Limit)
	}
	return fmt.Sprintf("libvirt %s%s did not answer within %s", e.RPC, on, e.Limit)
}

func (e *DeadlineError) Is(target error) bool {
	return target == provider.ErrTransient || target == context.DeadlineExceeded
}

// watch tells, when an RPC's deadline timer fires, whether the call is
// over its bound. For a stream the bound is on progress: the time since
// libvirt last took bytes, not counting time spent reading the caller's
// body. Only the calling goroutine touches the timer; the stream's reader
// only records its reads, so no timer is reset behind the caller's back.
type watch struct {
	stream bool
	clk    clock.PassiveClock
	limit  time.Duration

	mu        sync.Mutex
	reading   bool
	idleSince time.Time // when libvirt last got the stream back
	abandoned chan struct{}
}

func newWatch(stream bool) *watch {
	return &watch{stream: stream, abandoned: make(chan struct{})}
}

// start records the limit, from now.
func (w *watch) start(clk clock.PassiveClock, limit time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.clk, w.limit, w.idleSince = clk, limit, clk.Now()
}

// remaining is how much longer the call may wait once its timer fired: 0
// means it is over its bound.
func (w *watch) remaining() time.Duration {
	if !w.stream {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.reading {
		return w.limit // the body's time; the clock restarts when the read returns
	}
	if idle := w.clk.Now().Sub(w.idleSince); idle < w.limit {
		return w.limit - idle
	}
	return 0
}

// reads brackets one read of the stream's body.
func (w *watch) reads(read func() (int, error)) (int, error) {
	w.mu.Lock()
	w.reading = true
	w.mu.Unlock()
	n, err := read()
	w.mu.Lock()
	w.reading = false
	if w.clk != nil {
		w.idleSince = w.clk.Now()
	}
	w.mu.Unlock()
	return n, err
}

// abandon fails the stream's later reads.
func (w *watch) abandon() { close(w.abandoned) }

// CallTracker counts the RPCs of a caller from when they are sent until
// they really return, abandoned or not. After the caller's own calls have
// returned, what it still counts is what was abandoned and still runs on
// the daemon. The zero value is ready to use.
type CallTracker struct {
	wg      sync.WaitGroup
	running atomic.Int64
}

func (t *CallTracker) add() {
	t.running.Add(1)
	t.wg.Add(1)
}

func (t *CallTracker) done() {
	t.running.Add(-1)
	t.wg.Done()
}

// Running returns how many tracked RPCs have not returned yet.
func (t *CallTracker) Running() int { return int(t.running.Load()) }

// Wait blocks until every tracked RPC has returned.
func (t *CallTracker) Wait() { t.wg.Wait() }
