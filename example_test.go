package clusterip_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/servicecidr"
)

// ExampleNew builds the allocators of a cluster in IPAddressOnly mode, the default of
// kube-apiserver 1.34, on a fake clientset holding the ServiceCIDR that kube-apiserver creates from
// its --service-cluster-ip-range. A registry passes its real client and informer factory, and for
// Legacy and DualWrite mode also Config.Bitmaps: etcdstore.Stores of the etcd kube-apiserver
// stores in.
func ExampleNew() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewSimpleClientset(&networkingv1.ServiceCIDR{ //nolint:staticcheck // the simple fake needs no apply configurations
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/29"}},
	})
	factory := informers.NewSharedInformerFactory(client, 0)

	mode, _ := featuregate.ModeFor("1.34")
	ranges, err := clusterip.ParseRanges("10.96.0.0/29") // 8 addresses, the fewest kube-apiserver takes
	if err != nil {
		panic(err)
	}
	allocs, err := clusterip.New(ctx, clusterip.Config{Mode: mode, Ranges: ranges, Client: client, Informers: factory})
	if err != nil {
		panic(err)
	}
	defer allocs.Close()
	factory.Start(ctx.Done()) // after New, which registers the informers
	done := make(chan error)
	go func() { done <- allocs.Run(ctx) }()
	if err := allocs.WaitReady(ctx); err != nil { // the ServiceCIDR is synced and ready
		panic(err)
	}

	ipv4 := allocs.For(corev1.IPv4Protocol)
	owner := allocator.Owner{Resource: "services", Namespace: "default", Name: "web"}
	fmt.Println(allocs.Mode(), allocs.Families())
	fmt.Println(ipv4.Allocate(ctx, netip.MustParseAddr("10.96.0.1"), owner))
	for _, ip := range []string{"10.96.0.2", "10.96.0.3", "10.96.0.4", "10.96.0.5"} {
		if err := ipv4.Allocate(ctx, netip.MustParseAddr(ip), owner); err != nil {
			panic(err)
		}
	}
	fmt.Println(ipv4.AllocateNext(ctx, owner)) // the last free address
	_, err = ipv4.AllocateNext(ctx, owner)
	fmt.Println(errors.Is(err, allocator.ErrFull))
	fmt.Println(allocs.For(corev1.IPv6Protocol) == nil)

	cancel()
	fmt.Println(<-done)
	// Output:
	// IPAddressOnly [IPv4]
	// <nil>
	// 10.96.0.6 <nil>
	// true
	// true
	// <nil>
}

// ExampleAllocators_Services gives a Service its ClusterIP as kube-apiserver's Service registry
// does, through the allocators New built: the fields the registry stores are filled in, and the
// address is held until the Service is released.
func ExampleAllocators_Services() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewSimpleClientset(&networkingv1.ServiceCIDR{ //nolint:staticcheck // the simple fake needs no apply configurations
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/24"}},
	})
	factory := informers.NewSharedInformerFactory(client, 0)
	ranges, _ := clusterip.ParseRanges("10.96.0.0/24")
	allocs, err := clusterip.New(ctx, clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: ranges, Client: client, Informers: factory})
	if err != nil {
		panic(err)
	}
	defer allocs.Close()
	factory.Start(ctx.Done())
	go func() { _ = allocs.Run(ctx) }()
	if err := allocs.WaitReady(ctx); err != nil { // the ServiceCIDR is synced and ready
		panic(err)
	}

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10"},
	}
	txn, err := allocs.Services().Allocate(ctx, svc, false)
	if err != nil {
		panic(err)
	}
	if err := txn.Commit(ctx); err != nil { // the registry stored the Service
		panic(err)
	}
	fmt.Println(svc.Spec.ClusterIPs, svc.Spec.IPFamilies, *svc.Spec.IPFamilyPolicy)
	fmt.Println(allocs.For(corev1.IPv4Protocol).Has(netip.MustParseAddr("10.96.0.10")))

	fmt.Println(allocs.Services().Release(ctx, svc))
	fmt.Println(allocs.For(corev1.IPv4Protocol).Has(netip.MustParseAddr("10.96.0.10")))
	// Output:
	// [10.96.0.10] [IPv4] SingleStack
	// true
	// <nil>
	// false
}

// ExampleAllocators_WaitReady shows what WaitReady says when its context ends first: here no
// ServiceCIDR exists, as in a cluster whose API server is not kube-apiserver and where nothing
// has created the default one.
func ExampleAllocators_WaitReady() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewSimpleClientset() //nolint:staticcheck // the simple fake needs no apply configurations
	factory := informers.NewSharedInformerFactory(client, 0)
	ranges, _ := clusterip.ParseRanges("10.96.0.0/24")
	allocs, err := clusterip.New(ctx, clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: ranges, Client: client, Informers: factory})
	if err != nil {
		panic(err)
	}
	defer allocs.Close()
	factory.Start(ctx.Done())
	go func() { _ = allocs.Run(ctx) }()

	waitCtx, cancelWait := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelWait()
	err = allocs.WaitReady(waitCtx)
	var notReady *clusterip.NotReadyError
	fmt.Println(errors.As(err, &notReady), notReady.Family)
	fmt.Println(errors.Is(err, clusterip.ErrNoServiceCIDR), errors.Is(err, context.DeadlineExceeded))
	fmt.Println(err)
	// Output:
	// true IPv4
	// true true
	// clusterip: the IPv4 allocator is not ready: no ServiceCIDR has an IPv4 prefix (kube-apiserver creates "kubernetes" from --service-cluster-ip-range; without one, set Config.DefaultServiceCIDR): context deadline exceeded
}

// ExampleNew_defaultServiceCIDR builds the allocators of a registry that runs without a
// kube-apiserver: with Config.DefaultServiceCIDR, Run creates the default ServiceCIDR from the
// flag ranges and sets it ready, as kube-apiserver does, so WaitReady returns.
func ExampleNew_defaultServiceCIDR() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewSimpleClientset() //nolint:staticcheck // the simple fake needs no apply configurations
	factory := informers.NewSharedInformerFactory(client, 0)
	ranges, _ := clusterip.ParseRanges("10.96.0.0/24,fd00::/108")
	allocs, err := clusterip.New(ctx, clusterip.Config{
		Mode: featuregate.IPAddressOnly, Ranges: ranges, Client: client, Informers: factory,
		DefaultServiceCIDR: true,
	})
	if err != nil {
		panic(err)
	}
	defer allocs.Close()
	factory.Start(ctx.Done())
	go func() { _ = allocs.Run(ctx) }()
	if err := allocs.WaitReady(ctx); err != nil {
		panic(err)
	}

	sc, err := client.NetworkingV1().ServiceCIDRs().Get(ctx, servicecidr.DefaultServiceCIDRName, metav1.GetOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(sc.Name, sc.Spec.CIDRs)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack)},
	}
	txn, err := allocs.Services().Allocate(ctx, svc, false)
	if err != nil {
		panic(err)
	}
	if err := txn.Commit(ctx); err != nil {
		panic(err)
	}
	fmt.Println(len(svc.Spec.ClusterIPs), svc.Spec.IPFamilies)
	// Output:
	// kubernetes [10.96.0.0/24 fd00::/108]
	// 2 [IPv4 IPv6]
}
