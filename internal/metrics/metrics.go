package metrics

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// The scope label values of kube-apiserver: an Allocate of a chosen address is "static", an
// AllocateNext "dynamic".
const (
	ScopeStatic  = "static"
	ScopeDynamic = "dynamic"
)

const (
	namespace = "kube_apiserver"
	subsystem = "clusterip_allocator"
	// ours is the prefix of the metrics kube-apiserver does not have.
	ours = "clusterip_allocator"
)

// Recorder holds the metrics of every allocator it wraps. Build it with New; the zero Recorder is
// not usable. A Recorder is safe for concurrent use.
type Recorder struct {
	allocations *prometheus.CounterVec
	errors      *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	notReady    *prometheus.CounterVec
	sources     *sources
}

// New registers the allocator metrics on reg and returns their Recorder. Registering twice on one
// registry (two sets of allocators built from one Config, say) shares the metrics already there;
// any other registration error is returned.
func New(reg prometheus.Registerer) (*Recorder, error) {
	if reg == nil {
		return nil, errors.New("metrics: nil Registerer")
	}
	r := &Recorder{
		// The four below have kube-apiserver's names, help, labels and buckets
		// (pkg/registry/core/service/ipallocator/metrics.go).
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "allocation_total",
			Help: "Number of Cluster IPs allocations",
		}, []string{"cidr", "scope"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "allocation_errors_total",
			Help: "Number of errors trying to allocate Cluster IPs",
		}, []string{"cidr", "scope"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "allocation_duration_seconds",
			Help:    "Duration in seconds to allocate a Cluster IP by ServiceCIDR",
			Buckets: prometheus.DefBuckets,
		}, []string{"cidr"}),
		notReady: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: ours + "_not_ready_total",
			Help: "Number of Cluster IP allocations refused because the allocator was not ready (allocator.ErrNotReady)",
		}, []string{"cidr", "scope"}),
		sources: &sources{byLabel: map[string]*Source{}},
	}
	var err error
	if r.allocations, err = register(reg, r.allocations); err != nil {
		return nil, err
	}
	if r.errors, err = register(reg, r.errors); err != nil {
		return nil, err
	}
	if r.duration, err = register(reg, r.duration); err != nil {
		return nil, err
	}
	if r.notReady, err = register(reg, r.notReady); err != nil {
		return nil, err
	}
	if r.sources, err = register(reg, r.sources); err != nil {
		return nil, err
	}
	return r, nil
}

// register registers c on reg, or returns the collector of the same kind registered before.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("metrics: register: %w", err)
}

// Source is what the gauges and the dual-write counters of one allocator are read from at each
// scrape.
type Source struct {
	// Label is the value of the cidr label.
	Label string
	// Used and Free give the allocated_ips and available_ips gauges.
	Used, Free func() uint64
	// Undos, if not nil, gives the dual-write undo counters: the first writes undone after the
	// second failed, and the undos that failed themselves.
	Undos func() (undone, failed uint64)
}

var (
	allocatedDesc = prometheus.NewDesc(namespace+"_"+subsystem+"_allocated_ips",
		"Gauge measuring the number of allocated IPs for Services", []string{"cidr"}, nil)
	availableDesc = prometheus.NewDesc(namespace+"_"+subsystem+"_available_ips",
		"Gauge measuring the number of available IPs for Services", []string{"cidr"}, nil)
	undoDesc = prometheus.NewDesc(ours+"_dualwrite_undo_total",
		"Number of first writes of a dual write (a bit or an IPAddress) undone because the second failed", []string{"cidr"}, nil)
	undoFailedDesc = prometheus.NewDesc(ours+"_dualwrite_undo_errors_total",
		"Number of dual-write undos that failed, each leaving an address in one store only until repair frees it", []string{"cidr"}, nil)
)

// sources is the collector of the values read at scrape time, one Source per cidr label.
type sources struct {
	mu      sync.Mutex // guards byLabel
	byLabel map[string]*Source
}

func (s *sources) add(src *Source) {
	s.mu.Lock()
	s.byLabel[src.Label] = src
	s.mu.Unlock()
}

// remove forgets src unless another Source has taken its label since.
func (s *sources) remove(src *Source) {
	s.mu.Lock()
	if s.byLabel[src.Label] == src {
		delete(s.byLabel, src.Label)
	}
	s.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (s *sources) Describe(ch chan<- *prometheus.Desc) {
	ch <- allocatedDesc
	ch <- availableDesc
	ch <- undoDesc
	ch <- undoFailedDesc
}

// Collect implements prometheus.Collector. It calls Used, Free and Undos without holding mu.
func (s *sources) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	srcs := make([]*Source, 0, len(s.byLabel))
	for _, src := range s.byLabel {
		srcs = append(srcs, src)
	}
	s.mu.Unlock()
	for _, src := range srcs {
		ch <- prometheus.MustNewConstMetric(allocatedDesc, prometheus.GaugeValue, float64(src.Used()), src.Label)
		ch <- prometheus.MustNewConstMetric(availableDesc, prometheus.GaugeValue, float64(src.Free()), src.Label)
		if src.Undos != nil {
			undone, failed := src.Undos()
			ch <- prometheus.MustNewConstMetric(undoDesc, prometheus.CounterValue, float64(undone), src.Label)
			ch <- prometheus.MustNewConstMetric(undoFailedDesc, prometheus.CounterValue, float64(failed), src.Label)
		}
	}
}
