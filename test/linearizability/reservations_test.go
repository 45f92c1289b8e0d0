package linearizability

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// The reservation operations of an IPAddressOnly allocator process (process_test.go), whose
// allocators run with Config.Reservations: each worker reserves addresses through
// reservation.Client, anonymously or kept for a Service it names and has not created, creates
// that Service through Services().Allocate (a Claim, which must get the reserved address),
// deletes it through Services().Release (half of them with the release policy Retain, which
// keeps the address reserved for the Service's return), and releases its reservations.

const (
	// reservationShare is the share of an IPAddressOnly worker's operations that are about
	// reservations: Reserve, Unreserve, Claim, and Releases of claimed Services.
	reservationShare = 0.3
	// serviceNamespace is the namespace of the Services the workers' owners stand for; none of
	// them exists in kube-apiserver. The Namespace does, only to opt in to Retain
	// (optInServiceNamespace).
	serviceNamespace = "history"
)

// optInServiceNamespace creates the Namespace serviceNamespace, annotated with a
// reservation.AnnotationMaxRetained no run reaches, so that its Services may retain (retaining is
// opt-in per namespace); another process having created it is fine.
func optInServiceNamespace(client kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: serviceNamespace, Annotations: map[string]string{reservation.AnnotationMaxRetained: "1000000"}}}
	_, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Namespace %s: %w", serviceNamespace, err)
	}
	return nil
}

// reservationState is what one worker holds of reservations: its reservations and the Services
// it created through Services().Allocate.
type reservationState struct {
	reserved []keptAddr
	services []claimedService
}

// keptAddr is a reservation of the worker's. With orphan, its Reserve or a Claim of it lost its
// answer: the worker only releases it, and a Refused Unreserve then says a Service holds it.
type keptAddr struct {
	addr   netip.Addr
	svc    string // the Service it is kept for; "" for an anonymous one
	orphan bool
}

// claimedService is a Service the worker created through Services().Allocate.
type claimedService struct {
	svc    *corev1.Service
	addr   netip.Addr
	retain bool
}

// Bounds on what a worker keeps, so that a run ends with few addresses held.
const (
	maxReserved = 2
	maxServices = 2
)

// reservationStep runs one reservation operation of the worker, recording it as run does, and
// returns its outcome; a Claim whose reservation the process's informer does not show yet is
// not run, and reports OK.
func (w worker) reservationStep(id, seq int, rs *reservationState) Outcome {
	op := Op{Client: w.client, Process: w.spec.Name}
	name := fmt.Sprintf("%s-%d-%d", w.spec.Owner, w.client, seq)
	r := w.rng.Float64()
	named := -1 // the index in rs.reserved of a reservation to create the Service of
	for i, k := range rs.reserved {
		if k.svc != "" && !k.orphan {
			named = i
			break
		}
	}
	var call func(ctx context.Context) error
	var after func()
	switch {
	case len(rs.services) > 0 && (len(rs.services) >= maxServices || r < 0.3):
		i := w.rng.Intn(len(rs.services))
		s := rs.services[i]
		rs.services = append(rs.services[:i], rs.services[i+1:]...)
		op.Kind, op.Addr = Release, s.addr
		if s.retain {
			op.Owner, op.Retains = s.svc.Name, true
		}
		call = func(ctx context.Context) error { return w.svcs.Release(ctx, s.svc) }
		after = func() {
			if s.retain && op.Outcome == OK {
				rs.reserved = append(rs.reserved, keptAddr{addr: s.addr, svc: s.svc.Name})
			}
		}
	case named >= 0 && r < 0.65:
		k := rs.reserved[named]
		svc := testenv.ClusterIPService(k.svc, "")
		svc.Namespace = serviceNamespace
		retain := w.rng.Intn(2) == 0
		if retain {
			svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
		}
		if !w.showsReservation(svc, k.addr) {
			return OK
		}
		op.Kind, op.Owner, op.Range = Claim, k.svc, w.rg
		call = func(ctx context.Context) error {
			txn, err := w.svcs.Allocate(ctx, svc, false)
			if err != nil {
				return err
			}
			if op.Addr, err = netip.ParseAddr(svc.Spec.ClusterIPs[0]); err != nil {
				return fmt.Errorf("the Service's ClusterIP %q: %w", svc.Spec.ClusterIPs[0], err)
			}
			return txn.Commit(ctx)
		}
		after = func() {
			switch op.Outcome {
			case OK:
				rs.reserved = append(rs.reserved[:named], rs.reserved[named+1:]...)
				rs.services = append(rs.services, claimedService{svc: svc, addr: op.Addr, retain: retain})
			default:
				rs.reserved[named].orphan = true
			}
		}
	case len(rs.reserved) >= maxReserved || (len(rs.reserved) > 0 && r < 0.8):
		i := w.rng.Intn(len(rs.reserved))
		k := rs.reserved[i]
		op.Kind, op.Addr = Unreserve, k.addr
		call = func(ctx context.Context) error { return w.rc.Release(ctx, k.addr) }
		after = func() {
			if op.Outcome == Unknown {
				rs.reserved[i].orphan = true // released again later
				return
			}
			rs.reserved = append(rs.reserved[:i], rs.reserved[i+1:]...)
		}
	default:
		res := reservation.Reservation{Addr: pickAddr(w.rng, w.rg), Reason: "linearizability history"}
		k := keptAddr{addr: res.Addr}
		if w.rng.Float64() < 0.6 {
			k.svc, res.For = name, types.NamespacedName{Namespace: serviceNamespace, Name: name}
			op.Owner = ReservedFor(name)
		} else {
			res.Name = name
			op.Owner = ReservedAnonymously(name)
		}
		op.Kind, op.Addr = Reserve, res.Addr
		call = func(ctx context.Context) error { return w.rc.Reserve(ctx, res) }
		after = func() {
			switch op.Outcome {
			case OK:
				rs.reserved = append(rs.reserved, k)
			case Unknown:
				k.orphan = true
				rs.reserved = append(rs.reserved, k)
			}
		}
	}
	op.Call = time.Now().UnixNano()
	w.emit(id, op)
	ctx, cancel := context.WithTimeout(context.Background(), w.spec.OpTimeout)
	err := call(ctx)
	cancel()
	op.Return = time.Now().UnixNano()
	op.Outcome = reservationOutcome(op.Kind, err)
	if err != nil {
		op.Err = err.Error()
	}
	if op.Kind == Claim && op.Outcome != OK {
		op.Addr = netip.Addr{}
	}
	w.emit(id, op)
	after()
	return op.Outcome
}

// showsReservation reports whether the process's allocators, as their IPAddress informer shows
// them, would give svc addr: whether their Claimer (reservation.Claimer.Reserved) finds it kept
// for svc, tried for up to the operation timeout. A Claimer reads reservations from the
// informer, so a Service created before the informer shows its reservation gets another
// address; the harness creates one only after, so that a Claim that gets another address while
// its reservation exists is a failure of the allocators. A dry run of the create is no such
// signal: where the informer does not show the reservation yet, the dry run's dynamic pick can
// name the very address (CI saw it: the Claim that followed got another one).
func (w worker) showsReservation(svc *corev1.Service, addr netip.Addr) bool {
	owner := allocator.Owner{Resource: "services", Namespace: svc.Namespace, Name: svc.Name}
	deadline := time.Now().Add(w.spec.OpTimeout)
	for {
		if got, ok := w.claimer.Reserved(allocator.FamilyOf(addr), owner); ok && got == addr {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reservationOutcome classifies the error of a reservation operation: Reserve and Unreserve are
// refused with a HeldError (it matches allocator.ErrAllocated) when the address is held, by
// anyone for a Reserve, by a Service for an Unreserve; every other error, and any error of a
// Claim or a Service's Release, leaves the outcome unknown.
func reservationOutcome(k Kind, err error) Outcome {
	switch {
	case err == nil:
		return OK
	case (k == Reserve || k == Unreserve) && errors.Is(err, allocator.ErrAllocated):
		return Refused
	}
	return Unknown
}
