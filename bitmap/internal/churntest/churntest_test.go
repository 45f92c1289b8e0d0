package churntest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
)

// recordingTB collects the errors reported on it instead of failing the test.
type recordingTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// lyingRelease hands out one address and frees it on Release, but reports the first Release as a
// failure that stored nothing, and makes the second AllocateNext hand the address out while that
// Release is in flight. Only AllocateNext and Release are implemented.
type lyingRelease struct {
	allocator.Interface
	ip           netip.Addr
	allocs, rels atomic.Int32
	afters       atomic.Int32
	relStarted   chan struct{}
	secondRecord chan struct{} // closed once the second AllocateNext has been recorded
}

func (l *lyingRelease) AllocateNext(context.Context, allocator.Owner) (netip.Addr, error) {
	if l.allocs.Add(1) == 2 {
		<-l.relStarted
	}
	return l.ip, nil
}

func (l *lyingRelease) Release(context.Context, netip.Addr) error {
	if l.rels.Add(1) == 1 {
		close(l.relStarted)
		<-l.secondRecord
		return errors.New("injected: failed, nothing stored (a lie: the address was freed)")
	}
	return nil
}

// TestRunReportsAddressHandedOutDuringFailedRelease checks that Run reports an address that was
// handed to another worker while a Release of it was in flight, when that Release then fails
// without ErrOutcomeUnknown (so its caller keeps the address): two workers hold it.
func TestRunReportsAddressHandedOutDuringFailedRelease(t *testing.T) {
	l := &lyingRelease{ip: netip.MustParseAddr("10.0.0.1"), relStarted: make(chan struct{}), secondRecord: make(chan struct{})}
	tb := &recordingTB{TB: t}
	released := make(chan struct{})
	Run(tb, []allocator.Interface{l}, Config{WorkersEach: 2, Calls: 2, MaxHeld: 1, After: func(error) {
		switch l.afters.Add(1) {
		case 2: // the first worker's Release is blocked: this is the second worker's AllocateNext
			close(l.secondRecord)
			<-released // and it releases the address only after the first worker took it back
		case 3: // the first worker's failed Release
			close(released)
		}
	}})
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if len(tb.errs) == 0 {
		t.Errorf("Run reported nothing; want %v reported as held by two workers", l.ip)
	}
	t.Logf("reported: %q", tb.errs)
}
