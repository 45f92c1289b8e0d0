// This file is not part of Kubernetes: each kube-apiserver fork of github.com/kube-ipam/clusterip
// (forks/<release> in its repository; the file is kept once, in forks/common) adds it to package
// k8s.io/kubernetes/pkg/registry/core/rest, beside clusterip.go. It is what kube-apiserver's
// Service registry calls: clusterip's allocator of one IP family behind kube-apiserver's
// ipallocator.Interface, answering with kube-apiserver's errors.

package rest

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/version"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/registry/core/service/ipallocator"

	"github.com/kube-ipam/clusterip/allocator"
	clusteripservice "github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/featuregate"
)

const (
	// clusterIPCallTimeout bounds each call the Service registry makes to a ClusterIP allocator,
	// which has no context of its own: a write to etcd or an IPAddress create through the loopback
	// client.
	clusterIPCallTimeout = 30 * time.Second
)

// clusterIPAllocator is clusterip's allocator of one IP family as kube-apiserver's Service
// registry uses it: an ipallocator.Interface, plus AllocateService and AllocateNextService, which
// record the Service as the owner of the address. Errors carry kube-apiserver's own values and
// texts (ipallocator.ErrFull, ErrAllocated, *ErrNotInRange, ErrMismatchedNetwork, ErrNotReady).
// Each call is bounded by clusterIPCallTimeout.
type clusterIPAllocator struct {
	all    *clusterIPAllocators
	family api.IPFamily
	cidr   net.IPNet // the family's --service-cluster-ip-range
	dryRun bool
}

var _ ipallocator.Interface = (*clusterIPAllocator)(nil)

// get returns the allocator calls go to, or ipallocator.ErrNotReady before the allocators are
// started.
func (c *clusterIPAllocator) get() (allocator.Interface, error) {
	allocs := c.all.ready.Load()
	if allocs == nil {
		return nil, ipallocator.ErrNotReady
	}
	al := allocs.For(corev1.IPFamily(c.family))
	if al == nil {
		return nil, ipallocator.ErrNotReady
	}
	if c.dryRun {
		return al.DryRun(), nil
	}
	return al, nil
}

// AllocateService reserves ip for svc.
func (c *clusterIPAllocator) AllocateService(svc *api.Service, ip net.IP) error {
	addr, ok := addrOf(ip)
	if !ok {
		return &ipallocator.ErrNotInRange{IP: ip, ValidRange: c.cidr.String()}
	}
	al, err := c.get()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterIPCallTimeout)
	defer cancel()
	return c.ipallocatorError(al.Allocate(ctx, addr, ownerOf(svc)), ip)
}

// AllocateNextService reserves a free address for svc and returns it: with reservations, the
// address reserved for svc in the family if there is one.
func (c *clusterIPAllocator) AllocateNextService(svc *api.Service) (net.IP, error) {
	if ip, ok, err := c.claimReserved(svc); ok || err != nil {
		return ip, err
	}
	al, err := c.get()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterIPCallTimeout)
	defer cancel()
	addr, err := al.AllocateNext(ctx, ownerOf(svc))
	if err != nil {
		return nil, c.ipallocatorError(c.ownerRefusal(ctx, al, err), nil)
	}
	return net.IP(addr.AsSlice()), nil
}

// ownerRefusal returns err, an error of al's AllocateNext, as stock's allocator answers for an
// owner the library refuses before it writes anything (a Service without a name): stock creates
// the IPAddress object and the server refuses it (see clusteripservice.OwnerRefusal), except that before
// v1.35 its IPAddressOnly allocator goes on to the next address after each refusal and answers
// that the range is full.
func (c *clusterIPAllocator) ownerRefusal(ctx context.Context, al allocator.Interface, err error) error {
	var oe *allocator.OwnerError
	if !errors.As(err, &oe) {
		return err
	}
	if binary, _ := clusterIPVersion(); c.all.mode == featuregate.IPAddressOnly && binary.LessThan(version.MajorMinor(1, 35)) {
		return ipallocator.ErrFull
	}
	return clusteripservice.OwnerRefusal(ctx, al, err)
}

// Allocate reserves ip with no owner: kube-apiserver's registry calls it in Legacy mode, whose
// bitmaps record none.
func (c *clusterIPAllocator) Allocate(ip net.IP) error { return c.AllocateService(nil, ip) }

// AllocateNext reserves a free address with no owner; see Allocate.
func (c *clusterIPAllocator) AllocateNext() (net.IP, error) { return c.AllocateNextService(nil) }

// Release frees ip; an address that is not allocated, or out of range, is not an error. A claim
// of ip that could still be reverted is forgotten: stock's registry releases an address a Service
// gives up on update through here, and the undo must not outlive the allocation it undoes.
func (c *clusterIPAllocator) Release(ip net.IP) error {
	addr, ok := addrOf(ip)
	if !ok {
		return nil
	}
	c.all.claims.forget(addr)
	al, err := c.get()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterIPCallTimeout)
	defer cancel()
	return c.ipallocatorError(al.Release(ctx, addr), ip)
}

// ForEach calls f with every allocated address, in ascending order; nothing before start.
func (c *clusterIPAllocator) ForEach(f func(net.IP)) {
	al, err := c.get()
	if err != nil {
		return
	}
	for addr := range al.All() {
		f(net.IP(addr.AsSlice()))
	}
}

// CIDR returns the family's --service-cluster-ip-range.
func (c *clusterIPAllocator) CIDR() net.IPNet { return c.cidr }

// IPFamily returns the IP family served.
func (c *clusterIPAllocator) IPFamily() api.IPFamily { return c.family }

// Has reports whether ip is allocated; false before start.
func (c *clusterIPAllocator) Has(ip net.IP) bool {
	addr, ok := addrOf(ip)
	if !ok {
		return false
	}
	al, err := c.get()
	return err == nil && al.Has(addr)
}

// Destroy closes the allocators of every family (they share their clients); it is idempotent.
// A dry-run view destroys nothing.
func (c *clusterIPAllocator) Destroy() {
	if !c.dryRun {
		c.all.destroy()
	}
}

// EnableMetrics does nothing: the allocators register kube-apiserver's allocator metrics in the
// legacy registry when they are built.
func (c *clusterIPAllocator) EnableMetrics() {}

// DryRun returns a view that validates every call as the allocator would but changes nothing;
// unlike kube-apiserver's (which answers from one ServiceCIDR chosen at random), it reports
// an address that is already allocated.
func (c *clusterIPAllocator) DryRun() ipallocator.Interface {
	v := *c
	v.dryRun = true
	return &v
}

// ipallocatorError returns err as kube-apiserver's ipallocator reports the same case, so that the
// registry's messages ("provided IP is already allocated", "range is full", "The range of valid
// IPs is …") are kube-apiserver's. ip is the address asked for, nil for AllocateNext.
func (c *clusterIPAllocator) ipallocatorError(err error, ip net.IP) error {
	var nir *allocator.NotInRangeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &nir):
		if !nir.Range.IsValid() {
			// No ServiceCIDR holds it: kube-apiserver's multi-CIDR allocator says so this way.
			return ipallocator.ErrMismatchedNetwork
		}
		if ip == nil {
			ip = net.IP(nir.IP.AsSlice())
		}
		return &ipallocator.ErrNotInRange{IP: ip, ValidRange: nir.Range.String()}
	case errors.Is(err, allocator.ErrAllocated):
		return ipallocator.ErrAllocated
	case errors.Is(err, allocator.ErrFull):
		return ipallocator.ErrFull
	case errors.Is(err, allocator.ErrNotReady):
		return ipallocator.ErrNotReady
	case errors.Is(err, allocator.ErrMismatchedNetwork):
		return ipallocator.ErrMismatchedNetwork
	}
	// An answer of the API server, such as an admission policy's refusal of an IPAddress
	// object: as stock's allocator returns it, without what the library's layers added.
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if statusErr, ok := status.(error); ok {
			return statusErr
		}
	}
	return err
}

// addrOf returns ip as an unmapped netip.Addr, and false if ip is not an address.
func addrOf(ip net.IP) (netip.Addr, bool) {
	addr, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// ownerOf returns the Owner that names svc, the internal Service of the registry: the core group,
// resource "services", its namespace, name and UID. A nil svc gives the zero Owner.
func ownerOf(svc *api.Service) allocator.Owner {
	if svc == nil {
		return allocator.Owner{}
	}
	return allocator.Owner{Resource: "services", Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID}
}
