package bitmap

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/kube-ipam/clusterip/allocator"
)

// DefaultModifyAttempts is how many compare-and-swap attempts Modify makes before it gives up
// with an error wrapping ErrConflict.
const DefaultModifyAttempts = 100

// ModifyOption configures Load and Modify. A nil ModifyOption makes them fail with an error
// matching allocator.ErrInvalid.
type ModifyOption func(*modifyOptions)

type modifyOptions struct {
	project  bool
	existing bool // a missing bitmap is an error
	rev      int64
	pinned   bool // rev is set: one compare-and-swap at rev, a conflict returned
	attempts int
}

func buildModifyOptions(opts []ModifyOption) (modifyOptions, error) {
	o := modifyOptions{attempts: DefaultModifyAttempts}
	for i, opt := range opts {
		if opt == nil {
			return modifyOptions{}, fmt.Errorf("%w: bitmap: option %d is nil", allocator.ErrInvalid, i)
		}
		opt(&o)
	}
	return o, nil
}

// WithProjection makes Load and Modify read a stored bitmap of another range (the range changed
// under it, as when kube-apiserver's --service-cluster-ip-range does) as Project gives it: the
// bits of the stored range that cidr serves. Modify then writes the projection back even if its
// function changes nothing, so that the stored bitmap is rewritten to cidr, as kube-apiserver's
// Legacy repair rewrites it. By default such a bitmap is a *RangeMismatchError.
func WithProjection() ModifyOption {
	return func(o *modifyOptions) { o.project = true }
}

// WithoutCreate makes Modify fail with an error wrapping allocator.ErrNotReady, without calling
// its function, when nothing is stored, for a caller that must not create a bitmap that someone
// deleted. By default a missing bitmap reads as empty and a change creates it. Load ignores it.
func WithoutCreate() ModifyOption {
	return func(o *modifyOptions) { o.existing = true }
}

// WithRevision makes Modify act only on the state stored at rev, a revision the caller read
// earlier (0: nothing stored): Modify reads the store once, and if it has moved on returns a
// *ConflictError without calling its function; otherwise it makes exactly one compare-and-swap at
// rev, and a conflict is returned, not retried. It is for a caller whose decisions rest on what it
// read at rev, such as a repair pass acting on its audit. By default Modify acts on whatever is
// stored, and retries on the state that won. Load ignores it.
func WithRevision(rev int64) ModifyOption {
	return func(o *modifyOptions) { o.rev, o.pinned = rev, true }
}

// WithAttempts bounds the compare-and-swap attempts of Modify. Default DefaultModifyAttempts
// (100); n < 1 keeps the default, and 1 means "never retry": a conflict is returned. Load ignores
// it.
func WithAttempts(n int) ModifyOption {
	return func(o *modifyOptions) {
		if n >= 1 {
			o.attempts = n
		}
	}
}

// Load reads the bitmap of cidr from store and returns it with its revision. A missing bitmap is
// an empty one at revision 0. A stored bitmap of another range is a *RangeMismatchError, or, with
// WithProjection, its projection onto cidr (see Project). A snapshot that does not decode gives
// an error wrapping ErrCorrupt, and a cidr New refuses its *allocator.PrefixError; Store errors
// are returned as they are.
func Load(ctx context.Context, store Store, cidr netip.Prefix, opts ...ModifyOption) (*Allocator, int64, error) {
	o, err := buildModifyOptions(opts)
	if err != nil {
		return nil, 0, err
	}
	if store == nil {
		return nil, 0, fmt.Errorf("%w: bitmap: Load: nil Store", allocator.ErrInvalid)
	}
	s, rev, err := store.Get(ctx)
	if err != nil {
		return nil, 0, err
	}
	a, _, err := decode(s, rev, cidr, o.project)
	if err != nil {
		return nil, 0, err
	}
	return a, rev, nil
}

// decode returns the bitmap of cidr that s, stored at rev, holds, and whether it was projected
// from another range (only if project is set).
func decode(s Snapshot, rev int64, cidr netip.Prefix, project bool) (*Allocator, bool, error) {
	if rev == 0 {
		s = Snapshot{}
	}
	if project {
		return Project(s, cidr)
	}
	a, err := New(cidr)
	if err != nil {
		return nil, false, err
	}
	if s.Range == "" {
		return a, false, nil
	}
	return a, false, a.Restore(s)
}

// Modify changes the bitmap of cidr in store with compare-and-swap: it reads the stored bitmap
// as Load does, calls apply on it, and, if apply reports a change, stores the result at the
// revision read. On a revision conflict it starts over on the state that won (read again, or
// carried by a *ConflictError), so apply must be safe to run more than once and must decide from
// the bitmap it is given; after WithAttempts attempts (default DefaultModifyAttempts) it gives up
// with an error wrapping ErrConflict. A missing bitmap is read as empty, and a change to it
// creates it (compare-and-swap at revision 0), unless WithoutCreate.
//
// If apply returns an error, Modify returns it and stores nothing; if it reports no change,
// Modify stores nothing and returns nil (but see WithProjection). With WithRevision, Modify makes
// one attempt on the state of a given revision. Errors of the Store other than a conflict are
// returned as they are, and so are those of Load; a failed write that is not a conflict may have
// been stored (see ErrOutcomeUnknown): Modify does not find out.
//
// Modify is the reset, apply, commit loop of etcd's concurrency.STM for one bitmap. It starts no
// goroutine; ctx bounds every Store call.
func Modify(ctx context.Context, store Store, cidr netip.Prefix, apply func(*Allocator) (changed bool, err error), opts ...ModifyOption) error {
	o, err := buildModifyOptions(opts)
	if err != nil {
		return err
	}
	if store == nil || apply == nil {
		return fmt.Errorf("%w: bitmap: Modify: nil Store or function", allocator.ErrInvalid)
	}
	if o.pinned {
		o.attempts = 1
	}
	s, rev, err := store.Get(ctx)
	for attempt := 1; ; attempt++ {
		if err != nil {
			return err
		}
		if o.pinned && rev != o.rev {
			return &ConflictError{Current: s, Rev: rev}
		}
		if o.existing && rev == 0 {
			return fmt.Errorf("%w: no snapshot of %s is stored", allocator.ErrNotReady, cidr)
		}
		a, projected, derr := decode(s, rev, cidr, o.project)
		if derr != nil {
			return derr
		}
		changed, aerr := apply(a)
		if aerr != nil {
			return aerr
		}
		if !changed && !projected {
			return nil
		}
		_, err = store.Update(ctx, rev, a.Snapshot())
		if err == nil || !errors.Is(err, ErrConflict) {
			return err
		}
		if attempt >= o.attempts {
			if attempt == 1 {
				return err
			}
			return fmt.Errorf("bitmap: gave up after %d attempts: %w", attempt, err)
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if ce := (*ConflictError)(nil); errors.As(err, &ce) {
			s, rev, err = ce.Current, ce.Rev, nil
		} else {
			s, rev, err = store.Get(ctx)
		}
	}
}

// Project returns the bitmap of cidr that s becomes when the range is cidr: s itself if it is of
// cidr (or the zero Snapshot: empty), else the bits of s's range whose addresses cidr serves, the
// others dropped, as kube-apiserver's Legacy repair keeps them when it rewrites a bitmap of
// another range; projected reports that case. A Range that does not parse, or Data with bits
// beyond the range, gives an error wrapping ErrCorrupt; a cidr (or stored range) New refuses, its
// *allocator.PrefixError.
func Project(s Snapshot, cidr netip.Prefix) (a *Allocator, projected bool, err error) {
	if a, err = New(cidr); err != nil {
		return nil, false, err
	}
	if s.Range == "" {
		return a, false, nil
	}
	stored, err := netip.ParsePrefix(s.Range)
	if err != nil || stored.Masked() == cidr {
		return a, false, a.Restore(s)
	}
	prev, err := New(stored.Masked())
	if err != nil {
		return nil, false, fmt.Errorf("bitmap: the stored bitmap of %s: %w", s.Range, err)
	}
	if err := prev.Restore(s); err != nil {
		return nil, false, err
	}
	for ip := range prev.All() {
		_ = a.Allocate(context.Background(), ip, allocator.Owner{}) // an address cidr does not serve is dropped
	}
	return a, true, nil
}
