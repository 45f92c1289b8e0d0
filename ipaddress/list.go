package ipaddress

import (
	"context"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"
)

// List calls fn for every IPAddress object the API server holds, read in pages with client-go's
// tools/pager: pages of 500 from one consistent snapshot, never from a cache, and one full List
// if the snapshot expires before the last page. fn may keep the object but must not change it.
// An error from fn stops the List and is returned; so is one of the API server.
func List(ctx context.Context, client kubernetes.Interface, fn func(*networkingv1.IPAddress) error) error {
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.NetworkingV1().IPAddresses().List(ctx, opts)
	})
	return p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		if ipa, ok := obj.(*networkingv1.IPAddress); ok {
			return fn(ipa)
		}
		return nil
	})
}
