package reservation_test

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/reservation"
)

// ExampleKeptOnDelete reads the release cooldown of the ServiceCIDR an address lies in, as
// `kubectl annotate servicecidr kubernetes clusterip.kube-ipam.io/release-cooldown=10m` sets it,
// and shows what a deleted Service's address becomes under each release policy. A value that does
// not parse is an error and counts as no cooldown.
func ExampleKeptOnDelete() {
	cidrs := []*networkingv1.ServiceCIDR{{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Annotations: map[string]string{reservation.AnnotationReleaseCooldown: "10m"}},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}},
	}}
	ip := netip.MustParseAddr("10.96.0.7")
	cooldown, err := reservation.ReleaseCooldownFor(cidrs, ip)
	fmt.Println(cooldown, err)

	deleted := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	for _, value := range []string{"Release", "Retain/1m", "Retain/1h", "Retain"} {
		policy, _ := reservation.ParseReleasePolicy(value)
		r, ok := reservation.KeptOnDelete(web, ip, policy, cooldown, deleted)
		if !ok {
			fmt.Printf("%s: freed\n", value)
			continue
		}
		end := "no end"
		if !r.Expires.IsZero() {
			end = r.Expires.Sub(deleted).String()
		}
		fmt.Printf("%s: kept for %s, %s\n", value, r.For, end)
	}

	_, err = reservation.ParseReleaseCooldown("soon")
	fmt.Println(errors.Is(err, allocator.ErrInvalid))
	// Output:
	// 10m0s <nil>
	// Release: kept for default/web, 10m0s
	// Retain/1m: kept for default/web, 10m0s
	// Retain/1h: kept for default/web, 1h0m0s
	// Retain: kept for default/web, no end
	// true
}
