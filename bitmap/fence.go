package bitmap

import (
	"context"
	"fmt"
)

// fence settles the outcome of an Update of base's successor at rev that failed with cause (not a
// conflict): it stores base again at rev. If that succeeds, the failed write can never be applied
// later and the error says the write failed; otherwise its outcome is unknown.
func (p *Persistent) fence(ctx context.Context, base *Allocator, rev int64, cause error) error {
	failed := fmt.Errorf("bitmap: store snapshot of %s: %w", p.cidr, cause)
	if ctx.Err() == nil {
		if newRev, err := p.store.Update(ctx, rev, base.Snapshot()); err == nil {
			p.publish(base, newRev)
			return failed
		}
	}
	p.markStale()
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, failed)
}
