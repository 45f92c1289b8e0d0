package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	coordinationv1informers "k8s.io/client-go/informers/coordination/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	coordinationv1listers "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/reservation"
)

// The facts of a hand-out record: a coordination.k8s.io/v1 Lease in the webhook's namespace.
const (
	// LabelHandout labels every hand-out record, with the value "true"; the informer of
	// [Handouts] lists by it ([HandoutInformerOptions]).
	LabelHandout = "clusterip.kube-ipam.io/handout"
	// AnnotationHandoutReservation holds the reservation a hand-out replaced: the IPAddress
	// object [reservation.ObjectFor] makes of it, as JSON, with the UID and resourceVersion of the
	// object the webhook deleted.
	AnnotationHandoutReservation = "clusterip.kube-ipam.io/reservation"
	// DefaultHandoutBound is how long a hand-out is given to end in its Service holding the
	// address: kube-apiserver's longest request (60 seconds, its --request-timeout) plus the
	// longest timeoutSeconds a webhook can be given (30 seconds). A Service create that took the
	// hand-out has ended by then, one way or the other.
	DefaultHandoutBound = 90 * time.Second
)

// handoutPrefix begins the name of every hand-out record.
const handoutPrefix = "clusterip-handout-"

// HandoutName returns the name of the record of a hand-out of addr: "clusterip-handout-" and
// the address with its dots or colons as dashes, an IPv6 address written out in full so that the
// name ends in a hex digit ("clusterip-handout-10-96-0-10",
// "clusterip-handout-fd00-0000-0000-0000-0000-0000-0000-0010"). It is a DNS-1123 subdomain, as a
// Lease's name must be, and one address has one name; an IPv4-mapped IPv6 address is named as
// its IPv4 address. The invalid Addr returns "".
func HandoutName(addr netip.Addr) string {
	if !addr.IsValid() {
		return ""
	}
	addr = addr.Unmap().WithZone("")
	s := addr.String()
	if addr.Is6() {
		s = addr.StringExpanded()
	}
	return handoutPrefix + strings.NewReplacer(".", "-", ":", "-").Replace(s)
}

// HandoutInformerOptions returns the options of a shared informer factory whose Lease informer
// [NewHandouts] can use: namespace alone, and the Leases labelled [LabelHandout] alone.
func HandoutInformerOptions(namespace string) []informers.SharedInformerOption {
	return []informers.SharedInformerOption{
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = LabelHandout }),
	}
}

// Handouts is the record of the reservations a [Handler] hands out, shared by every replica of
// the webhook and kept across restarts: before it deletes a reservation to hand it to a Service,
// the Handler writes a Lease named [HandoutName] in the webhook's namespace, holding the Service
// (spec.holderIdentity, namespace/name), the reservation (annotation
// [AnnotationHandoutReservation]) and the time (spec.acquireTime). While it exists, the Handler
// refuses every other Service that asks for the address by spec.clusterIP or spec.clusterIPs, as
// kube-apiserver refuses an address already allocated; the [Controller] deletes it once its
// Service holds the address, and after the bound ([HandoutsOptions]) puts the reservation back
// if no object holds the address.
//
// The zero Handouts is not usable; use [NewHandouts]. A Handouts is safe for concurrent use.
type Handouts struct {
	namespace string
	client    coordinationv1client.LeaseInterface
	leases    coordinationv1listers.LeaseNamespaceLister
	informer  cache.SharedIndexInformer
	bound     time.Duration
}

// HandoutsOptions adjusts [NewHandouts].
type HandoutsOptions struct {
	// Bound is how long after a hand-out the [Controller] waits for its Service to hold the
	// address before it puts the reservation back. Defaults to [DefaultHandoutBound]; a value
	// not above zero keeps the default.
	Bound time.Duration
}

// NewHandouts returns the Handouts kept as Leases in namespace, written with client and read
// from leases, an informer the caller starts: one of a factory made with [HandoutInformerOptions]
// (any other Lease it holds is ignored). An empty namespace or a nil client or informer is an
// error matching allocator.ErrInvalid.
func NewHandouts(client kubernetes.Interface, leases coordinationv1informers.LeaseInformer, namespace string, opts HandoutsOptions) (*Handouts, error) {
	if client == nil || leases == nil || namespace == "" {
		return nil, fmt.Errorf("webhook: NewHandouts needs a client, a Lease informer and a namespace: %w", allocator.ErrInvalid)
	}
	h := &Handouts{
		namespace: namespace,
		client:    client.CoordinationV1().Leases(namespace),
		leases:    leases.Lister().Leases(namespace),
		informer:  leases.Informer(),
		bound:     opts.Bound,
	}
	if h.bound <= 0 {
		h.bound = DefaultHandoutBound
	}
	return h, nil
}

// HasSynced reports whether the Lease informer has synced.
func (h *Handouts) HasSynced() bool { return h.informer.HasSynced() }

// handout is one record as read back: Addr was handed to For at At, replacing Reservation,
// which was the IPAddress object of UID whose delete the record precedes.
type handout struct {
	Addr        netip.Addr
	For         types.NamespacedName
	At          time.Time
	Reservation reservation.Reservation
	UID         types.UID
}

// leaseFor returns the record of a hand-out to svc, at now, of the reservation obj.
func (h *Handouts) leaseFor(svc types.NamespacedName, obj *networkingv1.IPAddress, now time.Time) (*coordinationv1.Lease, error) {
	r, ok := reservation.FromObject(obj)
	if !ok {
		return nil, fmt.Errorf("webhook: IPAddress %s is not a well-formed reservation", obj.Name)
	}
	rec, err := reservation.ObjectFor(r)
	if err != nil {
		return nil, err
	}
	rec.UID, rec.ResourceVersion = obj.UID, obj.ResourceVersion
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("webhook: encode the reservation of %s: %w", obj.Name, err)
	}
	holder := svc.String()
	at := metav1.NewMicroTime(now)
	secs := int32(h.bound.Round(time.Second) / time.Second)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:        HandoutName(r.Addr),
			Namespace:   h.namespace,
			Labels:      map[string]string{LabelHandout: "true"},
			Annotations: map[string]string{AnnotationHandoutReservation: string(data)},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, AcquireTime: &at, LeaseDurationSeconds: &secs},
	}, nil
}

// handoutOf reads a record, reporting false for one that is not well formed.
func handoutOf(l *coordinationv1.Lease) (handout, *networkingv1.IPAddress, bool) {
	if l.Labels[LabelHandout] != "true" || l.Spec.HolderIdentity == nil || l.Spec.AcquireTime == nil {
		return handout{}, nil, false
	}
	ns, name, ok := strings.Cut(*l.Spec.HolderIdentity, "/")
	if !ok || ns == "" || name == "" {
		return handout{}, nil, false
	}
	var obj networkingv1.IPAddress
	if err := json.Unmarshal([]byte(l.Annotations[AnnotationHandoutReservation]), &obj); err != nil {
		return handout{}, nil, false
	}
	r, ok := reservation.FromObject(&obj)
	if !ok || l.Name != HandoutName(r.Addr) {
		return handout{}, nil, false
	}
	return handout{Addr: r.Addr, For: types.NamespacedName{Namespace: ns, Name: name}, At: l.Spec.AcquireTime.Time, Reservation: r, UID: obj.UID}, &obj, true
}

// lookup returns the record of addr as the informer holds it.
func (h *Handouts) lookup(addr netip.Addr) (handout, *coordinationv1.Lease, bool) {
	l, err := h.leases.Get(HandoutName(addr))
	if err != nil {
		return handout{}, nil, false
	}
	rec, _, ok := handoutOf(l)
	return rec, l, ok
}

// record writes the record of the hand-out of the reservation obj to svc, before its delete, and
// returns a func that deletes that record again (its write, by resourceVersion) for when the
// delete fails. A record of the same object (another replica handing it out now) is an error: the
// address is handed out once; a record of an earlier object of the address is from a hand-out
// that has ended, and is replaced (deleted by UID and resourceVersion, and written again). A nil Handouts records nothing and returns no error.
func (h *Handouts) record(ctx context.Context, svc types.NamespacedName, obj *networkingv1.IPAddress, now time.Time) (undo func(context.Context), err error) {
	if h == nil {
		return func(context.Context) {}, nil
	}
	want, err := h.leaseFor(svc, obj, now)
	if err != nil {
		return nil, err
	}
	got, err := h.client.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Read from the informer: a copy older than the record fails the delete's preconditions.
		old, getErr := h.leases.Get(want.Name)
		if getErr != nil {
			return nil, fmt.Errorf("webhook: the hand-out record %s is not in the informer yet: %w", want.Name, getErr)
		}
		if prev, prevObj, ok := handoutOf(old); ok {
			if prevObj.UID == obj.UID && prevObj.ResourceVersion == obj.ResourceVersion {
				return nil, fmt.Errorf("webhook: reservation %s is being handed out already (record %s)", obj.Name, want.Name)
			}
			// The address was reserved again since that hand-out, so it has ended; the
			// controller counts a window lost as soon as another Service is seen holding the
			// address, which comes before such a new reservation, but an informer that lags can
			// leave it uncounted.
			klog.FromContext(ctx).Info("Replacing the record of an earlier hand-out of the address", "record", old.Name, "earlierService", prev.For, "service", svc)
		}
		uid, rv := old.UID, old.ResourceVersion
		if err := h.client.Delete(ctx, old.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("webhook: delete the hand-out record %s of an earlier hand-out: %w", old.Name, err)
		}
		got, err = h.client.Create(ctx, want, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("webhook: write the hand-out record %s: %w", want.Name, err)
	}
	if !h.waitSeen(ctx, got) {
		klog.FromContext(ctx).Info("The hand-out record is not in the informer yet; handing out all the same", "record", got.Name)
	}
	return func(ctx context.Context) {
		uid, rv := got.UID, got.ResourceVersion
		err := h.client.Delete(ctx, got.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		if err != nil && !apierrors.IsNotFound(err) {
			klog.FromContext(ctx).Error(err, "Could not delete the record of a hand-out that did not happen; the controller will", "record", got.Name)
		}
	}, nil
}

// refuseHandedOut returns kube-apiserver's refusal of an address already allocated for a
// Service CREATE or UPDATE that asks by spec.clusterIP or spec.clusterIPs for an address handed
// out to another Service (one not already its own before an UPDATE), or nil.
func (h *Handouts) refuseHandedOut(req *admissionv1.AdmissionRequest, svc *corev1.Service, owner types.NamespacedName) *admissionv1.AdmissionResponse {
	if h == nil {
		return nil
	}
	var had []netip.Addr
	if req.Operation == admissionv1.Update {
		var old corev1.Service
		if err := json.Unmarshal(req.OldObject.Raw, &old); err == nil {
			had = clusterIPs(&old)
		}
	}
	for _, ip := range clusterIPs(svc) {
		if containsAddr(had, ip) {
			continue
		}
		if rec, _, ok := h.lookup(ip); ok && rec.For != owner {
			return &admissionv1.AdmissionResponse{UID: req.UID, Result: alreadyAllocated(owner.Name, svc, ip)}
		}
	}
	return nil
}

// containsAddr reports whether ips holds ip.
func containsAddr(ips []netip.Addr, ip netip.Addr) bool {
	for _, x := range ips {
		if x == ip {
			return true
		}
	}
	return false
}

// alreadyAllocated is kube-apiserver v1.37's answer to a Service named name that asks for ip,
// already allocated: 422 Invalid, field spec.clusterIPs, with the Service's spec.clusterIPs (or
// spec.clusterIP, before kube-apiserver fills clusterIPs in) as JSON.
func alreadyAllocated(name string, svc *corev1.Service, ip netip.Addr) *metav1.Status {
	asked := svc.Spec.ClusterIPs
	if len(asked) == 0 {
		asked = []string{svc.Spec.ClusterIP}
	}
	value, _ := json.Marshal(asked) // a []string always encodes
	detail := fmt.Sprintf("Invalid value: %s: failed to allocate IP %s: provided IP is already allocated", value, ip)
	return &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusUnprocessableEntity,
		Reason:  metav1.StatusReasonInvalid,
		Message: fmt.Sprintf("Service %q is invalid: spec.clusterIPs: %s", name, detail),
		Details: &metav1.StatusDetails{Name: name, Kind: "Service", Causes: []metav1.StatusCause{{
			Type: metav1.CauseTypeFieldValueInvalid, Field: "spec.clusterIPs", Message: detail,
		}}},
	}
}

// ipAddressesResource is what an IPAddress request's Resource is.
var ipAddressesResource = metav1.GroupVersionResource{Group: networkingv1.GroupName, Version: "v1", Resource: "ipaddresses"}

// guard decides on the CREATE of an IPAddress object of an address with a hand-out record: only a
// reservation, or the allocation of the address to the Service the record names, is allowed; any
// other is refused as kube-apiserver refuses an object that exists, 409 AlreadyExists, on which
// kube-apiserver's dynamic pick goes on to the next address and a pick by address answers
// "provided IP is already allocated". So no other Service takes the address in the window
// between the reservation's delete and its Service's allocation. An address without a record, or
// an object that does not decode, is allowed.
func (h *Handouts) guard(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	allow := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if h == nil {
		return allow
	}
	var obj networkingv1.IPAddress
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		return allow
	}
	name := obj.Name
	if name == "" {
		name = req.Name
	}
	addr, err := netip.ParseAddr(name)
	if err != nil {
		return allow
	}
	rec, _, ok := h.lookup(addr)
	if !ok || reservation.IsReservation(&obj) {
		return allow
	}
	if isServiceAllocation(&obj, rec.For) {
		return allow
	}
	return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusConflict, Reason: metav1.StatusReasonAlreadyExists,
		Message: fmt.Sprintf("ipaddresses.networking.k8s.io %q already exists: the address is kept for Service %s", name, rec.For),
		Details: &metav1.StatusDetails{Name: name, Group: networkingv1.GroupName, Kind: "ipaddresses"},
	}}
}

// seenTimeout bounds how long a writer of a record waits for the informer to hold it.
const seenTimeout = 2 * time.Second

// waitSeen waits, up to seenTimeout, until the informer holds l as written (its UID), so that
// [Handouts.guard] knows of it before the reservation's delete frees the address; it reports
// whether it does.
func (h *Handouts) waitSeen(ctx context.Context, l *coordinationv1.Lease) bool {
	ctx, cancel := context.WithTimeout(ctx, seenTimeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(context.Context) (bool, error) {
		got, err := h.leases.Get(l.Name)
		return err == nil && got.UID == l.UID, nil
	})
	return err == nil
}
