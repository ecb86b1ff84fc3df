package fake

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/remote"
)

// Serve serves f over libvirt's remote protocol on ln, as libvirtd serves
// its unix socket: a client (go-libvirt, the kvm provider's conn pool
// behind an SSH forward) gets every procedure virt.Client has, answered by
// a connection of its own (Connect), with f's errors, fault injection and
// counters, lifecycle and guest agent events as event messages, and
// virStorageVolUpload as a stream. Fake.Disconnect drops served clients
// too; a client going away disconnects its connection. Close the returned
// server to stop.
//
// What the wire changes, and only that, is go-libvirt's: a nil slice and
// an empty one arrive alike (as nil), and SubscribeEvents sends no domain
// filter, so the fake never sees one.
func Serve(f *Fake, ln net.Listener, opts remote.Options) *remote.Server {
	s := remote.NewServer(daemon{f}, opts)
	s.Serve(ln)
	return s
}

type daemon struct{ f *Fake }

// Open implements remote.Handler.
func (d daemon) Open(ctx context.Context, cl remote.Client) remote.Session {
	c := d.f.Connect()
	context.AfterFunc(ctx, func() { _ = c.Disconnect() })
	go func() {
		<-c.Disconnected()
		cl.Close()
	}()
	return &session{c: c, cl: cl, callbacks: map[int32]context.CancelFunc{}}
}

// session is one served client: its connection to the fake and its event
// callbacks.
type session struct {
	c  *Conn
	cl remote.Client

	nextID    atomic.Int32
	mu        sync.Mutex
	callbacks map[int32]context.CancelFunc
}

// serve decodes A, runs fn and encodes its result.
func serve[A, R any](args []byte, fn func(A) (R, error)) ([]byte, error) {
	var a A
	if err := remote.Unmarshal(args, &a); err != nil {
		return nil, lverr(libvirt.ErrRPC, "Unable to decode message payload: %v", err)
	}
	r, err := fn(a)
	if err != nil {
		return nil, err
	}
	return remote.Marshal(r)
}

type none struct{}

// Call implements remote.Session. A call that ends in
// libvirt.ErrInterrupted (a dropped connection, or FailNextAfter's "the
// reply was lost") drops the client's connection unanswered: over the wire
// that is the only way a reply gets lost, and go-libvirt then returns
// ErrInterrupted too.
func (s *session) Call(ctx context.Context, proc uint32, args []byte) ([]byte, error) {
	out, err := s.call(ctx, proc, args)
	if errors.Is(err, libvirt.ErrInterrupted) {
		s.cl.Close()
	}
	return out, err
}

//nolint:gocyclo // one case per procedure, as libvirtd's dispatch table
func (s *session) call(ctx context.Context, proc uint32, args []byte) ([]byte, error) {
	if out, ok := remote.Handshake(proc); ok {
		return out, nil
	}
	c := s.c
	switch proc {
	case remote.ProcConnectGetLibVersion:
		return serve(args, func(none) (libvirt.ConnectGetLibVersionRet, error) {
			v, err := c.ConnectGetLibVersion()
			return libvirt.ConnectGetLibVersionRet{LibVer: v}, err
		})
	case remote.ProcConnectGetHostname:
		return serve(args, func(none) (libvirt.ConnectGetHostnameRet, error) {
			h, err := c.ConnectGetHostname()
			return libvirt.ConnectGetHostnameRet{Hostname: h}, err
		})
	case remote.ProcNodeGetInfo:
		return serve(args, func(none) (r libvirt.NodeGetInfoRet, err error) {
			r.Model, r.Memory, r.Cpus, r.Mhz, r.Nodes, r.Sockets, r.Cores, r.Threads, err = c.NodeGetInfo()
			return r, err
		})
	case remote.ProcNodeGetMemoryStats:
		return serve(args, func(a libvirt.NodeGetMemoryStatsArgs) (r libvirt.NodeGetMemoryStatsRet, err error) {
			r.Params, r.Nparams, err = c.NodeGetMemoryStats(a.Nparams, a.CellNum, a.Flags)
			return r, err
		})
	case remote.ProcConnectGetAllDomainStats:
		return serve(args, func(a libvirt.ConnectGetAllDomainStatsArgs) (r libvirt.ConnectGetAllDomainStatsRet, err error) {
			r.RetStats, err = c.ConnectGetAllDomainStats(a.Doms, a.Stats, a.Flags)
			return r, err
		})

	case remote.ProcConnectListAllDomains:
		return serve(args, func(a libvirt.ConnectListAllDomainsArgs) (r libvirt.ConnectListAllDomainsRet, err error) {
			r.Domains, r.Ret, err = c.ConnectListAllDomains(a.NeedResults, a.Flags)
			return r, err
		})
	case remote.ProcDomainLookupByName:
		return serve(args, func(a libvirt.DomainLookupByNameArgs) (r libvirt.DomainLookupByNameRet, err error) {
			r.Dom, err = c.DomainLookupByName(a.Name)
			return r, err
		})
	case remote.ProcDomainLookupByUUID:
		return serve(args, func(a libvirt.DomainLookupByUUIDArgs) (r libvirt.DomainLookupByUUIDRet, err error) {
			r.Dom, err = c.DomainLookupByUUID(a.UUID)
			return r, err
		})
	case remote.ProcDomainDefineXMLFlags:
		return serve(args, func(a libvirt.DomainDefineXMLFlagsArgs) (r libvirt.DomainDefineXMLFlagsRet, err error) {
			r.Dom, err = c.DomainDefineXMLFlags(a.XML, a.Flags)
			return r, err
		})
	case remote.ProcDomainCreate:
		return serve(args, func(a libvirt.DomainCreateArgs) (none, error) { return none{}, c.DomainCreate(a.Dom) })
	case remote.ProcDomainResume:
		return serve(args, func(a libvirt.DomainResumeArgs) (none, error) { return none{}, c.DomainResume(a.Dom) })
	case remote.ProcDomainDestroyFlags:
		return serve(args, func(a libvirt.DomainDestroyFlagsArgs) (none, error) {
			return none{}, c.DomainDestroyFlags(a.Dom, a.Flags)
		})
	case remote.ProcDomainUndefineFlags:
		return serve(args, func(a libvirt.DomainUndefineFlagsArgs) (none, error) {
			return none{}, c.DomainUndefineFlags(a.Dom, a.Flags)
		})
	case remote.ProcDomainGetState:
		return serve(args, func(a libvirt.DomainGetStateArgs) (r libvirt.DomainGetStateRet, err error) {
			r.State, r.Reason, err = c.DomainGetState(a.Dom, a.Flags)
			return r, err
		})
	case remote.ProcDomainGetXMLDesc:
		return serve(args, func(a libvirt.DomainGetXMLDescArgs) (r libvirt.DomainGetXMLDescRet, err error) {
			r.XML, err = c.DomainGetXMLDesc(a.Dom, a.Flags)
			return r, err
		})
	case remote.ProcDomainGetMetadata:
		return serve(args, func(a libvirt.DomainGetMetadataArgs) (r libvirt.DomainGetMetadataRet, err error) {
			r.Metadata, err = c.DomainGetMetadata(a.Dom, a.Type, a.Uri, a.Flags)
			return r, err
		})
	case remote.ProcDomainInterfaceAddresses:
		return serve(args, func(a libvirt.DomainInterfaceAddressesArgs) (r libvirt.DomainInterfaceAddressesRet, err error) {
			r.Ifaces, err = c.DomainInterfaceAddresses(a.Dom, a.Source, a.Flags)
			return r, err
		})

	case remote.ProcStoragePoolLookupByName:
		return serve(args, func(a libvirt.StoragePoolLookupByNameArgs) (r libvirt.StoragePoolLookupByNameRet, err error) {
			r.Pool, err = c.StoragePoolLookupByName(a.Name)
			return r, err
		})
	case remote.ProcStoragePoolGetInfo:
		return serve(args, func(a libvirt.StoragePoolGetInfoArgs) (r libvirt.StoragePoolGetInfoRet, err error) {
			r.State, r.Capacity, r.Allocation, r.Available, err = c.StoragePoolGetInfo(a.Pool)
			return r, err
		})
	case remote.ProcStoragePoolRefresh:
		return serve(args, func(a libvirt.StoragePoolRefreshArgs) (none, error) {
			return none{}, c.StoragePoolRefresh(a.Pool, a.Flags)
		})
	case remote.ProcStoragePoolListAllVolumes:
		return serve(args, func(a libvirt.StoragePoolListAllVolumesArgs) (r libvirt.StoragePoolListAllVolumesRet, err error) {
			r.Vols, r.Ret, err = c.StoragePoolListAllVolumes(a.Pool, a.NeedResults, a.Flags)
			return r, err
		})
	case remote.ProcStorageVolLookupByName:
		return serve(args, func(a libvirt.StorageVolLookupByNameArgs) (r libvirt.StorageVolLookupByNameRet, err error) {
			r.Vol, err = c.StorageVolLookupByName(a.Pool, a.Name)
			return r, err
		})
	case remote.ProcStorageVolCreateXML:
		return serve(args, func(a libvirt.StorageVolCreateXMLArgs) (r libvirt.StorageVolCreateXMLRet, err error) {
			r.Vol, err = c.StorageVolCreateXML(a.Pool, a.XML, a.Flags)
			return r, err
		})
	case remote.ProcStorageVolDelete:
		return serve(args, func(a libvirt.StorageVolDeleteArgs) (none, error) {
			return none{}, c.StorageVolDelete(a.Vol, a.Flags)
		})
	case remote.ProcStorageVolGetPath:
		return serve(args, func(a libvirt.StorageVolGetPathArgs) (r libvirt.StorageVolGetPathRet, err error) {
			r.Name, err = c.StorageVolGetPath(a.Vol)
			return r, err
		})
	case remote.ProcStorageVolGetInfo:
		return serve(args, func(a libvirt.StorageVolGetInfoArgs) (r libvirt.StorageVolGetInfoRet, err error) {
			r.Type, r.Capacity, r.Allocation, err = c.StorageVolGetInfo(a.Vol)
			return r, err
		})
	case remote.ProcStorageVolGetXMLDesc:
		return serve(args, func(a libvirt.StorageVolGetXMLDescArgs) (r libvirt.StorageVolGetXMLDescRet, err error) {
			r.XML, err = c.StorageVolGetXMLDesc(a.Vol, a.Flags)
			return r, err
		})

	case remote.ProcNetworkLookupByName:
		return serve(args, func(a libvirt.NetworkLookupByNameArgs) (r libvirt.NetworkLookupByNameRet, err error) {
			r.Net, err = c.NetworkLookupByName(a.Name)
			return r, err
		})
	case remote.ProcNetworkGetDhcpLeases:
		return serve(args, func(a libvirt.NetworkGetDhcpLeasesArgs) (r libvirt.NetworkGetDhcpLeasesRet, err error) {
			r.Leases, r.Ret, err = c.NetworkGetDhcpLeases(a.Net, a.Mac, a.NeedResults, a.Flags)
			return r, err
		})

	case remote.ProcConnectDomainEventCallbackRegisterAny:
		return serve(args, func(a libvirt.ConnectDomainEventCallbackRegisterAnyArgs) (libvirt.ConnectDomainEventCallbackRegisterAnyRet, error) {
			id, err := s.register(ctx, a)
			return libvirt.ConnectDomainEventCallbackRegisterAnyRet{CallbackID: id}, err
		})
	case remote.ProcConnectDomainEventCallbackDeregisterAny:
		return serve(args, func(a libvirt.ConnectDomainEventCallbackDeregisterAnyArgs) (none, error) {
			s.mu.Lock()
			cancel, ok := s.callbacks[a.CallbackID]
			delete(s.callbacks, a.CallbackID)
			s.mu.Unlock()
			if !ok {
				return none{}, lverr(libvirt.ErrInvalidArg, "callback %d not registered", a.CallbackID)
			}
			cancel()
			return none{}, nil
		})
	}
	return nil, remote.UnknownProcedure(proc)
}

// register subscribes the connection to one event type and forwards what
// it delivers as event messages of a new callback, until the client
// deregisters it or goes away. A lifecycle registration is
// LifecycleEvents, anything else SubscribeEvents (which refuses what the
// fake does not deliver), so the fake counts each as in process.
func (s *session) register(ctx context.Context, a libvirt.ConnectDomainEventCallbackRegisterAnyArgs) (int32, error) {
	ctx, cancel := context.WithCancel(ctx)
	id := s.nextID.Add(1)
	var forward func()
	if libvirt.DomainEventID(a.EventID) == libvirt.DomainEventIDLifecycle && len(a.Dom) == 0 {
		ch, err := s.c.LifecycleEvents(ctx)
		if err != nil {
			cancel()
			return 0, err
		}
		forward = func() {
			for ev := range ch {
				_ = s.cl.Send(remote.ProcDomainEventCallbackLifecycle, libvirt.DomainEventCallbackLifecycleMsg{CallbackID: id, Msg: ev})
			}
		}
	} else {
		ch, err := s.c.SubscribeEvents(ctx, libvirt.DomainEventID(a.EventID), a.Dom)
		if err != nil {
			cancel()
			return 0, err
		}
		forward = func() {
			for ev := range ch {
				if m, ok := ev.(*libvirt.DomainEventCallbackAgentLifecycleMsg); ok {
					msg := *m
					msg.CallbackID = id
					_ = s.cl.Send(remote.ProcDomainEventCallbackAgentLifecycle, msg)
				}
			}
		}
	}
	s.mu.Lock()
	s.callbacks[id] = cancel
	s.mu.Unlock()
	go forward()
	return id, nil
}

// Upload implements remote.Uploader.
func (s *session) Upload(_ context.Context, args []byte, accept func(), data io.Reader) error {
	var a libvirt.StorageVolUploadArgs
	if err := remote.Unmarshal(args, &a); err != nil {
		return lverr(libvirt.ErrRPC, "Unable to decode message payload: %v", err)
	}
	err := s.c.StorageVolUpload(a.Vol, acceptingReader{Reader: data, accept: accept}, a.Offset, a.Length, a.Flags)
	if errors.Is(err, libvirt.ErrInterrupted) {
		s.cl.Close()
	}
	return err
}

// acceptingReader is an upload's stream as StorageVolUpload reads it;
// StorageVolUpload calls uploadAccepted once it has taken the upload on,
// which is when libvirtd answers the call.
type acceptingReader struct {
	io.Reader
	accept func()
}

func (r acceptingReader) uploadAccepted() { r.accept() }
