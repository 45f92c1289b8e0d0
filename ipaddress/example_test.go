package ipaddress_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/ipaddress"
)

func Example() {
	ctx := context.Background()
	// A fake clientset stands in for a cluster; with a real one the code is the same.
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	ips := factory.Networking().V1().IPAddresses()

	a, err := ipaddress.New(netip.MustParsePrefix("10.96.0.0/28"), client, ips, ipaddress.WithSeed(1))
	if err != nil {
		panic(err)
	}
	defer a.Close()
	stop := make(chan struct{})
	factory.Start(stop)
	defer factory.Shutdown()
	defer close(stop)
	cache.WaitForCacheSync(stop, a.Ready)

	owner := allocator.Owner{Resource: "services", Namespace: "default", Name: "web"}
	ip, err := a.AllocateNext(ctx, owner)
	if err != nil {
		panic(err)
	}
	obj, err := client.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(obj.Name, obj.Labels["ipaddress.kubernetes.io/ip-family"], obj.Spec.ParentRef.Name)
	fmt.Println(a.Used(), a.Free())

	err = a.Allocate(ctx, ip, owner)
	fmt.Println(err != nil && errors.Is(err, allocator.ErrAllocated))
	// Output:
	// 10.96.0.8 IPv4 web
	// 1 13
	// true
}
