// Package servicecidr allocates Service ClusterIPs from every networking.k8s.io/v1 ServiceCIDR of
// one IP family, as kube-apiserver's multi-CIDR allocator does (KEP-1880).
//
// An Allocator watches ServiceCIDRs through a shared informer and keeps one per-CIDR allocator
// (an ipaddress.Allocator, which records each address as an IPAddress object) for every distinct
// prefix of its family. It implements allocator.Interface over all of them:
//
//   - AllocateNext picks a ready prefix at random, weighted by its free space, and skips full and
//     not-ready ones; no lock is held across API calls, so concurrent callers proceed in parallel.
//   - An allocation whose ServiceCIDR stops being ready while it is made is undone and retried
//     elsewhere, so no address comes from a ServiceCIDR the Allocator already saw go.
//   - Prefixes may overlap. An address belongs to every prefix that contains it, the network and
//     IPv4 broadcast address of each prefix excluded: 192.168.1.0 is not allocatable from
//     192.168.1.0/24 alone but is once 192.168.0.0/16 exists.
//   - A ServiceCIDR is ready while its Ready condition is True or absent and it is not being
//     deleted. Addresses only in ServiceCIDRs that are not ready are refused with
//     allocator.ErrNotReady; addresses in none with a range-less *allocator.NotInRangeError, which
//     matches allocator.ErrMismatchedNetwork. Until Run has reconciled the synced ServiceCIDR
//     cache once, Allocate and AllocateNext return allocator.ErrNotReady; HasSynced, client-go's
//     signal, tells when that has happened, even where no ServiceCIDR of the family exists.
//
// The LifecycleController is the optional controller that kube-controller-manager runs upstream: it
// adds the networking.k8s.io/service-cidr-finalizer finalizer and the Ready condition, and holds a
// ServiceCIDR that is being deleted (Ready=False, reason Terminating) while any IPAddress would be
// left in no other ready ServiceCIDR. With LifecycleOptions.Recorder it emits Warning Events:
// kube-controller-manager's KubernetesServiceCIDRError when Ready=True cannot be set, and
// Terminating when a deletion becomes blocked.
//
// The DefaultController is the optional controller that kube-apiserver runs itself: it creates the
// default ServiceCIDR, DefaultServiceCIDRName, from the flag ranges if it is missing, sets it
// ready, and reports (in the log and with a Warning Event) a default ServiceCIDR whose ranges are
// not the flags', as the kube-apiserver release named in DefaultOptions.Version does. A registry
// that serves Services without a kube-apiserver runs it, so that the Allocators have a
// ServiceCIDR to allocate from.
//
// A decision that cannot be undone is confirmed against live state. The LifecycleController's
// informer caches drive its cheap checks, but before it removes a finalizer, which lets the
// ServiceCIDR go for good, it lists ServiceCIDRs and IPAddresses from the API server, once per
// deletion attempt, and removes the finalizer with an update that carries the resourceVersion it
// read, so that a decision taken on state that has changed since fails with a Conflict and is
// taken again. A cache that lags behind (an IPAddress created a moment before the deletion, a
// slow or restarted watch) therefore cannot let a ServiceCIDR go while an address is in it.
//
// The files follow the two controllers: allocator.go (the Allocator's type, New and the
// allocator.Interface methods), allocator_run.go (Run and its queue), allocator_handlers.go
// (ServiceCIDR events), allocator_sync.go (one level-based pass over every prefix),
// allocator_options.go and allocator_dryrun.go; lifecycle.go (the LifecycleController's type,
// options, NewLifecycleController and Run), lifecycle_handlers.go, lifecycle_sync.go (one pass
// per ServiceCIDR, with the live confirmation) and lifecycle_grace.go (the grace-period marks);
// default.go is the DefaultController;
// cidrs.go parses spec.cidrs and defines readiness for both, exported as Prefixes and Ready (the
// repair package finds whether an address is in range with Prefixes).
//
// New starts nothing; Allocator.Run, LifecycleController.Run and DefaultController.Run do the work
// and block until their context is done. Start the informer factory after New,
// NewLifecycleController and NewDefaultController so that their informers are registered with it.
package servicecidr
