// Package image caches boot images in the storage pools of KVM hosts.
//
// Ensure makes a verified copy of an image exist in a pool: it streams the
// image from its URL straight into a libvirt volume (StorageVolUpload),
// hashing on the way, and only when the sha256 matches does it create a
// small marker volume that vouches for the image volume. The marker is the
// commit point: an image volume without its marker is never used, only
// replaced, so an interrupted or corrupt upload leaves nothing usable
// behind. Nothing is buffered: memory use does not depend on image size and
// nothing touches the operator's local disk.
//
// Volumes are content-addressed (see names.go): every image with one digest
// shares one volume per pool. Within a process a Cache lets one call at a
// time upload a given volume (Wait lets others queue behind it); across
// processes the operator's leader election does, and a volume that appears
// under us anyway is reported as an upload in progress. Installs sharing a
// pool record which of them hold each image with claim volumes; Prune gives
// up this install's claim on what it no longer wants and deletes an image
// only as its last holder, when no overlay in the pool uses it as its
// backing file.
//
// Logging goes to the logger in ctx (logr.FromContextOrDiscard) with the key
// "image"; callers add "host" to that logger, as the KVM provider does for
// every operation on a host.
package image
