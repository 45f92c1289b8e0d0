package bitmap

import "time"

// Defaults of the options that only Persistent uses.
const (
	// DefaultMaxAttempts is how many compare-and-swap attempts Persistent makes for one batch of
	// operations before it gives up with an error wrapping ErrConflict.
	// Writers that keep one key busy are not served in turn: the one whose write landed first
	// also hears back first and sends its next write first, so another can lose many rounds in a
	// row (the demo, two allocators with four workers each on one key, saw more than 100). A
	// thousand attempts is about a second of losing every round; callers bound it further with
	// their context.
	DefaultMaxAttempts = 1000
	// DefaultBackoff bounds the first random wait (full jitter) between attempts, once a batch backs
	// off: after a conflict that did not bring the current state along (from the second such), or
	// after more than 16 conflicts in a row that did (those are retried at once on the state that
	// won). The bound doubles with every further round.
	DefaultBackoff = 100 * time.Microsecond
	// DefaultMaxBackoff caps the bound of the random wait between retries. It is kept near an
	// etcd round trip: a writer that waits longer loses every round to one that does not wait.
	DefaultMaxBackoff = 2 * time.Millisecond
	// DefaultMaxBatch is how many concurrent operations Persistent commits at most in one
	// compare-and-swap.
	DefaultMaxBatch = 1024
)

// persistentOptions holds the settings only Persistent uses. Zero fields mean "the default".
type persistentOptions struct {
	maxAttempts int
	backoff     time.Duration
	maxBackoff  time.Duration
	maxBatch    int
}

// withDefaults returns o with every unset field set to its default.
func (o persistentOptions) withDefaults() persistentOptions {
	if o.maxAttempts <= 0 {
		o.maxAttempts = DefaultMaxAttempts
	}
	if o.backoff <= 0 {
		o.backoff = DefaultBackoff
	}
	if o.maxBackoff <= 0 {
		o.maxBackoff = DefaultMaxBackoff
	}
	o.maxBackoff = max(o.maxBackoff, o.backoff)
	if o.maxBatch <= 0 {
		o.maxBatch = DefaultMaxBatch
	}
	return o
}

// WithMaxAttempts bounds the compare-and-swap attempts Persistent makes for one batch of
// operations; when every attempt meets a revision conflict the operations fail with an error
// wrapping ErrConflict. Default DefaultMaxAttempts (1000); n < 1 keeps the default, and 1 means
// "never retry".
func WithMaxAttempts(n int) PersistentOption {
	return persistentOptionFunc(func(o *persistentOptions) {
		if n >= 1 {
			o.maxAttempts = n
		}
	})
}

// WithBackoff sets how long Persistent waits between attempts once it backs off after revision
// conflicts. A conflict that brings the stored state along (as etcdstore's and bitmaptest's
// do) is retried at once on that state, without a wait, up to 16 in a row; after those, and from the
// second conflict that does not, the wait is random up to initial, and the bound doubles every
// round up to max. Defaults DefaultBackoff (100 µs) and DefaultMaxBackoff (2 ms); a value ≤ 0
// keeps its default, and a max below initial is raised to initial.
func WithBackoff(initial, max time.Duration) PersistentOption {
	return persistentOptionFunc(func(o *persistentOptions) {
		if initial > 0 {
			o.backoff = initial
		}
		if max > 0 {
			o.maxBackoff = max
		}
	})
}

// WithMaxBatch bounds how many concurrent operations Persistent commits together in one
// compare-and-swap (group commit). Default DefaultMaxBatch (1024); n < 1 keeps the default.
// WithMaxBatch(1) disables group commit: one compare-and-swap per operation, as kube-apiserver
// does.
func WithMaxBatch(n int) PersistentOption {
	return persistentOptionFunc(func(o *persistentOptions) {
		if n >= 1 {
			o.maxBatch = n
		}
	})
}

// WithoutBatching disables group commit, so that every operation of a Persistent allocator is
// its own compare-and-swap, as in kube-apiserver. It is WithMaxBatch(1), for comparisons and
// benchmarks.
func WithoutBatching() PersistentOption { return WithMaxBatch(1) }
