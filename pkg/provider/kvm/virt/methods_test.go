package virt_test

import (
	"context"
	"strings"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// handles are what the calls of everyMethod act on; calls that make an
// object (define, pool lookup, volume create, network lookup) set it.
type handles struct {
	dom  libvirt.Domain
	pool libvirt.StoragePool
	vol  libvirt.StorageVol
	net  libvirt.Network
	// ctx bounds event subscriptions; cancel ends them.
	ctx    context.Context
	cancel context.CancelFunc
}

func (h *handles) events() context.Context {
	if h.ctx == nil {
		h.ctx, h.cancel = context.WithCancel(context.Background())
	}
	return h.ctx
}

// everyMethod calls each Client method once, under its RPC name. Run in
// this order on a host with pool and network "default" (newHost), every
// call succeeds.
var everyMethod = []struct {
	rpc  string
	call func(c virt.Client, h *handles) error
}{
	{virt.RPCDomainDefineXMLFlags, func(c virt.Client, h *handles) (err error) {
		h.dom, err = c.DomainDefineXMLFlags(domainXML("a"), 0)
		return err
	}},
	{virt.RPCConnectGetLibVersion, func(c virt.Client, _ *handles) error { _, err := c.ConnectGetLibVersion(); return err }},
	{virt.RPCConnectGetHostname, func(c virt.Client, _ *handles) error { _, err := c.ConnectGetHostname(); return err }},
	{virt.RPCConnectListAllDomains, func(c virt.Client, _ *handles) error { _, _, err := c.ConnectListAllDomains(1, 0); return err }},
	{virt.RPCNodeGetInfo, func(c virt.Client, _ *handles) error {
		_, _, _, _, _, _, _, _, err := c.NodeGetInfo()
		return err
	}},
	{virt.RPCNodeGetMemoryStats, func(c virt.Client, _ *handles) error {
		_, _, err := c.NodeGetMemoryStats(4, int32(libvirt.NodeMemoryStatsAllCells), 0)
		return err
	}},
	{virt.RPCConnectGetAllDomainStats, func(c virt.Client, _ *handles) error {
		_, err := c.ConnectGetAllDomainStats(nil, 0, 0)
		return err
	}},
	{virt.RPCDomainLookupByName, func(c virt.Client, _ *handles) error { _, err := c.DomainLookupByName("a"); return err }},
	{virt.RPCDomainLookupByUUID, func(c virt.Client, h *handles) error { _, err := c.DomainLookupByUUID(h.dom.UUID); return err }},
	{virt.RPCDomainCreate, func(c virt.Client, h *handles) error { return c.DomainCreate(h.dom) }},
	{virt.RPCDomainResume, func(c virt.Client, h *handles) error { return c.DomainResume(h.dom) }},
	{virt.RPCDomainGetState, func(c virt.Client, h *handles) error { _, _, err := c.DomainGetState(h.dom, 0); return err }},
	{virt.RPCDomainGetXMLDesc, func(c virt.Client, h *handles) error { _, err := c.DomainGetXMLDesc(h.dom, 0); return err }},
	{virt.RPCDomainGetMetadata, func(c virt.Client, h *handles) error {
		_, err := c.DomainGetMetadata(h.dom, int32(libvirt.DomainMetadataElement), libvirt.OptString{ns}, 0)
		return err
	}},
	{virt.RPCDomainInterfaceAddresses, func(c virt.Client, h *handles) error {
		_, err := c.DomainInterfaceAddresses(h.dom, uint32(libvirt.DomainInterfaceAddressesSrcLease), 0)
		return err
	}},
	{virt.RPCDomainDestroyFlags, func(c virt.Client, h *handles) error { return c.DomainDestroyFlags(h.dom, 0) }},
	{virt.RPCDomainUndefineFlags, func(c virt.Client, h *handles) error { return c.DomainUndefineFlags(h.dom, 0) }},
	{virt.RPCStoragePoolLookupByName, func(c virt.Client, h *handles) (err error) {
		h.pool, err = c.StoragePoolLookupByName("default")
		return err
	}},
	{virt.RPCStoragePoolGetInfo, func(c virt.Client, h *handles) error {
		_, _, _, _, err := c.StoragePoolGetInfo(h.pool)
		return err
	}},
	{virt.RPCStoragePoolRefresh, func(c virt.Client, h *handles) error { return c.StoragePoolRefresh(h.pool, 0) }},
	{virt.RPCStorageVolCreateXML, func(c virt.Client, h *handles) (err error) {
		h.vol, err = c.StorageVolCreateXML(h.pool, "<volume><name>v</name><capacity>1</capacity></volume>", 0)
		return err
	}},
	{virt.RPCStorageVolLookupByName, func(c virt.Client, h *handles) error { _, err := c.StorageVolLookupByName(h.pool, "v"); return err }},
	{virt.RPCStorageVolGetPath, func(c virt.Client, h *handles) error { _, err := c.StorageVolGetPath(h.vol); return err }},
	{virt.RPCStorageVolGetInfo, func(c virt.Client, h *handles) error { _, _, _, err := c.StorageVolGetInfo(h.vol); return err }},
	{virt.RPCStorageVolUpload, func(c virt.Client, h *handles) error {
		return c.StorageVolUpload(h.vol, strings.NewReader("x"), 0, 0, 0)
	}},
	{virt.RPCStoragePoolListAllVolumes, func(c virt.Client, h *handles) error {
		_, _, err := c.StoragePoolListAllVolumes(h.pool, 1, 0)
		return err
	}},
	{virt.RPCStorageVolGetXMLDesc, func(c virt.Client, h *handles) error { _, err := c.StorageVolGetXMLDesc(h.vol, 0); return err }},
	{virt.RPCStorageVolDelete, func(c virt.Client, h *handles) error { return c.StorageVolDelete(h.vol, 0) }},
	{virt.RPCNetworkLookupByName, func(c virt.Client, h *handles) (err error) {
		h.net, err = c.NetworkLookupByName("default")
		return err
	}},
	{virt.RPCNetworkGetDHCPLeases, func(c virt.Client, h *handles) error {
		_, _, err := c.NetworkGetDhcpLeases(h.net, nil, 1, 0)
		return err
	}},
	{virt.RPCConnectDomainEventRegisterAny, func(c virt.Client, h *handles) error {
		_, err := c.LifecycleEvents(h.events())
		return err
	}},
	{virt.RPCConnectDomainEventCallbackRegisterAny, func(c virt.Client, h *handles) error {
		_, err := c.SubscribeEvents(h.events(), libvirt.DomainEventIDAgentLifecycle, nil)
		return err
	}},
}
