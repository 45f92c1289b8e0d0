package bitmap

import "sync/atomic"

// PersistentStats counts what a Persistent's group commit has done since it was created. Every
// count only grows. Conflicts is Retries plus the batches that gave up after WithMaxAttempts
// conflicting attempts (they fail with an error wrapping ErrConflict).
//
// The zero PersistentStats is a Persistent that has committed nothing. A PersistentStats is a
// plain value, safe to copy and compare.
type PersistentStats struct {
	// Batches is the number of batches of queued operations the committer took up: one per group
	// of concurrent operations, however many Store calls it needed.
	Batches uint64
	// Writes is the number of compare-and-swap writes the Store accepted.
	Writes uint64
	// Conflicts is the number of compare-and-swap writes the Store refused because another writer
	// changed the stored bitmap first (an error wrapping ErrConflict).
	Conflicts uint64
	// Retries is the number of conflicts after which the batch went on to another attempt: it is
	// applied again to the state that won (or one read afresh) and written again, unless every
	// caller of the batch has given up by then.
	Retries uint64
}

// persistentCounters are the counters behind PersistentStats, updated by the committer and read
// without a lock.
type persistentCounters struct {
	batches, writes, conflicts, retries atomic.Uint64
}

// Stats returns the counts of p's group commit so far. Each count is read atomically; counts read
// while a batch is being committed may be from either side of one of its steps, but none is ever
// more than what has happened, and Conflicts is never less than Retries. It is cheap (four atomic
// loads) and safe to call concurrently with anything, such as from a metrics scrape.
func (p *Persistent) Stats() PersistentStats {
	// Retries is read before Conflicts, which is incremented first, so that Conflicts >= Retries.
	retries := p.stats.retries.Load()
	return PersistentStats{
		Batches:   p.stats.batches.Load(),
		Writes:    p.stats.writes.Load(),
		Conflicts: p.stats.conflicts.Load(),
		Retries:   retries,
	}
}
