package reservation

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"

	"github.com/kube-ipam/clusterip/allocator"
)

// releaseAttempts bounds how many times Release reads the object again after its delete lost a
// race (the object changed or was replaced between the Get and the Delete).
const releaseAttempts = 5

// Client reserves, releases and lists reservations through the API server, with no cache: every
// call reads what it decides on. It keeps no state but the client.
//
// The zero Client is invalid: its methods return an error matching allocator.ErrInvalid. A Client
// is safe for concurrent use.
type Client struct {
	client kubernetes.Interface
}

// New returns a Client that works through client. A nil client returns an error matching
// allocator.ErrInvalid.
func New(client kubernetes.Interface) (*Client, error) {
	if client == nil {
		return nil, errNilClient
	}
	return &Client{client: client}, nil
}

// ready returns errNilClient for a Client without a client.
func (c *Client) ready() error {
	if c == nil || c.client == nil {
		return errNilClient
	}
	return nil
}

// Reserve records r: it creates the IPAddress object ObjectFor(r) gives, so that no Service gets
// r.Addr by dynamic allocation. Before it writes, it checks, in this order:
//   - r with [Validate]: an [*InvalidError];
//   - that a ServiceCIDR not being deleted can hand r.Addr out (lists them): outside every one,
//     an *allocator.NotInRangeError with no Range (it matches allocator.ErrMismatchedNetwork); inside
//     some but their network address, or IPv4 broadcast address, in each, an
//     *allocator.NotInRangeError naming the first such ServiceCIDR prefix;
//   - that no ServiceCIDR that can hand r.Addr out goes over its [AnnotationMaxReserved] cap with
//     it (the reservations listed, only when one has the annotation; r.Addr's own is not
//     counted): a [*LimitError] naming the ServiceCIDR and its cap (it matches [ErrCapped]). An
//     annotation that does not parse refuses too, with its [*InvalidError]: an operator who
//     reserves by hand can fix it, and no delete waits on it;
//   - that no IPAddress object holds r.Addr (a Get): a [*HeldError] naming its parentRef and
//     manager, unless it is this very reservation (same address, For, Name, Expires and Reason),
//     for which Reserve returns nil, so a retried Reserve succeeds;
//   - that no Service lists r.Addr in spec.clusterIPs (a List of every Service, in pages of
//     500: its cost grows with the cluster's Services): a [*HeldError] naming the Service. This
//     catches a Service whose address has no IPAddress object, as Services allocated by a Legacy
//     kube-apiserver have until the IPAddress repair loop creates theirs; the object is checked
//     first and decides the common case.
//
// A refusal writes nothing. The create itself is the lock: if another writer creates the object
// after the checks (a Service allocated in between, another Reserve), the API server answers
// AlreadyExists and Reserve returns the [*HeldError] of the object it finds then. Both errors of
// the held kind match allocator.ErrAllocated. Errors of the API server are returned wrapped.
func (c *Client) Reserve(ctx context.Context, r Reservation) error {
	if err := c.ready(); err != nil {
		return err
	}
	obj, err := ObjectFor(r)
	if err != nil {
		return err
	}
	if err := c.checkInServiceCIDR(ctx, r.Addr); err != nil {
		return err
	}
	if err := c.checkCaps(ctx, r.Addr); err != nil {
		return err
	}
	ipas := c.client.NetworkingV1().IPAddresses()
	existing, err := ipas.Get(ctx, obj.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		return heldBy(existing, r)
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("reservation: read IPAddress %s: %w", obj.Name, err)
	}
	if err := c.checkServices(ctx, r.Addr); err != nil {
		return err
	}
	if _, err := ipas.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("reservation: create IPAddress %s: %w", obj.Name, err)
		}
		existing, getErr := ipas.Get(ctx, obj.Name, metav1.GetOptions{})
		if getErr != nil {
			// Gone again already: whoever held it held it at the create.
			return &HeldError{Addr: r.Addr}
		}
		return heldBy(existing, r)
	}
	return nil
}

// heldBy returns nil if obj records r itself, and otherwise the *HeldError obj makes.
func heldBy(obj *networkingv1.IPAddress, r Reservation) error {
	if got, ok := FromObject(obj); ok && same(got, r) {
		return nil
	}
	return &HeldError{Addr: r.Addr, Holder: ownerOf(obj.Spec.ParentRef), ManagedBy: obj.Labels[networkingv1.LabelManagedBy]}
}

// same reports whether a and b are the same reservation, their ends compared as instants.
func same(a, b Reservation) bool {
	return a.Addr == b.Addr && a.For == b.For && a.Name == b.Name && a.Reason == b.Reason && a.Expires.Equal(b.Expires)
}

// ownerOf returns the Owner a parentRef names; the zero Owner for none.
func ownerOf(p *networkingv1.ParentReference) allocator.Owner {
	if p == nil {
		return allocator.Owner{}
	}
	return allocator.Owner{Group: p.Group, Resource: p.Resource, Namespace: p.Namespace, Name: p.Name}
}

// checkInServiceCIDR returns nil if a live ServiceCIDR can hand addr out ([Served]), and the
// *allocator.NotInRangeError Reserve documents otherwise.
func (c *Client) checkInServiceCIDR(ctx context.Context, addr netip.Addr) error {
	list, err := c.client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("reservation: list ServiceCIDRs: %w", err)
	}
	cidrs := make([]*networkingv1.ServiceCIDR, len(list.Items))
	for i := range list.Items {
		cidrs[i] = &list.Items[i]
	}
	if Served(cidrs, addr) {
		return nil
	}
	for _, sc := range cidrs {
		if sc.DeletionTimestamp != nil {
			continue // the error names a range that serves: none does here
		}
		for _, s := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(s); err == nil && p.Masked().Contains(addr) {
				return &allocator.NotInRangeError{IP: addr, Range: p.Masked()}
			}
		}
	}
	return &allocator.NotInRangeError{IP: addr}
}

// checkServices returns a *HeldError if a Service lists addr in spec.clusterIPs (or, for a
// Service written before clusterIPs existed, spec.clusterIP), read as kube-apiserver reads them.
func (c *Client) checkServices(ctx context.Context, addr netip.Addr) error {
	var held error
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return c.client.CoreV1().Services(metav1.NamespaceAll).List(ctx, opts)
	})
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		svc, ok := obj.(*corev1.Service)
		if !ok {
			return nil
		}
		ips := svc.Spec.ClusterIPs
		if len(ips) == 0 && svc.Spec.ClusterIP != "" {
			ips = []string{svc.Spec.ClusterIP}
		}
		for _, s := range ips {
			if ip, err := allocator.ParseClusterIP(s); err == nil && ip == addr {
				held = &HeldError{Addr: addr, Holder: allocator.ServiceOwner(svc)}
				return held
			}
		}
		return nil
	})
	if held != nil {
		return held
	}
	if err != nil {
		return fmt.Errorf("reservation: list Services: %w", err)
	}
	return nil
}

// Release deletes the reservation of addr, if there is one, and returns nil; an address with no
// IPAddress object returns nil too. It reads the object, and deletes it only if it is labelled as
// a reservation ([IsReservation]; a malformed one too), with its UID and resourceVersion as
// preconditions, so it never deletes an object that took its place in between; if the delete
// loses such a race it reads again, up to 5 times. An object of anyone else, such as the
// IPAddress of a Service's allocation, is never deleted: Release returns a [*HeldError] naming
// its holder (it matches allocator.ErrAllocated). An invalid addr (allocator.CheckAddr) returns
// an [*InvalidError] and reads nothing. Errors of the API server are returned wrapped.
func (c *Client) Release(ctx context.Context, addr netip.Addr) error {
	if err := c.ready(); err != nil {
		return err
	}
	if err := checkAddr(addr); err != nil {
		return err
	}
	ipas := c.client.NetworkingV1().IPAddresses()
	name := addr.String()
	var err error
	for range releaseAttempts {
		var obj *networkingv1.IPAddress
		obj, err = ipas.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("reservation: read IPAddress %s: %w", name, err)
		case !IsReservation(obj):
			return &HeldError{Addr: addr, Holder: ownerOf(obj.Spec.ParentRef), ManagedBy: obj.Labels[networkingv1.LabelManagedBy]}
		}
		uid, rv := obj.UID, obj.ResourceVersion
		err = ipas.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err):
			return fmt.Errorf("reservation: delete IPAddress %s: %w", name, err)
		}
	}
	return fmt.Errorf("reservation: delete IPAddress %s: changed on each of %d attempts: %w", name, releaseAttempts, err)
}

// List returns every reservation, sorted by address. It reads the IPAddress objects labelled
// managed-by [ManagedBy] from the API server (never a cache) in pages of 500 with client-go's
// tools/pager, from one consistent snapshot unless it expires before the last page, when it
// lists once more in full. Objects so labelled that [FromObject] refuses (malformed by hand) are
// left out; [Client.Release] still deletes them. Expired reservations are listed: nothing in this
// package deletes them (see [Reservation.Expired]).
func (c *Client) List(ctx context.Context) ([]Reservation, error) {
	objs, err := c.ListObjects(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Reservation, 0, len(objs))
	for i := range objs {
		r, _ := FromObject(&objs[i]) // ListObjects keeps only those it takes
		out = append(out, r)
	}
	return out, nil
}

// ListObjects returns the IPAddress objects of the reservations [Client.List] returns, in the
// same order, read the same way: for a caller that keeps or prints the objects whole.
func (c *Client) ListObjects(ctx context.Context) ([]networkingv1.IPAddress, error) {
	if err := c.ready(); err != nil {
		return nil, err
	}
	type item struct {
		addr netip.Addr
		obj  *networkingv1.IPAddress
	}
	var items []item
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return c.client.NetworkingV1().IPAddresses().List(ctx, opts)
	})
	selector := labels.Set{networkingv1.LabelManagedBy: ManagedBy}.AsSelector().String()
	err := p.EachListItem(ctx, metav1.ListOptions{LabelSelector: selector}, func(obj runtime.Object) error {
		if ipa, ok := obj.(*networkingv1.IPAddress); ok {
			if r, ok := FromObject(ipa); ok {
				items = append(items, item{r.Addr, ipa})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reservation: list IPAddresses: %w", err)
	}
	slices.SortFunc(items, func(a, b item) int { return a.addr.Compare(b.addr) })
	out := make([]networkingv1.IPAddress, 0, len(items))
	for _, it := range items {
		out = append(out, *it.obj)
	}
	return out, nil
}
