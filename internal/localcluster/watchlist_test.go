package localcluster

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
)

// TestNewFakeClientStreamsTheListOfEachResource: a streaming-list watch on NewFakeClient gets the
// objects of its resource and namespace only, in name order, then the initial-events-end
// bookmark (at resourceVersion "": this fake keeps none) as an object of the resource's kind.
func TestNewFakeClientStreamsTheListOfEachResource(t *testing.T) {
	c := NewFakeClient()
	ctx := context.Background()
	for _, s := range []struct{ ns, name string }{{"default", "b"}, {"other", "x"}, {"default", "a"}} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.name}}
		if _, err := c.CoreV1().Services(s.ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cidr := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}}
	if _, err := c.NetworkingV1().ServiceCIDRs().Create(ctx, cidr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	opts := metav1.ListOptions{SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true}
	tests := []struct {
		name  string
		watch func() (watch.Interface, error)
		want  []string
		kind  runtime.Object
	}{
		{"namespaced", func() (watch.Interface, error) { return c.CoreV1().Services("default").Watch(ctx, opts) },
			[]string{"ADDED default/a", "ADDED default/b", "BOOKMARK end"}, &corev1.Service{}},
		{"all namespaces", func() (watch.Interface, error) { return c.CoreV1().Services("").Watch(ctx, opts) },
			[]string{"ADDED default/a", "ADDED default/b", "ADDED other/x", "BOOKMARK end"}, &corev1.Service{}},
		{"cluster-scoped", func() (watch.Interface, error) { return c.NetworkingV1().ServiceCIDRs().Watch(ctx, opts) },
			[]string{"ADDED /kubernetes", "BOOKMARK end"}, &networkingv1.ServiceCIDR{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := tt.watch()
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			var got []string
			for range tt.want {
				select {
				case ev := <-w.ResultChan():
					m, err := meta.Accessor(ev.Object)
					if err != nil {
						t.Fatal(err)
					}
					if ev.Type == watch.Bookmark {
						if m.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" || m.GetResourceVersion() != "" {
							t.Errorf("bookmark annotations %v, resourceVersion %q; want the initial-events-end annotation and \"\"", m.GetAnnotations(), m.GetResourceVersion())
						}
						if got, want := reflect.TypeOf(ev.Object), reflect.TypeOf(tt.kind); got != want {
							t.Errorf("bookmark object is a %v, want a %v", got, want)
						}
						got = append(got, "BOOKMARK end")
						continue
					}
					got = append(got, string(ev.Type)+" "+m.GetNamespace()+"/"+m.GetName())
				case <-time.After(10 * time.Second):
					t.Fatalf("events %q, then none; want %q", got, tt.want)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("events = %q, want %q", got, tt.want)
			}
		})
	}
}
