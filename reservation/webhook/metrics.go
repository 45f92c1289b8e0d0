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
//
// The zero Metrics is not usable; use [NewMetrics]. A Metrics is safe for concurrent use.
type Metrics struct {
	claims               prometheus.Counter
	webhookWindowLost    prometheus.Counter
	controllerWindowLost prometheus.Counter
}

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
			Help: "Addresses of a deleted Service with a Retain policy that another Service took before the reservation was made.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.claims, m.webhookWindowLost, m.controllerWindowLost} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("webhook: register metrics: %w", err)
			}
		}
	}
	return m, nil
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
// for, until that Service or another one is seen holding it, so that a [Controller] can tell when
// another Service took one in the window (see the package doc). A hand-out is forgotten after a
// minute. Give the same Claims to the Handler and the Controller.
//
// The zero Claims is empty and ready to use. A Claims is safe for concurrent use.
type Claims struct {
	mu      sync.Mutex // guards pending
	pending map[netip.Addr]claim
}

// claim is one hand-out: the address was handed to For at At.
type claim struct {
	For types.NamespacedName
	At  time.Time
}

// add remembers that addr was handed to svc at now.
func (c *Claims) add(addr netip.Addr, svc types.NamespacedName, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = map[netip.Addr]claim{}
	}
	c.pending[addr] = claim{For: svc, At: now}
}

// observe records that svc holds addr at now, forgets addr's hand-out, and reports whether addr
// had been handed to another Service (a lost window). A hand-out older than claimTTL is
// forgotten without being reported.
func (c *Claims) observe(addr netip.Addr, svc types.NamespacedName, now time.Time) (lost bool) {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cl, ok := c.pending[addr]
	if !ok {
		return false
	}
	delete(c.pending, addr)
	return cl.For != svc && now.Sub(cl.At) < claimTTL
}

// forget drops addr's hand-out: it was not made after all.
func (c *Claims) forget(addr netip.Addr) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, addr)
}
