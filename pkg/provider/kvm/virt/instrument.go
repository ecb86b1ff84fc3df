package virt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// Observer is told about every RPC Instrument issues: its libvirt API name,
// how long the caller waited and the error the caller got (nil on success;
// wrapping ctx.Err() if the call was abandoned). Calls not sent because the
// context was already done are not observed. Observers must be safe for
// concurrent use and cheap: they run on the caller's path.
type Observer interface {
	ObserveRPC(rpc string, d time.Duration, err error)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(rpc string, d time.Duration, err error)

// ObserveRPC calls f.
func (f ObserverFunc) ObserveRPC(rpc string, d time.Duration, err error) { f(rpc, d, err) }

// Option configures Instrument.
type Option func(*instrumented)

// WithCallTracker counts in t every RPC that can be abandoned (ctx can
// end, or a deadline applies), from before it is sent until the inner call
// really returns: t tells when the daemon has stopped working for this
// operation (a caller bounding the calls in flight to a host waits for it).
// Kept when the client is instrumented again.
func WithCallTracker(t *CallTracker) Option {
	return func(c *instrumented) { c.tracker = t }
}

// WithDeadlines replaces the per-RPC deadlines (DefaultDeadlines when not
// given). Kept when the client is instrumented again.
func WithDeadlines(d Deadlines) Option {
	return func(c *instrumented) { c.deadlines = d }
}

// WithoutDeadlines leaves every RPC bounded by ctx alone, for a caller that
// bounds and tracks its RPCs as a whole (the host health check).
func WithoutDeadlines() Option { return WithDeadlines(noDeadlines) }

// WithHost names the host the client talks to, for DeadlineError. Kept
// when the client is instrumented again.
func WithHost(name string) Option {
	return func(c *instrumented) { c.host = name }
}

// WithObserver adds an observer (metrics, RPC counting). May be repeated.
func WithObserver(o Observer) Option {
	return func(c *instrumented) {
		if o != nil {
			c.observers = append(c.observers, o)
		}
	}
}

// Instrument returns a Client that runs every call of inner under ctx and
// its own deadline, and traces it.
//
// Deadlines: each RPC gets the deadline of its class (see CallClass and
// Deadlines; DefaultDeadlines unless WithDeadlines), so one RPC the daemon
// never answers costs its caller seconds, not the caller's whole budget.
// An upload is bounded by progress instead (Deadlines.StreamStall). An RPC
// abandoned at its deadline fails with a *DeadlineError naming the RPC, the
// host (WithHost) and the deadline; it is transient.
//
// Cancellation: go-libvirt RPCs take no context, so each call runs in its own
// goroutine and Instrument returns as soon as ctx ends or the deadline runs
// out, with an error wrapping ctx.Err() or a DeadlineError. The abandoned
// call finishes (or hangs) on its own and its result is discarded; the
// connection is left open because one stuck RPC must not kill the others
// multiplexed on it. An upload's body is read through a reader that fails
// once the call is abandoned, so an abandoned upload aborts its stream at
// the next chunk instead of streaming on. If ctx is already done, nothing is
// sent.
//
// Tracing: one "libvirt call" line per RPC at V(1) on the logger from ctx,
// with the RPC name, identifiers, curated results, duration and, on failure,
// err/code/codeName; XML payloads are added only when V(2) is enabled. Upload
// bodies are never logged.
//
// Instrument is cheap; bind it per operation: virt.Instrument(ctx, conn, ...).
// Instrumenting an instrumented client rebinds the context and keeps its
// observers (pass only additional ones), tracker, deadlines and host
// instead of tracing twice.
func Instrument(ctx context.Context, inner Client, opts ...Option) Client {
	c := &instrumented{ctx: ctx, inner: inner, deadlines: DefaultDeadlines}
	if prev, ok := inner.(*instrumented); ok {
		c.inner = prev.inner
		c.observers = slices.Clone(prev.observers)
		c.tracker = prev.tracker
		c.deadlines = prev.deadlines
		c.host = prev.host
	}
	for _, o := range opts {
		o(c)
	}
	c.log = logr.FromContextOrDiscard(ctx)
	return c
}

type instrumented struct {
	ctx       context.Context
	inner     Client
	log       logr.Logger
	observers []Observer
	tracker   *CallTracker
	deadlines Deadlines
	host      string
}

var _ Client = (*instrumented)(nil)

// payload marks a log value that is only logged at V(2): XML documents are
// kilobytes each and would drown the V(1) trace.
type payload string

// uuidText defers formatting a UUID until a log sink actually renders it.
type uuidText libvirt.UUID

func (u uuidText) String() string { return FormatUUID(libvirt.UUID(u)) }

// call is the one place that does deadlines, cancellation, timing, logging
// and observation. args are logged always, res(result) only on success.
// discard, if set, receives a result that arrived after the caller gave up,
// for cleanup.
func call[T any](c *instrumented, rpc string, args []any, fn func() (T, error), res func(T) []any, discard func(T)) (T, error) {
	return callWatched(c, rpc, newWatch(false), args, fn, res, discard)
}

// callWatched is call with the RPC's watch made by the caller: a stream
// hands it to the reader of its body.
func callWatched[T any](c *instrumented, rpc string, w *watch, args []any, fn func() (T, error), res func(T) []any, discard func(T)) (T, error) {
	var zero T
	start := time.Now()
	if c.ctx.Err() != nil {
		err := ctxErr(c.ctx, rpc, "not sent")
		c.trace(rpc, start, args, nil, err, false)
		return zero, err
	}
	limit := c.deadlines.forRPC(rpc)
	if c.ctx.Done() == nil && limit <= 0 { // nothing can end the wait: no goroutine needed
		v, err := fn()
		c.trace(rpc, start, args, results(res, v, err), err, true)
		return v, err
	}

	type outcome struct {
		v   T
		err error
	}
	done := make(chan outcome, 1) // buffered: an abandoned call must not leak blocked on send
	var timer clock.Timer
	var expired <-chan time.Time
	if limit > 0 {
		clk := c.deadlines.clock()
		w.start(clk, limit)
		timer = clk.NewTimer(limit)
		defer timer.Stop()
		expired = timer.C()
	}
	if c.tracker != nil {
		c.tracker.add()
	}
	go func() {
		v, err := fn()
		if c.tracker != nil {
			// Before the answer is delivered: a caller that has its
			// answer finds the call no longer counted.
			c.tracker.done()
		}
		done <- outcome{v, err}
	}()
	var o outcome
	var abandon error
wait:
	for {
		select {
		case o = <-done:
			break wait
		case <-c.ctx.Done():
			abandon = ctxErr(c.ctx, rpc, "abandoned")
			break wait
		case <-expired:
			if more := w.remaining(); more > 0 {
				timer.Reset(more) // fired and drained: safe to reuse
				continue
			}
			class, _ := ClassOf(rpc)
			abandon = &DeadlineError{RPC: rpc, Host: c.host, Class: class, Limit: limit}
			break wait
		}
	}
	if abandon != nil {
		select {
		case o = <-done: // it finished anyway; a real answer beats an abandonment
			abandon = nil
		default:
		}
	}
	if abandon != nil {
		w.abandon() // a stream reads no more of its body
		if discard != nil {
			go func() {
				if late := <-done; late.err == nil {
					discard(late.v)
				}
			}()
		}
		c.trace(rpc, start, append(args, "abandoned", true), nil, abandon, true)
		return zero, abandon
	}
	c.trace(rpc, start, args, results(res, o.v, o.err), o.err, true)
	return o.v, o.err
}

// call0 is call for methods that only return an error.
func call0(c *instrumented, rpc string, args []any, fn func() error) error {
	_, err := call(c, rpc, args, func() (struct{}, error) { return struct{}{}, fn() }, nil, nil)
	return err
}

func results[T any](res func(T) []any, v T, err error) []any {
	if err != nil || res == nil {
		return nil
	}
	return res(v)
}

// ctxErr wraps ctx.Err() (and a distinct cause) so errors.Is(err,
// context.DeadlineExceeded) holds for callers and classifiers.
func ctxErr(ctx context.Context, rpc, what string) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err { //nolint:errorlint // identity: a cause other than ctx.Err() itself
		return fmt.Errorf("libvirt %s %s: %w: %w", rpc, what, err, cause)
	}
	return fmt.Errorf("libvirt %s %s: %w", rpc, what, err)
}

// trace observes (if the RPC was sent) and logs one call.
func (c *instrumented) trace(rpc string, start time.Time, args, res []any, err error, sent bool) {
	d := time.Since(start)
	if sent {
		for _, o := range c.observers {
			o.ObserveRPC(rpc, d, err)
		}
	}
	v1 := c.log.V(1)
	if !v1.Enabled() {
		return
	}
	verbose := c.log.V(2).Enabled()
	kv := make([]any, 0, 2+len(args)+len(res)+8)
	kv = append(kv, "rpc", rpc)
	kv = appendKV(kv, args, verbose)
	kv = appendKV(kv, res, verbose)
	kv = append(kv, "duration", d)
	if !sent {
		kv = append(kv, "skipped", true) // ctx was already done
	}
	if err != nil {
		kv = append(kv, "err", err.Error())
		if code, ok := ErrorCode(err); ok {
			kv = append(kv, "code", int(code), "codeName", code.String())
		}
	}
	v1.Info("libvirt call", kv...)
}

// appendKV copies key/value pairs, dropping payload values unless verbose.
func appendKV(dst, src []any, verbose bool) []any {
	for i := 0; i+1 < len(src); i += 2 {
		if p, ok := src[i+1].(payload); ok {
			if verbose {
				dst = append(dst, src[i], string(p))
			}
			continue
		}
		dst = append(dst, src[i], src[i+1])
	}
	return dst
}

// ErrorCodeName classifies err for metric labels: "" for nil, libvirt's code
// name (e.g. "ErrNoDomain") for daemon answers, "Canceled" or
// "DeadlineExceeded" for abandoned calls and "Transport" for anything else
// (connection lost, interrupted call).
func ErrorCodeName(err error) string {
	switch code, ok := ErrorCode(err); {
	case err == nil:
		return ""
	case ok:
		return code.String()
	case errors.Is(err, context.Canceled):
		return "Canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "DeadlineExceeded"
	default:
		return "Transport"
	}
}

// Small tuples so multi-result methods fit the generic helper.
type (
	two[A, B any] struct {
		a A
		b B
	}
	three[A, B, C any] struct {
		a A
		b B
		c C
	}
	four[A, B, C, D any] struct {
		a A
		b B
		c C
		d D
	}
)

func domArgs(d libvirt.Domain, kv ...any) []any {
	return append([]any{"domain", d.Name, "uuid", uuidText(d.UUID)}, kv...)
}

func volArgs(v libvirt.StorageVol, kv ...any) []any {
	return append([]any{"pool", v.Pool, "volume", v.Name}, kv...)
}

func domRes(d libvirt.Domain) []any {
	return []any{"uuid", uuidText(d.UUID), "id", d.ID}
}

func optString(s libvirt.OptString) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// Daemon.

func (c *instrumented) ConnectGetLibVersion() (uint64, error) {
	return call(c, RPCConnectGetLibVersion, nil, c.inner.ConnectGetLibVersion,
		func(v uint64) []any { return []any{"version", v} }, nil)
}

func (c *instrumented) ConnectGetHostname() (string, error) {
	return call(c, RPCConnectGetHostname, nil, c.inner.ConnectGetHostname,
		func(h string) []any { return []any{"hostname", h} }, nil)
}

// Host capacity.

// nodeInfo carries NodeGetInfo's eight results through call.
type nodeInfo struct {
	model                                  [32]int8
	memory                                 uint64
	cpus, mhz, nodes, sockets, cores, thrd int32
}

func (c *instrumented) NodeGetInfo() ([32]int8, uint64, int32, int32, int32, int32, int32, int32, error) {
	r, err := call(c, RPCNodeGetInfo, nil,
		func() (nodeInfo, error) {
			var i nodeInfo
			var err error
			i.model, i.memory, i.cpus, i.mhz, i.nodes, i.sockets, i.cores, i.thrd, err = c.inner.NodeGetInfo()
			return i, err
		},
		func(i nodeInfo) []any { return []any{"cpus", i.cpus, "memoryKiB", i.memory} }, nil)
	return r.model, r.memory, r.cpus, r.mhz, r.nodes, r.sockets, r.cores, r.thrd, err
}

func (c *instrumented) NodeGetMemoryStats(nparams int32, cellNum int32, flags uint32) ([]libvirt.NodeGetMemoryStats, int32, error) {
	type res = two[[]libvirt.NodeGetMemoryStats, int32]
	r, err := call(c, RPCNodeGetMemoryStats, []any{"nparams", nparams, "cell", cellNum},
		func() (res, error) {
			p, n, err := c.inner.NodeGetMemoryStats(nparams, cellNum, flags)
			return res{p, n}, err
		},
		func(r res) []any {
			kib := make(map[string]uint64, len(r.a))
			for _, p := range r.a {
				kib[p.Field] = p.Value
			}
			return []any{"count", r.b, "kib", kib}
		}, nil)
	return r.a, r.b, err
}

func (c *instrumented) ConnectGetAllDomainStats(doms []libvirt.Domain, stats uint32, flags uint32) ([]libvirt.DomainStatsRecord, error) {
	return call(c, RPCConnectGetAllDomainStats, []any{"domains", len(doms), "stats", stats, "flags", flags},
		func() ([]libvirt.DomainStatsRecord, error) {
			return c.inner.ConnectGetAllDomainStats(doms, stats, flags)
		},
		func(r []libvirt.DomainStatsRecord) []any { return []any{"records", len(r)} }, nil)
}

// Domains.

func (c *instrumented) ConnectListAllDomains(needResults int32, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, uint32, error) {
	r, err := call(c, RPCConnectListAllDomains, []any{"flags", uint32(flags)},
		func() (two[[]libvirt.Domain, uint32], error) {
			d, n, err := c.inner.ConnectListAllDomains(needResults, flags)
			return two[[]libvirt.Domain, uint32]{d, n}, err
		},
		func(r two[[]libvirt.Domain, uint32]) []any { return []any{"count", len(r.a)} }, nil)
	return r.a, r.b, err
}

func (c *instrumented) DomainLookupByName(name string) (libvirt.Domain, error) {
	return call(c, RPCDomainLookupByName, []any{"domain", name},
		func() (libvirt.Domain, error) { return c.inner.DomainLookupByName(name) }, domRes, nil)
}

func (c *instrumented) DomainLookupByUUID(uuid libvirt.UUID) (libvirt.Domain, error) {
	return call(c, RPCDomainLookupByUUID, []any{"uuid", uuidText(uuid)},
		func() (libvirt.Domain, error) { return c.inner.DomainLookupByUUID(uuid) },
		func(d libvirt.Domain) []any { return []any{"domain", d.Name, "id", d.ID} }, nil)
}

func (c *instrumented) DomainDefineXMLFlags(xml string, flags libvirt.DomainDefineFlags) (libvirt.Domain, error) {
	return call(c, RPCDomainDefineXMLFlags, []any{"flags", uint32(flags), "xml", payload(xml)},
		func() (libvirt.Domain, error) { return c.inner.DomainDefineXMLFlags(xml, flags) },
		func(d libvirt.Domain) []any { return []any{"domain", d.Name, "uuid", uuidText(d.UUID)} }, nil)
}

func (c *instrumented) DomainCreate(dom libvirt.Domain) error {
	return call0(c, RPCDomainCreate, domArgs(dom), func() error { return c.inner.DomainCreate(dom) })
}

func (c *instrumented) DomainResume(dom libvirt.Domain) error {
	return call0(c, RPCDomainResume, domArgs(dom), func() error { return c.inner.DomainResume(dom) })
}

func (c *instrumented) DomainDestroyFlags(dom libvirt.Domain, flags libvirt.DomainDestroyFlagsValues) error {
	return call0(c, RPCDomainDestroyFlags, domArgs(dom, "flags", uint32(flags)),
		func() error { return c.inner.DomainDestroyFlags(dom, flags) })
}

func (c *instrumented) DomainUndefineFlags(dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error {
	return call0(c, RPCDomainUndefineFlags, domArgs(dom, "flags", uint32(flags)),
		func() error { return c.inner.DomainUndefineFlags(dom, flags) })
}

func (c *instrumented) DomainGetState(dom libvirt.Domain, flags uint32) (int32, int32, error) {
	r, err := call(c, RPCDomainGetState, domArgs(dom),
		func() (two[int32, int32], error) {
			s, why, err := c.inner.DomainGetState(dom, flags)
			return two[int32, int32]{s, why}, err
		},
		func(r two[int32, int32]) []any {
			return []any{"state", libvirt.DomainState(r.a).String(), "reason", r.b}
		}, nil)
	return r.a, r.b, err
}

func (c *instrumented) DomainGetXMLDesc(dom libvirt.Domain, flags libvirt.DomainXMLFlags) (string, error) {
	return call(c, RPCDomainGetXMLDesc, domArgs(dom, "flags", uint32(flags)),
		func() (string, error) { return c.inner.DomainGetXMLDesc(dom, flags) },
		func(x string) []any { return []any{"bytes", len(x), "xml", payload(x)} }, nil)
}

func (c *instrumented) DomainGetMetadata(dom libvirt.Domain, typ int32, uri libvirt.OptString, flags libvirt.DomainModificationImpact) (string, error) {
	return call(c, RPCDomainGetMetadata, domArgs(dom, "type", libvirt.DomainMetadataType(typ).String(), "uri", optString(uri), "flags", uint32(flags)),
		func() (string, error) { return c.inner.DomainGetMetadata(dom, typ, uri, flags) },
		func(m string) []any { return []any{"metadata", payload(m)} }, nil)
}

func (c *instrumented) DomainInterfaceAddresses(dom libvirt.Domain, source uint32, flags uint32) ([]libvirt.DomainInterface, error) {
	return call(c, RPCDomainInterfaceAddresses, domArgs(dom, "source", libvirt.DomainInterfaceAddressesSource(source).String()),
		func() ([]libvirt.DomainInterface, error) { return c.inner.DomainInterfaceAddresses(dom, source, flags) },
		func(ifs []libvirt.DomainInterface) []any {
			return []any{"count", len(ifs), "addresses", ifaceAddrs(ifs)}
		}, nil)
}

// ifaceAddrs flattens interfaces to "name=ip/prefix" for the trace: the
// addresses are what one debugs when a proxy gets no IP.
func ifaceAddrs(ifs []libvirt.DomainInterface) []string {
	var out []string
	for _, i := range ifs {
		for _, a := range i.Addrs {
			out = append(out, fmt.Sprintf("%s=%s/%d", i.Name, a.Addr, a.Prefix))
		}
	}
	return out
}

// Storage.

func (c *instrumented) StoragePoolLookupByName(name string) (libvirt.StoragePool, error) {
	return call(c, RPCStoragePoolLookupByName, []any{"pool", name},
		func() (libvirt.StoragePool, error) { return c.inner.StoragePoolLookupByName(name) },
		func(p libvirt.StoragePool) []any { return []any{"uuid", uuidText(p.UUID)} }, nil)
}

func (c *instrumented) StoragePoolGetInfo(pool libvirt.StoragePool) (uint8, uint64, uint64, uint64, error) {
	type info = four[uint8, uint64, uint64, uint64]
	r, err := call(c, RPCStoragePoolGetInfo, []any{"pool", pool.Name},
		func() (info, error) {
			s, capa, alloc, avail, err := c.inner.StoragePoolGetInfo(pool)
			return info{s, capa, alloc, avail}, err
		},
		func(r info) []any {
			return []any{"state", libvirt.StoragePoolState(r.a).String(), "capacity", r.b, "allocation", r.c, "available", r.d}
		}, nil)
	return r.a, r.b, r.c, r.d, err
}

func (c *instrumented) StoragePoolRefresh(pool libvirt.StoragePool, flags uint32) error {
	return call0(c, RPCStoragePoolRefresh, []any{"pool", pool.Name, "flags", flags},
		func() error { return c.inner.StoragePoolRefresh(pool, flags) })
}

func (c *instrumented) StoragePoolListAllVolumes(pool libvirt.StoragePool, needResults int32, flags uint32) ([]libvirt.StorageVol, uint32, error) {
	type res = two[[]libvirt.StorageVol, uint32]
	r, err := call(c, RPCStoragePoolListAllVolumes, []any{"pool", pool.Name, "flags", flags},
		func() (res, error) {
			v, n, err := c.inner.StoragePoolListAllVolumes(pool, needResults, flags)
			return res{v, n}, err
		},
		func(r res) []any { return []any{"volumes", len(r.a)} }, nil)
	return r.a, r.b, err
}

func (c *instrumented) StorageVolGetXMLDesc(vol libvirt.StorageVol, flags uint32) (string, error) {
	return call(c, RPCStorageVolGetXMLDesc, volArgs(vol, "flags", flags),
		func() (string, error) { return c.inner.StorageVolGetXMLDesc(vol, flags) },
		func(x string) []any { return []any{"bytes", len(x), "xml", payload(x)} }, nil)
}

func (c *instrumented) StorageVolLookupByName(pool libvirt.StoragePool, name string) (libvirt.StorageVol, error) {
	return call(c, RPCStorageVolLookupByName, []any{"pool", pool.Name, "volume", name},
		func() (libvirt.StorageVol, error) { return c.inner.StorageVolLookupByName(pool, name) },
		func(v libvirt.StorageVol) []any { return []any{"key", v.Key} }, nil)
}

func (c *instrumented) StorageVolCreateXML(pool libvirt.StoragePool, xml string, flags libvirt.StorageVolCreateFlags) (libvirt.StorageVol, error) {
	return call(c, RPCStorageVolCreateXML, []any{"pool", pool.Name, "flags", uint32(flags), "xml", payload(xml)},
		func() (libvirt.StorageVol, error) { return c.inner.StorageVolCreateXML(pool, xml, flags) },
		func(v libvirt.StorageVol) []any { return []any{"volume", v.Name, "key", v.Key} }, nil)
}

func (c *instrumented) StorageVolDelete(vol libvirt.StorageVol, flags libvirt.StorageVolDeleteFlags) error {
	return call0(c, RPCStorageVolDelete, volArgs(vol, "flags", uint32(flags)),
		func() error { return c.inner.StorageVolDelete(vol, flags) })
}

func (c *instrumented) StorageVolGetPath(vol libvirt.StorageVol) (string, error) {
	return call(c, RPCStorageVolGetPath, volArgs(vol),
		func() (string, error) { return c.inner.StorageVolGetPath(vol) },
		func(p string) []any { return []any{"path", p} }, nil)
}

func (c *instrumented) StorageVolGetInfo(vol libvirt.StorageVol) (int8, uint64, uint64, error) {
	type info = three[int8, uint64, uint64]
	r, err := call(c, RPCStorageVolGetInfo, volArgs(vol),
		func() (info, error) {
			t, capa, alloc, err := c.inner.StorageVolGetInfo(vol)
			return info{t, capa, alloc}, err
		},
		func(r info) []any { return []any{"type", r.a, "capacity", r.b, "allocation", r.c} }, nil)
	return r.a, r.b, r.c, err
}

// StorageVolUpload logs offset, length and the bytes actually read from body,
// never the body. Its deadline is a stall bound (Deadlines.StreamStall).
func (c *instrumented) StorageVolUpload(vol libvirt.StorageVol, body io.Reader, offset, length uint64, flags libvirt.StorageVolUploadFlags) error {
	w := newWatch(true)
	r := &streamReader{ctx: c.ctx, w: w, r: body}
	_, err := callWatched(c, RPCStorageVolUpload, w, volArgs(vol, "offset", offset, "length", length, "flags", uint32(flags), "bytes", r),
		func() (struct{}, error) { return struct{}{}, c.inner.StorageVolUpload(vol, r, offset, length, flags) }, nil, nil)
	return err
}

// streamReader is an upload's body as libvirt reads it. It fails reads once
// the call is abandoned (ctx ended or no progress), so an abandoned upload
// aborts its stream instead of pushing the rest of the image; it pauses the
// stall bound while the body is read, so only the time libvirt holds the
// stream counts; and it counts bytes read for the trace (it is a
// fmt.Stringer so the count is read when logged).
type streamReader struct {
	ctx context.Context
	w   *watch
	r   io.Reader
	n   atomic.Int64
}

func (r *streamReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	select {
	case <-r.w.abandoned:
		return 0, errStreamAbandoned
	default:
	}
	n, err := r.w.reads(func() (int, error) { return r.r.Read(p) })
	r.n.Add(int64(n))
	return n, err
}

func (r *streamReader) String() string { return fmt.Sprint(r.n.Load()) }

// errStreamAbandoned ends the body of an upload abandoned at its deadline.
var errStreamAbandoned = errors.New("upload abandoned: libvirt made no progress")

// Networks.

func (c *instrumented) NetworkLookupByName(name string) (libvirt.Network, error) {
	return call(c, RPCNetworkLookupByName, []any{"network", name},
		func() (libvirt.Network, error) { return c.inner.NetworkLookupByName(name) },
		func(n libvirt.Network) []any { return []any{"uuid", uuidText(n.UUID)} }, nil)
}

func (c *instrumented) NetworkGetDhcpLeases(net libvirt.Network, mac libvirt.OptString, needResults int32, flags uint32) ([]libvirt.NetworkDhcpLease, uint32, error) {
	r, err := call(c, RPCNetworkGetDHCPLeases, []any{"network", net.Name, "mac", optString(mac)},
		func() (two[[]libvirt.NetworkDhcpLease, uint32], error) {
			l, n, err := c.inner.NetworkGetDhcpLeases(net, mac, needResults, flags)
			return two[[]libvirt.NetworkDhcpLease, uint32]{l, n}, err
		},
		func(r two[[]libvirt.NetworkDhcpLease, uint32]) []any { return []any{"count", len(r.a)} }, nil)
	return r.a, r.b, err
}

// Events.

// LifecycleEvents registers under the Instrument context; the stream itself
// lives until the ctx argument ends. If the registration is abandoned but
// completes later, its channel is drained so go-libvirt's event goroutine
// (which blocks on an unread channel) cannot leak.
func (c *instrumented) LifecycleEvents(ctx context.Context) (<-chan libvirt.DomainEventLifecycleMsg, error) {
	return call(c, RPCConnectDomainEventRegisterAny, nil,
		func() (<-chan libvirt.DomainEventLifecycleMsg, error) { return c.inner.LifecycleEvents(ctx) }, nil,
		func(ch <-chan libvirt.DomainEventLifecycleMsg) {
			for range ch {
			}
		})
}

// SubscribeEvents is instrumented like LifecycleEvents.
func (c *instrumented) SubscribeEvents(ctx context.Context, eventID libvirt.DomainEventID, dom libvirt.OptDomain) (<-chan interface{}, error) {
	return call(c, RPCConnectDomainEventCallbackRegisterAny, []any{"event", eventID},
		func() (<-chan interface{}, error) { return c.inner.SubscribeEvents(ctx, eventID, dom) }, nil,
		func(ch <-chan interface{}) {
			for range ch {
			}
		})
}
