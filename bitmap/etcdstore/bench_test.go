package etcdstore_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// countingStore counts the compare-and-swaps that reach the store.
type countingStore struct {
	bitmap.Store
	updates atomic.Int64
}

func (s *countingStore) Update(ctx context.Context, rev int64, snap bitmap.Snapshot) (int64, error) {
	s.updates.Add(1)
	return s.Store.Update(ctx, rev, snap)
}

// compactEvery compacts etcd's history every interval until the returned function is called, so
// that long benchmarks of large snapshots do not grow etcd's database without bound.
func compactEvery(client *clientv3.Client, interval time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if resp, err := client.Get(ctx, "compact-probe"); err == nil {
				client.Compact(ctx, resp.Header.Revision)
			}
			cancel()
		}
	}()
	return func() { close(done); wg.Wait() }
}

// BenchmarkPersistentEtcd measures AllocateNext+Release pairs per second against an embedded etcd,
// with group commit and with one compare-and-swap per operation (as kube-apiserver does), for 1, 4
// and 16 concurrent callers in one process. CAS/pair is the number of compare-and-swaps per pair.
func BenchmarkPersistentEtcd(b *testing.B) {
	e := testenv.NewEtcd(b)
	client := e.TestClient(b)
	defer compactEvery(client, 200*time.Millisecond)()
	n := 0
	for _, cidr := range []string{"10.96.0.0/24", "10.96.0.0/12"} {
		for _, mode := range []string{"batch", "nobatch"} {
			for _, callers := range []int{1, 4, 16} {
				b.Run(fmt.Sprintf("prefix=%s/%s/callers=%d", cidr[len(cidr)-2:], mode, callers), func(b *testing.B) {
					n++
					store := &countingStore{Store: etcdstore.New(client, fmt.Sprintf("/registry/bench/%d", n))}
					var opts []bitmap.PersistentOption
					if mode == "nobatch" {
						opts = append(opts, bitmap.WithoutBatching())
					}
					p, err := bitmap.NewPersistent(context.Background(), netip.MustParsePrefix(cidr), store, opts...)
					if err != nil {
						b.Fatal(err)
					}
					defer p.Close()
					store.updates.Store(0)
					var next atomic.Int64
					var wg sync.WaitGroup
					b.ResetTimer()
					for range callers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							ctx := context.Background()
							for next.Add(1) <= int64(b.N) {
								ip, err := p.AllocateNext(ctx, allocator.Owner{})
								if err != nil {
									b.Error(err)
									return
								}
								if err := p.Release(ctx, ip); err != nil {
									b.Error(err)
									return
								}
							}
						}()
					}
					wg.Wait()
					b.StopTimer()
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
					b.ReportMetric(float64(store.updates.Load())/float64(b.N), "CAS/pair")
				})
			}
		}
	}
}

// churnSnapshot returns the snapshot of a /16 bitmap with a high slot set, as Service churn with
// random picks leaves it: about 8 KiB of data, the value every compare-and-swap of the fork's
// DualWrite and Legacy churn writes.
func churnSnapshot(b *testing.B) bitmap.Snapshot {
	b.Helper()
	a, err := bitmap.New(netip.MustParsePrefix("10.96.0.0/16"))
	if err != nil {
		b.Fatal(err)
	}
	for _, ip := range []string{"10.96.0.1", "10.96.255.250"} {
		if err := a.Allocate(context.Background(), netip.MustParseAddr(ip), allocator.Owner{}); err != nil {
			b.Fatal(err)
		}
	}
	return a.Snapshot()
}

// BenchmarkEncode measures encoding a churned /16 bitmap as kube-apiserver stores it.
func BenchmarkEncode(b *testing.B) {
	s := churnSnapshot(b)
	for _, f := range []etcdstore.Format{etcdstore.Protobuf, etcdstore.JSON} {
		b.Run(f.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := etcdstore.Encode(s, f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUpdate measures one compare-and-swap of a churned /16 bitmap against an embedded
// etcd, which runs in the benchmark's process: its allocations count too, the same before and
// after a change of Store's own.
func BenchmarkUpdate(b *testing.B) {
	e := testenv.NewEtcd(b)
	client := e.TestClient(b)
	store := etcdstore.New(client, "/registry/bench/update")
	s := churnSnapshot(b)
	ctx := context.Background()
	rev, err := store.Update(ctx, 0, s)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if rev, err = store.Update(ctx, rev, s); err != nil {
			b.Fatal(err)
		}
	}
}
