// This file is not part of Kubernetes: each kube-apiserver fork of github.com/kube-ipam/clusterip
// (forks/<release> in its repository; the file is kept once, in forks/common) adds it to package
// k8s.io/kubernetes/pkg/registry/core/rest. It puts clusterip's allocators behind kube-apiserver's
// ipallocator.Interface, and runs them and clusterip's repair controller in place of
// kube-apiserver's own. What differs by release is in clusterip_release.go.
//
// This file builds the allocators, when the Service registry is built, and holds them;
// clusterip_repair.go starts them and the repair controller once the server serves, and
// clusterip_ipallocator.go is what the registry calls, one clusterIPAllocator per IP family.

package rest

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/registry/core/service/ipallocator"
	ipaddressstore "k8s.io/kubernetes/pkg/registry/networking/ipaddress/storage"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/reservation"
)

// clusterIPAllocators are clusterip's allocators of the cluster's Service IP families. The
// registry gets one clusterIPAllocator per family at once, from the flags; the allocators behind
// them are built by the PostStartHook start-service-ip-repair-controllers (see repairRunner),
// because in DualWrite mode clusterip.New may list IPAddress objects through the loopback client,
// which only answers once the server serves. Until then every allocation fails with
// ipallocator.ErrNotReady, and the server does not report ready.
//
// The zero value is not usable; build it with newClusterIPAllocators. It is safe for concurrent
// use.
type clusterIPAllocators struct {
	mode    featuregate.Mode
	ranges  []netip.Prefix
	storage storagebackend.ConfigForResource // of the Services: etcd's servers, TLS files and prefix
	config  *Config
	ready   atomic.Pointer[clusterip.Allocators] // nil until started

	// writes is how the allocators write IPAddress objects: clusterIPWritesLoopback or
	// clusterIPWritesRegistry (see clusterIPWritesEnv).
	writes string
	// reservations is whether the allocators keep reservations (see clusterIPReservationsEnv),
	// and claims the claims a failed create or update may yet undo.
	reservations bool
	claims       pendingClaims

	mu        sync.Mutex // guards destroyed, ipAddresses and the store of ready
	destroyed bool
	// ipAddresses is the registry the allocators' IPAddress creates and deletes go to with
	// clusterIPWritesRegistry (see useRESTOptions); nil until the server's REST storage is
	// built, and in Legacy mode or with clusterIPWritesLoopback.
	ipAddresses *ipaddressstore.REST
}

// clusterIPVersion returns the kube-apiserver version whose semantics the allocators must have:
// this binary's version, as component-base's compatibility registry holds it for kube-apiserver,
// and the version it emulates (--emulated-version, the binary's own by default), as the feature
// gates hold it that select the mode. The gates are the process's, which every server in it
// obeys; kube-apiserver's in-process test server keeps a compatibility registry of its own, but
// sets the gates' emulated version from it.
func clusterIPVersion() (binary, emulated *version.Version) {
	binary = compatibility.DefaultComponentGlobalsRegistry.EffectiveVersionFor(basecompatibility.DefaultKubeComponent).BinaryVersion()
	return binary, utilfeature.DefaultMutableFeatureGate.EmulationVersion()
}

// newClusterIPAllocators checks the --service-cluster-ip-range flag as clusterip does and returns
// the allocators of its families: the primary (the flag's first range), and every family's. It
// registers the ServiceCIDR and IPAddress informers the allocators will use, so that the generic
// server starts them with the others.
func (c *Config) newClusterIPAllocators(storage *storagebackend.ConfigForResource) (*clusterIPAllocators, ipallocator.Interface, map[api.IPFamily]ipallocator.Interface, error) {
	flag := []string{c.Services.ClusterIPRange.String()}
	if c.Services.SecondaryClusterIPRange.IP != nil {
		flag = append(flag, c.Services.SecondaryClusterIPRange.String())
	}
	ranges, err := clusterip.ParseRanges(strings.Join(flag, ","))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cannot create cluster IP allocator: %w", err)
	}
	writes, err := clusterIPWrites(os.Getenv(clusterIPWritesEnv))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cannot create cluster IP allocator: %w", err)
	}
	a := &clusterIPAllocators{mode: clusterIPMode(), ranges: ranges, storage: *storage, config: c, writes: writes}
	if a.reservations, err = clusterIPReservations(os.Getenv(clusterIPReservationsEnv), a.mode); err != nil {
		return nil, nil, nil, fmt.Errorf("cannot create cluster IP allocator: %w", err)
	}
	if a.mode != featuregate.Legacy {
		c.Informers.Networking().V1().ServiceCIDRs().Informer()
		ipInformer := c.Informers.Networking().V1().IPAddresses().Informer()
		if a.reservations {
			// The reservations' index, which the allocators built once the server serves
			// find there: an informer takes a new index only before it starts.
			if _, err := reservation.NewIndex(ipInformer); err != nil {
				return nil, nil, nil, fmt.Errorf("cannot create cluster IP allocator: %w", err)
			}
		}
	}
	byFamily := map[api.IPFamily]ipallocator.Interface{}
	var primary ipallocator.Interface
	for i, r := range ranges {
		f := api.IPFamily(allocator.FamilyOf(r.Addr()))
		al := &clusterIPAllocator{all: a, family: f, cidr: ipNetOf(r)}
		byFamily[f] = al
		if i == 0 {
			primary = al
		}
	}
	klog.InfoS("Service ClusterIPs are allocated by clusterip", "mode", a.mode, "ranges", flag, "ipAddressWrites", writes, "reservations", a.reservations)
	return a, primary, byFamily, nil
}

// clusterIPConfig returns the clusterip.Config of the allocators and of the repair controller:
// the flag ranges, an etcd client built from the Service storage's transport (nil in
// IPAddressOnly mode), its prefix, a clientset of the loopback client config (whose IPAddress
// creates and deletes go to the IPAddress registry in this process with clusterIPWritesRegistry),
// and the server's shared informer factory. The caller closes the etcd client.
func (a *clusterIPAllocators) clusterIPConfig() (clusterip.Config, error) {
	cfg := clusterip.Config{
		Mode:         a.mode,
		Ranges:       a.ranges,
		Informers:    a.config.Informers,
		Registerer:   legacyregistry.Registerer(),
		Reservations: a.reservations,
	}
	// The one place the fork tells the library which release's semantics to have: this binary's
	// version and the version it emulates (clusterIPVersion), and the one gate of the library's
	// validation that --feature-gates may set besides the mode's. The mode above already follows
	// --emulated-version, through the server's own feature gates.
	binary, emulated := clusterIPVersion()
	v := basecompatibility.NewEffectiveVersion(binary, false, version.MajorMinor(0, 0), version.MajorMinor(0, 0))
	v.SetEmulationVersion(emulated)
	cfg.Version = v
	cfg.FeatureGates = map[string]bool{
		string(features.StrictIPCIDRValidation): utilfeature.DefaultFeatureGate.Enabled(features.StrictIPCIDRValidation),
	}
	klog.V(2).InfoS("ClusterIP allocators configured", "mode", a.mode, "binaryVersion", binary, "emulatedVersion", emulated)
	client, err := kubernetes.NewForConfig(a.config.LoopbackClientConfig)
	if err != nil {
		return cfg, err
	}
	cfg.Client = client
	if a.mode != featuregate.Legacy && a.writes == clusterIPWritesRegistry {
		a.mu.Lock()
		registry := a.ipAddresses
		a.mu.Unlock()
		if registry == nil {
			return cfg, fmt.Errorf("%s=%s: the server built no IPAddress registry", clusterIPWritesEnv, clusterIPWritesRegistry)
		}
		cfg.Client = registryClientset{client, registry}
	}
	if a.mode == featuregate.IPAddressOnly {
		return cfg, nil
	}
	etcd, err := newClusterIPEtcdClient(a.storage.Transport)
	if err != nil {
		return cfg, fmt.Errorf("etcd client for the Service IP bitmaps: %w", err)
	}
	cfg.Bitmaps = etcdstore.Stores{Client: etcd, Prefix: a.storage.Prefix}
	return cfg, nil
}

// start makes allocs the allocators that the registry's calls go to. It reports false, and
// closes allocs, if the registry has been destroyed.
func (a *clusterIPAllocators) start(allocs *clusterip.Allocators) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.destroyed {
		allocs.Close()
		return false
	}
	a.ready.Store(allocs)
	return true
}

// destroy closes the allocators, if started, and the IPAddress registry. It is idempotent.
func (a *clusterIPAllocators) destroy() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.destroyed {
		return
	}
	a.destroyed = true
	if allocs := a.ready.Load(); allocs != nil {
		allocs.Close()
	}
	if a.ipAddresses != nil {
		a.ipAddresses.Destroy()
	}
}

// ipNetOf returns p as a net.IPNet, 4 bytes long for IPv4.
func ipNetOf(p netip.Prefix) net.IPNet {
	bits := p.Addr().BitLen()
	return net.IPNet{IP: net.IP(p.Masked().Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}
