package linearizability

import (
	"sort"
	"sync"
)

// recorder keeps a history as it happens: operations called and not yet returned, and those
// returned. It is safe for concurrent use; the zero recorder is not usable, use newRecorder.
type recorder struct {
	mu       sync.Mutex    // guards open and returned
	open     map[string]Op // by process and operation ID
	returned []Op
}

func newRecorder() *recorder { return &recorder{open: map[string]Op{}} }

// call records op as called; key names it until it returns.
func (r *recorder) call(key string, op Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.open[key] = op
}

// ret records op, called under key, as returned.
func (r *recorder) ret(key string, op Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.open, key)
	r.returned = append(r.returned, op)
}

// history ends the history at end: every operation never answered, and every one whose outcome
// is unknown, returns then, with an unknown outcome. It returns the operations sorted by call.
func (r *recorder) history(end int64) []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := make([]Op, 0, len(r.returned)+len(r.open))
	for _, op := range r.returned {
		if op.Outcome == Unknown {
			op.Return = end // a request held back may still take effect after its caller gave up
		}
		ops = append(ops, op)
	}
	for _, op := range r.open {
		op.Return, op.Outcome, op.Err = end, Unknown, "no answer"
		ops = append(ops, op)
	}
	r.open = map[string]Op{}
	ops = WithUndos(ops)
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops
}
