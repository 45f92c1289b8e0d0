package reservation

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	corev1informers "k8s.io/client-go/informers/core/v1"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// Claimer gives a Service created without a ClusterIP the address reserved for it: the
// reservation kept For its namespace and name, of the family asked for, that has not expired.
// Claiming turns the reservation's IPAddress object into the Service's allocation in one update,
// guarded by its resourceVersion: the managed-by label becomes the allocator's and the
// annotations go; the object, its name and its parentRef (which already names the Service) stay,
// so no other allocator can take the address at any instant. allocator/service uses a Claimer
// through its Options.Reserved.
//
// A Claimer reads reservations from an IPAddress informer, to which NewClaimer adds an index.
// Create it before the informer starts. A Claimer is safe for concurrent use.
type Claimer struct {
	client    networkingv1client.IPAddressInterface
	index     *Index
	cidrs     networkingv1informers.ServiceCIDRInformer // nil: no release cooldown
	nss       corev1informers.NamespaceInformer         // nil: no namespace may retain
	limits    *Limits
	managedBy string
	now       func() time.Time
}

// ClaimerOption adjusts [NewClaimer].
type ClaimerOption func(*Claimer)

// WithServiceCIDRs makes the Claimer read the release cooldown of a deleted Service's addresses
// ([AnnotationReleaseCooldown]) from the ServiceCIDRs informer shows, which the caller starts
// (and which should have synced before Services are deleted: until then an address has no
// cooldown), and give no Service a reserved address that no live ServiceCIDR there serves
// ([Served]): such a reservation stays, and the Service gets a dynamic address. Default none:
// no address has a cooldown and every reservation may be claimed. A nil informer keeps the
// default.
func WithServiceCIDRs(informer networkingv1informers.ServiceCIDRInformer) ClaimerOption {
	return func(c *Claimer) {
		if informer != nil {
			c.cidrs = informer
		}
	}
}

// WithNamespaces makes the Claimer read the caps of namespaces ([AnnotationMaxRetained]) from
// the Namespaces informer shows, which the caller starts: only a namespace whose Namespace has
// the annotation may keep addresses with a Retain policy, up to its cap (see [Limits]). Default
// none: no namespace may retain, and a Service with a Retain policy is refused. A nil informer
// keeps the default.
func WithNamespaces(informer corev1informers.NamespaceInformer) ClaimerOption {
	return func(c *Claimer) {
		if informer != nil {
			c.nss = informer
		}
	}
}

// NewClaimer returns a Claimer that reads reservations from informer and updates them with
// client, labelling a claimed object managed by managedBy, the allocator's label (empty means
// kube-apiserver's "ipallocator.k8s.io", as package ipaddress writes it), adjusted by opts. It
// adds an index to informer, which fails once the informer has started. A nil client or
// informer is an error matching allocator.ErrInvalid.
func NewClaimer(client kubernetes.Interface, informer networkingv1informers.IPAddressInformer, managedBy string, opts ...ClaimerOption) (*Claimer, error) {
	if client == nil || informer == nil {
		return nil, fmt.Errorf("reservation: NewClaimer needs a client and an IPAddress informer: %w", allocator.ErrInvalid)
	}
	if managedBy == "" {
		managedBy = ipaddress.DefaultManagedBy
	}
	index, err := NewIndex(informer.Informer())
	if err != nil {
		return nil, err
	}
	c := &Claimer{client: client.NetworkingV1().IPAddresses(), index: index, managedBy: managedBy, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	if c.cidrs != nil {
		c.cidrs.Informer() // registers the informer with its factory, so that the caller's Start starts it
	}
	c.limits = newLimits(index, c.nss, c.cidrs)
	return c, nil
}

// Reserved returns the address reserved for owner (a Service, by namespace and name) in family,
// as the informer shows it, and whether there is one. Of several, the lowest address is given.
// With [WithServiceCIDRs], a reservation of an address no live ServiceCIDR serves ([Served]) is
// not given. A dry run of a Service create shows it.
func (c *Claimer) Reserved(family corev1.IPFamily, owner allocator.Owner) (netip.Addr, bool) {
	r, ok := c.lookup(family, owner)
	return r.Addr, ok
}

// lookup returns the reservation Reserved names.
func (c *Claimer) lookup(family corev1.IPFamily, owner allocator.Owner) (Reservation, bool) {
	if owner.Group != "" || owner.Resource != serviceResource || owner.Name == "" {
		return Reservation{}, false
	}
	key := types.NamespacedName{Namespace: owner.Namespace, Name: owner.Name}
	if c.cidrs == nil {
		r, _, ok := c.index.Lowest(key, family, c.now())
		return r, ok
	}
	cidrs, err := c.cidrs.Lister().List(labels.Everything())
	if err != nil {
		return Reservation{}, false
	}
	r, _, ok := c.index.LowestServed(key, family, c.now(), cidrs)
	return r, ok
}

// Claim gives owner the address reserved for it in family (see Reserved): it updates the
// reservation's object into owner's allocation and returns the address, with an undo that turns
// the object back into the reservation it was (for a Service create that then fails). It returns
// the zero Addr, a nil undo and nil when nothing is reserved for owner, or when the reservation
// went or kept changing while it was claimed (deleted between the read and the update, or a
// Conflict at every retry): the Service then gets a dynamic address, as if it had lost the race;
// allocator.ErrNotReady (wrapped) before the informer has synced; and an API error, wrapped, when
// the update fails for another reason. After a Conflict it reads the object again: one that is
// no longer a reservation for owner (claimed or released meanwhile) is not claimed.
func (c *Claimer) Claim(ctx context.Context, family corev1.IPFamily, owner allocator.Owner) (netip.Addr, func(context.Context) error, error) {
	if !c.index.HasSynced() {
		return netip.Addr{}, nil, fmt.Errorf("reservation: the IPAddress informer has not synced: %w", allocator.ErrNotReady)
	}
	r, ok := c.lookup(family, owner)
	if !ok {
		return netip.Addr{}, nil, nil
	}
	var live Reservation
	updated, err := c.update(ctx, r.Addr, func(obj *networkingv1.IPAddress) bool {
		var ok bool
		live, ok = FromObject(obj)
		if !ok || live.For != r.For || live.Expired(c.now()) {
			return false
		}
		obj.Labels[networkingv1.LabelManagedBy] = c.managedBy
		delete(obj.Annotations, AnnotationExpires)
		delete(obj.Annotations, AnnotationReason)
		return true
	})
	if apierrors.IsConflict(err) {
		// Changed at every read, past the retries: another kube-apiserver is claiming or
		// releasing it. The Service gets a dynamic address, as a lost race for it would.
		klog.FromContext(ctx).Info("Not claiming a reservation that keeps changing", "ip", r.Addr, "service", owner, "err", err)
		return netip.Addr{}, nil, nil
	}
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("reservation: claim %s for %s: %w", r.Addr, owner, err)
	}
	if !updated {
		return netip.Addr{}, nil, nil
	}
	return r.Addr, func(ctx context.Context) error { return c.unclaim(ctx, live) }, nil
}

// unclaim turns the object of r.Addr back into the reservation r, if it is still the claimed
// allocation of r's Service (the allocator's label, r's parentRef).
func (c *Claimer) unclaim(ctx context.Context, r Reservation) error {
	want, err := ObjectFor(r)
	if err != nil {
		return err
	}
	_, err = c.update(ctx, r.Addr, func(obj *networkingv1.IPAddress) bool {
		if !c.allocationOf(obj, r.Owner()) {
			return false // not our claim any more
		}
		obj.Labels, obj.Annotations = want.Labels, want.Annotations
		return true
	})
	if err != nil {
		return fmt.Errorf("reservation: restore the reservation of %s: %w", r.Addr, err)
	}
	return nil
}

// CheckService returns the field error that refuses svc, being created (old nil) or updated from
// old: a release policy that does not parse, or a Retain policy the caps on reservations refuse
// (see [Limits.CheckService]; the namespace's cap is read with [WithNamespaces] only: without it
// no namespace may retain). Nil when svc may go on.
func (c *Claimer) CheckService(old, svc *corev1.Service) *field.Error {
	return c.limits.CheckService(old, svc, c.now())
}

// Retain keeps ip, one of the ClusterIPs of svc, which is being deleted, as svc's release policy
// and the release cooldown of ip's ServiceCIDR say (see [KeptOnDelete]; the cooldown only with
// [WithServiceCIDRs]), within the caps on reservations ([Limits.KeptOnDelete]: a cap that
// refuses is logged, and the address released or kept by a cooldown alone): it updates the IPAddress object of ip, the Service's allocation, into a
// reservation kept for svc's namespace and name, with the end [KeptOnDelete] gives, in one
// update guarded by the object's resourceVersion, so no allocator can take the address at any
// instant ([Keep]); it reports true, also when the object already is that reservation (a delete
// retried). It reports false, changing nothing, when neither the policy nor a cooldown keeps ip,
// the policy annotation does not parse, or the object is not svc's allocation (another parent,
// or none): the caller then releases ip as usual. A cooldown
// annotation that does not parse is logged (klog, from ctx) and counts as none. An API error
// other than a Conflict is returned.
func (c *Claimer) Retain(ctx context.Context, svc *corev1.Service, ip netip.Addr) (bool, error) {
	policy, err := ReleasePolicyOf(svc.Annotations)
	if err != nil {
		return false, nil
	}
	svcKey := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	r, ok, refused, bad := c.limits.KeptOnDelete(svcKey, ip, policy, c.cooldown(ctx, ip), c.now())
	logCaps(klog.FromContext(ctx), svcKey, ip, ok, refused, bad)
	if !ok {
		return false, nil
	}
	want, err := ObjectFor(r)
	if err != nil {
		return false, nil
	}
	owner := allocator.Owner{Resource: serviceResource, Namespace: svc.Namespace, Name: svc.Name}
	kept, err := Keep(ctx, c.client, want, func(obj *networkingv1.IPAddress) bool { return c.allocationOf(obj, owner) })
	if err != nil {
		return false, fmt.Errorf("reservation: retain %s of %s: %w", ip, svcKey, err)
	}
	return kept, nil
}

// cooldown returns the release cooldown of ip from the ServiceCIDR informer (0 without one),
// logging the annotations that do not parse.
func (c *Claimer) cooldown(ctx context.Context, ip netip.Addr) time.Duration {
	if c.cidrs == nil {
		return 0
	}
	d, err := ReleaseCooldownIn(c.cidrs.Lister(), ip)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Ignoring a release cooldown that does not parse", "ip", ip)
	}
	return d
}

// allocationOf reports whether obj is the allocation of owner by the Claimer's allocator: its
// managed-by label and owner as its parentRef.
func (c *Claimer) allocationOf(obj *networkingv1.IPAddress, owner allocator.Owner) bool {
	return obj.Labels[networkingv1.LabelManagedBy] == c.managedBy && obj.Spec.ParentRef != nil && ownerOf(obj.Spec.ParentRef) == owner
}

// update reads the IPAddress object of ip from the API server and, if change accepts it (changing
// the copy it is given), writes it back, guarded by the resourceVersion read; after a Conflict it
// reads the object again, as client-go's retry.RetryOnConflict does. It reports whether it wrote:
// false, with no error, when the object is gone or change refuses it.
func (c *Claimer) update(ctx context.Context, ip netip.Addr, change func(*networkingv1.IPAddress) bool) (bool, error) {
	wrote := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := c.client.Get(ctx, ip.String(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		obj = obj.DeepCopy()
		if obj.Labels == nil {
			obj.Labels = map[string]string{}
		}
		if !change(obj) {
			return nil
		}
		_, err = c.client.Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return nil // deleted since the read: gone, as above
		}
		if err != nil {
			return err
		}
		wrote = true
		return nil
	})
	return wrote, err
}
