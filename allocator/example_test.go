package allocator_test

import (
	"errors"
	"fmt"

	"github.com/kube-ipam/clusterip/allocator"
)

func ExampleParsePrefix() {
	for _, s := range []string{"10.96.0.0/12", "10.96.0.1/12", "10.0.0.0/31", "::ffff:10.0.0.0/104", "::/80"} {
		p, err := allocator.ParsePrefix(s)
		fmt.Println(p, errors.Is(err, allocator.ErrInvalid), err)
	}
	// Output:
	// 10.96.0.0/12 false <nil>
	// invalid Prefix true allocator: invalid range "10.96.0.1/12": host bits set, the range is 10.96.0.0/12
	// invalid Prefix true allocator: invalid range "10.0.0.0/31": no usable addresses
	// invalid Prefix true allocator: invalid range "::ffff:10.0.0.0/104": overlaps the IPv4-mapped IPv6 block ::ffff:0:0/96
	// invalid Prefix true allocator: invalid range "::/80": overlaps the IPv4-mapped IPv6 block ::ffff:0:0/96
}

func ExampleOwner_String() {
	fmt.Println(allocator.Owner{Resource: "services", Namespace: "default", Name: "web", UID: "u-1"})
	fmt.Println(allocator.Owner{Group: "gateway.networking.k8s.io", Resource: "gateways", Name: "gw"})
	// Output:
	// services default/web
	// gateways.gateway.networking.k8s.io gw
}
