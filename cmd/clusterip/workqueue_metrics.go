package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// workqueueMetrics is a client-go workqueue.MetricsProvider that keeps the workqueue metrics
// kube's components serve, under their names and with their label (name, the queue's name):
// workqueue_depth, workqueue_adds_total, workqueue_queue_duration_seconds,
// workqueue_work_duration_seconds, workqueue_unfinished_work_seconds,
// workqueue_longest_running_processor_seconds and workqueue_retries_total.
//
// The zero workqueueMetrics is not usable; use newWorkqueueMetrics. It is safe for concurrent use.
type workqueueMetrics struct {
	depth          *prometheus.GaugeVec
	adds           *prometheus.CounterVec
	latency        *prometheus.HistogramVec
	workDuration   *prometheus.HistogramVec
	unfinished     *prometheus.GaugeVec
	longestRunning *prometheus.GaugeVec
	retries        *prometheus.CounterVec
}

var _ workqueue.MetricsProvider = (*workqueueMetrics)(nil)

// newWorkqueueMetrics returns a workqueueMetrics registered on reg; a registration that fails
// returns its error wrapped.
func newWorkqueueMetrics(reg prometheus.Registerer) (*workqueueMetrics, error) {
	const subsystem = "workqueue"
	name := []string{"name"}
	// kube's buckets: 10 ns to 10 s, in powers of ten.
	buckets := prometheus.ExponentialBuckets(10e-9, 10, 11)
	m := &workqueueMetrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: subsystem, Name: "depth",
			Help: "Current depth of workqueue."}, name),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem, Name: "adds_total",
			Help: "Total number of adds handled by workqueue."}, name),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: subsystem, Name: "queue_duration_seconds",
			Help: "How long in seconds an item stays in workqueue before being requested.", Buckets: buckets}, name),
		workDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: subsystem, Name: "work_duration_seconds",
			Help: "How long in seconds processing an item from workqueue takes.", Buckets: buckets}, name),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: subsystem, Name: "unfinished_work_seconds",
			Help: "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads."}, name),
		longestRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: subsystem, Name: "longest_running_processor_seconds",
			Help: "How many seconds has the longest running processor for workqueue been running."}, name),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem, Name: "retries_total",
			Help: "Total number of retries handled by workqueue."}, name),
	}
	for _, c := range []prometheus.Collector{m.depth, m.adds, m.latency, m.workDuration, m.unfinished, m.longestRunning, m.retries} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register the workqueue metrics: %w", err)
		}
	}
	return m, nil
}

// NewDepthMetric returns the depth gauge of the queue name.
func (m *workqueueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return m.depth.WithLabelValues(name)
}

// NewAddsMetric returns the adds counter of the queue name.
func (m *workqueueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return m.adds.WithLabelValues(name)
}

// NewLatencyMetric returns the queue-duration histogram of the queue name.
func (m *workqueueMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return m.latency.WithLabelValues(name)
}

// NewWorkDurationMetric returns the work-duration histogram of the queue name.
func (m *workqueueMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return m.workDuration.WithLabelValues(name)
}

// NewUnfinishedWorkSecondsMetric returns the unfinished-work gauge of the queue name.
func (m *workqueueMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.unfinished.WithLabelValues(name)
}

// NewLongestRunningProcessorSecondsMetric returns the longest-running-processor gauge of the
// queue name.
func (m *workqueueMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.longestRunning.WithLabelValues(name)
}

// NewRetriesMetric returns the retries counter of the queue name.
func (m *workqueueMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return m.retries.WithLabelValues(name)
}
