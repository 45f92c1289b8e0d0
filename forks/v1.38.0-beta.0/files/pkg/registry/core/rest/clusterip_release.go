// This file is not part of Kubernetes: the kube-apiserver v1.38 fork of
// github.com/kube-ipam/clusterip (forks/v1.38.0-beta.0 in its repository) adds it to package
// k8s.io/kubernetes/pkg/registry/core/rest, beside clusterip.go: what the adapter does as this
// release of kube-apiserver does it. v1.38 has neither the bitmap allocator nor dual write, so its
// mode is always IPAddressOnly and it never builds an etcd client for bitmaps.

package rest

import (
	"errors"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apiserver/pkg/storage/storagebackend"

	"github.com/kube-ipam/clusterip/featuregate"
)

// clusterIPMode returns the mode of stock kube-apiserver v1.38: IPAddressOnly, the only one it
// has. Its gates MultiCIDRServiceAllocator and DisableAllocatorDualWrite are gone, and it
// emulates 1.35 at the lowest, a release that no longer dual writes by default either, so no
// flag of a v1.38 binary selects another mode.
func clusterIPMode() featuregate.Mode {
	return featuregate.IPAddressOnly
}

// errNoBitmaps is what newClusterIPEtcdClient answers: kube-apiserver v1.38 neither reads nor
// writes the Service IP bitmaps (/ranges/serviceips is left in etcd as it was).
var errNoBitmaps = errors.New("kube-apiserver v1.38 has no Service IP bitmaps")

// newClusterIPEtcdClient fails: clusterip.go asks for the bitmaps' etcd client in Legacy and
// DualWrite mode only, which clusterIPMode never returns in this release.
func newClusterIPEtcdClient(storagebackend.TransportConfig) (*clientv3.Client, error) {
	return nil, errNoBitmaps
}
