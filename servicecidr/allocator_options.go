package servicecidr

import (
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"

	"net/netip"

	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// cidrAllocator is what the Allocator needs from a per-CIDR allocator: allocator.Interface plus a
// switch for the readiness of its ServiceCIDR. ipaddress.Allocator is one.
type cidrAllocator interface {
	allocator.Interface
	// SetReady marks the ServiceCIDR ready or not; a not-ready allocator refuses Allocate and
	// AllocateNext with allocator.ErrNotReady and still releases.
	SetReady(ready bool)
	// Ready reports whether the allocator can allocate: its ServiceCIDR is ready and its own state
	// (such as an informer) is in sync.
	Ready() bool
}

// allocatorFactory builds the per-CIDR allocator of a prefix. It must start no goroutines that
// outlive Close.
type allocatorFactory func(logger klog.Logger, cidr netip.Prefix) (cidrAllocator, error)

// Option configures New.
type Option func(*options)

type options struct {
	factory     allocatorFactory // nil: ipaddress.New with the Allocator's client and informer
	ipaddresses []ipaddress.Option
	managedBy   string // the managed-by label value, given to every per-CIDR allocator
}

// WithManagedBy sets the ipaddress.kubernetes.io/managed-by label of the IPAddress objects the
// Allocator creates (it is passed to every per-CIDR allocator, after WithIPAddressOptions) and by
// which Release recognises them outside any known ServiceCIDR. Default
// ipaddress.DefaultManagedBy, as ipaddress.New's; an empty value keeps the default. An
// ipaddress.WithManagedBy in WithIPAddressOptions is overridden by this value, default or not, so
// the two cannot disagree.
func WithManagedBy(value string) Option {
	return func(o *options) {
		if value != "" {
			o.managedBy = value
		}
	}
}

// WithIPAddressOptions passes opts to ipaddress.New for every per-CIDR allocator, after the
// Allocator's own (the logger of Run's context). Default none. Readiness is managed by the
// Allocator: an ipaddress.WithReady here is overridden as soon as the allocator is created.
func WithIPAddressOptions(opts ...ipaddress.Option) Option {
	return func(o *options) { o.ipaddresses = append(o.ipaddresses, opts...) }
}

// withAllocatorFactory replaces the per-CIDR allocator; tests use in-memory ones. Default: an
// ipaddress.Allocator per prefix. A nil f keeps the default.
func withAllocatorFactory(f allocatorFactory) Option {
	return func(o *options) {
		if f != nil {
			o.factory = f
		}
	}
}

// ipaddressFactory builds an ipaddress.Allocator per prefix, sharing client and the IPAddress
// informer.
func ipaddressFactory(client kubernetes.Interface, ips networkingv1informers.IPAddressInformer, opts []ipaddress.Option) allocatorFactory {
	return func(logger klog.Logger, cidr netip.Prefix) (cidrAllocator, error) {
		all := append([]ipaddress.Option{ipaddress.WithLogger(logger)}, opts...)
		return ipaddress.New(cidr, client, ips, all...)
	}
}
