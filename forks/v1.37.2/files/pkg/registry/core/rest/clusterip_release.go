// This file is not part of Kubernetes: the kube-apiserver v1.37.2 fork of
// github.com/kube-ipam/clusterip (forks/v1.37.2 in its repository) adds it to package
// k8s.io/kubernetes/pkg/registry/core/rest, beside clusterip.go: what the adapter does as this
// release of kube-apiserver does it, the mode its feature gates select and what its storage adds
// to the etcd client of the bitmaps (clusterip_etcd.go builds the rest, as every release does).

package rest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/tracing"
	"k8s.io/kubernetes/pkg/features"

	"github.com/kube-ipam/clusterip/featuregate"
)

// clusterIPMode returns the mode kube-apiserver's own feature gates select, as stock
// kube-apiserver v1.37 selects its allocators: MultiCIDRServiceAllocator off is Legacy;
// on, DisableAllocatorDualWrite chooses between DualWrite and IPAddressOnly. A v1.37 binary
// emulates 1.34 at the lowest, where MultiCIDRServiceAllocator is locked on, so it reaches
// IPAddressOnly (its default) and DualWrite (--emulated-version=1.34 with
// DisableAllocatorDualWrite=false) only; the gates refuse the other combinations at start-up.
func clusterIPMode() featuregate.Mode {
	switch {
	case !utilfeature.DefaultFeatureGate.Enabled(features.MultiCIDRServiceAllocator):
		return featuregate.Legacy
	case !utilfeature.DefaultFeatureGate.Enabled(features.DisableAllocatorDualWrite):
		return featuregate.DualWrite
	}
	return featuregate.IPAddressOnly
}

// clusterIPEtcdMetrics are the gRPC client metrics of the bitmaps' etcd client, registered in the
// legacy registry once. kube-apiserver v1.37's storage keeps its own client metrics unexported, so
// these are a set of their own, under the "clusterip" namespace (clusterip_grpc_client_…).
var (
	clusterIPEtcdMetrics = grpcprom.NewClientMetrics(grpcprom.WithClientCounterOptions(grpcprom.WithNamespace("clusterip")))
	registerEtcdMetrics  sync.Once
)

// newClusterIPEtcdClient returns a client of the etcd servers t names, built as kube-apiserver
// v1.37's storage builds its own: t's TLS files (none: plain HTTP), its egress selector's dialer
// for etcd (--egress-selector-config-file), OpenTelemetry with t's TracerProvider (a no-op one
// still propagates the context), gRPC client metrics (clusterIPEtcdMetrics), the same dial and
// keepalive timeouts, and a wait until the connection is ready or the dial times out.
func newClusterIPEtcdClient(t storagebackend.TransportConfig) (*clientv3.Client, error) {
	tlsConfig, err := clusterIPEtcdTLS(t)
	if err != nil {
		return nil, err
	}
	registerEtcdMetrics.Do(func() { legacyregistry.RawMustRegister(clusterIPEtcdMetrics) })
	dialOptions := []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(clusterIPEtcdMetrics.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(clusterIPEtcdMetrics.StreamClientInterceptor()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithMessageEvents(otelgrpc.ReceivedEvents, otelgrpc.SentEvents),
			otelgrpc.WithPropagators(tracing.Propagators()),
			otelgrpc.WithTracerProvider(t.TracerProvider),
		)),
	}
	client, err := dialClusterIPEtcd(t, tlsConfig, dialOptions)
	if err != nil {
		return nil, err
	}
	if err := waitEtcdReady(client, etcdDialTimeout); err != nil {
		client.Close()
		return nil, err
	}
	return client, nil
}

// waitEtcdReady waits until client's connection is ready, connecting it if idle, for at most
// timeout, as kube-apiserver v1.37's storage waits for its own client.
func waitEtcdReady(client *clientv3.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn := client.ActiveConnection()
	if conn == nil {
		return errors.New("no grpc connection to etcd")
	}
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, state) {
			return fmt.Errorf("etcd grpc connection not ready: %w", ctx.Err())
		}
	}
}
