// Package informerutil holds small helpers for client-go informer event handlers, shared by the
// controllers of the library.
package informerutil

import "k8s.io/client-go/tools/cache"

// ObjectFrom returns the object of type T that an informer passed to an event handler: obj
// itself or, for a delete whose final state the informer missed, the object inside the
// cache.DeletedFinalStateUnknown tombstone. It reports false if that object is not a T.
func ObjectFrom[T any](obj any) (T, bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	t, ok := obj.(T)
	return t, ok
}
