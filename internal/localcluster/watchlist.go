package localcluster

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionvalidation "k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
)

// WatchTracker answers a watch action of client-go's fake clientset from tracker, the fake's
// object tracker, and returns the tracker's own watch (to observe its backlog) and the watch to
// hand to the client: the tracker's events relayed through RelayWatch.
//
// The fake ignores SendInitialEvents, so a streaming list (client-go's WatchListClient, on by
// default from v0.35) waits for initial events that never come. WatchTracker answers it as
// kube-apiserver v1.33's watch cache does (k8s.io/apiserver storage/cacher): with
// SendInitialEvents true it first sends every object of the resource in action's namespace as an
// ADDED event, in namespace/name order, and then, if AllowWatchBookmarks is set, a BOOKMARK whose
// object is an empty object of the kind carrying resourceVersion rv and the annotation
// metav1.InitialEventsAnnotationKey ("k8s.io/initial-events-end": "true"); the tracker's events
// follow. The listing and the start of the tracker's watch are atomic with respect to writes
// through the clientset, whose reactors run one action at a time. SendInitialEvents without
// ResourceVersionMatch NotOlderThan, or ResourceVersionMatch without SendInitialEvents, is refused
// with the Invalid error kube-apiserver returns. The resourceVersion asked for is not waited for
// (the fake has no history), and label and field selectors are ignored, as the fake's own watch
// ignores them. A watch without SendInitialEvents starts from now, with every client-go release
// (v0.36's tracker would send what it holds when given the options): kube-apiserver's
// defaulting of an unversioned watch to SendInitialEvents is not copied, because the fake's
// lists carry no resourceVersion and informers would then get every object twice.
func WatchTracker(tracker k8stesting.ObjectTracker, action k8stesting.Action, rv string) (tracked, relayed watch.Interface, err error) {
	var opts metav1.ListOptions
	if wa, ok := action.(k8stesting.WatchActionImpl); ok {
		opts = wa.ListOptions
	}
	if err := validateWatchOptions(opts); err != nil {
		return nil, nil, err
	}
	gvr, ns := action.GetResource(), action.GetNamespace()
	// Without options: client-go v0.36's tracker, given options, also sends the objects it
	// holds (from the resourceVersion asked for), which would send the initial events twice.
	w, err := tracker.Watch(gvr, ns)
	if err != nil {
		return nil, nil, err
	}
	if opts.SendInitialEvents == nil || !*opts.SendInitialEvents {
		return w, RelayWatch(w), nil
	}
	initial, err := initialEvents(tracker, gvr, ns, opts.AllowWatchBookmarks, rv)
	if err != nil {
		w.Stop()
		return nil, nil, err
	}
	return w, relayAfter(initial, w), nil
}

// validateWatchOptions validates opts of a watch as kube-apiserver v1.33 does (WatchList on).
func validateWatchOptions(opts metav1.ListOptions) error {
	opts.Watch = true
	var in metainternalversion.ListOptions
	if err := metainternalversion.Convert_v1_ListOptions_To_internalversion_ListOptions(&opts, &in, nil); err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	if errs := metainternalversionvalidation.ValidateListOptions(&in, true); len(errs) > 0 {
		return apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	return nil
}

// initialEvents lists gvr in ns from tracker as ADDED events in namespace/name order, followed,
// if bookmark is set, by the initial-events-end bookmark at rv.
func initialEvents(tracker k8stesting.ObjectTracker, gvr schema.GroupVersionResource, ns string, bookmark bool, rv string) ([]watch.Event, error) {
	gvk, ok := kindsByResource()[gvr]
	if !ok {
		return nil, apierrors.NewBadRequest("no kind is known for resource " + gvr.String())
	}
	list, err := tracker.List(gvr, gvk, ns)
	if err != nil {
		return nil, err
	}
	objs, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(objs))
	for i, o := range objs {
		m, err := meta.Accessor(o)
		if err != nil {
			return nil, err
		}
		keys[i] = m.GetNamespace() + "/" + m.GetName()
	}
	order := make([]int, len(objs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(keys[a], keys[b]) })
	events := make([]watch.Event, 0, len(objs)+1)
	for _, i := range order {
		events = append(events, watch.Event{Type: watch.Added, Object: objs[i].DeepCopyObject()})
	}
	if bookmark {
		obj, err := scheme.Scheme.New(gvk)
		if err != nil {
			return nil, err
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil, err
		}
		m.SetResourceVersion(rv)
		m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
		events = append(events, watch.Event{Type: watch.Bookmark, Object: obj})
	}
	return events, nil
}

// kindsByResource maps each resource of client-go's scheme to its kind, with the plural the fake
// clientset's tracker files objects under (meta.UnsafeGuessKindToResource).
var kindsByResource = sync.OnceValue(func() map[schema.GroupVersionResource]schema.GroupVersionKind {
	m := map[schema.GroupVersionResource]schema.GroupVersionKind{}
	for gvk := range scheme.Scheme.AllKnownTypes() {
		if gvk.Version == runtime.APIVersionInternal || strings.HasSuffix(gvk.Kind, "List") {
			continue
		}
		plural, _ := meta.UnsafeGuessKindToResource(gvk)
		m[plural] = gvk
	}
	return m
})
