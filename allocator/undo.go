package allocator

import "time"

// UndoTimeout bounds each release that undoes or completes a change after the call that began
// it: in package allocator/service, Transaction.Commit and Transaction.Revert and the revert of
// a failed Allocate or Update; in the dual-write allocator of the root package, the undo of a
// first write whose second failed; in bitmap.Persistent, the release of an allocation stored after
// its caller gave up (if the store does not take it in time, the address stays allocated without
// an owner, a leak that repair finds). Those releases run on a context of their own
// (context.WithoutCancel of the caller's, with this timeout), so that a caller whose deadline
// ran out during the call does not leave an address held for nothing. Implementations of
// Interface that undo half of a write of their own should use the same bound.
const UndoTimeout = 30 * time.Second
