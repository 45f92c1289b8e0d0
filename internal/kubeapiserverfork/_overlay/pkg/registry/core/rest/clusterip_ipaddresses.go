// This file is not part of Kubernetes: the kube-apiserver fork of
// github.com/kube-ipam/clusterip adds it to package k8s.io/kubernetes/pkg/registry/core/rest with
// go build -overlay, beside clusterip.go.

package rest

import (
	"context"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"
	registryrest "k8s.io/apiserver/pkg/registry/rest"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	"k8s.io/client-go/kubernetes"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/networking"
	ipaddressstore "k8s.io/kubernetes/pkg/registry/networking/ipaddress/storage"
)

// The fork writes the IPAddress objects of its allocators through the IPAddress registry in its
// own process, where stock kube-apiserver v1.33 sends each create and delete to itself through
// the loopback client. The objects, their storage version, encryption at rest, validation and
// watch events are the same; what the writes no longer pass through is the request path: TLS
// and HTTP to itself, authentication, authorization, priority and fairness (the loopback user is
// exempt from it anyway), admission (webhooks and policies on ipaddresses do not see them),
// audit (no entries for them) and field management (the objects have no managedFields).
// kube-apiserver writes its Service IP bitmaps to storage the same way. Reads, watches, and
// every other object, go through the loopback client as before.

// newIPAddressRegistry returns a registry of IPAddress objects straight on etcd, configured by
// factory as the served networking.k8s.io ipaddresses are, but without a watch cache: only the
// allocators' creates and deletes use it, and every watcher sees them through the served
// registry's cache, which watches etcd. Destroy it on shutdown.
func newIPAddressRegistry(factory serverstorage.StorageFactory) (*ipaddressstore.REST, error) {
	return ipaddressstore.NewREST(undecoratedRESTOptions{factory})
}

// undecoratedRESTOptions is a generic.RESTOptionsGetter of registries on etcd without a watch
// cache, from a storage factory.
type undecoratedRESTOptions struct{ factory serverstorage.StorageFactory }

// GetRESTOptions implements generic.RESTOptionsGetter.
func (o undecoratedRESTOptions) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	cfg, err := o.factory.NewConfig(resource, example)
	if err != nil {
		return generic.RESTOptions{}, err
	}
	return generic.RESTOptions{
		StorageConfig:           cfg,
		Decorator:               generic.UndecoratedStorage,
		DeleteCollectionWorkers: 1,
		ResourcePrefix:          o.factory.ResourcePrefix(resource),
	}, nil
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
	created, err := s.registry.Create(genericapirequest.WithNamespace(ctx, metav1.NamespaceNone), obj, nil, &opts)
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
	_, _, err := s.registry.Delete(genericapirequest.WithNamespace(ctx, metav1.NamespaceNone), name, registryrest.ValidateAllObjectFunc, &opts)
	return err
}
