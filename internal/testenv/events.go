package testenv

import (
	"fmt"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
)

// EventRecorder is an events.EventRecorder that keeps each Event it is given as "type reason
// name" (name: of the object it regards). The zero EventRecorder is ready to use; it is safe for
// concurrent use.
type EventRecorder struct {
	mu     sync.Mutex
	events []string
}

var _ events.EventRecorder = (*EventRecorder)(nil)

// Eventf records the Event's type, reason and the name of regarding.
func (r *EventRecorder) Eventf(regarding, _ runtime.Object, eventtype, reason, _, _ string, _ ...any) {
	name := ""
	if m, ok := regarding.(metav1.Object); ok {
		name = m.GetName()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("%s %s %s", eventtype, reason, name))
}

// WithLogger returns nil: the recorder logs nothing.
func (r *EventRecorder) WithLogger(klog.Logger) events.EventRecorderLogger { return nil }

// Got returns the Events recorded so far, sorted.
func (r *EventRecorder) Got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.events)
	slices.Sort(out)
	return out
}
