package servicecidr_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/servicecidr"
)

// Example allocates from two ServiceCIDRs held by a fake clientset: a /30 with two usable
// addresses and, once it is full, a second one added while the Allocator runs.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewSimpleClientset(&networkingv1.ServiceCIDR{ //nolint:staticcheck // the simple fake needs no apply configurations
		ObjectMeta: metav1.ObjectMeta{Name: "first"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.0.0.0/30"}},
	})
	factory := informers.NewSharedInformerFactory(client, 0)
	a, err := servicecidr.New(corev1.IPv4Protocol, client,
		factory.Networking().V1().ServiceCIDRs(), factory.Networking().V1().IPAddresses())
	if err != nil {
		panic(err)
	}
	defer a.Close()
	factory.Start(ctx.Done()) // after New, which registers both informers
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	waitFor(func() bool { return a.Ready() })

	owner := allocator.Owner{Resource: "services", Namespace: "default", Name: "web"}
	if err := a.Allocate(ctx, netip.MustParseAddr("10.0.0.1"), owner); err != nil {
		panic(err)
	}
	ip, err := a.AllocateNext(ctx, owner)
	fmt.Println(ip, err)
	_, err = a.AllocateNext(ctx, owner)
	fmt.Println(errors.Is(err, allocator.ErrFull))
	err = a.Allocate(ctx, netip.MustParseAddr("10.0.1.1"), owner)
	fmt.Println(errors.Is(err, allocator.ErrMismatchedNetwork))

	_, err = client.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "second"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.0.1.0/30"}},
	}, metav1.CreateOptions{})
	if err != nil {
		panic(err)
	}
	waitFor(func() bool { return len(a.ReadyCIDRs()) == 2 })
	fmt.Println(a.ReadyCIDRs(), a.Used(), a.Free())
	ip, err = a.AllocateNext(ctx, owner)
	fmt.Println(netip.MustParsePrefix("10.0.1.0/30").Contains(ip), err)

	cancel()
	fmt.Println(<-done)
	// Output:
	// 10.0.0.2 <nil>
	// true
	// true
	// [10.0.0.0/30 10.0.1.0/30] 2 2
	// true <nil>
	// <nil>
}

// ExampleAllocator_HasSynced tells an Allocator that has not caught up with the API server yet
// from one that has and found no ServiceCIDR of its family to allocate from.
func ExampleAllocator_HasSynced() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewSimpleClientset() //nolint:staticcheck // the simple fake needs no apply configurations
	factory := informers.NewSharedInformerFactory(client, 0)
	a, err := servicecidr.New(corev1.IPv4Protocol, client,
		factory.Networking().V1().ServiceCIDRs(), factory.Networking().V1().IPAddresses())
	if err != nil {
		panic(err)
	}
	defer a.Close()
	fmt.Println(a.HasSynced(), a.Ready()) // before Run
	factory.Start(ctx.Done())
	go func() { _ = a.Run(ctx) }()
	waitFor(a.HasSynced)
	fmt.Println(a.HasSynced(), a.Ready()) // synced: there is no ServiceCIDR
	// Output:
	// false false
	// true false
}

// ExampleDefaultController starts a registry that has no kube-apiserver to create the default
// ServiceCIDR: the DefaultController creates it from the flag ranges and sets it ready, and the
// Allocator allocates from it.
func ExampleDefaultController() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewSimpleClientset() //nolint:staticcheck // the simple fake needs no apply configurations
	factory := informers.NewSharedInformerFactory(client, 0)
	cidrs, ips := factory.Networking().V1().ServiceCIDRs(), factory.Networking().V1().IPAddresses()

	flag := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")} // --service-cluster-ip-range
	dc, err := servicecidr.NewDefaultController(flag, client, cidrs, servicecidr.DefaultOptions{})
	if err != nil {
		panic(err)
	}
	a, err := servicecidr.New(corev1.IPv4Protocol, client, cidrs, ips)
	if err != nil {
		panic(err)
	}
	defer a.Close()
	factory.Start(ctx.Done())
	go func() { _ = dc.Run(ctx) }()
	go func() { _ = a.Run(ctx) }()
	waitFor(func() bool { return dc.HasSynced() && a.Ready() })

	sc, err := client.NetworkingV1().ServiceCIDRs().Get(ctx, servicecidr.DefaultServiceCIDRName, metav1.GetOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(sc.Name, sc.Spec.CIDRs, meta.IsStatusConditionTrue(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady))
	ip, err := a.AllocateNext(ctx, allocator.Owner{Resource: "services", Namespace: "default", Name: "web"})
	fmt.Println(flag[0].Contains(ip), err)
	// Output:
	// kubernetes [10.96.0.0/24] true
	// true <nil>
}

// waitFor polls cond for up to ten seconds.
func waitFor(cond func() bool) {
	for deadline := time.Now().Add(10 * time.Second); !cond() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}
