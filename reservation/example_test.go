package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/reservation"
)

// Example reserves two addresses of a cluster whose ServiceCIDR is 10.96.0.0/28, one kept for a
// Service that does not exist yet and one anonymous until the end of a cooldown, lists them and
// releases one. A program passes its real client, such as kubernetes.NewForConfig's.
func Example() {
	ctx := context.Background()
	client := fake.NewSimpleClientset(&networkingv1.ServiceCIDR{ //nolint:staticcheck // the simple fake needs no apply configurations
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/28"}},
	})
	c, err := reservation.New(client)
	if err != nil {
		panic(err)
	}

	dns := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"),
		For: types.NamespacedName{Namespace: "kube-system", Name: "kube-dns"}, Reason: "the cluster's DNS address"}
	cooldown := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.7"), Name: "cooldown-web",
		Expires: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	for _, r := range []reservation.Reservation{dns, cooldown} {
		if err := c.Reserve(ctx, r); err != nil {
			panic(err)
		}
	}

	// Refusals change nothing, and say why.
	err = c.Reserve(ctx, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), Name: "mine"})
	fmt.Println(errors.Is(err, allocator.ErrAllocated), err)
	err = c.Reserve(ctx, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.15"), Name: "mine"})
	fmt.Println(err)
	err = c.Reserve(ctx, reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.3"), Name: "Mine"})
	fmt.Println(errors.Is(err, allocator.ErrInvalid))

	list, err := c.List(ctx)
	if err != nil {
		panic(err)
	}
	for _, r := range list {
		line := fmt.Sprintf("%s held for %s", r.Addr, r.Owner())
		if !r.Expires.IsZero() {
			line += fmt.Sprintf(" until %s (expired in 2031: %v)", r.Expires.Format(time.RFC3339), r.Expired(time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)))
		}
		if r.Reason != "" {
			line += ": " + r.Reason
		}
		fmt.Println(line)
	}

	if err := c.Release(ctx, cooldown.Addr); err != nil {
		panic(err)
	}
	list, _ = c.List(ctx)
	fmt.Println(len(list), "reservation left")
	// Output:
	// true reservation: 10.96.0.10 is already allocated to services kube-system/kube-dns (managed by reservations.clusterip.kube-ipam.io)
	// allocator: 10.96.0.15 is not in the allocatable range 10.96.0.0/28
	// true
	// 10.96.0.7 held for reservations.clusterip.kube-ipam.io cooldown-web until 2030-01-02T03:04:05Z (expired in 2031: true)
	// 10.96.0.10 held for services kube-system/kube-dns: the cluster's DNS address
	// 1 reservation left
}
