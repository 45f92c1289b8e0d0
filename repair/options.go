package repair

import (
	"time"

	"k8s.io/client-go/tools/events"
)

// Defaults of Options.
const (
	// DefaultLeakGrace is the hold-off before a leak is freed when Options.LeakGrace is zero.
	DefaultLeakGrace = 60 * time.Second
	// DefaultInterval is how often Run audits and repairs when Options.Interval is zero, as
	// kube-apiserver's repair loops do.
	DefaultInterval = 3 * time.Minute
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
	LeakGrace time.Duration

	// Interval is how often Run audits and repairs. Defaults to 3 minutes (DefaultInterval);
	// a negative value keeps the default.
	Interval time.Duration

	// Recorder receives Events with kube-apiserver's reasons (ClusterIPNotValid,
	// ClusterIPOutOfRange, ClusterIPNotAllocated, ClusterIPAlreadyAllocated,
	// IPAddressNotAllocated, IPAddressWrongReference). Defaults to none: no Events are emitted.
	// Build one with client-go's events.NewBroadcaster.
	Recorder events.EventRecorder
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
