package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// TestShippedWebhookGuardsAnAddressHandedOut runs the shipped webhook (see startShippedWebhook)
// beside stock kube-apiserver of each release the tests build, serving a /28 with one address
// left, X, recorded as handed out to default/web (as the webhook records it before it deletes
// web's reservation): a Service asking for any address is refused, since kube-apiserver's
// dynamic pick of X is refused as if X existed and it finds no other, and X has no IPAddress
// object after; web asking for X gets it.
//
// Stock v1.33.13 dual writes by default, and there the guard costs web its address for a while:
// its AllocateNext sets X's bit in the bitmap first and, when the IPAddress create is refused,
// returns the error without clearing the bit, so web asking for X is refused ("provided IP is
// already allocated"); v1.33 runs no bitmap repair once MultiCIDRServiceAllocator is on, so
// nothing in kube-apiserver clears it. The thief is refused all the same. docs/reservations.md
// says so.
func TestShippedWebhookGuardsAnAddressHandedOut(t *testing.T) {
	t.Parallel()
	tests := []struct {
		release string
		// stockLeaksTheBit: the release dual writes and leaves X's bit set when its dynamic
		// pick's IPAddress create is refused, so web is refused X.
		stockLeaksTheBit bool
	}{
		{"v1.33.13", true},
		{"v1.36.3", false},
		{"v1.37.2", false},
	}
	for _, tt := range tests {
		t.Run(tt.release, func(t *testing.T) {
			t.Parallel()
			testShippedWebhookGuardsAnAddressHandedOut(t, tt.release, tt.stockLeaksTheBit)
		})
	}
}

func testShippedWebhookGuardsAnAddressHandedOut(t *testing.T, release string, stockLeaksTheBit bool) {
	webKey := types.NamespacedName{Namespace: "default", Name: "web"}
	s := startShippedWebhook(t, shippedOptions{Release: release, ServiceClusterIPRange: "10.96.0.0/28"})
	api, ctx := s.api.Client, t.Context()
	ipas := api.NetworkingV1().IPAddresses()

	// Fill the range but for one address, X (14 usable; the kubernetes Service and the
	// webhook's hold some).
	free := func() []netip.Addr {
		var out []netip.Addr
		for a := netip.MustParseAddr("10.96.0.1"); a.Compare(netip.MustParseAddr("10.96.0.14")) <= 0; a = a.Next() {
			if _, err := ipas.Get(ctx, a.String(), metav1.GetOptions{}); apierrors.IsNotFound(err) {
				out = append(out, a)
			}
		}
		return out
	}
	for i := 0; len(free()) > 1; i++ {
		if _, err := api.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService(fmt.Sprintf("fill-%d", i), ""), metav1.CreateOptions{}); err != nil {
			t.Fatalf("fill the range: %v", err)
		}
	}
	left := free()
	if len(left) != 1 {
		t.Fatalf("addresses left in 10.96.0.0/28: %v, want one", left)
	}
	x := left[0]

	// The record of a hand-out of X to default/web, as the webhook writes it.
	obj, err := reservation.ObjectFor(reservation.Reservation{Addr: x, For: webKey, Reason: "guard"})
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	holder, at, secs := webKey.String(), metav1.NewMicroTime(time.Now()), int32(90)
	if _, err := api.CoordinationV1().Leases("kube-system").Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: webhook.HandoutName(x), Labels: map[string]string{webhook.LabelHandout: "true"},
			Annotations: map[string]string{webhook.AnnotationHandoutReservation: string(data)}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, AcquireTime: &at, LeaseDurationSeconds: &secs},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Once the webhook's informer holds the record, it refuses another Service asking for X.
	poll(t, "the webhook to know the record", func() bool {
		_, err := api.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService("probe", x.String()), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsInvalid(err) && strings.Contains(err.Error(), "already allocated")
	})

	// The refusal reaches the thief as the range being full, or, where stock dual writes, as
	// its bitmap pick's IPAddress create being refused.
	wantThief := "range is full"
	if stockLeaksTheBit {
		wantThief = "failed to allocate a serviceIP: provided IP is already allocated"
	}
	_, err = api.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService("thief", ""), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), wantThief) {
		t.Errorf("a Service asking for any address, with %s handed out and no other left: %v; want %q", x, err, wantThief)
	}
	if got, err := ipas.Get(ctx, x.String(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after the refused create, IPAddress %s = %+v, %v; want none", x, got, err)
	}
	if _, err := api.CoreV1().Services("default").Get(ctx, "thief", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused Service exists: %v", err)
	}

	web, err := api.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService(webKey.Name, x.String()), metav1.CreateOptions{})
	if stockLeaksTheBit {
		if err == nil || !strings.Contains(err.Error(), "provided IP is already allocated") {
			t.Errorf("default/web asking for %s on %s, whose bit the thief's refused create left set: %v, %v; want refused", x, release, web, err)
		}
		return
	}
	if err != nil || web.Spec.ClusterIP != x.String() {
		t.Fatalf("default/web asking for %s, handed out to it: %v, %v", x, web, err)
	}
}
