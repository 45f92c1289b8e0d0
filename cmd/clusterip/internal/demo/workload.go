package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kube-ipam/clusterip"
)

// ledger is the demo's own record of which Service holds each address, across every phase and
// allocator: an address handed out while the ledger still holds it is a duplicate. It also
// keeps the Services that may be deleted, to pick one at random. A ledger is safe for concurrent
// use.
type ledger struct {
	mu sync.Mutex // guards the fields below
	// owner maps every address held to the Service holding it.
	owner map[netip.Addr]string
	// live are the Services the workload may delete; index maps a name to its place in live.
	live  []*corev1.Service
	index map[string]int
	// duplicates are the addresses that were handed out while held.
	duplicates []string
	next       int
}

func newLedger() *ledger {
	return &ledger{owner: map[netip.Addr]string{}, index: map[string]int{}}
}

// nextName returns a new Service name.
func (l *ledger) nextName() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next++
	return fmt.Sprintf("demo-%05d", l.next)
}

// hold records that name holds ips. It returns false, and records the duplicates, if another
// Service holds one of them.
func (l *ledger) hold(name string, ips []netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ok := true
	for _, ip := range ips {
		if other, taken := l.owner[ip]; taken {
			l.duplicates = append(l.duplicates, fmt.Sprintf("%s handed to %s while %s holds it", ip, name, other))
			ok = false
		}
	}
	if ok {
		for _, ip := range ips {
			l.owner[ip] = name
		}
	}
	return ok
}

// drop forgets ips.
func (l *ledger) drop(ips []netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ip := range ips {
		delete(l.owner, ip)
	}
}

// add makes svc one that the workload may delete.
func (l *ledger) add(svc *corev1.Service) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.index[svc.Name] = len(l.live)
	l.live = append(l.live, svc)
}

// take removes a random deletable Service and returns it, or nil if there is none.
func (l *ledger) take(r *rand.Rand) *corev1.Service {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.live) == 0 {
		return nil
	}
	i := r.IntN(len(l.live))
	svc := l.live[i]
	last := len(l.live) - 1
	l.live[i] = l.live[last]
	l.index[l.live[i].Name] = i
	l.live = l.live[:last]
	delete(l.index, svc.Name)
	return svc
}

func (l *ledger) liveCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.live)
}

func (l *ledger) held() map[netip.Addr]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[netip.Addr]string, len(l.owner))
	for ip, name := range l.owner {
		out[ip] = name
	}
	return out
}

func (l *ledger) duplicateList() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.duplicates)
}

// counters are what one member did in one family during a phase. They are updated atomically.
type counters struct {
	allocated, released, undone, refused, errors atomic.Uint64
	mu                                           sync.Mutex // guards latencies and firstErr
	latencies                                    []time.Duration
	firstErr                                     error
}

func (c *counters) fail(err error) {
	c.errors.Add(1)
	c.mu.Lock()
	if c.firstErr == nil {
		c.firstErr = err
	}
	c.mu.Unlock()
}

// workload runs the Services of one phase: each worker of each member creates a Service (its
// ClusterIP from the member's allocators) or deletes a random one, keeping about hold Services.
type workload struct {
	c       *cluster
	ledger  *ledger
	hold    int
	members []*member
	// stats is indexed by member, then by family.
	stats []map[corev1.IPFamily]*counters
	// creates counts the Services created, to forget the fake client's record now and then.
	creates atomic.Uint64
}

func newWorkload(c *cluster, l *ledger, hold int, members []*member) *workload {
	w := &workload{c: c, ledger: l, hold: hold, members: members}
	for _, m := range members {
		s := map[corev1.IPFamily]*counters{}
		for _, f := range m.allocs.Families() {
			s[f] = &counters{}
		}
		w.stats = append(w.stats, s)
	}
	return w
}

// run runs workers goroutines per member until ctx is done or the deadline passes.
func (w *workload) run(ctx context.Context, workers int, until time.Time) {
	var wg sync.WaitGroup
	for mi, m := range w.members {
		for wi := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(mi), uint64(wi)^uint64(time.Now().UnixNano())))
				fams := m.allocs.Families()
				for ctx.Err() == nil && time.Now().Before(until) {
					f := fams[r.IntN(len(fams))]
					n := w.ledger.liveCount()
					if n == 0 || (n < w.hold && r.IntN(10) < 6) {
						w.create(ctx, m, w.stats[mi][f], f)
					} else {
						w.delete(ctx, m, r)
					}
				}
			}()
		}
	}
	wg.Wait()
}

// create allocates the ClusterIP of a new single-stack Service of family f through m, as
// kube-apiserver's Service registry does, and stores the Service; if the API server refuses it
// the allocation is reverted.
func (w *workload) create(ctx context.Context, m *member, st *counters, f corev1.IPFamily) {
	svc := newService(w.ledger.nextName(), f)
	start := time.Now()
	txn, err := m.allocs.Services().Allocate(ctx, svc, false)
	took := time.Since(start)
	if err != nil {
		if ctx.Err() == nil {
			st.fail(fmt.Errorf("%s: allocate %s: %w", m.name, svc.Name, err))
		}
		return
	}
	st.mu.Lock()
	st.latencies = append(st.latencies, took)
	st.mu.Unlock()
	ips := txn.Allocated()
	if !w.ledger.hold(svc.Name, ips) {
		// A duplicate: keep the addresses (they are another Service's too) and stop here.
		if err := txn.Commit(ctx); err != nil {
			st.fail(fmt.Errorf("%s: commit %s: %w", m.name, svc.Name, err))
		}
		return
	}
	if _, err := w.c.client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		w.ledger.drop(ips)
		if rerr := txn.Revert(context.WithoutCancel(ctx)); rerr != nil {
			st.fail(fmt.Errorf("%s: revert %s: %w", m.name, svc.Name, rerr))
		}
		st.undone.Add(1)
		switch {
		case ctx.Err() != nil:
		case apierrors.IsInvalid(err) || apierrors.IsAlreadyExists(err):
			// The API server holds the address for another Service (kube-apiserver's own
			// allocator checks every ClusterIP it stores).
			st.refused.Add(1)
		default:
			st.fail(fmt.Errorf("%s: create Service %s: %w", m.name, svc.Name, err))
		}
		return
	}
	if err := txn.Commit(ctx); err != nil {
		st.fail(fmt.Errorf("%s: commit %s: %w", m.name, svc.Name, err))
	}
	st.allocated.Add(1)
	w.ledger.add(svc)
	if w.c.forget != nil && w.creates.Add(1)%1024 == 0 {
		w.c.forget()
	}
}

// delete deletes a random Service and releases its ClusterIPs through m.
func (w *workload) delete(ctx context.Context, m *member, r *rand.Rand) {
	svc := w.ledger.take(r)
	if svc == nil {
		return
	}
	st := w.statsOf(m, svc)
	ctx = context.WithoutCancel(ctx) // a deletion is finished, so that the books stay right
	if err := w.c.client.CoreV1().Services(svc.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		st.fail(fmt.Errorf("%s: delete Service %s: %w", m.name, svc.Name, err))
		w.ledger.add(svc)
		return
	}
	ips := addrs(svc)
	// The ledger forgets the addresses before they are free again, or a fast allocator would
	// look like a duplicate.
	w.ledger.drop(ips)
	if err := m.allocs.Services().Release(ctx, svc); err != nil {
		st.fail(fmt.Errorf("%s: release %s of %s: %w", m.name, ips, svc.Name, err))
		return
	}
	st.released.Add(1)
}

// statsOf returns the counters of the member and family that release svc.
func (w *workload) statsOf(m *member, svc *corev1.Service) *counters {
	f := corev1.IPv4Protocol
	if len(svc.Spec.IPFamilies) > 0 {
		f = svc.Spec.IPFamilies[0]
	}
	for i, mm := range w.members {
		if mm == m {
			if st, ok := w.stats[i][f]; ok {
				return st
			}
		}
	}
	return &counters{}
}

// newService returns a single-stack ClusterIP Service of family f in the default namespace.
func newService(name string, f corev1.IPFamily) *corev1.Service {
	single := corev1.IPFamilyPolicySingleStack
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name, Labels: map[string]string{"app.kubernetes.io/created-by": "clusterip-demo"}},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeClusterIP,
			IPFamilies:     []corev1.IPFamily{f},
			IPFamilyPolicy: &single,
			Ports:          []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(80), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// addrs returns the ClusterIPs of svc that parse.
func addrs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if ip, err := netip.ParseAddr(s); err == nil {
			out = append(out, ip)
		}
	}
	return out
}

// dualWriteStats returns the dual-write counts of m's allocator of family f, zero outside
// DualWrite mode.
func dualWriteStats(m *member, f corev1.IPFamily) clusterip.DualWriteStats {
	if dw := m.allocs.DualWrite(f); dw != nil {
		return dw.Stats()
	}
	return clusterip.DualWriteStats{}
}
