package ipaddress_test

import (
	"errors"
	"strconv"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-ipam/clusterip/ipaddress"
)

func TestListFollowsPagesOfFiveHundred(t *testing.T) {
	var all []networkingv1.IPAddress
	for i := range 1100 {
		all = append(all, networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)}})
	}
	client := fake.NewClientset()
	var limits []int64
	client.PrependReactor("list", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		opts := action.(k8stesting.ListActionImpl).ListOptions
		limits = append(limits, opts.Limit)
		start := 0
		if opts.Continue != "" {
			start, _ = strconv.Atoi(opts.Continue)
		}
		end := min(start+int(opts.Limit), len(all))
		l := &networkingv1.IPAddressList{Items: all[start:end]}
		if end < len(all) {
			l.Continue = strconv.Itoa(end)
		}
		return true, l, nil
	})
	var names []string
	err := ipaddress.List(t.Context(), client, func(ipa *networkingv1.IPAddress) error {
		names = append(names, ipa.Name)
		return nil
	})
	if err != nil {
		t.Fatalf("List() = %v", err)
	}
	if len(names) != len(all) || names[0] != all[0].Name || names[len(names)-1] != all[len(all)-1].Name {
		t.Errorf("List() saw %d objects, want %d in order", len(names), len(all))
	}
	if want := []int64{500, 500, 500}; len(limits) != len(want) || limits[0] != 500 {
		t.Errorf("List() asked for pages of %v, want %v", limits, want)
	}

	stop := errors.New("stop")
	n := 0
	err = ipaddress.List(t.Context(), client, func(*networkingv1.IPAddress) error {
		n++
		return stop
	})
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("List() with a failing fn = %v after %d calls, want %v after 1", err, n, stop)
	}
}
