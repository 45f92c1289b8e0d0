package bitmap

// QueuedOps returns the number of operations of p waiting for a batch, for tests that need to
// know that callers have queued up behind a compare-and-swap in flight.
func QueuedOps(p *Persistent) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}
