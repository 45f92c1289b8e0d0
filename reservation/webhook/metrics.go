package webhook

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

// Metrics are the counters of a [Handler] and a [Controller]:
//
//	clusterip_reservation_webhook_claims_total            Services patched with their reserved addresses
//	clusterip_reservation_webhook_window_lost_total       addresses so handed out that another Service took
//	clusterip_reservation_controller_window_lost_total    addresses of a deleted Service that another Service took before the reservation was made
//	clusterip_reservation_controller_kept_in_place_total  addresses of a Retain Service being deleted turned into its reservations before their release
//	clusterip_reservation_retain_refused_total{cap}       addresses of a deleted Service a cap on reservations kept from being kept (cap "namespace" or "servicecidr")
//	clusterip_reservation_webhook_handouts_returned_total reservations handed out whose Service did not hold the address within the bound, put back
//	clusterip_reservation_webhook_admission_requests_total{result}      requests the Handler answered, by result (see below)
//	clusterip_reservation_webhook_admission_duration_seconds{result}    how long the Handler took to answer one, from its request to its response written
//
// An admission request's result is "allowed" (let through unchanged), "patched" (let through with
// a JSONPatch: reserved addresses, the finalizer, or both), "refused" (denied, such as a malformed
// release policy or a cap) or "error" (not answered with a review: a request that is not a POST
// of an AdmissionReview, or a response that could not be encoded).
//
// The zero Metrics is not usable; use [NewMetrics]. A Metrics is safe for concurrent use.
type Metrics struct {
	claims               prometheus.Counter
	webhookWindowLost    prometheus.Counter
	controllerWindowLost prometheus.Counter
	keptInPlace          prometheus.Counter
	retainRefused        *prometheus.CounterVec
	handoutsReturned     prometheus.Counter
	admissionRequests    *prometheus.CounterVec
	admissionDuration    *prometheus.HistogramVec
}

// The results of an admission request in clusterip_reservation_webhook_admission_requests_total.
const (
	resultAllowed = "allowed"
	resultPatched = "patched"
	resultRefused = "refused"
	resultError   = "error"
)

// NewMetrics returns Metrics registered on reg; a nil reg registers them nowhere (they still
// count). A registration that fails, such as a second NewMetrics on one registry, returns its
// error wrapped.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		claims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clusterip_reservation_webhook_claims_total",
			Help: "Service creates the webhook patched with the addresses reserved for them.",
		}),
		webhookWindowLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clusterip_reservation_webhook_window_lost_total",
			Help: "Addresses the webhook handed to a Service that another Service took before kube-apiserver allocated them.",
		}),
		controllerWindowLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clusterip_reservation_controller_window_lost_total",
			Help: "Addresses of a deleted Service with a Retain policy or a release cooldown that another Service took before the reservation was made.",
		}),
		keptInPlace: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clusterip_reservation_controller_kept_in_place_total",
			Help: "Addresses of a Retain Service being deleted that the controller turned into its reservations before kube-apiserver released them (no window).",
		}),
		retainRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clusterip_reservation_retain_refused_total",
			Help: "Addresses of a deleted Service that a cap on reservations (cap: namespace, a Namespace's max-retained; servicecidr, a ServiceCIDR's max-reserved) kept from being kept.",
		}, []string{"cap"}),
		handoutsReturned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clusterip_reservation_webhook_handouts_returned_total",
			Help: "Reservations the webhook handed to a Service that did not hold the address within the bound (its create failed), put back as they were.",
		}),
		admissionRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clusterip_reservation_webhook_admission_requests_total",
			Help: "Admission requests the webhook answered, by result: allowed (unchanged), patched, refused, or error (no review answered).",
		}, []string{"result"}),
		// From 1 ms to about 16 s: kube-apiserver gives the webhook 10 s (timeoutSeconds).
		admissionDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "clusterip_reservation_webhook_admission_duration_seconds",
			Help:    "How long the webhook took to answer an admission request, by result.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"result"}),
	}
	// Every result from the start, at zero: a rate of refusals or errors is then defined.
	for _, r := range []string{resultAllowed, resultPatched, resultRefused, resultError} {
		m.admissionRequests.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.claims, m.webhookWindowLost, m.controllerWindowLost, m.keptInPlace, m.retainRefused, m.handoutsReturned, m.admissionRequests, m.admissionDuration} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("webhook: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// observeAdmission counts one admission request answered with result, begun at start.
func (m *Metrics) observeAdmission(result string, start time.Time) {
	m.admissionRequests.WithLabelValues(result).Inc()
	m.admissionDuration.WithLabelValues(result).Observe(time.Since(start).Seconds())
}

// orNew returns m, or unregistered Metrics when m is nil.
func (m *Metrics) orNew() *Metrics {
	if m != nil {
		return m
	}
	m, _ = NewMetrics(nil) // cannot fail without a registry
	return m
}

// claimTTL is how long Claims remembers a hand-out: far longer than a Service create takes.
const claimTTL = time.Minute

// Claims remembers the addresses a [Handler] handed out, each for the Service it was reserved
// for, until a Service is seen created holding it, so that a [Controller] can tell when another
// Service took one in the window (see the package doc). Hand-outs of one address are matched to
// the Services seen holding it in order, oldest first, as informer events come in the order the
// API server wrote them; a hand-out is forgotten after a minute.
// Give the same Claims to the Handler and the Controller.
//
// The match is by events, not by a record of who allocated what, so it is approximate: under
// heavy churn for one address (a nearly full range) it counts a few more lost windows than there
// were (6 in 219 in this package's test against kube-apiserver v1.37.2), and it has not been
// seen to count fewer.
//
// The zero Claims is empty and ready to use. A Claims is safe for concurrent use.
type Claims struct {
	mu      sync.Mutex // guards pending
	pending map[netip.Addr][]claim
}

// claim is one hand-out: the address was handed to For at At, by deleting a reservation of
// resourceVersion After.
type claim struct {
	For   types.NamespacedName
	At    time.Time
	After uint64
}

// add remembers that addr was handed to svc at now, by deleting a reservation of
// resourceVersion after.
func (c *Claims) add(addr netip.Addr, svc types.NamespacedName, after uint64, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = map[netip.Addr][]claim{}
	}
	c.pending[addr] = append(c.pending[addr], claim{For: svc, At: now, After: after})
}

// observe records that svc was seen at now holding addr, as of resourceVersion rv, forgets the
// oldest hand-out of addr not older than claimTTL, and reports whether it was to another Service
// (a lost window). A Service written before the reservation of the oldest hand-out (rv not after
// its resourceVersion) held addr before that reservation existed: it is no hand-out's taker,
// though its event may come late. resourceVersions are compared as the etcd revisions
// kube-apiserver writes them as; one that is not a number (0) is not compared.
func (c *Claims) observe(addr netip.Addr, svc types.NamespacedName, rv uint64, now time.Time) (lost bool) {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.pending[addr]
	for len(q) > 0 && now.Sub(q[0].At) >= claimTTL {
		q = q[1:]
	}
	if len(q) == 0 {
		delete(c.pending, addr)
		return false
	}
	cl := q[0]
	if rv != 0 && rv <= cl.After {
		c.pending[addr] = q
		return false
	}
	if q = q[1:]; len(q) == 0 {
		delete(c.pending, addr)
	} else {
		c.pending[addr] = q
	}
	return cl.For != svc
}

// forget drops the newest hand-out of addr: it was not made after all.
func (c *Claims) forget(addr netip.Addr) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if q := c.pending[addr]; len(q) > 1 {
		c.pending[addr] = q[:len(q)-1]
	} else {
		delete(c.pending, addr)
	}
}
