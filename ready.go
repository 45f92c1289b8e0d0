package clusterip

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/servicecidr"
)

// The causes of a *NotReadyError: what an allocator was waiting for when WaitReady's context
// ended. A NotReadyError matches its cause with errors.Is.
var (
	// ErrNotSynced is the cause while the allocator has not caught up with the API server
	// (servicecidr.Allocator.HasSynced is false): Config.Informers not started, its ServiceCIDR or
	// IPAddress informer not synced (an API server that does not answer, or a client that may not
	// list), or Run not running.
	ErrNotSynced = errors.New("clusterip: not synced with the API server")
	// ErrNoServiceCIDR is the cause when the allocator has synced and no ServiceCIDR has a prefix
	// of its family. kube-apiserver creates the default ServiceCIDR, "kubernetes", from its
	// --service-cluster-ip-range; a registry that runs without a kube-apiserver sets
	// Config.DefaultServiceCIDR, or runs a servicecidr.DefaultController, to have it created.
	ErrNoServiceCIDR = errors.New("clusterip: no ServiceCIDR of the family")
	// ErrServiceCIDRNotReady is the cause when ServiceCIDRs of the family exist but none is ready
	// (see servicecidr.Ready): each has the condition Ready=False or Unknown, or is being deleted.
	// NotReadyError.ServiceCIDR and Condition name one.
	ErrServiceCIDRNotReady = errors.New("clusterip: no ServiceCIDR of the family is ready")
	// ErrBitmapNotLoaded is the cause in Legacy mode while a family's bitmap cannot be read as one
	// of its flag range: most often it is stored for another range, because
	// --service-cluster-ip-range changed, until package repair's first pass rewrites it (as
	// kube-apiserver's repair does). NotReadyError.Reason is the bitmap's
	// bitmap.Persistent.LoadError, a *bitmap.RangeMismatchError in that case.
	ErrBitmapNotLoaded = errors.New("clusterip: bitmap not loaded")
)

// NotReadyError is the error of WaitReady when its context ends before every family's allocator
// can allocate. It describes the first family, in the order of Config.Ranges, that could not.
// It matches, with errors.Is, its Cause (one of ErrNotSynced, ErrNoServiceCIDR,
// ErrServiceCIDRNotReady and ErrBitmapNotLoaded), the context's error (context.Canceled or
// context.DeadlineExceeded) and Reason, if any.
type NotReadyError struct {
	// Family is the IP family whose allocator is not ready.
	Family corev1.IPFamily
	// Cause is what the allocator waits for: one of the Err variables above.
	Cause error
	// ServiceCIDR, with ErrServiceCIDRNotReady, is the name of a ServiceCIDR of the family that is
	// not ready, the first by name; otherwise "".
	ServiceCIDR string
	// Condition, with ErrServiceCIDRNotReady, is the Ready condition of that ServiceCIDR, nil if
	// it has none (it is not ready because it is being deleted); otherwise nil.
	Condition *metav1.Condition
	// Reason is the error behind Cause, if any: with ErrBitmapNotLoaded, the bitmap's LoadError.
	Reason error
	// Detail says what is missing, in a sentence for a person.
	Detail string
	// Err is the error of WaitReady's context.
	Err error
}

// Error implements error.
func (e *NotReadyError) Error() string {
	s := fmt.Sprintf("clusterip: the %s allocator is not ready: %s", e.Family, e.Detail)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns Cause, Reason and Err, those that are not nil.
func (e *NotReadyError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.Cause, e.Reason, e.Err} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// ready reports whether every family's allocator can allocate, cheaply enough to poll.
func (a *Allocators) ready() bool {
	for _, f := range a.families {
		if sc := a.cidrs[f]; sc != nil && !sc.Ready() {
			return false
		}
		if a.mode == featuregate.Legacy && a.bitmaps[f].LoadError() != nil {
			return false
		}
	}
	return true
}

// notReady returns why the first family, in the order of Config.Ranges, cannot allocate, as a
// *NotReadyError without Err, or nil if every family can.
func (a *Allocators) notReady() *NotReadyError {
	for _, f := range a.families {
		if e := a.notReadyFamily(f); e != nil {
			return e
		}
	}
	return nil
}

// notReadyFamily returns why f cannot allocate, or nil if it can.
func (a *Allocators) notReadyFamily(f corev1.IPFamily) *NotReadyError {
	if a.mode == featuregate.Legacy {
		if err := a.bitmaps[f].LoadError(); err != nil {
			return &NotReadyError{Family: f, Cause: ErrBitmapNotLoaded, Reason: err, Detail: fmt.Sprintf(
				"its bitmap cannot be read as one of %s until package repair rewrites it (%v)", a.ranges[f], err)}
		}
		return nil
	}
	sc := a.cidrs[f]
	if sc.Ready() {
		return nil
	}
	if !sc.HasSynced() {
		e := &NotReadyError{Family: f, Cause: ErrNotSynced}
		a.mu.Lock()
		running := a.running
		a.mu.Unlock()
		switch {
		case !a.cidrInformer.HasSynced():
			e.Detail = "the ServiceCIDR informer has not synced (is Config.Informers started, and may the client list ServiceCIDRs?)"
		case !a.ipInformer.HasSynced():
			e.Detail = "the IPAddress informer has not synced (is Config.Informers started, and may the client list IPAddresses?)"
		case !running:
			e.Detail = "Run has not been called"
		default:
			e.Detail = "Run has not reconciled the ServiceCIDRs yet"
		}
		return e
	}
	list, err := a.cidrLister.List(labels.Everything())
	if err != nil { // a cache lister does not fail
		return &NotReadyError{Family: f, Cause: ErrNotSynced, Reason: err, Detail: "listing the ServiceCIDR cache failed"}
	}
	var mine []*networkingv1.ServiceCIDR
	for _, obj := range list {
		if slices.ContainsFunc(servicecidr.Prefixes(obj), func(p netip.Prefix) bool { return allocator.FamilyOf(p.Addr()) == f }) {
			mine = append(mine, obj)
		}
	}
	if len(mine) == 0 {
		return &NotReadyError{Family: f, Cause: ErrNoServiceCIDR, Detail: fmt.Sprintf(
			"no ServiceCIDR has an %s prefix (kube-apiserver creates %q from --service-cluster-ip-range; without one, set Config.DefaultServiceCIDR)",
			f, servicecidr.DefaultServiceCIDRName)}
	}
	slices.SortFunc(mine, func(x, y *networkingv1.ServiceCIDR) int { return strings.Compare(x.Name, y.Name) })
	var notReady []*networkingv1.ServiceCIDR
	for _, obj := range mine {
		if !servicecidr.Ready(obj) {
			notReady = append(notReady, obj)
		}
	}
	if len(notReady) == len(mine) {
		first := notReady[0]
		e := &NotReadyError{Family: f, Cause: ErrServiceCIDRNotReady, ServiceCIDR: first.Name}
		var why string
		if c := meta.FindStatusCondition(first.Status.Conditions, networkingv1.ServiceCIDRConditionReady); c != nil {
			e.Condition = c.DeepCopy()
			why = fmt.Sprintf("has condition Ready=%s (reason %q, message %q)", c.Status, c.Reason, c.Message)
		}
		if first.DeletionTimestamp != nil {
			if why != "" {
				why += " and "
			}
			why += "is being deleted"
		}
		e.Detail = fmt.Sprintf("ServiceCIDR %q %v %s", first.Name, first.Spec.CIDRs, why)
		if n := len(notReady) - 1; n > 0 {
			e.Detail += fmt.Sprintf(", and %d more %s ServiceCIDRs are not ready", n, f)
		}
		return e
	}
	// A ready ServiceCIDR whose allocator cannot serve yet: one added since the first sync, whose
	// IPAddress list is still coming, or a prefix the allocator cannot serve (logged by Run).
	var ready []string
	for _, obj := range mine {
		if servicecidr.Ready(obj) {
			ready = append(ready, obj.Name)
		}
	}
	return &NotReadyError{Family: f, Cause: ErrNotSynced, Detail: fmt.Sprintf(
		"the ready %s ServiceCIDRs %q are not served yet (their IPAddress list is still coming, or their prefixes cannot be served: see Run's log)", f, ready)}
}
