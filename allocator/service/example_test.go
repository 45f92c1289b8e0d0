package service_test

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/bitmap"
)

// ExampleAllocator gives a dual-stack Service its ClusterIPs from two in-memory bitmaps,
// downgrades it to single-stack, and shows the 422 another Service gets for the same address.
func ExampleAllocator() {
	ctx := context.Background()
	v4, _ := bitmap.New(netip.MustParsePrefix("10.96.0.0/16"))
	v6, _ := bitmap.New(netip.MustParsePrefix("fd00:10:96::/112"))
	services := service.New(corev1.IPv4Protocol, map[corev1.IPFamily]allocator.Interface{
		corev1.IPv4Protocol: v4,
		corev1.IPv6Protocol: v6,
	})

	// Create a dual-stack Service with a chosen primary address; the secondary is picked.
	require := corev1.IPFamilyPolicyRequireDualStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeClusterIP,
			IPFamilyPolicy: &require,
			ClusterIP:      "10.96.0.10",
		},
	}
	txn, err := services.Allocate(ctx, svc, false)
	if err != nil {
		panic(err)
	}
	if err := txn.Commit(ctx); err != nil { // the registry stored the Service
		panic(err)
	}
	fmt.Println(svc.Spec.ClusterIPs[0], svc.Spec.IPFamilies, *svc.Spec.IPFamilyPolicy, v6.Used())

	// Downgrade it to single-stack: the IPv6 address is released when the update commits.
	single := corev1.IPFamilyPolicySingleStack
	updated := svc.DeepCopy()
	updated.Spec.IPFamilyPolicy = &single
	txn, err = services.Update(ctx, svc, updated, false)
	if err != nil {
		panic(err)
	}
	if err := txn.Commit(ctx); err != nil { // releases the IPv6 address
		panic(err)
	}
	fmt.Println(updated.Spec.ClusterIPs, updated.Spec.IPFamilies, v6.Used())

	// Another Service may not take the same address: a 422 at spec.clusterIPs, as from kube-apiserver.
	other := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10"},
	}
	_, err = services.Allocate(ctx, other, false)
	fmt.Println(apierrors.IsInvalid(err), err.(*apierrors.StatusError).Status().Details.Causes[0].Field)
	// Output:
	// 10.96.0.10 [IPv4 IPv6] RequireDualStack 1
	// [10.96.0.10] [IPv4] 0
	// true spec.clusterIPs
}
