package sharedread

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// gatedRead is a read that counts its calls and answers each once release lets it: the n-th call
// returns n, or err.
type gatedRead struct {
	calls   atomic.Int32
	release chan struct{}
	err     error
}

func (g *gatedRead) read(ctx context.Context) (int32, error) {
	n := g.calls.Add(1)
	select {
	case <-g.release:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return n, g.err
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

type result struct {
	n   int32
	err error
}

func call(ctx context.Context, r *Reads[int32], g *gatedRead) <-chan result {
	since := time.Now()
	ch := make(chan result, 1)
	go func() {
		n, err := r.Since(ctx, since, g.read)
		ch <- result{n, err}
	}()
	return ch
}

func TestSince(t *testing.T) {
	t.Run("callers that come while a read is in flight share the next one", func(t *testing.T) {
		var r Reads[int32]
		g := &gatedRead{release: make(chan struct{})}
		first := call(context.Background(), &r, g)
		waitUntil(t, "the first read", func() bool { return g.calls.Load() == 1 })
		const later = 5
		var results []<-chan result
		for range later {
			results = append(results, call(context.Background(), &r, g))
		}
		waitUntil(t, "the later callers waiting", func() bool { return r.Waiting() == later })
		g.release <- struct{}{} // the first read answers; one later caller makes the next
		waitUntil(t, "the second read, the others waiting for it", func() bool {
			return g.calls.Load() == 2 && r.Waiting() == later-1
		})
		close(g.release)
		if got := <-first; got.n != 1 || got.err != nil {
			t.Errorf("first caller = %d, %v; want 1, nil", got.n, got.err)
		}
		for i, ch := range results {
			if got := <-ch; got.n != 2 || got.err != nil {
				t.Errorf("later caller %d = %d, %v; want the second read's 2, nil", i, got.n, got.err)
			}
		}
	})

	t.Run("a failed read is the error of its caller alone", func(t *testing.T) {
		var r Reads[int32]
		boom := errors.New("boom")
		g := &gatedRead{release: make(chan struct{}), err: boom}
		first := call(context.Background(), &r, g)
		waitUntil(t, "the first read", func() bool { return g.calls.Load() == 1 })
		close(g.release)
		if got := <-first; !errors.Is(got.err, boom) {
			t.Errorf("first caller = %d, %v; want %v", got.n, got.err, boom)
		}
		g.err = nil
		if got := <-call(context.Background(), &r, g); got.n != 2 || got.err != nil {
			t.Errorf("next caller = %d, %v; want a read of its own (2), nil", got.n, got.err)
		}
	})

	t.Run("a waiter whose context ends returns its error", func(t *testing.T) {
		var r Reads[int32]
		g := &gatedRead{release: make(chan struct{})}
		first := call(context.Background(), &r, g)
		waitUntil(t, "the first read", func() bool { return g.calls.Load() == 1 })
		ctx, cancel := context.WithCancel(context.Background())
		waiter := call(ctx, &r, g)
		waitUntil(t, "the waiter", func() bool { return r.Waiting() == 1 })
		cancel()
		if got := <-waiter; !errors.Is(got.err, context.Canceled) {
			t.Errorf("waiter = %d, %v; want context.Canceled", got.n, got.err)
		}
		close(g.release)
		if got := <-first; got.n != 1 || got.err != nil {
			t.Errorf("first caller = %d, %v; want 1, nil", got.n, got.err)
		}
	})
}
