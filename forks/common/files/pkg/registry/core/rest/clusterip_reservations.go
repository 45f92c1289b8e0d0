// This file is not part of Kubernetes: each kube-apiserver fork of github.com/kube-ipam/clusterip
// (forks/<release> in its repository; the file is kept once, in forks/common) adds it to package
// k8s.io/kubernetes/pkg/registry/core/rest, beside clusterip.go.

package rest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	api "k8s.io/kubernetes/pkg/apis/core"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/reservation"
)

// Whether the allocators keep reservations (package reservation) is the fork operator's choice,
// made with the environment variable CLUSTERIP_RESERVATIONS of the kube-apiserver process:
//
//   - "off" or unset, the default: as stock kube-apiserver, the allocators hold a reserved address
//     (an IPAddress object another manager labels) as taken and read nothing else of it;
//   - "on": besides, a Service created without a ClusterIP gets the address reserved for its
//     namespace and name in each family, claimed from the reservation in one update; a deleted
//     Service's addresses become reservations for its return when its release policy
//     (reservation.AnnotationReleasePolicy) says so, in the update that ends the allocation; a
//     create or update whose release policy does not parse, or whose Retain policy the caps on
//     reservations refuse (reservation.Limits), is refused with 422 at the annotation;
//     and reservations are deleted when they end. Only in IPAddressOnly mode: any other mode
//     stops the server at start-up, as clusterip.New refuses it.
//
// Any other value stops the server at start-up.
const clusterIPReservationsEnv = "CLUSTERIP_RESERVATIONS"

// clusterIPReservations reads the value of clusterIPReservationsEnv for the allocators of mode.
func clusterIPReservations(value string, mode featuregate.Mode) (bool, error) {
	switch value {
	case "", "off":
		return false, nil
	case "on":
		if mode != featuregate.IPAddressOnly {
			return false, fmt.Errorf("%s=on: reservations need the IPAddressOnly mode, and the feature gates select %s", clusterIPReservationsEnv, mode)
		}
		return true, nil
	}
	return false, fmt.Errorf("%s=%q: want \"on\" or \"off\" (the default)", clusterIPReservationsEnv, value)
}

// claimTTL is how long the fork remembers how to undo a claim: longer than any Service create or
// update takes to revert, which happens within the request.
const claimTTL = 5 * time.Minute

// pendingClaims are the claims of reservations whose Service create or update may yet be reverted:
// the undo of each, by address, with the Service it was claimed for. A claim is forgotten when
// its address is released by any path (the Service's delete, or stock's release of an address a
// Service gives up on update, such as a type change to ExternalName), and only the Service it was
// claimed for can revert it: an undo left behind must never stand in for the release of the
// address's next allocation. It is safe for concurrent use.
type pendingClaims struct {
	mu     sync.Mutex
	claims map[netip.Addr]pendingClaim
	pruned time.Time // when claims older than claimTTL were last forgotten
}

// pendingClaim is the undo of one claim, the Service it was claimed for and when it was made.
type pendingClaim struct {
	undo  func(context.Context) error
	owner types.NamespacedName
	at    time.Time
}

// add remembers undo for ip, claimed for owner. Once per claimTTL it forgets the claims older than
// claimTTL, so that a claim costs O(1) however many were made within the last claimTTL.
func (p *pendingClaims) add(ip netip.Addr, owner types.NamespacedName, undo func(context.Context) error) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.claims == nil {
		p.claims = map[netip.Addr]pendingClaim{}
	}
	if now.Sub(p.pruned) > claimTTL {
		for a, c := range p.claims {
			if now.Sub(c.at) > claimTTL {
				delete(p.claims, a)
			}
		}
		p.pruned = now
	}
	p.claims[ip] = pendingClaim{undo: undo, owner: owner, at: now}
}

// forget forgets the claim of ip, if any: its address was released.
func (p *pendingClaims) forget(ip netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.claims, ip)
}

// take returns and forgets the undo of the claim of ip for owner; nil if there is none, it is
// older than claimTTL, or it was claimed for another Service (then it is forgotten too).
func (p *pendingClaims) take(ip netip.Addr, owner types.NamespacedName) func(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.claims[ip]
	if !ok {
		return nil
	}
	delete(p.claims, ip)
	if c.owner != owner || time.Since(c.at) > claimTTL {
		return nil
	}
	return c.undo
}

// claimer returns the allocators' reservation.Claimer, nil without reservations or before start.
func (c *clusterIPAllocator) claimer() *reservation.Claimer {
	if !c.all.reservations {
		return nil
	}
	allocs := c.all.ready.Load()
	if allocs == nil {
		return nil
	}
	return allocs.Reservations()
}

// claimReserved gives svc the address reserved for it in the allocator's family, if any (a dry run
// only looks it up), and reports whether it did.
func (c *clusterIPAllocator) claimReserved(svc *api.Service) (net.IP, bool, error) {
	cl := c.claimer()
	if cl == nil || svc == nil {
		return nil, false, nil
	}
	owner := ownerOf(svc)
	if c.dryRun {
		addr, ok := cl.Reserved(corev1.IPFamily(c.family), owner)
		if !ok {
			return nil, false, nil
		}
		return net.IP(addr.AsSlice()), true, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterIPCallTimeout)
	defer cancel()
	addr, undo, err := cl.Claim(ctx, corev1.IPFamily(c.family), owner)
	if err != nil {
		return nil, false, c.ipallocatorError(err, nil)
	}
	if !addr.IsValid() {
		return nil, false, nil
	}
	c.all.claims.add(addr, types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}, undo)
	klog.V(2).InfoS("Claimed a reserved ClusterIP", "service", klog.KRef(svc.Namespace, svc.Name), "clusterIP", addr)
	return net.IP(addr.AsSlice()), true, nil
}

// CheckService returns the error that refuses svc, created (before nil) or updated from before,
// for its release policy: one that does not parse, or a Retain policy the caps on reservations
// refuse (reservation.Limits: the namespace's clusterip.kube-ipam.io/max-retained), as the
// Claimer decides it; nil without reservations. Before the allocators have started it checks
// only that the policy parses.
func (c *clusterIPAllocator) CheckService(before, svc *api.Service) *field.Error {
	if !c.all.reservations {
		return nil
	}
	cl := c.claimer()
	if cl == nil {
		return reservation.CheckReleasePolicy(serviceMeta(svc))
	}
	var old *corev1.Service
	if before != nil {
		old = serviceMeta(before)
	}
	return cl.CheckService(old, serviceMeta(svc))
}

// ReleaseService releases ip, which svc held and is being deleted with it, or keeps it as a
// reservation for svc's namespace and name if svc's release policy says so.
func (c *clusterIPAllocator) ReleaseService(svc *api.Service, ip net.IP) error {
	addr, ok := addrOf(ip)
	if cl := c.claimer(); cl != nil && ok {
		c.all.claims.forget(addr)
		ctx, cancel := context.WithTimeout(context.Background(), clusterIPCallTimeout)
		defer cancel()
		kept, err := cl.Retain(ctx, serviceMeta(svc), addr)
		if err != nil {
			return err
		}
		if kept {
			klog.V(2).InfoS("Kept a ClusterIP as a reservation", "service", klog.KRef(svc.Namespace, svc.Name), "clusterIP", addr)
			return nil
		}
	}
	return c.Release(ip)
}

// RevertService undoes the allocation of ip to svc, whose create or update failed: an address
// svc claimed from a reservation becomes the reservation again, any other is released.
func (c *clusterIPAllocator) RevertService(svc *api.Service, ip net.IP) error {
	if addr, ok := addrOf(ip); ok {
		if undo := c.all.claims.take(addr, types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}); undo != nil {
			ctx, cancel := context.WithTimeout(context.Background(), clusterIPCallTimeout)
			defer cancel()
			return undo(ctx)
		}
	}
	return c.Release(ip)
}

// serviceMeta returns the object metadata of svc, the registry's internal Service, and the spec
// fields that say how many addresses it keeps, as the v1 Service package reservation reads a
// release policy and its caps from.
func serviceMeta(svc *api.Service) *corev1.Service {
	out := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID, Annotations: svc.Annotations}}
	out.Spec.Type = corev1.ServiceType(svc.Spec.Type)
	out.Spec.ClusterIP = svc.Spec.ClusterIP
	if p := svc.Spec.IPFamilyPolicy; p != nil {
		v := corev1.IPFamilyPolicy(*p)
		out.Spec.IPFamilyPolicy = &v
	}
	return out
}
