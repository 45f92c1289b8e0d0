// This file is not part of Kubernetes: the kube-apiserver v1.35.4 fork of
// github.com/kube-ipam/clusterip (forks/v1.35.4 in its repository) adds it to package
// k8s.io/kubernetes/pkg/registry/core/rest, beside clusterip.go: what the adapter does as this
// release of kube-apiserver does it, the mode its feature gates select and what its storage adds
// to the etcd client of the bitmaps (clusterip_etcd.go builds the rest, as every release does).

package rest

import (
	grpcprom "github.com/grpc-ecosystem/go-grpc-prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	genericfeatures "k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/tracing"
	"k8s.io/kubernetes/pkg/features"

	"github.com/kube-ipam/clusterip/featuregate"
)

// clusterIPMode returns the mode kube-apiserver's own feature gates select, as stock
// kube-apiserver v1.35 selects its allocators: MultiCIDRServiceAllocator off is Legacy;
// on, DisableAllocatorDualWrite chooses between DualWrite and IPAddressOnly. A v1.35 binary
// reaches Legacy at --emulated-version=1.32, or 1.33 with MultiCIDRServiceAllocator=false, and
// DualWrite at emulated 1.33 or 1.34 with DisableAllocatorDualWrite=false; the gates refuse
// MultiCIDRServiceAllocator=false with DisableAllocatorDualWrite=true at start-up.
func clusterIPMode() featuregate.Mode {
	switch {
	case !utilfeature.DefaultFeatureGate.Enabled(features.MultiCIDRServiceAllocator):
		return featuregate.Legacy
	case !utilfeature.DefaultFeatureGate.Enabled(features.DisableAllocatorDualWrite):
		return featuregate.DualWrite
	}
	return featuregate.IPAddressOnly
}

// newClusterIPEtcdClient returns a client of the etcd servers t names, built as kube-apiserver's
// storage builds its own: t's TLS files (none: plain HTTP), its egress selector's dialer for etcd
// (--egress-selector-config-file), OpenTelemetry tracing with t's TracerProvider when
// APIServerTracing is enabled, the gRPC client metrics of the legacy registry, and the same dial
// and keepalive timeouts. It blocks until a connection is up or the dial times out.
func newClusterIPEtcdClient(t storagebackend.TransportConfig) (*clientv3.Client, error) {
	tlsConfig, err := clusterIPEtcdTLS(t)
	if err != nil {
		return nil, err
	}
	dialOptions := []grpc.DialOption{
		grpc.WithBlock(),
		grpc.WithChainUnaryInterceptor(grpcprom.UnaryClientInterceptor),
		grpc.WithChainStreamInterceptor(grpcprom.StreamClientInterceptor),
	}
	if utilfeature.DefaultFeatureGate.Enabled(genericfeatures.APIServerTracing) {
		dialOptions = append(dialOptions, grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithMessageEvents(otelgrpc.ReceivedEvents, otelgrpc.SentEvents),
			otelgrpc.WithPropagators(tracing.Propagators()),
			otelgrpc.WithTracerProvider(t.TracerProvider),
		)))
	}
	return dialClusterIPEtcd(t, tlsConfig, dialOptions)
}
