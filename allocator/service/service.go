package service

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-base/compatibility"
	basefeaturegate "k8s.io/component-base/featuregate"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/semantics"
)

// serviceKind is the GroupKind kube-apiserver names in a Service's Invalid errors.
var serviceKind = schema.GroupKind{Kind: "Service"}

// Field paths kube-apiserver uses for the ClusterIP fields.
var (
	pathClusterIPs     = field.NewPath("spec", "clusterIPs")
	pathIPFamilies     = field.NewPath("spec", "ipFamilies")
	pathIPFamilyPolicy = field.NewPath("spec", "ipFamilyPolicy")
)

// Allocator gives Services their ClusterIPs the way kube-apiserver's Service registry does:
// it defaults spec.ipFamilyPolicy and spec.ipFamilies from the cluster's families, allocates
// spec.clusterIPs from one allocator.Interface per family, and rejects what kube-apiserver
// rejects with the same 422 Invalid errors (field paths and error types).
//
// An Allocator keeps no state of its own beyond its allocators; it is safe for concurrent use
// when they are. The zero Allocator serves no family and rejects every Service that needs a
// ClusterIP; use New.
type Allocator struct {
	primary  corev1.IPFamily
	families map[corev1.IPFamily]allocator.Interface
	sem      semantics.Semantics
	reserved Reserved
}

// Options adjusts an Allocator built by NewWithOptions. The zero Options gives the answers of the
// newest supported kube-apiserver with its default feature gates.
type Options struct {
	// Version is the kube-apiserver whose answers the Allocator gives: its binary version decides
	// status codes and texts, its emulation version the default of StrictIPCIDRValidation. Build
	// one with featuregate.KubeVersion. Nil means featuregate.DefaultVersion().
	Version compatibility.EffectiveVersion

	// FeatureGate, if not nil and it knows StrictIPCIDRValidation (see featuregate.NewGate),
	// decides that gate as the registry runs it; otherwise its default at Version applies.
	FeatureGate basefeaturegate.FeatureGate

	// Reserved, if not nil, gives a Service created without a ClusterIP of a family the address
	// reserved for it in that family (package reservation's Claimer), before any dynamic
	// allocation; a Service that asks for its reserved address by spec.clusterIP(s) is refused
	// as for any address held, as kube-apiserver refuses it. Nil: no reservation is looked up.
	Reserved Reserved
}

// Reserved gives a Service the address reserved for it, as package reservation's Claimer does.
// owner is the Service, as allocator.ServiceOwner gives it.
type Reserved interface {
	// Claim makes the address reserved for owner in family owner's allocation and returns it,
	// with an undo that makes it the reservation again; the zero Addr when none is reserved.
	Claim(ctx context.Context, family corev1.IPFamily, owner allocator.Owner) (netip.Addr, func(context.Context) error, error)
	// Reserved returns the address Claim would give, changing nothing (for a dry run).
	Reserved(family corev1.IPFamily, owner allocator.Owner) (netip.Addr, bool)
	// CheckService returns the error that refuses svc, created (old nil) or updated from old,
	// for its release policy: one that does not parse, or a Retain policy over a cap.
	CheckService(old, svc *corev1.Service) *field.Error
	// Retain keeps ip of svc, which is being deleted, as a reservation if svc's release policy
	// says so, and reports whether it did; false means ip is to be released as usual.
	Retain(ctx context.Context, svc *corev1.Service, ip netip.Addr) (bool, error)
}

// New returns an Allocator for a cluster whose default family is primary (the family of the
// first --service-cluster-ip-range) and which serves the families in families, with the answers
// of the newest supported kube-apiserver (see NewWithOptions). Entries with a nil
// allocator.Interface are ignored. The map is copied.
func New(primary corev1.IPFamily, families map[corev1.IPFamily]allocator.Interface) *Allocator {
	return NewWithOptions(primary, families, Options{})
}

// NewWithOptions is New with the kube-apiserver release, and its feature gates, whose answers the
// Allocator gives.
func NewWithOptions(primary corev1.IPFamily, families map[corev1.IPFamily]allocator.Interface, opts Options) *Allocator {
	s := &Allocator{primary: primary, families: make(map[corev1.IPFamily]allocator.Interface, len(families)), sem: semantics.Of(opts.Version, opts.FeatureGate), reserved: opts.Reserved}
	for f, a := range families {
		if a != nil {
			s.families[f] = a
		}
	}
	return s
}

// dualStack reports whether the cluster serves two families.
func (s *Allocator) dualStack() bool { return len(s.families) > 1 }

// Transaction is the outcome of one successful Allocate or Update: the addresses it took and
// those an update dropped. Exactly one of Commit or Revert should be called once the caller
// knows whether the Service was stored. A nil *Transaction is valid and does nothing. A
// Transaction is not safe for concurrent use.
type Transaction struct {
	s         *Allocator
	dryRun    bool
	done      bool
	allocated []netip.Addr // taken by the call; released by Revert
	claimed   []netip.Addr // reservations the call claimed; made reservations again by Revert
	unclaim   []func(context.Context) error
	released  []netip.Addr // dropped by an update; released by Commit
}

// Commit finalizes the transaction once the Service is stored: it releases the addresses an
// update dropped (the secondary IP of a dual-stack to single-stack downgrade, or every IP of a
// change to ExternalName) and keeps those the call allocated. The releases run on a context of
// their own, bounded by allocator.UndoTimeout, which keeps ctx's values but not its
// cancellation or deadline: the Service is stored whatever happened to the caller, so its
// dropped addresses are freed all the same. It returns the first release error, having tried
// every address; an address whose release failed is left to the repair loop, as
// kube-apiserver does. Commit after Commit or Revert does nothing and returns nil.
func (t *Transaction) Commit(ctx context.Context) error {
	if t == nil || t.done {
		return nil
	}
	t.done = true
	if t.dryRun || len(t.released) == 0 {
		return nil
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), allocator.UndoTimeout)
	defer cancel()
	return t.s.release(uctx, t.released)
}

// Revert undoes the transaction once the Service could not be stored: it releases the addresses
// the call allocated and keeps those an update would have dropped. The releases run on a
// context of their own, bounded by allocator.UndoTimeout, which keeps ctx's values but not its
// cancellation or deadline: a caller whose deadline has passed still gets its addresses back.
// It returns the first release error, having tried every address. Revert after Commit or Revert
// does nothing and returns nil.
func (t *Transaction) Revert(ctx context.Context) error {
	if t == nil || t.done {
		return nil
	}
	t.done = true
	if t.dryRun || len(t.allocated)+len(t.unclaim) == 0 {
		return nil
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), allocator.UndoTimeout)
	defer cancel()
	errs := []error{t.s.release(uctx, t.allocated)}
	for _, undo := range t.unclaim {
		errs = append(errs, undo(uctx))
	}
	return errors.Join(errs...)
}

// Allocated returns the addresses the call took by allocation, in family order; addresses
// claimed from reservations are in Claimed.
func (t *Transaction) Allocated() []netip.Addr {
	if t == nil {
		return nil
	}
	return slices.Clone(t.allocated)
}

// Claimed returns the addresses the call took from reservations kept for the Service (see
// Options.Reserved), which Revert makes reservations again.
func (t *Transaction) Claimed() []netip.Addr {
	if t == nil {
		return nil
	}
	return slices.Clone(t.claimed)
}

// Released returns the addresses Commit releases.
func (t *Transaction) Released() []netip.Addr {
	if t == nil {
		return nil
	}
	return slices.Clone(t.released)
}

// Allocate fills spec.clusterIP, spec.clusterIPs, spec.ipFamilies and spec.ipFamilyPolicy of svc,
// which is being created, and allocates its ClusterIPs, changing svc in place.
//
// An ExternalName Service gets nothing; a headless Service ("None") gets families and a policy but
// no address. A chosen ClusterIP may be written in any spelling kube-apiserver v1.33 accepts (see
// allocator.ParseClusterIP): the Service keeps it as written and the allocator takes the parsed
// address.
//
// Errors are kube-apiserver v1.33's, with its status codes, field paths and texts, so that a
// registry passes them to clients as they are. A request kube-apiserver rejects returns a 422
// Invalid *errors.StatusError built from a field.ErrorList. Any failure to allocate a chosen
// address is a 422 at spec.clusterIPs, "failed to allocate IP <ip>: <reason>", whose reason is
// v1.33's text for the allocator's error: "provided IP is already allocated"
// (allocator.ErrAllocated), "the provided IP (<ip>) is not in the valid range. The range of valid
// IPs is <range>" (a *allocator.NotInRangeError with a Range), "the provided network does not
// match the current range" (a range-less *allocator.NotInRangeError or allocator.ErrNotReady: the
// address is in no ready ServiceCIDR), "the provided range does not match the current range"
// (another allocator.ErrMismatchedNetwork: a stored bitmap of another range), or the error's own
// text. A failure to allocate a fresh address is a 500 InternalError, "failed to allocate a
// serviceIP: <reason>", where allocator.ErrFull and allocator.ErrNotReady read "range is full" and
// the others as for a chosen address. On any error nothing stays allocated. With dryRun the
// allocators' DryRun views validate and pick addresses, and nothing is taken; the returned
// Transaction then does nothing.
func (s *Allocator) Allocate(ctx context.Context, svc *corev1.Service, dryRun bool) (*Transaction, error) {
	if svc == nil {
		return nil, errors.New("service: nil Service")
	}
	normalizeClusterIPs(svc, nil)
	if err := s.checkReleasePolicy(nil, svc); err != nil {
		return nil, err
	}
	if err := s.initIPFamilyFields(svc, nil); err != nil {
		return nil, err
	}
	txn := &Transaction{s: s, dryRun: dryRun}
	if err := s.allocClusterIPs(ctx, svc, txn); err != nil {
		return nil, err
	}
	if el := validateCreate(svc, s.sem.StrictClusterIPs()); len(el) > 0 {
		_ = txn.Revert(ctx)
		return nil, s.newInvalid(svc.Name, el)
	}
	return txn, nil
}

// Update applies kube-apiserver's update rules to svc, the new version of old, changing svc in
// place: values the client left out are kept from old, a single-stack Service asking for two
// families gets its secondary address, a dual-stack Service set to SingleStack drops its secondary
// address (released by Transaction.Commit), a change from ExternalName allocates and a change to
// ExternalName releases (on Commit), and ClusterIPs and families that are set may not change.
// old is not changed. Errors and dryRun are as for Allocate; on error nothing is taken or dropped.
func (s *Allocator) Update(ctx context.Context, old, svc *corev1.Service, dryRun bool) (*Transaction, error) {
	if svc == nil || old == nil {
		return nil, errors.New("service: nil Service")
	}
	patchAllocatedValues(svc, old)
	normalizeClusterIPs(svc, old)
	if err := s.checkReleasePolicy(old, svc); err != nil {
		return nil, err
	}
	if err := s.initIPFamilyFields(svc, old); err != nil {
		return nil, err
	}
	txn := &Transaction{s: s, dryRun: dryRun}
	if err := s.updateClusterIPs(ctx, svc, old, txn); err != nil {
		return nil, err
	}
	dropTypeDependentFields(svc, old)
	if el := validateUpdate(svc, old, s.sem.StrictClusterIPs()); len(el) > 0 {
		_ = txn.Revert(ctx)
		return nil, s.newInvalid(svc.Name, el)
	}
	return txn, nil
}

// Release frees every ClusterIP svc holds, read with allocator.ParseClusterIP, in the allocator of
// its family. Addresses that do not parse, "None", and families the cluster does not serve are
// skipped. With Options.Reserved, an address svc's release policy retains (package reservation's
// AnnotationReleasePolicy) becomes a reservation kept for svc's namespace and name instead of
// being freed. It returns the errors, having tried every address.
func (s *Allocator) Release(ctx context.Context, svc *corev1.Service) error {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	addrs := parseAll(ips)
	if s.reserved == nil {
		return s.release(ctx, addrs)
	}
	var errs []error
	var rest []netip.Addr
	for _, ip := range addrs {
		kept, err := s.reserved.Retain(ctx, svc, ip)
		errs = append(errs, err)
		if !kept && err == nil {
			rest = append(rest, ip)
		}
	}
	return errors.Join(append(errs, s.release(ctx, rest))...)
}

// checkReleasePolicy refuses, with kube-apiserver's 422 Invalid, a Service created (old nil) or
// updated from old whose release policy annotation does not parse or goes over a cap on
// reservations, where Options.Reserved is set.
func (s *Allocator) checkReleasePolicy(old, svc *corev1.Service) error {
	if s.reserved == nil {
		return nil
	}
	if fe := s.reserved.CheckService(old, svc); fe != nil {
		return s.newInvalid(svc.Name, field.ErrorList{fe})
	}
	return nil
}

// release frees each address in the allocator of its family and returns the first error.
func (s *Allocator) release(ctx context.Context, ips []netip.Addr) error {
	var first error
	for _, ip := range ips {
		a := s.families[allocator.FamilyOf(ip)]
		if a == nil {
			continue
		}
		if err := a.Release(ctx, ip); err != nil && first == nil {
			first = fmt.Errorf("service: release %s: %w", ip, err)
		}
	}
	return first
}

// allocClusterIPs gives svc an address for each of its families, keeping chosen ones, and records
// them in txn. On error it releases what it took.
func (s *Allocator) allocClusterIPs(ctx context.Context, svc *corev1.Service, txn *Transaction) error {
	if svc.Spec.Type == corev1.ServiceTypeExternalName || isNone(svc) {
		return nil
	}
	for i := len(svc.Spec.ClusterIPs); i < len(svc.Spec.IPFamilies); i++ {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, "")
	}
	requested := slices.Clone(svc.Spec.ClusterIPs)
	for i := range svc.Spec.IPFamilies {
		if err := s.allocIndex(ctx, svc, i, requested, txn); err != nil {
			_ = txn.Revert(ctx)
			return err
		}
	}
	if len(svc.Spec.ClusterIPs) > 0 {
		svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	}
	return nil
}

// allocIndex allocates svc.Spec.ClusterIPs[i] (any free address when empty) from the allocator of
// svc.Spec.IPFamilies[i] and records it in txn. A chosen address, kept as written, is read with
// allocator.ParseClusterIP and the parsed address allocated. requested is clusterIPs as the client
// asked for them (fresh ones ""), which kube-apiserver shows in the error of a chosen address.
func (s *Allocator) allocIndex(ctx context.Context, svc *corev1.Service, i int, requested []string, txn *Transaction) error {
	family := svc.Spec.IPFamilies[i]
	a := s.families[family]
	if a == nil { // initIPFamilyFields has checked this; keep it from panicking anyway
		return s.newInvalid(svc.Name, field.ErrorList{
			field.Invalid(pathIPFamilies.Index(i), family, "not configured on this cluster")})
	}
	if txn.dryRun {
		a = a.DryRun()
	}
	owner := allocator.ServiceOwner(svc)
	if svc.Spec.ClusterIPs[i] == "" && s.reserved != nil {
		ip, undo, err := s.claim(ctx, family, owner, txn.dryRun)
		if err != nil {
			return s.nextError(svc.Name, requested, err)
		}
		if ip.IsValid() {
			svc.Spec.ClusterIPs[i] = ip.String()
			if undo != nil {
				txn.claimed, txn.unclaim = append(txn.claimed, ip), append(txn.unclaim, undo)
			}
			return nil
		}
	}
	if svc.Spec.ClusterIPs[i] == "" {
		ip, err := a.AllocateNext(ctx, owner)
		if err != nil {
			return s.nextError(svc.Name, requested, OwnerRefusal(ctx, a, err))
		}
		svc.Spec.ClusterIPs[i] = ip.String()
		if !txn.dryRun {
			txn.allocated = append(txn.allocated, ip)
		}
		return nil
	}
	written := svc.Spec.ClusterIPs[i]
	ip, err := allocator.ParseClusterIP(written)
	if err == nil {
		err = a.Allocate(ctx, ip, owner)
	}
	if err != nil {
		return s.chosenError(svc.Name, requested, written, err)
	}
	if !txn.dryRun {
		txn.allocated = append(txn.allocated, ip)
	}
	return nil
}

// updateClusterIPs allocates or drops addresses for an update, as kube-apiserver does: every
// address on a change from ExternalName, the secondary on an upgrade to dual-stack; on a change to
// ExternalName every old address, and on a downgrade the old secondary, are left for Commit.
func (s *Allocator) updateClusterIPs(ctx context.Context, svc, old *corev1.Service, txn *Transaction) error {
	if isMatchingPreferDualStack(svc, old) {
		return nil
	}
	if old.Spec.Type == corev1.ServiceTypeExternalName && svc.Spec.Type != corev1.ServiceTypeExternalName {
		return s.allocClusterIPs(ctx, svc, txn)
	}
	if isNone(old) {
		return nil
	}
	if old.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.Type == corev1.ServiceTypeExternalName {
		txn.released = append(txn.released, parseAll(old.Spec.ClusterIPs)...)
		return nil
	}
	switch {
	case len(old.Spec.IPFamilies) == 1 && len(svc.Spec.IPFamilies) == 2: // upgrade
		if len(svc.Spec.ClusterIPs) == 0 {
			// A stored Service with a family but no address (kube-apiserver v1.33 indexes past
			// the end of clusterIPs here and answers with a panic): it has no primary to add a
			// secondary to.
			return s.newInvalid(svc.Name, field.ErrorList{field.Invalid(pathClusterIPs.Index(0),
				svc.Spec.ClusterIPs, "primary clusterIP can not be unset")})
		}
		if len(svc.Spec.ClusterIPs) < 2 {
			svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, "")
		}
		if err := s.allocIndex(ctx, svc, 1, slices.Clone(svc.Spec.ClusterIPs), txn); err != nil {
			if len(svc.Spec.ClusterIPs) == 2 && svc.Spec.ClusterIPs[1] == "" {
				svc.Spec.ClusterIPs = svc.Spec.ClusterIPs[:1]
			}
			return err
		}
	case len(old.Spec.IPFamilies) == 2 && len(svc.Spec.IPFamilies) == 1: // downgrade
		if len(old.Spec.ClusterIPs) > 1 {
			txn.released = append(txn.released, parseAll(old.Spec.ClusterIPs[1:2])...)
		}
	}
	return nil
}

// parseAll returns the addresses among ips that parse, read with allocator.ParseClusterIP.
func parseAll(ips []string) []netip.Addr {
	var out []netip.Addr
	for _, v := range ips {
		if ip, err := allocator.ParseClusterIP(v); err == nil {
			out = append(out, ip)
		}
	}
	return out
}

// isNone reports whether svc asks for no ClusterIP ("None" first).
func isNone(svc *corev1.Service) bool {
	return len(svc.Spec.ClusterIPs) > 0 && svc.Spec.ClusterIPs[0] == corev1.ClusterIPNone
}

// isHeadless reports whether svc is a headless Service as validation counts it: the single
// ClusterIP "None".
func isHeadless(svc *corev1.Service) bool {
	return len(svc.Spec.ClusterIPs) == 1 && svc.Spec.ClusterIPs[0] == corev1.ClusterIPNone
}

// policyOf returns svc's ipFamilyPolicy, or "" when unset.
func policyOf(svc *corev1.Service) corev1.IPFamilyPolicy {
	if svc.Spec.IPFamilyPolicy == nil {
		return ""
	}
	return *svc.Spec.IPFamilyPolicy
}

func policyPtr(p corev1.IPFamilyPolicy) *corev1.IPFamilyPolicy { return &p }

// otherFamily returns the family that is not f.
func otherFamily(f corev1.IPFamily) corev1.IPFamily {
	if f == corev1.IPv4Protocol {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// familyOfString returns the family of a ClusterIP as kube-apiserver v1.33 judges it (an
// IPv4-mapped IPv6 spelling is IPv4), IPv4 when it does not parse.
func familyOfString(s string) corev1.IPFamily {
	if ip, err := allocator.ParseClusterIP(s); err == nil && ip.Is6() {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// initIPFamilyFields defaults ipFamilyPolicy and ipFamilies from the request and the cluster and
// rejects combinations the cluster cannot serve, following kube-apiserver's Service registry.
func (s *Allocator) initIPFamilyFields(svc, old *corev1.Service) error {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	// A PreferDualStack Service is neither upgraded nor downgraded when the cluster changes,
	// only when the client changes its policy and its addresses or families.
	if isMatchingPreferDualStack(svc, old) {
		return nil
	}
	if svc.Spec.IPFamilyPolicy == nil {
		switch {
		case old != nil && old.Spec.IPFamilyPolicy != nil:
			svc.Spec.IPFamilyPolicy = policyPtr(*old.Spec.IPFamilyPolicy)
		case svc.Spec.ClusterIP == corev1.ClusterIPNone && len(svc.Spec.Selector) == 0:
			svc.Spec.IPFamilyPolicy = policyPtr(corev1.IPFamilyPolicyRequireDualStack)
		default:
			svc.Spec.IPFamilyPolicy = policyPtr(corev1.IPFamilyPolicySingleStack)
		}
	}
	if svc.Spec.IPFamilies == nil {
		svc.Spec.IPFamilies = []corev1.IPFamily{}
	}
	if el := validateClusterIPsRelatedFields(svc, old, s.sem.StrictClusterIPs()); len(el) > 0 {
		return s.newInvalid(svc.Name, el)
	}

	var el field.ErrorList
	policy := policyOf(svc)
	if old != nil {
		if policy == corev1.IPFamilyPolicySingleStack {
			// With the addresses and families unchanged, SingleStack is a clear request to
			// drop the secondary; the primary cannot change.
			if slices.Equal(old.Spec.ClusterIPs, svc.Spec.ClusterIPs) && len(svc.Spec.ClusterIPs) > 1 {
				svc.Spec.ClusterIPs = svc.Spec.ClusterIPs[:1]
			}
			if slices.Equal(old.Spec.IPFamilies, svc.Spec.IPFamilies) && len(svc.Spec.IPFamilies) > 1 {
				svc.Spec.IPFamilies = svc.Spec.IPFamilies[:1]
			}
		} else {
			if len(svc.Spec.ClusterIPs) > 0 && len(svc.Spec.ClusterIPs) < len(old.Spec.ClusterIPs) {
				el = append(el, field.Invalid(pathIPFamilyPolicy, svc.Spec.IPFamilyPolicy,
					"must be 'SingleStack' to release the secondary cluster IP"))
			}
			if len(svc.Spec.IPFamilies) > 0 && len(svc.Spec.IPFamilies) < len(old.Spec.IPFamilies) {
				el = append(el, field.Invalid(pathIPFamilyPolicy, svc.Spec.IPFamilyPolicy,
					"must be 'SingleStack' to release the secondary IP family"))
			}
		}
	}
	if policy == corev1.IPFamilyPolicySingleStack {
		if len(svc.Spec.ClusterIPs) == 2 {
			el = append(el, field.Invalid(pathIPFamilyPolicy, svc.Spec.IPFamilyPolicy,
				"must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified"))
		}
		if len(svc.Spec.IPFamilies) == 2 {
			el = append(el, field.Invalid(pathIPFamilyPolicy, svc.Spec.IPFamilyPolicy,
				"must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified"))
		}
	}
	// Families follow the chosen addresses where the client named none.
	for i, ip := range svc.Spec.ClusterIPs {
		if ip == corev1.ClusterIPNone {
			break
		}
		if i < len(svc.Spec.IPFamilies) {
			continue
		}
		fam := familyOfString(ip)
		if s.families[fam] == nil {
			el = append(el, field.Invalid(pathClusterIPs.Index(i), svc.Spec.ClusterIPs,
				fmt.Sprintf("%s is not configured on this cluster", fam)))
		} else {
			svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, fam)
		}
	}
	if len(el) > 0 {
		return s.newInvalid(svc.Name, el)
	}

	// Headless and selectorless: no addresses, so any family goes, even on a single-stack
	// cluster.
	if svc.Spec.ClusterIP == corev1.ClusterIPNone && len(svc.Spec.Selector) == 0 {
		if len(svc.Spec.IPFamilies) == 0 {
			svc.Spec.IPFamilies = []corev1.IPFamily{s.primary}
		}
		if len(svc.Spec.IPFamilies) < 2 && policy != corev1.IPFamilyPolicySingleStack {
			svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, otherFamily(svc.Spec.IPFamilies[0]))
		}
		return nil
	}

	if policy == corev1.IPFamilyPolicyRequireDualStack && !s.dualStack() {
		el = append(el, field.Invalid(pathIPFamilyPolicy, svc.Spec.IPFamilyPolicy,
			"this cluster is not configured for dual-stack services"))
	}
	for i, fam := range svc.Spec.IPFamilies {
		if s.families[fam] == nil {
			el = append(el, field.Invalid(pathIPFamilies.Index(i), fam, "not configured on this cluster"))
		}
	}
	if len(el) > 0 {
		return s.newInvalid(svc.Name, el)
	}
	if len(svc.Spec.IPFamilies) == 0 {
		svc.Spec.IPFamilies = []corev1.IPFamily{s.primary}
	}
	if policy != corev1.IPFamilyPolicySingleStack && len(svc.Spec.IPFamilies) == 1 && s.dualStack() {
		svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, otherFamily(svc.Spec.IPFamilies[0]))
	}
	return nil
}

// isMatchingPreferDualStack reports whether an update keeps a PreferDualStack Service's type,
// addresses and families (the old policy may be unset), in which case nothing is defaulted or
// allocated.
func isMatchingPreferDualStack(svc, old *corev1.Service) bool {
	if old == nil || svc.Spec.IPFamilyPolicy == nil || svc.Spec.Type != old.Spec.Type {
		return false
	}
	switch svc.Spec.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	default:
		return false
	}
	if *svc.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyPreferDualStack ||
		(old.Spec.IPFamilyPolicy != nil && *old.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyPreferDualStack) {
		return false
	}
	return slices.Equal(old.Spec.ClusterIPs, svc.Spec.ClusterIPs) &&
		slices.Equal(old.Spec.IPFamilies, svc.Spec.IPFamilies)
}

// normalizeClusterIPs keeps spec.clusterIP and spec.clusterIPs in step for clients that set only
// one of them, as kube-apiserver does before anything else looks at them. old is nil on create.
func normalizeClusterIPs(svc, old *corev1.Service) {
	if old == nil {
		if svc.Spec.ClusterIP != "" && len(svc.Spec.ClusterIPs) == 0 {
			svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIP}
		}
		return
	}
	// An old client that does not know clusterIPs sent it empty.
	if len(old.Spec.ClusterIPs) > 0 && len(svc.Spec.ClusterIPs) == 0 && old.Spec.ClusterIP == svc.Spec.ClusterIP {
		svc.Spec.ClusterIPs = slices.Clone(old.Spec.ClusterIPs)
	}
	if old.Spec.ClusterIP != svc.Spec.ClusterIP {
		if old.Spec.ClusterIP != "" && svc.Spec.ClusterIP == "" && slices.Equal(old.Spec.ClusterIPs, svc.Spec.ClusterIPs) {
			svc.Spec.ClusterIPs = nil
		}
		if slices.Equal(old.Spec.ClusterIPs, svc.Spec.ClusterIPs) {
			svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIP}
		}
	}
}

// patchAllocatedValues keeps the old addresses when the client left them out of an update.
func patchAllocatedValues(svc, old *corev1.Service) {
	if old.Spec.Type == corev1.ServiceTypeExternalName || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return
	}
	if svc.Spec.ClusterIP == "" {
		svc.Spec.ClusterIP = old.Spec.ClusterIP
	}
	if len(svc.Spec.ClusterIPs) == 0 && len(old.Spec.ClusterIPs) > 0 {
		svc.Spec.ClusterIPs = slices.Clone(old.Spec.ClusterIPs)
	}
}

// dropTypeDependentFields clears the ClusterIP fields of a Service changed to ExternalName when
// the client left them as they were.
func dropTypeDependentFields(svc, old *corev1.Service) {
	if old.Spec.Type == corev1.ServiceTypeExternalName || svc.Spec.Type != corev1.ServiceTypeExternalName {
		return
	}
	if slices.Equal(old.Spec.ClusterIPs, svc.Spec.ClusterIPs) && old.Spec.ClusterIP == svc.Spec.ClusterIP {
		svc.Spec.ClusterIP = ""
		svc.Spec.ClusterIPs = nil
	}
	if slices.Equal(old.Spec.IPFamilies, svc.Spec.IPFamilies) {
		svc.Spec.IPFamilies = nil
	}
	if policyOf(old) == policyOf(svc) {
		svc.Spec.IPFamilyPolicy = nil
	}
}

// claim returns the address reserved for owner in family and the undo of its claim (see
// Options.Reserved); a dry run only looks it up, with no undo.
func (s *Allocator) claim(ctx context.Context, family corev1.IPFamily, owner allocator.Owner, dryRun bool) (netip.Addr, func(context.Context) error, error) {
	if dryRun {
		ip, _ := s.reserved.Reserved(family, owner)
		return ip, nil, nil
	}
	return s.reserved.Claim(ctx, family, owner)
}
