package testenv

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ServiceChurn has a kube-apiserver allocate ClusterIPs its own way: Workers goroutines create
// ClusterIP Services ([ClusterIPService], any address) in the default namespace and, with Delete,
// delete each one right after its create, until Count creates have been asked for, Stop is
// closed or the context of [ServiceChurn.Run] is done. The zero ServiceChurn (one worker, no
// Count, no Stop) runs until that context is done.
type ServiceChurn struct {
	// Workers is the number of goroutines. Defaults to 1.
	Workers int
	// Count is the number of creates asked for in all; 0 means until Stop is closed.
	Count int
	// Stop ends the churn when closed: each worker finishes the create (and delete) it is doing
	// and stops. Nil means only Count ends it.
	Stop <-chan struct{}
	// Prefix names the Services: Prefix-i, i counting the creates asked for from 0.
	Prefix string
	// Delete deletes each Service right after it was created. A delete that fails fails the test.
	Delete bool
	// Created, if not nil, is called with each Service the API server created, before its delete,
	// from the worker that created it: it must be safe for concurrent use.
	Created func(svc *corev1.Service)
	// Failed, if not nil, is called with the name of each Service whose create the API server
	// refused and its error, from the worker: it must be safe for concurrent use.
	Failed func(name string, err error)
}

// ChurnResult is what a [ServiceChurn] did.
type ChurnResult struct {
	Created, Failed int // creates that succeeded and that the API server refused
	// Latencies holds, for each Service created, how long its create took, and with Delete its
	// create and delete together; in ascending order.
	Latencies []time.Duration
	Took      time.Duration // from the first create to the last worker's end
}

// Quantile returns the q-quantile (0 ≤ q < 1) of r.Latencies, or 0 if there are none.
func (r ChurnResult) Quantile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	return r.Latencies[int(float64(len(r.Latencies))*q)]
}

// Run runs the churn through client and returns what it did once every worker has stopped. It
// fails t (t.Errorf, from the workers) for each delete that fails.
func (c ServiceChurn) Run(ctx context.Context, t testing.TB, client kubernetes.Interface) ChurnResult {
	services := client.CoreV1().Services(metav1.NamespaceDefault)
	var (
		next            atomic.Int64
		created, failed atomic.Int64
		mu              sync.Mutex // guards lat
		lat             []time.Duration
		wg              sync.WaitGroup
	)
	start := time.Now()
	for range max(c.Workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-c.Stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				i := int(next.Add(1)) - 1
				if c.Count > 0 && i >= c.Count {
					return
				}
				name := fmt.Sprintf("%s-%d", c.Prefix, i)
				t0 := time.Now()
				svc, err := services.Create(ctx, ClusterIPService(name, ""), metav1.CreateOptions{})
				if err != nil {
					failed.Add(1)
					if c.Failed != nil {
						c.Failed(name, err)
					}
					continue
				}
				created.Add(1)
				if c.Created != nil {
					c.Created(svc)
				}
				if c.Delete {
					if err := services.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
						t.Errorf("delete Service %s: %v", name, err)
					}
				}
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	return ChurnResult{Created: int(created.Load()), Failed: int(failed.Load()), Latencies: lat, Took: time.Since(start)}
}
