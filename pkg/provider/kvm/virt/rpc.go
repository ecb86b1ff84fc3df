package virt

// RPC names are libvirt's public C API names for the Client methods. Logs,
// metrics and the fake's fault injection all use them, so an "rpc" label in
// a dashboard, a log line and a test's fake.FailNext name the same thing and
// can be looked up in libvirt's documentation as is.
const (
	RPCConnectGetLibVersion      = "virConnectGetLibVersion"
	RPCConnectGetHostname        = "virConnectGetHostname"
	RPCConnectListAllDomains     = "virConnectListAllDomains"
	RPCNodeGetInfo               = "virNodeGetInfo"
	RPCNodeGetMemoryStats        = "virNodeGetMemoryStats"
	RPCConnectGetAllDomainStats  = "virConnectGetAllDomainStats"
	RPCDomainLookupByName        = "virDomainLookupByName"
	RPCDomainLookupByUUID        = "virDomainLookupByUUID"
	RPCDomainDefineXMLFlags      = "virDomainDefineXMLFlags"
	RPCDomainCreate              = "virDomainCreate"
	RPCDomainResume              = "virDomainResume"
	RPCDomainDestroyFlags        = "virDomainDestroyFlags"
	RPCDomainUndefineFlags       = "virDomainUndefineFlags"
	RPCDomainGetState            = "virDomainGetState"
	RPCDomainGetXMLDesc          = "virDomainGetXMLDesc"
	RPCDomainGetMetadata         = "virDomainGetMetadata"
	RPCDomainInterfaceAddresses  = "virDomainInterfaceAddresses"
	RPCStoragePoolLookupByName   = "virStoragePoolLookupByName"
	RPCStoragePoolGetInfo        = "virStoragePoolGetInfo"
	RPCStoragePoolRefresh        = "virStoragePoolRefresh"
	RPCStoragePoolListAllVolumes = "virStoragePoolListAllVolumes"
	RPCStorageVolLookupByName    = "virStorageVolLookupByName"
	RPCStorageVolCreateXML       = "virStorageVolCreateXML"
	RPCStorageVolDelete          = "virStorageVolDelete"
	RPCStorageVolGetPath         = "virStorageVolGetPath"
	RPCStorageVolGetInfo         = "virStorageVolGetInfo"
	RPCStorageVolUpload          = "virStorageVolUpload"
	RPCStorageVolGetXMLDesc      = "virStorageVolGetXMLDesc"
	RPCNetworkLookupByName       = "virNetworkLookupByName"
	// The C API spells DHCP in capitals, unlike go-libvirt's method.
	RPCNetworkGetDHCPLeases = "virNetworkGetDHCPLeases"
	// LifecycleEvents registers a lifecycle callback; this is the C API the
	// registration corresponds to.
	RPCConnectDomainEventRegisterAny = "virConnectDomainEventRegisterAny"
	// SubscribeEvents is named after the remote procedure both event
	// registrations send, to tell it apart from LifecycleEvents.
	RPCConnectDomainEventCallbackRegisterAny = "virConnectDomainEventCallbackRegisterAny"
)

// RPCNames lists every RPC name above, one per Client method, e.g. to
// pre-create metric series.
var RPCNames = []string{
	RPCConnectGetLibVersion,
	RPCConnectGetHostname,
	RPCConnectListAllDomains,
	RPCNodeGetInfo,
	RPCNodeGetMemoryStats,
	RPCConnectGetAllDomainStats,
	RPCDomainLookupByName,
	RPCDomainLookupByUUID,
	RPCDomainDefineXMLFlags,
	RPCDomainCreate,
	RPCDomainResume,
	RPCDomainDestroyFlags,
	RPCDomainUndefineFlags,
	RPCDomainGetState,
	RPCDomainGetXMLDesc,
	RPCDomainGetMetadata,
	RPCDomainInterfaceAddresses,
	RPCStoragePoolLookupByName,
	RPCStoragePoolGetInfo,
	RPCStoragePoolRefresh,
	RPCStoragePoolListAllVolumes,
	RPCStorageVolLookupByName,
	RPCStorageVolCreateXML,
	RPCStorageVolDelete,
	RPCStorageVolGetPath,
	RPCStorageVolGetInfo,
	RPCStorageVolUpload,
	RPCStorageVolGetXMLDesc,
	RPCNetworkLookupByName,
	RPCNetworkGetDHCPLeases,
	RPCConnectDomainEventRegisterAny,
	RPCConnectDomainEventCallbackRegisterAny,
}
