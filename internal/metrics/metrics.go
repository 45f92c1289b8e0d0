package metrics

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-ipam/clusterip/bitmap"
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

// Source is what the gauges and the counters read at scrape time of one allocator are read from.
type Source struct {
	// Label is the value of the cidr label.
	Label string
	// LabelOf, if not nil, gives the cidr label of the counters and the histogram of an
	// allocation of ip (the address asked for by Allocate, the one AllocateNext returned):
	// the ServiceCIDR prefix that serves ip, as kube-apiserver counts each allocation under the
	// prefix of the allocator that made it. An empty result, or a failed AllocateNext, which
	// has no address, counts under Label.
	LabelOf func(ip netip.Addr) string
	// Used and Free give the allocated_ips and available_ips gauges of Label, unless CIDRs is set.
	Used, Free func() uint64
	// CIDRs, if not nil, gives the allocated_ips and available_ips gauges instead of Used and
	// Free: one series per ServiceCIDR prefix, labelled with the prefix, as kube-apiserver has one
	// per prefix allocator. A prefix counts every address it contains, so an address in two
	// overlapping prefixes counts in both. A prefix's series appear with it and go with it.
	CIDRs func() []CIDRGauges
	// Undos, if not nil, gives the dual-write undo counters: the first writes undone after the
	// second failed, and the undos that failed themselves.
	Undos func() (undone, failed uint64)
	// Bitmap, if not nil, gives the group-commit counters of the allocator's bitmap (the
	// allocator itself in Legacy mode, the mirror in DualWrite mode).
	Bitmap func() bitmap.PersistentStats
}

// CIDRGauges are the gauge values of one ServiceCIDR prefix.
type CIDRGauges struct {
	// Label is the value of the cidr label: the prefix.
	Label      string
	Used, Free uint64
	// Reserved, if not nil, is the number of the prefix's addresses that reservations hold
	// (package reservation), the reserved_ips gauge; they count in Used, and not in Free.
	Reserved *uint64
}

var (
	allocatedDesc = prometheus.NewDesc(namespace+"_"+subsystem+"_allocated_ips",
		"Gauge measuring the number of allocated IPs for Services", []string{"cidr"}, nil)
	availableDesc = prometheus.NewDesc(namespace+"_"+subsystem+"_available_ips",
		"Gauge measuring the number of available IPs for Services", []string{"cidr"}, nil)
	reservedDesc = prometheus.NewDesc(ours+"_reserved_ips",
		"Gauge measuring the number of IPs of a ServiceCIDR prefix that reservations hold, out of dynamic allocation; they count as allocated, not as available", []string{"cidr"}, nil)
	undoDesc = prometheus.NewDesc(ours+"_dualwrite_undo_total",
		"Number of first writes of a dual write (a bit or an IPAddress) undone because the second failed", []string{"cidr"}, nil)
	undoFailedDesc = prometheus.NewDesc(ours+"_dualwrite_undo_errors_total",
		"Number of dual-write undos that failed, each leaving an address in one store only until repair frees it", []string{"cidr"}, nil)
	batchesDesc = prometheus.NewDesc(ours+"_bitmap_batches_total",
		"Number of batches of concurrent bitmap operations committed, each with one or more compare-and-swap writes", []string{"cidr"}, nil)
	writesDesc = prometheus.NewDesc(ours+"_bitmap_cas_writes_total",
		"Number of compare-and-swap writes of the bitmap the store accepted", []string{"cidr"}, nil)
	conflictsDesc = prometheus.NewDesc(ours+"_bitmap_cas_conflicts_total",
		"Number of compare-and-swap writes of the bitmap refused because another writer changed it first", []string{"cidr"}, nil)
	retriesDesc = prometheus.NewDesc(ours+"_bitmap_cas_retries_total",
		"Number of compare-and-swap conflicts of the bitmap after which the batch was written again", []string{"cidr"}, nil)
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
	ch <- reservedDesc
	ch <- undoDesc
	ch <- undoFailedDesc
	ch <- batchesDesc
	ch <- writesDesc
	ch <- conflictsDesc
	ch <- retriesDesc
}

// Collect implements prometheus.Collector. It calls each Source's functions without holding mu. A
// gauge series that two Sources would both give (two allocators of one prefix on one registry) is
// given once, from the Source with the smaller Label.
func (s *sources) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	srcs := make([]*Source, 0, len(s.byLabel))
	for _, src := range s.byLabel {
		srcs = append(srcs, src)
	}
	s.mu.Unlock()
	slices.SortFunc(srcs, func(x, y *Source) int { return strings.Compare(x.Label, y.Label) })
	gauged := make(map[string]bool, len(srcs))
	gauges := func(label string, used, free uint64) {
		if gauged[label] {
			return
		}
		gauged[label] = true
		ch <- prometheus.MustNewConstMetric(allocatedDesc, prometheus.GaugeValue, float64(used), label)
		ch <- prometheus.MustNewConstMetric(availableDesc, prometheus.GaugeValue, float64(free), label)
	}
	counter := func(d *prometheus.Desc, v uint64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label)
	}
	for _, src := range srcs {
		if src.CIDRs != nil {
			for _, c := range src.CIDRs() {
				if c.Reserved != nil && !gauged[c.Label] {
					ch <- prometheus.MustNewConstMetric(reservedDesc, prometheus.GaugeValue, float64(*c.Reserved), c.Label)
				}
				gauges(c.Label, c.Used, c.Free)
			}
		} else {
			gauges(src.Label, src.Used(), src.Free())
		}
		if src.Undos != nil {
			undone, failed := src.Undos()
			counter(undoDesc, undone, src.Label)
			counter(undoFailedDesc, failed, src.Label)
		}
		if src.Bitmap != nil {
			st := src.Bitmap()
			counter(batchesDesc, st.Batches, src.Label)
			counter(writesDesc, st.Writes, src.Label)
			counter(conflictsDesc, st.Conflicts, src.Label)
			counter(retriesDesc, st.Retries, src.Label)
		}
	}
}
