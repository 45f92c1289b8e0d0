// Package embedetcd starts the clusterip command's local etcd in the command's own process, so
// that a command installed with "go install", without a clone of the repository, needs no etcd
// binary: the tests run the same server as a child process built from the repository (see
// localcluster.EtcdBinary), and package embedded of internal/localcluster/etcdserver configures
// it in both cases.
package embedetcd

import (
	"context"

	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/localcluster/etcdserver/embedded"
)

var _ localcluster.EtcdServer = (*embedded.Member)(nil)

// Start is a [localcluster.EtcdStarter] that starts the member in this process.
func Start(config []byte) (localcluster.EtcdServer, error) {
	return embedded.Start(config)
}

// StartEtcd starts an etcd as [localcluster.StartEtcd] does with opts, in this process.
func StartEtcd(ctx context.Context, opts localcluster.EtcdOptions) (*localcluster.Etcd, error) {
	opts.Start = Start
	return localcluster.StartEtcd(ctx, opts)
}
