// This file is not part of Kubernetes: each kube-apiserver fork of github.com/kube-ipam/clusterip
// (forks/<release> in its repository; the file is kept once, in forks/common) adds it to package
// k8s.io/kubernetes/pkg/registry/core/rest, beside clusterip.go. It holds what every release
// builds the same way in the etcd client of the Service IP bitmaps; newClusterIPEtcdClient, in
// clusterip_release.go, adds what differs by release (gRPC metrics, tracing, the wait for the
// connection). A release without bitmaps (v1.38) builds no client and leaves these unused.

package rest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/apiserver/pkg/storage/storagebackend"
)

// The etcd client settings kube-apiserver's storage uses for its own clients.
const (
	etcdDialTimeout      = 20 * time.Second
	etcdKeepaliveTime    = 30 * time.Second
	etcdKeepaliveTimeout = 10 * time.Second
)

// clusterIPEtcdTLS returns the TLS configuration of t's TLS files, or nil if t names none
// (plain HTTP).
func clusterIPEtcdTLS(t storagebackend.TransportConfig) (*tls.Config, error) {
	var tlsConfig *tls.Config
	if t.CertFile != "" || t.KeyFile != "" || t.TrustedCAFile != "" {
		var err error
		tlsInfo := transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.TrustedCAFile}
		if tlsConfig, err = tlsInfo.ClientConfig(); err != nil {
			return nil, err
		}
	}
	return tlsConfig, nil
}

// dialClusterIPEtcd returns a client of the etcd servers t names, with tlsConfig, dialOptions
// (the release's) followed by t's egress selector's dialer for etcd
// (--egress-selector-config-file), the dial and keepalive timeouts of kube-apiserver's storage,
// and etcd's default logger, named clusterip-etcd-client.
func dialClusterIPEtcd(t storagebackend.TransportConfig, tlsConfig *tls.Config, dialOptions []grpc.DialOption) (*clientv3.Client, error) {
	if t.EgressLookup != nil {
		egressDialer, err := t.EgressLookup(egressselector.Etcd.AsNetworkContext())
		if err != nil {
			return nil, fmt.Errorf("the egress selector's dialer for etcd: %w", err)
		}
		if egressDialer != nil {
			dialOptions = append(dialOptions, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return egressDialer(ctx, "tcp", addr)
			}))
		}
	}
	logger, err := logutil.CreateDefaultZapLogger(zap.InfoLevel)
	if err != nil {
		logger = zap.NewNop()
	}
	return clientv3.New(clientv3.Config{
		Endpoints:            t.ServerList,
		TLS:                  tlsConfig,
		DialTimeout:          etcdDialTimeout,
		DialKeepAliveTime:    etcdKeepaliveTime,
		DialKeepAliveTimeout: etcdKeepaliveTimeout,
		DialOptions:          dialOptions,
		Logger:               logger.Named("clusterip-etcd-client"),
	})
}
