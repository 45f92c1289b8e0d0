package reservation

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	corev1informers "k8s.io/client-go/informers/core/v1"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/ipmath"
)

// AnnotationMaxRetained is the Namespace annotation that lets the Services of the namespace use a
// Retain release policy ([AnnotationReleasePolicy]) and caps how many addresses the namespace may
// keep: a decimal integer of at least 0 (see [ParseMaxRetained]). Without it (or with 0, or with
// a value that does not parse) no Service of the namespace may retain: retaining is opt-in, since
// anyone who may create and delete Services could otherwise keep the whole range (IPAddress
// objects are cluster-scoped: no ResourceQuota counts them). How a namespace is counted is
// [Limits]'s rule.
const AnnotationMaxRetained = "clusterip.kube-ipam.io/max-retained"

// AnnotationMaxReserved is the ServiceCIDR annotation that caps the reservations in the
// ServiceCIDR, whoever they are kept for (a Service of any namespace, anonymous, a release
// cooldown's): "<n>", an integer of at least 0, or "<p>%", an integer percentage from 0 to 100 of
// the addresses the ServiceCIDR can hand out (see [ParseMaxReserved]). A dual-stack ServiceCIDR
// is capped in each family on its own. Without it the ServiceCIDR has no cap. A value that does
// not parse is reported and counts as no cap, as a release cooldown's does: a typo never blocks a
// delete.
const AnnotationMaxReserved = "clusterip.kube-ipam.io/max-reserved"

// Which cap a [LimitError] names.
const (
	// CapNamespace is the cap of a Namespace's [AnnotationMaxRetained].
	CapNamespace = "namespace"
	// CapServiceCIDR is the cap of a ServiceCIDR's [AnnotationMaxReserved].
	CapServiceCIDR = "servicecidr"
)

// ErrCapped is what every [*LimitError] matches: keeping an address would exceed a cap on
// reservations, or the namespace may not retain at all.
var ErrCapped = errors.New("reservation: over a cap on reservations")

// LimitError reports an address that is not kept, or a Service that is refused, because of a cap:
// a Namespace's [AnnotationMaxRetained] (Cap [CapNamespace]) or a ServiceCIDR's
// [AnnotationMaxReserved] (Cap [CapServiceCIDR]). It matches [ErrCapped].
type LimitError struct {
	// Cap is [CapNamespace] or [CapServiceCIDR].
	Cap string
	// Name is the Namespace's or the ServiceCIDR's name.
	Name string
	// Prefix is, for a ServiceCIDR, the prefix of its whose reservations were counted; zero for a
	// Namespace.
	Prefix netip.Prefix
	// Kept is how many reservations were counted.
	Kept int
	// Adding is how many addresses the refused request would have kept besides.
	Adding int
	// Max is the cap: how many the Namespace or the ServiceCIDR's prefix may keep.
	Max int
	// Value is the annotation's value as written ("" when absent).
	Value string
	// Forbidden, when not empty, says why the namespace may not retain at all (no annotation, 0,
	// or a value that does not parse); Kept and Max are then not set.
	Forbidden string
}

// Error implements error.
func (e *LimitError) Error() string { return "reservation: " + e.Message() }

// Is reports whether target is [ErrCapped].
func (e *LimitError) Is(target error) bool { return target == ErrCapped }

// Message says what the cap refuses, for people, in the words of kube-apiserver's field errors,
// such as `namespace "team-a" keeps 3 reserved addresses and may keep 3 (annotation
// clusterip.kube-ipam.io/max-retained of Namespace "team-a")`.
func (e *LimitError) Message() string {
	if e.Cap == CapNamespace && e.Forbidden != "" {
		return fmt.Sprintf("namespace %q may not retain addresses: %s", e.Name, e.Forbidden)
	}
	more := ""
	if e.Adding > 1 {
		more = fmt.Sprintf(", this Service would keep %d more,", e.Adding)
	}
	if e.Cap == CapServiceCIDR {
		return fmt.Sprintf("ServiceCIDR %q keeps %d reserved addresses in %s%s and may keep %d (annotation %s: %q of ServiceCIDR %q)",
			e.Name, e.Kept, e.Prefix, more, e.Max, AnnotationMaxReserved, e.Value, e.Name)
	}
	return fmt.Sprintf("namespace %q keeps %d reserved addresses%s and may keep %d (annotation %s of Namespace %q)",
		e.Name, e.Kept, more, e.Max, AnnotationMaxRetained, e.Name)
}

// ParseMaxRetained reads the value of a Namespace's [AnnotationMaxRetained] annotation: a
// decimal integer of at least 0, digits only. Any other value (a sign, spaces, a number past
// 2^31-1) returns 0 and an [*InvalidError] for the annotation's field.
func ParseMaxRetained(value string) (int, error) {
	n, ok := parseCount(value)
	if !ok {
		return 0, &InvalidError{Field: "metadata.annotations[" + AnnotationMaxRetained + "]", Value: value, Reason: "must be a decimal integer of at least 0, such as \"10\""}
	}
	return n, nil
}

// parseCount reads a decimal integer of digits only that fits in an int32.
func parseCount(s string) (int, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return 0, false
	}
	return int(n), true
}

// MaxReserved is the cap of a ServiceCIDR's [AnnotationMaxReserved]: a number of addresses, or a
// percentage of those a prefix can hand out. The zero MaxReserved caps at 0. It is a small value,
// safe to copy and for concurrent use.
type MaxReserved struct {
	// N is the number, or the percentage (0 to 100) when Percent is set.
	N int
	// Percent is whether N is a percentage.
	Percent bool
}

// String returns the annotation's value for m: "<n>" or "<n>%".
func (m MaxReserved) String() string {
	if m.Percent {
		return strconv.Itoa(m.N) + "%"
	}
	return strconv.Itoa(m.N)
}

// Of returns how many reservations m lets prefix p keep: N, or N percent of the addresses p can
// hand out (ipmath's count: no network address, no IPv4 broadcast), rounded down.
func (m MaxReserved) Of(p netip.Prefix) int {
	if !m.Percent {
		return m.N
	}
	size := ipmath.Size(p.Masked())
	n := size/100*uint64(m.N) + size%100*uint64(m.N)/100 // no overflow for any size
	return int(min(n, math.MaxInt32))
}

// ParseMaxReserved reads the value of a ServiceCIDR's [AnnotationMaxReserved] annotation: "<n>",
// a decimal integer of at least 0, or "<p>%", a decimal integer from 0 to 100 followed by "%".
// Any other value returns the zero MaxReserved and an [*InvalidError] for the annotation's field.
func ParseMaxReserved(value string) (MaxReserved, error) {
	invalid := &InvalidError{Field: "metadata.annotations[" + AnnotationMaxReserved + "]", Value: value,
		Reason: "must be a decimal integer of at least 0, such as \"100\", or a percentage from 0 to 100, such as \"10%\""}
	if p, ok := strings.CutSuffix(value, "%"); ok {
		n, ok := parseCount(p)
		if !ok || n > 100 {
			return MaxReserved{}, invalid
		}
		return MaxReserved{N: n, Percent: true}, nil
	}
	n, ok := parseCount(value)
	if !ok {
		return MaxReserved{}, invalid
	}
	return MaxReserved{N: n}, nil
}

// The informer indexes of the caps: the namespace of the Service a reservation is kept for, and
// the family of every reservation.
const (
	forNamespaceIndex = "clusterip.kube-ipam.io/reserved-for-namespace"
	familyIndex       = "clusterip.kube-ipam.io/reservation-family"
)

// reservations returns the reservations of the index index under key that have not ended at now
// and that keep reports true for.
func (x *Index) reservations(index, key string, now time.Time, keep func(Reservation) bool) []Reservation {
	objs, err := x.informer.GetIndexer().ByIndex(index, key)
	if err != nil {
		return nil
	}
	var out []Reservation
	for _, o := range objs {
		ipa, ok := o.(*networkingv1.IPAddress)
		if !ok {
			continue
		}
		if r, ok := FromObject(ipa); ok && !r.Expired(now) && keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// CountForNamespace returns how many reservations kept for Services of namespace ns have not
// ended at now, leaving out those for which skip reports true (nil skips none).
func (x *Index) CountForNamespace(ns string, now time.Time, skip func(Reservation) bool) int {
	return len(x.reservations(forNamespaceIndex, ns, now, func(r Reservation) bool { return skip == nil || !skip(r) }))
}

// CountIn returns how many reservations (of any owner) in p have not ended at now, leaving out
// the one of address except (the zero Addr leaves out none). It costs one pass over the names of
// the reservations of p's family, and reads the end of those in p (the index holds only objects
// [FromObject] reads as reservations).
func (x *Index) CountIn(p netip.Prefix, now time.Time, except netip.Addr) int {
	family := corev1.IPv4Protocol
	if p.Addr().Is6() {
		family = corev1.IPv6Protocol
	}
	objs, err := x.informer.GetIndexer().ByIndex(familyIndex, string(family))
	if err != nil {
		return 0
	}
	n := 0
	for _, o := range objs {
		ipa, ok := o.(*networkingv1.IPAddress)
		if !ok {
			continue
		}
		if a, err := netip.ParseAddr(ipa.Name); err != nil || a == except || !p.Contains(a) {
			continue
		}
		if expires, err := expiresOf(ipa); err == nil && !(Reservation{Expires: expires}).Expired(now) {
			n++
		}
	}
	return n
}

// Limits applies the caps on reservations, the one place every entry point asks: a Claimer (a
// registry with clusterip.Config.Reservations, a kube-apiserver fork with
// CLUSTERIP_RESERVATIONS=on) and package reservation/webhook's Handler and Controller.
//
//   - The namespace cap ([AnnotationMaxRetained] on the Namespace): a namespace keeps the
//     reservations, not ended, kept for Services of it (by its Service's Retain policy or by a
//     release cooldown: each holds an address for the namespace all the same). A Service whose
//     release policy is Retain or Retain/<d> is refused at create, and at an update that makes
//     its policy Retain from another, when the namespace may not retain, or when what the
//     namespace keeps (leaving out the reservations kept for the Service's own name, which its
//     create claims back) plus what the Service would keep (2 addresses for
//     spec.ipFamilyPolicy PreferDualStack or RequireDualStack, 1 otherwise, none for a headless
//     or ExternalName Service) exceeds the cap ([Limits.CheckService]). An update of a Service
//     whose policy was Retain already is never refused for the cap, so that a namespace at its
//     cap can still change its Services. At delete the Retain policy keeps an address only while
//     the namespace stays within its cap ([Limits.KeptOnDelete]); otherwise the address is
//     released (or kept by a release cooldown alone).
//   - The ServiceCIDR cap ([AnnotationMaxReserved] on a ServiceCIDR): the reservations of any
//     owner in each prefix of the ServiceCIDR. An address is not kept at delete (by a Retain
//     policy or a release cooldown) if it would exceed the cap of a ServiceCIDR that can hand it
//     out; [Client.Reserve] refuses to exceed it.
//
// Counts are read from an IPAddress informer's cache, so two deletes of one namespace handled at
// once may both see room for one address: the cap can be overshot by the deletes in flight, and
// never by more. The next create of a Retain Service is refused until the namespace is back within
// its cap.
//
// A nil *Limits reads no Namespace and no ServiceCIDR: no namespace may retain, and no ServiceCIDR
// is capped. A Limits is safe for concurrent use.
type Limits struct {
	index      *Index
	namespaces corev1listers.NamespaceLister         // nil: no namespace may retain
	cidrs      networkingv1listers.ServiceCIDRLister // nil: no ServiceCIDR cap
	synced     []cache.InformerSynced
}

// NewLimits returns Limits that count reservations in ipas, whose informer it indexes (create it
// before the informer starts), and read the caps from the Namespaces of namespaces and the
// ServiceCIDRs of cidrs. The caller starts the informers (from their factory: NewLimits registers
// each with it). A nil namespaces lets no namespace retain; a nil cidrs caps no ServiceCIDR. A nil
// ipas is an error matching allocator.ErrInvalid.
func NewLimits(ipas networkingv1informers.IPAddressInformer, namespaces corev1informers.NamespaceInformer, cidrs networkingv1informers.ServiceCIDRInformer) (*Limits, error) {
	if ipas == nil {
		return nil, fmt.Errorf("reservation: NewLimits needs an IPAddress informer: %w", allocator.ErrInvalid)
	}
	index, err := NewIndex(ipas.Informer())
	if err != nil {
		return nil, err
	}
	return newLimits(index, namespaces, cidrs), nil
}

func newLimits(index *Index, namespaces corev1informers.NamespaceInformer, cidrs networkingv1informers.ServiceCIDRInformer) *Limits {
	l := &Limits{index: index, synced: []cache.InformerSynced{index.HasSynced}}
	if namespaces != nil {
		l.namespaces = namespaces.Lister()
		l.synced = append(l.synced, namespaces.Informer().HasSynced)
	}
	if cidrs != nil {
		l.cidrs = cidrs.Lister()
		l.synced = append(l.synced, cidrs.Informer().HasSynced)
	}
	return l
}

// HasSynced reports whether every informer l reads has synced.
func (l *Limits) HasSynced() bool {
	if l == nil {
		return true
	}
	for _, s := range l.synced {
		if !s() {
			return false
		}
	}
	return true
}

// releasePolicyPath is the field a release policy's refusal names.
var releasePolicyPath = field.NewPath("metadata", "annotations").Key(AnnotationReleasePolicy)

// CheckService returns the field error that refuses svc, being created (old nil) or updated from
// old, at metadata.annotations[<AnnotationReleasePolicy>], and nil when it may go on:
//   - a release policy that does not parse: Invalid, as [CheckReleasePolicy];
//   - a Retain policy (on create, or on an update whose old policy was not Retain) that the
//     namespace's cap refuses, as the type doc says: Forbidden, with the [*LimitError]'s
//     [LimitError.Message], such as `namespace "team-a" may not retain addresses: its Namespace
//     has no clusterip.kube-ipam.io/max-retained annotation`.
//
// The Service's namespace is svc.Namespace; reservations are counted as at now.
func (l *Limits) CheckService(old, svc *corev1.Service, now time.Time) *field.Error {
	if fe := CheckReleasePolicy(svc); fe != nil {
		return fe
	}
	if err := l.checkRetain(old, svc, now); err != nil {
		return field.Forbidden(releasePolicyPath, err.Message())
	}
	return nil
}

// checkRetain returns the *LimitError of the namespace cap for svc, as CheckService says.
func (l *Limits) checkRetain(old, svc *corev1.Service, now time.Time) *LimitError {
	policy, _ := ReleasePolicyOf(svc.Annotations)
	if !policy.Retain {
		return nil
	}
	if old != nil {
		if was, err := ReleasePolicyOf(old.Annotations); err == nil && was.Retain {
			return nil
		}
	}
	adding := wouldKeep(svc)
	if adding == 0 {
		return nil
	}
	own := svc.Name
	return l.namespaceRoom(svc.Namespace, adding, now, func(r Reservation) bool { return r.For.Name == own })
}

// wouldKeep returns how many addresses svc keeps when deleted: none for ExternalName and headless,
// 2 when it asks for two families, else 1.
func wouldKeep(svc *corev1.Service) int {
	if svc.Spec.Type == corev1.ServiceTypeExternalName || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return 0
	}
	if p := svc.Spec.IPFamilyPolicy; p != nil && (*p == corev1.IPFamilyPolicyPreferDualStack || *p == corev1.IPFamilyPolicyRequireDualStack) {
		return 2
	}
	return 1
}

// namespaceRoom returns nil if namespace ns may keep adding more addresses, counting its
// reservations but those skip reports true for, and its *LimitError otherwise.
func (l *Limits) namespaceRoom(ns string, adding int, now time.Time, skip func(Reservation) bool) *LimitError {
	limit, forbidden, value := l.maxRetained(ns)
	if forbidden != "" {
		return &LimitError{Cap: CapNamespace, Name: ns, Adding: adding, Value: value, Forbidden: forbidden}
	}
	kept := l.index.CountForNamespace(ns, now, skip)
	if kept+adding > limit {
		return &LimitError{Cap: CapNamespace, Name: ns, Kept: kept, Adding: adding, Max: limit, Value: value}
	}
	return nil
}

// maxRetained returns the cap of namespace ns, or why it may not retain, with the annotation's
// value.
func (l *Limits) maxRetained(ns string) (limit int, forbidden, value string) {
	noAnnotation := "its Namespace has no " + AnnotationMaxRetained + " annotation"
	if l == nil || l.namespaces == nil {
		return 0, noAnnotation, ""
	}
	obj, err := l.namespaces.Get(ns)
	if err != nil {
		return 0, noAnnotation, ""
	}
	value, ok := obj.Annotations[AnnotationMaxRetained]
	if !ok {
		return 0, noAnnotation, ""
	}
	n, err := ParseMaxRetained(value)
	if err != nil {
		return 0, fmt.Sprintf("annotation %s of Namespace %q is %q, not a decimal integer of at least 0", AnnotationMaxRetained, ns, value), value
	}
	if n == 0 {
		return 0, fmt.Sprintf("annotation %s of Namespace %q is 0", AnnotationMaxRetained, ns), value
	}
	return n, "", value
}

// KeptOnDelete returns the reservation ip, a ClusterIP of the Service svc deleted at now, becomes
// under svc's release policy and ip's release cooldown ([KeptOnDelete]) within the caps, and
// whether it becomes one, with the refusals of the caps that changed the outcome (for a log line
// and a count) and the errors of ServiceCIDR annotations that do not parse (which count as no
// cap):
//   - a Retain policy keeps ip only if the namespace of svc, with ip, stays within its cap;
//     otherwise ip is kept by the release cooldown alone, if any;
//   - what is then kept is kept only if no ServiceCIDR that can hand ip out goes over its cap
//     with it; otherwise ip is released.
//
// The reservation of ip itself, if one exists already, is not counted against it.
func (l *Limits) KeptOnDelete(svc types.NamespacedName, ip netip.Addr, policy ReleasePolicy, cooldown time.Duration, now time.Time) (Reservation, bool, []*LimitError, error) {
	var refused []*LimitError
	if policy.Retain {
		if err := l.namespaceRoom(svc.Namespace, 1, now, func(r Reservation) bool { return r.Addr == ip }); err != nil {
			refused = append(refused, err)
			policy = ReleasePolicy{}
		}
	}
	r, ok := KeptOnDelete(svc, ip, policy, cooldown, now)
	if !ok {
		return Reservation{}, false, refused, nil
	}
	capErr, bad := l.serviceCIDRRoom(ip, now)
	if capErr != nil {
		return Reservation{}, false, append(refused, capErr), bad
	}
	return r, true, refused, bad
}

// serviceCIDRRoom returns the *LimitError of the first ServiceCIDR that can hand ip out and has
// no room for it, counting from the informer, and the errors of annotations that do not parse.
func (l *Limits) serviceCIDRRoom(ip netip.Addr, now time.Time) (*LimitError, error) {
	if l == nil || l.cidrs == nil {
		return nil, nil
	}
	cidrs, err := l.cidrs.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("reservation: list ServiceCIDRs: %w", err)
	}
	return ServiceCIDRRoom(cidrs, ip, func(p netip.Prefix) int { return l.index.CountIn(p, now, ip) })
}

// ServiceCIDRRoom returns nil if keeping one more reservation, of ip, stays within the
// [AnnotationMaxReserved] cap of every ServiceCIDR in cidrs that can hand ip out, and otherwise
// the [*LimitError] of the first that it exceeds, for its prefix that holds ip; count gives how
// many reservations a prefix holds, not counting ip's. An annotation that does not parse counts as
// no cap: its [*InvalidError], wrapped with the ServiceCIDR's name, is returned besides (joined
// when there are several). Nil entries, ServiceCIDRs without the annotation and CIDRs that do not
// parse are skipped, and count is not called for them.
func ServiceCIDRRoom(cidrs []*networkingv1.ServiceCIDR, ip netip.Addr, count func(netip.Prefix) int) (*LimitError, error) {
	ip = ip.Unmap()
	var errs []error
	for _, sc := range cidrs {
		if sc == nil {
			continue
		}
		value, ok := sc.Annotations[AnnotationMaxReserved]
		if !ok {
			continue
		}
		for _, s := range sc.Spec.CIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil || !ipmath.Usable(p.Masked(), ip) {
				continue
			}
			m, err := ParseMaxReserved(value)
			if err != nil {
				errs = append(errs, fmt.Errorf("ServiceCIDR %s: %w", sc.Name, err))
				break
			}
			p = p.Masked()
			kept, limit := count(p), m.Of(p)
			if kept+1 > limit {
				return &LimitError{Cap: CapServiceCIDR, Name: sc.Name, Prefix: p, Kept: kept, Adding: 1, Max: limit, Value: value}, errors.Join(errs...)
			}
		}
	}
	return nil, errors.Join(errs...)
}

// logCaps logs, for ip of the deleted Service svc, each cap that refused to keep it and each
// ServiceCIDR cap that does not parse; kept is whether ip is kept all the same (by a cooldown).
func logCaps(logger klog.Logger, svc types.NamespacedName, ip netip.Addr, kept bool, refused []*LimitError, bad error) {
	if bad != nil {
		logger.Error(bad, "Ignoring a cap on reservations that does not parse", "ip", ip)
	}
	for _, e := range refused {
		logger.Info("A cap on reservations refused to keep the address of a deleted Service", "ip", ip, "service", svc, "cap", e.Cap, "keptByCooldown", kept, "reason", e.Message())
	}
}

// checkCaps returns the *LimitError of the first ServiceCIDR whose AnnotationMaxReserved cap
// addr would exceed, counting the reservations the API server lists, or the error of an
// annotation that does not parse (see Client.Reserve).
func (c *Client) checkCaps(ctx context.Context, addr netip.Addr) error {
	list, err := c.client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("reservation: list ServiceCIDRs: %w", err)
	}
	var cidrs []*networkingv1.ServiceCIDR
	for i := range list.Items {
		if _, ok := list.Items[i].Annotations[AnnotationMaxReserved]; ok && list.Items[i].DeletionTimestamp == nil {
			cidrs = append(cidrs, &list.Items[i])
		}
	}
	if len(cidrs) == 0 {
		return nil
	}
	all, err := c.List(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	capErr, bad := ServiceCIDRRoom(cidrs, addr, func(p netip.Prefix) int {
		n := 0
		for _, r := range all {
			if r.Addr != addr && p.Contains(r.Addr) && !r.Expired(now) {
				n++
			}
		}
		return n
	})
	if capErr != nil {
		return capErr
	}
	return bad
}
