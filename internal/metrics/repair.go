package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// The type label values of apiserver_clusterip_repair_ip_errors_total, as kube-apiserver's
// ClusterIP repair loop counts them (pkg/registry/core/service/ipallocator/controller).
const (
	// RepairLeak counts addresses freed as leaked: a bit or an IPAddress object no Service holds,
	// once its hold-off is over.
	RepairLeak = "leak"
	// RepairRepair counts records created or fixed for an address a Service holds: a missing bit
	// or IPAddress object, a wrong parentRef, wrong labels.
	RepairRepair = "repair"
	// RepairFull counts Service CIDRs found full while rebuilding a bitmap. Repair rebuilds a
	// bitmap from its own snapshot, which always has room, so it stays 0; it is kept for
	// kube-apiserver's label set.
	RepairFull = "full"
	// RepairOutOfRange counts Service ClusterIPs outside every range.
	RepairOutOfRange = "outOfRange"
	// RepairDuplicate counts Services holding an IP another Service holds too (each one after
	// the first).
	RepairDuplicate = "duplicate"
	// RepairUnknown counts addresses whose bit could not be set for an unexpected reason.
	RepairUnknown = "unknown"
	// RepairInvalid counts Service ClusterIPs (and IPAddress names) that are not valid addresses.
	RepairInvalid = "invalid"
)

// RepairTypes lists every type label value in kube-apiserver's order (its help text).
var RepairTypes = [...]string{RepairLeak, RepairRepair, RepairFull, RepairOutOfRange, RepairDuplicate, RepairUnknown, RepairInvalid}

// The kind label values of clusterip_repair_drift_addresses: the two DualWrite classes of package
// repair in which the stores disagree.
const (
	// DriftBitmapOnly is a bit set with neither an IPAddress object nor a Service.
	DriftBitmapOnly = "bitmap-only"
	// DriftIPAddressOnly is a Service's IP with its IPAddress object whose bit is clear.
	DriftIPAddressOnly = "ipaddress-only"
)

// Repair holds the metrics of a repair controller, registered on the registry the caller passed.
// Build it with NewRepair. A nil *Repair records nothing, so a controller without a registry
// calls it unconditionally. A Repair is safe for concurrent use.
//
// The metrics:
//
//	apiserver_clusterip_repair_ip_errors_total{type}         counter  kube-apiserver's name, help and label
//	apiserver_clusterip_repair_reconcile_errors_total        counter  kube-apiserver's name and help
//	clusterip_repair_drift_addresses{family,kind}            gauge    ours: one store only, last audit
//
// type takes the values of RepairTypes; every one is there from creation at 0 (kube-apiserver
// creates a series on its first increment). family is "IPv4" or "IPv6"; kind is "bitmap-only" or
// "ipaddress-only"; the gauges of the families NewRepair is given are there from creation at 0.
type Repair struct {
	ipErrors        *prometheus.CounterVec
	reconcileErrors prometheus.Counter
	drift           *prometheus.GaugeVec
}

// NewRepair registers the repair metrics on reg and returns them, with the drift gauges of
// families (the IP families of the flag ranges, "IPv4" or "IPv6") seeded at 0. Registering twice
// on one registry (two controllers) shares the metrics already there; any other registration
// error is returned. A nil reg is an error.
func NewRepair(reg prometheus.Registerer, families []string) (*Repair, error) {
	if reg == nil {
		return nil, errors.New("metrics: nil Registerer")
	}
	r := &Repair{
		ipErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "apiserver", Subsystem: "clusterip_repair", Name: "ip_errors_total",
			Help: "Number of errors detected on clusterips by the repair loop broken down by type of error: leak, repair, full, outOfRange, duplicate, unknown, invalid",
		}, []string{"type"}),
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "apiserver", Subsystem: "clusterip_repair", Name: "reconcile_errors_total",
			Help: "Number of reconciliation failures on the clusterip repair reconcile loop",
		}),
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "clusterip_repair_drift_addresses",
			Help: "Number of addresses the last repair audit found in one store only, by IP family: kind bitmap-only is a bit set with neither an IPAddress nor a Service, kind ipaddress-only a Service's IP and IPAddress whose bit is clear",
		}, []string{"family", "kind"}),
	}
	var err error
	if r.ipErrors, err = register(reg, r.ipErrors); err != nil {
		return nil, err
	}
	if r.reconcileErrors, err = register(reg, r.reconcileErrors); err != nil {
		return nil, err
	}
	if r.drift, err = register(reg, r.drift); err != nil {
		return nil, err
	}
	for _, t := range RepairTypes {
		r.ipErrors.WithLabelValues(t)
	}
	for _, f := range families {
		r.drift.WithLabelValues(f, DriftBitmapOnly)
		r.drift.WithLabelValues(f, DriftIPAddressOnly)
	}
	return r, nil
}

// IPErrors adds n to the ip_errors_total series of typ (one of RepairTypes). n ≤ 0 adds nothing.
func (r *Repair) IPErrors(typ string, n int) {
	if r == nil || n <= 0 {
		return
	}
	r.ipErrors.WithLabelValues(typ).Add(float64(n))
}

// ReconcileError counts one repair pass that failed.
func (r *Repair) ReconcileError() {
	if r != nil {
		r.reconcileErrors.Inc()
	}
}

// SetDrift sets the drift gauge of family and kind to n.
func (r *Repair) SetDrift(family, kind string, n int) {
	if r != nil {
		r.drift.WithLabelValues(family, kind).Set(float64(n))
	}
}
