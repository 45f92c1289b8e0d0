// This file is not part of Kubernetes: each kube-apiserver fork of github.com/kube-ipam/clusterip
// (forks/<release> in its repository; the file is kept once, in forks/common) adds it to package
// k8s.io/kubernetes/pkg/registry/core/rest, beside clusterip.go.

package rest

import (
	"context"
	"fmt"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"
	registryrest "k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/client-go/kubernetes"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/networking"
	ipaddressstore "k8s.io/kubernetes/pkg/registry/networking/ipaddress/storage"

	"github.com/kube-ipam/clusterip/featuregate"
)

// How the allocators write their IPAddress objects is the fork operator's choice, made with the
// environment variable CLUSTERIP_IPADDRESS_WRITES of the kube-apiserver process:
//
//   - "loopback", the default: as stock kube-apiserver does, each create and delete is a request
//     to the server itself through the loopback client. It is authenticated as system:apiserver,
//     audited, admitted (webhooks and policies on ipaddresses see it), field-managed (the
//     objects' managedFields name kube-apiserver) and stored through the served ipaddresses
//     resource, with its encryption at rest.
//   - "registry": each create and delete calls an IPAddress registry in this process, configured
//     as the served resource is (the same storage version, prefix and encryption at rest, see
//     useRESTOptions), as kube-apiserver writes its Service IP bitmaps. It skips the request path:
//     TLS and HTTP to itself, authentication, authorization, admission (webhooks and policies on
//     ipaddresses do not see these writes), audit (no entries for them) and field management (the
//     objects have no managedFields). The objects, their validation and the watch events every
//     client sees are the same; each write costs the server less CPU.
//
// Any other value stops the server at start-up. Reads, watches and every other object go through
// the loopback client whatever the choice.
const clusterIPWritesEnv = "CLUSTERIP_IPADDRESS_WRITES"

// The values of clusterIPWritesEnv.
const (
	clusterIPWritesLoopback = "loopback"
	clusterIPWritesRegistry = "registry"
)

// clusterIPWrites returns the write path that value, the value of clusterIPWritesEnv, chooses:
// clusterIPWritesLoopback when it is empty.
func clusterIPWrites(value string) (string, error) {
	switch value {
	case "", clusterIPWritesLoopback:
		return clusterIPWritesLoopback, nil
	case clusterIPWritesRegistry:
		return clusterIPWritesRegistry, nil
	}
	return "", fmt.Errorf("%s=%q: want %q (the default) or %q", clusterIPWritesEnv, value, clusterIPWritesLoopback, clusterIPWritesRegistry)
}

// useClusterIPRESTOptions gives the allocators, if they write IPAddress objects through a registry
// in this process, that registry, built with getter: the server's REST options, whose storage
// configs carry the resource transformers of --encryption-provider-config. Every family's
// allocator shares them; the registry no longer keeps a primary one from v1.38.
func (p *legacyProvider) useClusterIPRESTOptions(getter generic.RESTOptionsGetter) error {
	for _, a := range p.serviceClusterIPAllocators {
		if al, ok := a.(*clusterIPAllocator); ok {
			return al.all.useRESTOptions(getter)
		}
	}
	return nil
}

// useRESTOptions builds the IPAddress registry the allocators write to, if they write through
// one, from getter, the REST options the served ipaddresses resource is built from, so that its
// storage has the same codec, prefix and encryption at rest. The registry has no watch cache:
// only the allocators' creates and deletes use it, and every watcher sees them through the served
// resource's cache, which watches etcd. destroy destroys it.
func (a *clusterIPAllocators) useRESTOptions(getter generic.RESTOptionsGetter) error {
	if a.mode == featuregate.Legacy || a.writes != clusterIPWritesRegistry {
		return nil
	}
	registry, err := ipaddressstore.NewREST(uncachedRESTOptions{getter})
	if err != nil {
		return fmt.Errorf("cannot create cluster IP allocator: the IPAddress registry: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.destroyed || a.ipAddresses != nil {
		registry.Destroy()
		return nil
	}
	a.ipAddresses = registry
	return nil
}

// uncachedRESTOptions is a generic.RESTOptionsGetter that gives what the embedded getter gives,
// storage config and its transformers included, but without a watch cache.
type uncachedRESTOptions struct{ generic.RESTOptionsGetter }

// GetRESTOptions implements generic.RESTOptionsGetter.
func (o uncachedRESTOptions) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	opts, err := o.RESTOptionsGetter.GetRESTOptions(resource, example)
	if err != nil {
		return generic.RESTOptions{}, err
	}
	opts.Decorator = generic.UndecoratedStorage
	return opts, nil
}

// registryClientset is a clientset whose IPAddress creates and deletes go to an IPAddress
// registry in this process; every other call goes to the embedded clientset.
type registryClientset struct {
	kubernetes.Interface
	ipAddresses *ipaddressstore.REST
}

// NetworkingV1 returns the embedded clientset's networking.k8s.io/v1 client with IPAddress
// creates and deletes sent to the registry.
func (c registryClientset) NetworkingV1() networkingv1client.NetworkingV1Interface {
	return registryNetworkingV1{c.Interface.NetworkingV1(), c.ipAddresses}
}

// registryNetworkingV1 is a networking.k8s.io/v1 client whose IPAddress creates and deletes go
// to a registry.
type registryNetworkingV1 struct {
	networkingv1client.NetworkingV1Interface
	ipAddresses *ipaddressstore.REST
}

// IPAddresses returns the embedded client's IPAddress client with creates and deletes sent to
// the registry.
func (n registryNetworkingV1) IPAddresses() networkingv1client.IPAddressInterface {
	return registryIPAddresses{n.NetworkingV1Interface.IPAddresses(), n.ipAddresses}
}

// registryIPAddresses is an IPAddress client whose Create and Delete call a registry in this
// process, with the answers (objects and API status errors) a request would have had.
type registryIPAddresses struct {
	networkingv1client.IPAddressInterface
	registry *ipaddressstore.REST
}

// Create defaults and converts in as the API would decode it, and creates it in the registry
// (dry run included, as opts say).
func (s registryIPAddresses) Create(ctx context.Context, in *networkingv1.IPAddress, opts metav1.CreateOptions) (*networkingv1.IPAddress, error) {
	in = in.DeepCopy()
	legacyscheme.Scheme.Default(in)
	obj := &networking.IPAddress{}
	if err := legacyscheme.Scheme.Convert(in, obj, nil); err != nil {
		return nil, err
	}
	created, err := s.registry.Create(registryContext(ctx, "create", in.Name), obj, nil, &opts)
	if err != nil {
		return nil, err
	}
	out := &networkingv1.IPAddress{}
	if err := legacyscheme.Scheme.Convert(created, out, nil); err != nil {
		return nil, err
	}
	return out, nil
}

// Delete deletes the IPAddress named name from the registry, with opts' preconditions.
func (s registryIPAddresses) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	_, _, err := s.registry.Delete(registryContext(ctx, "delete", name), name, registryrest.ValidateAllObjectFunc, &opts)
	return err
}

// registryContext returns ctx as the registry sees a request with verb on the IPAddress name:
// cluster-scoped, with the RequestInfo of networking.k8s.io/v1 ipaddresses, which declarative
// validation reads the API version from (without it, every create is refused).
func registryContext(ctx context.Context, verb, name string) context.Context {
	ctx = genericapirequest.WithNamespace(ctx, metav1.NamespaceNone)
	return genericapirequest.WithRequestInfo(ctx, &genericapirequest.RequestInfo{
		IsResourceRequest: true,
		Verb:              verb,
		APIPrefix:         "apis",
		APIGroup:          networkingv1.GroupName,
		APIVersion:        "v1",
		Resource:          "ipaddresses",
		Name:              name,
	})
}
