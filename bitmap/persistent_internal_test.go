package bitmap

import (
	"context"
	"math"
	"testing"
	"time"
)

// QueuedOps returns the number of operations of p waiting for a batch, for tests that need to
// know that callers have queued up behind a compare-and-swap in flight.
func QueuedOps(p *Persistent) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// TestPersistentSleepHugeBackoffDoesNotOverflow checks that a backoff bound near the largest
// Duration, such as WithBackoff(time.Second, math.MaxInt64) for "no cap", neither overflows when it
// doubles nor panics when the random wait is drawn.
func TestPersistentSleepHugeBackoffDoesNotOverflow(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // sleep returns at once; only the bound's arithmetic runs
	for _, initial := range []time.Duration{time.Second, 1 << 62, math.MaxInt64} {
		p := &Persistent{opts: persistentOptions{backoff: initial, maxBackoff: math.MaxInt64}.withDefaults()}
		for n := range 100 {
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("sleep(attempt %d) with backoff %v up to %v panicked: %v", n, initial, time.Duration(math.MaxInt64), r)
					}
				}()
				p.sleep(ctx, n)
			}()
		}
	}
}

// Idle reports whether p has no operation queued or being committed.
func Idle(p *Persistent) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.inFlight && len(p.pending) == 0
}
