// Package sharedread shares one read among callers that each need a read started no earlier than a
// time of their own, such as the consistent List that confirms a range is full: when many callers
// find it full at once, the API server answers one List at a time, not one per caller.
package sharedread

import (
	"context"
	"sync"
	"time"
)

// Reads shares the reads of a T among its callers: at most one is in flight, and every caller
// that waits for it and needs a read started no later than it uses its result. The zero value is
// ready to use; a Reads must not be copied after first use.
type Reads[T any] struct {
	mu      sync.Mutex
	flight  *flight[T] // the read in flight; nil if none
	waiting int        // callers waiting for a read another caller started
}

// flight is one read of Reads: when it started, and, once done is closed, what it returned.
type flight[T any] struct {
	start time.Time
	done  chan struct{}
	val   T // shared by every caller that uses it: read only
	err   error
}

// Since returns what read returned in a call that started at or after since, so that what the
// read shows held at an instant after since. It makes that call with ctx, or waits for the one in
// flight; if that one started before since, or failed, it then makes or joins the next. The error
// is that of the caller's own call, or ctx's. The value may be shared with other callers: treat
// it as read only.
func (r *Reads[T]) Since(ctx context.Context, since time.Time, read func(context.Context) (T, error)) (T, error) {
	for {
		r.mu.Lock()
		f := r.flight
		if f == nil {
			f = &flight[T]{start: time.Now(), done: make(chan struct{})}
			r.flight = f
			r.mu.Unlock()
			f.val, f.err = read(ctx)
			r.mu.Lock()
			r.flight = nil
			r.mu.Unlock()
			close(f.done)
			return f.val, f.err
		}
		r.waiting++
		r.mu.Unlock()
		var err error
		select {
		case <-f.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		r.mu.Lock()
		r.waiting--
		r.mu.Unlock()
		if err != nil {
			var zero T
			return zero, err
		}
		if f.err == nil && !f.start.Before(since) {
			return f.val, nil
		}
	}
}

// Waiting reports how many callers wait for a read another caller started.
func (r *Reads[T]) Waiting() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiting
}
