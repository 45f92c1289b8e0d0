package reservation

import (
	"context"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/util/retry"
)

// Keep turns an allocation into the reservation want (an object of [ObjectFor]) in place: it reads
// the IPAddress object of want's address and, if isAllocation accepts it, writes want's labels
// and annotations into it (the parentRef stays), guarded by the resourceVersion read and read
// again after a Conflict (client-go's retry.RetryOnConflict). No allocator can take the address
// at any instant. It reports whether the object is want's reservation now: true too when it
// already was (a delete retried after an earlier Keep). It reports false, with no error, when the
// object is gone or isAllocation refuses it. An API error other than a Conflict is returned.
func Keep(ctx context.Context, client networkingv1client.IPAddressInterface, want *networkingv1.IPAddress, isAllocation func(*networkingv1.IPAddress) bool) (bool, error) {
	wanted, _ := FromObject(want)
	kept := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := client.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if r, ok := FromObject(obj); ok && r.For == wanted.For && r.Name == wanted.Name {
			kept = true
			return nil
		}
		if IsReservation(obj) || !isAllocation(obj) {
			return nil
		}
		obj = obj.DeepCopy()
		obj.Labels, obj.Annotations = want.Labels, want.Annotations
		_, err = client.Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return nil // deleted since the read: gone, as above
		}
		if err != nil {
			return err
		}
		kept = true
		return nil
	})
	return kept, err
}
