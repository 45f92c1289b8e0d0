package repair

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/events"
)

// Defaults of Options.
const (
	// DefaultLeakGrace is the hold-off before a leak is freed when Options.LeakGrace is zero.
	DefaultLeakGrace = 60 * time.Second
	// DefaultInterval is how often Run audits and repairs when Options.Interval is zero, as
	// kube-apiserver's repair loops do.
	DefaultInterval = 3 * time.Minute
	// newerThanParentGrace is the least hold-off of a leaked IPAddress created after the Service
	// its parentRef names, whatever LeakGrace says: kube-apiserver creates the IPAddress of a
	// Service before the Service, and when the create fails because the Service exists already
	// (a POST of an existing Service) it deletes the IPAddress again; repair must not race that
	// undo (kubernetes#132321, fixed upstream by kubernetes#132906 with the same 5 s).
	newerThanParentGrace = 5 * time.Second
	// externalNameParentGrace is the least hold-off of a leaked IPAddress whose parentRef names
	// a Service that is still of type ExternalName: kube-apiserver creates the IPAddress of an
	// update from ExternalName to a type with a ClusterIP before it stores the Service, and
	// repair must not free it while the update is in flight. kube-apiserver's repair holds such
	// an object for its 60 s request timeout from v1.36 (kubernetes#135503); clusterip does in
	// every release, as the race is the same.
	externalNameParentGrace = 60 * time.Second
	// legacyLeakPasses is how many passes a bit must be seen leaked on before Legacy repair frees
	// it, as kube-apiserver does (numRepairsBeforeLeakCleanup).
	legacyLeakPasses = 3
)

// Options configures a Controller. The zero Options uses every default.
type Options struct {
	// LeakGrace is how long a leak is held off before it is freed: an IPAddress object older
	// than LeakGrace that no Service holds is deleted; a bit (which has no age) is cleared once
	// the Controller has seen it leaked for LeakGrace (and, in Legacy mode, on 3 passes).
	// Defaults to 60 seconds (DefaultLeakGrace); a negative value means no hold-off.
	//
	// Whatever its value, an IPAddress whose parentRef names a Service that exists, that does not
	// hold the IP and that was created before the IPAddress is held off for at least 5 seconds
	// from its creation, as kube-apiserver does since kubernetes#132906 (kubernetes#132321):
	// that is the IPAddress of a create of an existing Service, which kube-apiserver deletes
	// again itself. One whose parentRef names a Service that is still of type ExternalName is
	// held off for at least 60 seconds (the update that gives that Service a ClusterIP may be in
	// flight), as kube-apiserver does from v1.36 (kubernetes#135503).
	LeakGrace time.Duration

	// Interval is how often Run audits and repairs. Defaults to 3 minutes (DefaultInterval);
	// a negative value keeps the default.
	Interval time.Duration

	// Recorder receives Events with kube-apiserver's reasons (ClusterIPNotValid,
	// ClusterIPOutOfRange, ClusterIPNotAllocated, ClusterIPAlreadyAllocated,
	// IPAddressNotAllocated, IPAddressWrongReference). Each cause (the object, the address
	// and the reason) gets one Event, from the first pass or retry that finds it: unlike
	// kube-apiserver, a cause that stays (an out-of-range ClusterIP, say) is not reported again
	// on every pass, nor a repair again on its retries. A cause that a pass no longer finds is
	// forgotten, so its return is reported again. Defaults to none: no Events are emitted.
	// Build one with client-go's events.NewBroadcaster.
	Recorder events.EventRecorder

	// Registerer, if not nil, receives the repair metrics: kube-apiserver's
	// apiserver_clusterip_repair_ip_errors_total{type} and
	// apiserver_clusterip_repair_reconcile_errors_total, counted per pass as kube-apiserver's
	// repair loop counts them, and clusterip_repair_drift_addresses{family,kind}, set after
	// each audit (see the package documentation). Controllers sharing a Registerer share the
	// metrics. Defaults to none: nothing is registered or counted. The Config's Registerer is
	// never used, so that a caller can run repair without metrics on the Config its allocators
	// register theirs with (as the kube-apiserver fork does when the registry refuses them).
	Registerer prometheus.Registerer
}

// leakGrace returns the hold-off LeakGrace stands for.
func (o Options) leakGrace() time.Duration {
	switch {
	case o.LeakGrace == 0:
		return DefaultLeakGrace
	case o.LeakGrace < 0:
		return 0
	}
	return o.LeakGrace
}

// interval returns the period Interval stands for.
func (o Options) interval() time.Duration {
	if o.Interval <= 0 {
		return DefaultInterval
	}
	return o.Interval
}
