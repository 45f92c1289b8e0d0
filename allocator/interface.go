package allocator

import (
	"context"
	"iter"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Interface allocates Service ClusterIPs of one IP family.
//
// Every method is safe for concurrent use. Methods that take a context may call a storage backend
// (etcd or the Kubernetes API); the others answer from local state and never block on the network.
type Interface interface {
	// Allocate reserves ip for owner. It returns ErrAllocated if ip is already taken, a
	// *NotInRangeError if ip is outside the range or is its network or IPv4 broadcast address, an
	// *AddrError if ip is invalid, zoned or IPv4-mapped, an *OwnerError if the allocator records
	// owners and owner lacks a Resource or a Name, and ErrNotReady if the allocator cannot serve
	// yet. Allocate may take any usable address, including those of the static band.
	Allocate(ctx context.Context, ip netip.Addr, owner Owner) error

	// AllocateNext reserves any free address for owner and returns it. It prefers the dynamic
	// (upper) band and falls back to the static (lower) band only when the upper one is full. If no
	// address is free it returns the zero Addr and ErrFull. Like Allocate, an allocator that
	// records owners returns an *OwnerError for an owner without a Resource or a Name.
	AllocateNext(ctx context.Context, owner Owner) (netip.Addr, error)

	// Release frees ip. Releasing an address that is not allocated, or that is outside the range,
	// returns nil. An invalid, zoned or IPv4-mapped ip returns an *AddrError.
	Release(ctx context.Context, ip netip.Addr) error

	// Has reports whether ip is allocated.
	Has(ip netip.Addr) bool

	// All yields every allocated address in ascending order. The sequence reflects a consistent
	// view of the allocator taken when iteration starts.
	All() iter.Seq[netip.Addr]

	// CIDR returns the range this allocator serves, or the zero Prefix for a multi-CIDR allocator.
	CIDR() netip.Prefix

	// Family returns the IP family of the addresses this allocator serves.
	Family() corev1.IPFamily

	// Used returns the number of allocated addresses.
	Used() uint64

	// Free returns the number of addresses that can still be allocated.
	Free() uint64

	// DryRun returns a view of the allocator that validates every call as the allocator would and
	// reports its outcome, but never changes or persists anything: Allocate reports ErrAllocated or
	// a range error, AllocateNext returns an address that is free now without reserving it, and
	// Release does nothing.
	DryRun() Interface

	// Close releases the allocator's resources. The allocator must not be used afterwards.
	Close() error
}

// Owner identifies the object an address is allocated to. It becomes the parentRef of an
// IPAddress object; the bitmap allocator ignores it.
//
// An allocator that records owners (ipaddress.Allocator, and servicecidr.Allocator through it)
// needs a Resource and a Name, as kube-apiserver does for a parentRef: Allocate and AllocateNext,
// and their DryRun views, reject an Owner without them with an *OwnerError (matching ErrInvalid)
// before any API call; see CheckOwner. An allocator that records no owner (package bitmap) accepts
// any Owner, the zero one included. The zero Owner means "no owner". Owner is a small comparable
// value.
type Owner struct {
	// Group is the API group of the owner, empty for the core group.
	Group string
	// Resource is the plural resource name, such as "services".
	Resource string
	// Namespace is the namespace of the owner, empty for cluster-scoped owners.
	Namespace string
	// Name is the name of the owner.
	Name string
	// UID is the owner's UID when known. IPAddress parentRefs do not record it.
	UID types.UID
}

// ServiceOwner returns the Owner that names svc: the core group, resource "services", and the
// Service's namespace, name and UID. A nil svc returns the zero Owner, which allocators that
// record owners reject.
func ServiceOwner(svc *corev1.Service) Owner {
	if svc == nil {
		return Owner{}
	}
	return Owner{
		Resource:  "services",
		Namespace: svc.Namespace,
		Name:      svc.Name,
		UID:       svc.UID,
	}
}

// IsZero reports whether o is the zero Owner.
func (o Owner) IsZero() bool { return o == Owner{} }

// String returns "resource.group namespace/name", as kubectl names a resource and an object, for
// logs and errors: "services ns/web" for a Service, "gateways.gateway.networking.k8s.io gw" for a
// cluster-scoped owner of another group. An empty group (the core group) or namespace is left
// out with its dot or slash, an empty resource or name with the space; the UID is never shown, and
// the zero Owner gives "".
func (o Owner) String() string {
	gr := o.Resource
	if o.Group != "" {
		gr = o.Resource + "." + o.Group
	}
	name := o.Name
	if o.Namespace != "" {
		name = o.Namespace + "/" + o.Name
	}
	switch {
	case gr == "":
		return name
	case name == "":
		return gr
	}
	return gr + " " + name
}
