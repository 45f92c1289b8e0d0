package testenv

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestServiceChurnCreatesAndDeletesCountServices(t *testing.T) {
	client := fake.NewSimpleClientset() //nolint:staticcheck // the simple fake needs no apply configurations
	client.PrependReactor("create", "services", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if strings.HasSuffix(a.(k8stesting.CreateAction).GetObject().(*corev1.Service).Name, "-3") {
			return true, nil, errors.New("refused")
		}
		return false, nil, nil
	})
	var mu sync.Mutex
	var created, failed []string
	res := ServiceChurn{
		Workers: 3, Count: 10, Prefix: "churn", Delete: true,
		Created: func(svc *corev1.Service) { mu.Lock(); created = append(created, svc.Name); mu.Unlock() },
		Failed:  func(name string, err error) { mu.Lock(); failed = append(failed, name); mu.Unlock() },
	}.Run(context.Background(), t, client)
	if res.Created != 9 || res.Failed != 1 || len(created) != 9 || !slices.Equal(failed, []string{"churn-3"}) {
		t.Errorf("Run() = %d created, %d failed (Created saw %v, Failed saw %v); want 9 and churn-3", res.Created, res.Failed, created, failed)
	}
	if len(res.Latencies) != 9 || !slices.IsSorted(res.Latencies) {
		t.Errorf("Latencies = %v, want 9 in ascending order", res.Latencies)
	}
	left, err := client.CoreV1().Services(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(left.Items) != 0 {
		t.Errorf("Services left after a churn with Delete: %v, %v; want none", left, err)
	}
}

func TestServiceChurnRunsUntilStop(t *testing.T) {
	client := fake.NewSimpleClientset() //nolint:staticcheck // the simple fake needs no apply configurations
	stop := make(chan struct{})
	var once sync.Once
	res := ServiceChurn{
		Workers: 2, Stop: stop, Prefix: "keep",
		Created: func(svc *corev1.Service) {
			if svc.Name == "keep-20" {
				once.Do(func() { close(stop) })
			}
		},
	}.Run(context.Background(), t, client)
	left, err := client.CoreV1().Services(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(left.Items) != res.Created || res.Created < 21 {
		t.Errorf("Run() created %d, %d Services left (%v); want at least 21, all kept", res.Created, len(left.Items), err)
	}
}
