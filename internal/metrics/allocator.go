package metrics

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-ipam/clusterip/allocator"
)

var _ allocator.Interface = (*Allocator)(nil)

// Allocator is an allocator.Interface that records the metrics of the allocator it wraps, under
// the cidr label of its Source (or, with Source.LabelOf, of the prefix that served each address). Build it with Recorder.Wrap; the zero Allocator is not usable. It is safe for
// concurrent use and holds no lock of its own.
//
// As in kube-apiserver, Allocate counts under scope "static" and AllocateNext under "dynamic": a
// success adds to allocation_total and observes allocation_duration_seconds, a failure adds to
// allocation_errors_total. A refusal with allocator.ErrNotReady is not an allocation error
// (kube-apiserver returns it before counting anything): it adds to
// clusterip_allocator_not_ready_total instead. Release and the DryRun view count nothing.
type Allocator struct {
	// Interface is the wrapped allocator. Its Release and read methods (Has, All, CIDR, Family,
	// Used, Free) are promoted unchanged; Allocate, AllocateNext, DryRun and Close are
	// Allocator's own.
	allocator.Interface
	rec *Recorder
	src *Source
	now func() time.Time

	// The series of src.Label, resolved on first use (so that, as in kube-apiserver, a series
	// appears once it has something to count) and then without a label lookup. Index 0 is scope
	// static, 1 dynamic.
	allocations, errors, notReady [2]lazy[prometheus.Counter]
	duration                      lazy[prometheus.Observer]
}

// lazy holds a series resolved on first use. Two first uses racing resolve the same series.
type lazy[M any] struct{ p atomic.Pointer[M] }

func (l *lazy[M]) get(resolve func() M) M {
	if m := l.p.Load(); m != nil {
		return *m
	}
	m := resolve()
	l.p.Store(&m)
	return m
}

// Wrap returns an Allocator that passes every call on to a and records its metrics under the cidr
// label src.Label. From now until that Allocator's Close, the gauges of the label read src.Used
// and src.Free (a's own when nil), or those of src.CIDRs, and the counters read at scrape time
// (src.Undos, src.Bitmap) are given; a later Wrap with the same label takes them over.
func (r *Recorder) Wrap(a allocator.Interface, src Source) *Allocator {
	if src.Used == nil {
		src.Used = a.Used
	}
	if src.Free == nil {
		src.Free = a.Free
	}
	w := &Allocator{Interface: a, rec: r, src: &src, now: time.Now}
	r.sources.add(w.src)
	return w
}

// Unwrap returns the wrapped allocator.
func (w *Allocator) Unwrap() allocator.Interface { return w.Interface }

// record counts the outcome of one allocation of scope (0 static, 1 dynamic) of ip (the zero Addr
// for a failed AllocateNext) that started at start.
func (w *Allocator) record(scope int, start time.Time, ip netip.Addr, err error) {
	name := [2]string{ScopeStatic, ScopeDynamic}[scope]
	if label, ok := w.labelOf(ip); ok {
		// A prefix other than the Source's own: not worth a cached series.
		switch {
		case err == nil:
			w.rec.allocations.WithLabelValues(label, name).Inc()
			w.rec.duration.WithLabelValues(label).Observe(w.now().Sub(start).Seconds())
		case errors.Is(err, allocator.ErrNotReady):
			w.rec.notReady.WithLabelValues(label, name).Inc()
		default:
			w.rec.errors.WithLabelValues(label, name).Inc()
		}
		return
	}
	counter := func(vec *prometheus.CounterVec) func() prometheus.Counter {
		return func() prometheus.Counter { return vec.WithLabelValues(w.src.Label, name) }
	}
	switch {
	case err == nil:
		w.allocations[scope].get(counter(w.rec.allocations)).Inc()
		w.duration.get(func() prometheus.Observer {
			return w.rec.duration.WithLabelValues(w.src.Label)
		}).Observe(w.now().Sub(start).Seconds())
	case errors.Is(err, allocator.ErrNotReady):
		w.notReady[scope].get(counter(w.rec.notReady)).Inc()
	default:
		w.errors[scope].get(counter(w.rec.errors)).Inc()
	}
}

// labelOf returns the label src.LabelOf gives ip, and reports whether there is one that differs
// from src.Label.
func (w *Allocator) labelOf(ip netip.Addr) (string, bool) {
	if w.src.LabelOf == nil || !ip.IsValid() {
		return "", false
	}
	label := w.src.LabelOf(ip)
	return label, label != "" && label != w.src.Label
}

// Allocate calls the wrapped Allocate and counts it under scope "static".
func (w *Allocator) Allocate(ctx context.Context, ip netip.Addr, owner allocator.Owner) error {
	start := w.now()
	err := w.Interface.Allocate(ctx, ip, owner)
	w.record(0, start, ip, err)
	return err
}

// AllocateNext calls the wrapped AllocateNext and counts it under scope "dynamic".
func (w *Allocator) AllocateNext(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
	start := w.now()
	ip, err := w.Interface.AllocateNext(ctx, owner)
	w.record(1, start, ip, err)
	return ip, err
}

// DryRun returns the wrapped allocator's DryRun view, unwrapped: dry runs are not counted, as in
// kube-apiserver.
func (w *Allocator) DryRun() allocator.Interface { return w.Interface.DryRun() }

// Close stops the gauges of its label (unless another Wrap took them over) and closes the wrapped
// allocator. The counters keep their values.
func (w *Allocator) Close() error {
	w.rec.sources.remove(w.src)
	return w.Interface.Close()
}
