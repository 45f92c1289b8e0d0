package etcdstore_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
)

// This allocates from the Service IP bitmap a kube-apiserver started with
// --service-cluster-ip-range=10.96.0.0/12 keeps in the etcd at 127.0.0.1:2379. It needs that etcd,
// so it is compiled but not run.
func ExampleNew() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	store := etcdstore.New(client, etcdstore.ServiceIPsKey("/registry"))
	p, err := bitmap.NewPersistent(ctx, netip.MustParsePrefix("10.96.0.0/12"), store)
	if err != nil {
		panic(err)
	}
	defer p.Close()
	ip, err := p.AllocateNext(ctx, allocator.Owner{Resource: "services", Namespace: "default", Name: "web"})
	if err != nil {
		panic(err) // wraps a *bitmap.RangeMismatchError if kube-apiserver's bitmap is of another range
	}
	fmt.Println("allocated", ip)
}

// Stores gives clusterip.Config.Bitmaps the keys a kube-apiserver started with
// --etcd-prefix=/registry keeps its bitmaps at: Store(i) for the range at index i of its
// --service-cluster-ip-range.
func ExampleStores() {
	var client *clientv3.Client // the client of kube-apiserver's etcd; not dialled here
	stores := etcdstore.Stores{Client: client, Prefix: "/registry"}
	for i := range 2 {
		fmt.Println(i, stores.Store(i).(*etcdstore.Store).Key())
	}
	// Output:
	// 0 /registry/ranges/serviceips
	// 1 /registry/ranges/secondaryserviceips
}
