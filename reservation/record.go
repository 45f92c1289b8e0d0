package reservation

import (
	"net/netip"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/allocator"
)

// The facts of the record. A reservation is a networking.k8s.io/v1 IPAddress object named after
// the canonical address and labelled ipaddress.kubernetes.io/managed-by: [ManagedBy].
const (
	// ManagedBy is the ipaddress.kubernetes.io/managed-by label of every reservation. Because it
	// is not kube-apiserver's ipallocator.k8s.io, kube-apiserver's allocators take the address
	// for allocated and its repair loop leaves the object alone (see the package doc).
	ManagedBy = "reservations.clusterip.kube-ipam.io"
	// Group is the parentRef group of an anonymous reservation: a reservation kept for no Service.
	Group = "clusterip.kube-ipam.io"
	// Resource is the parentRef resource of an anonymous reservation; the parentRef's name is the
	// reservation's [Reservation.Name]. No such resource is served: the parentRef only names.
	Resource = "reservations"
	// AnnotationExpires holds when a reservation ends, in RFC 3339 in UTC with as many fractional
	// seconds as it has ("2030-01-02T03:04:05Z", "2030-01-02T03:04:05.5Z"). It is absent for a
	// reservation that never ends.
	AnnotationExpires = "clusterip.kube-ipam.io/expires"
	// AnnotationReason holds why the address is reserved, free text for people; absent when
	// there is none.
	AnnotationReason = "clusterip.kube-ipam.io/reason"
)

// serviceResource is the parentRef resource of a reservation kept for a Service, in the core group.
const serviceResource = "services"

// Reservation is an address no Service gets by dynamic allocation: kept for a Service that does
// not exist yet (For), or anonymous, under a name of its own (Name). Exactly one of For and Name is
// set; [Validate] says what else a Reservation must be.
//
// The zero Reservation is invalid. Reservation is a small value, safe to copy and for concurrent
// use.
type Reservation struct {
	// Addr is the reserved address, unzoned and unmapped.
	Addr netip.Addr
	// For is the Service the address is kept for, by namespace and name, which stay the same
	// when the Service is deleted and created again (a UID does not). The zero value means the
	// reservation is anonymous.
	For types.NamespacedName
	// Name names an anonymous reservation, a DNS label such as "block-a"; empty when For is set.
	Name string
	// Expires is when the reservation ends, such as the end of a cooldown; the zero Time means
	// never. It is kept to the nanosecond, in UTC.
	Expires time.Time
	// Reason says why the address is reserved, for people; may be empty.
	Reason string
}

// Expired reports whether r has an end and now is not before it. A reservation that never ends
// is never expired.
func (r Reservation) Expired(now time.Time) bool {
	return !r.Expires.IsZero() && !now.Before(r.Expires)
}

// Owner returns the parentRef r is recorded with, as an allocator.Owner: the Service r.For in the
// core group, or the anonymous reservation r.Name of [Group] and [Resource].
func (r Reservation) Owner() allocator.Owner {
	if r.For != (types.NamespacedName{}) {
		return allocator.Owner{Resource: serviceResource, Namespace: r.For.Namespace, Name: r.For.Name}
	}
	return allocator.Owner{Group: Group, Resource: Resource, Name: r.Name}
}

// ObjectFor returns the IPAddress object that records r: named after r.Addr's canonical form,
// labelled with its IP family and managed-by [ManagedBy], with r.Owner() as parentRef and the
// [AnnotationExpires] and [AnnotationReason] annotations when r has an end or a reason. It is the
// object [Client.Reserve] creates. An r that [Validate] refuses returns its error and no object.
func ObjectFor(r Reservation) (*networkingv1.IPAddress, error) {
	if err := Validate(r); err != nil {
		return nil, err
	}
	obj := &networkingv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{
			Name: r.Addr.String(),
			Labels: map[string]string{
				networkingv1.LabelIPAddressFamily: string(allocator.FamilyOf(r.Addr)),
				networkingv1.LabelManagedBy:       ManagedBy,
			},
		},
	}
	o := r.Owner()
	obj.Spec.ParentRef = &networkingv1.ParentReference{Group: o.Group, Resource: o.Resource, Namespace: o.Namespace, Name: o.Name}
	if !r.Expires.IsZero() {
		setAnnotation(obj, AnnotationExpires, r.Expires.UTC().Format(time.RFC3339Nano))
	}
	if r.Reason != "" {
		setAnnotation(obj, AnnotationReason, r.Reason)
	}
	return obj, nil
}

func setAnnotation(obj *networkingv1.IPAddress, key, value string) {
	if obj.Annotations == nil {
		obj.Annotations = map[string]string{}
	}
	obj.Annotations[key] = value
}

// IsReservation reports whether obj is labelled as a reservation: its managed-by label is
// [ManagedBy]. Such an object is a reservation's to delete even if it is malformed; [FromObject]
// reads one that is well formed.
func IsReservation(obj *networkingv1.IPAddress) bool {
	return obj != nil && obj.Labels[networkingv1.LabelManagedBy] == ManagedBy
}

// FromObject returns the Reservation obj records and true, or the zero Reservation and false if
// obj is nil, not labelled as a reservation (see [IsReservation]), or malformed: a name that is
// not an address in canonical form, a parentRef of neither a reservation's shapes (a Service in
// the core group, or [Group] and [Resource] with no namespace), an [AnnotationExpires] that is not
// RFC 3339, or any value [Validate] refuses. The ip-family label is not read; the family is the
// address's. Expires comes back in UTC, so FromObject(ObjectFor(r)) gives r with r.Expires in UTC.
func FromObject(obj *networkingv1.IPAddress) (Reservation, bool) {
	if !IsReservation(obj) || obj.Spec.ParentRef == nil {
		return Reservation{}, false
	}
	addr, err := netip.ParseAddr(obj.Name)
	if err != nil || addr.String() != obj.Name {
		return Reservation{}, false
	}
	r := Reservation{Addr: addr, Reason: obj.Annotations[AnnotationReason]}
	switch p := obj.Spec.ParentRef; {
	case p.Group == "" && p.Resource == serviceResource:
		r.For = types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	case p.Group == Group && p.Resource == Resource && p.Namespace == "":
		r.Name = p.Name
	default:
		return Reservation{}, false
	}
	expires, err := expiresOf(obj)
	if err != nil {
		return Reservation{}, false
	}
	r.Expires = expires
	if Validate(r) != nil {
		return Reservation{}, false
	}
	return r, true
}

// expiresOf returns the end obj's [AnnotationExpires] annotation records, in UTC: the zero Time
// without one, an error for a value that does not parse.
func expiresOf(obj *networkingv1.IPAddress) (time.Time, error) {
	s, ok := obj.Annotations[AnnotationExpires]
	if !ok {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, err
	}
	return t.UTC(), nil
}
