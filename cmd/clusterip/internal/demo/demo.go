// Package demo is the main job of the clusterip command: it shows the library's allocators at
// work against real components it starts itself, and checks what it shows.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// Options configures [Run].
type Options struct {
	// Ranges are the Service ranges, as kube-apiserver's --service-cluster-ip-range: one, or two
	// of different families, primary first. As in kube-apiserver, the first range's bitmap is
	// stored at ranges/serviceips and the second's at ranges/secondaryserviceips, whatever their
	// families. Defaults to 10.96.0.0/20.
	Ranges []netip.Prefix
	// Count is how many addresses to allocate in each range. Defaults to 3000; it is capped at
	// the range size.
	Count int
	// Workers is how many goroutines allocate through each of the two allocators. Defaults to 4.
	Workers int
	// EtcdEndpoints names an etcd to use. Defaults to starting an embedded one on 127.0.0.1 in a
	// temporary directory, removed afterwards.
	EtcdEndpoints []string
	// Prefix is the etcd key prefix, as kube-apiserver's --etcd-prefix. Defaults to /registry.
	Prefix string
	// Out receives the report. Defaults to io.Discard.
	Out io.Writer
}

func (o *Options) setDefaults() {
	if len(o.Ranges) == 0 {
		o.Ranges = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/20")}
	}
	if o.Count <= 0 {
		o.Count = 3000
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.Prefix == "" {
		o.Prefix = etcdstore.DefaultPrefix
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
}

// checkRanges applies kube-apiserver's rules for --service-cluster-ip-range: one range, or two
// of different families.
func checkRanges(ranges []netip.Prefix) error {
	switch {
	case len(ranges) > 2:
		return fmt.Errorf("demo: %d Service ranges, want one, or two of different IP families", len(ranges))
	case len(ranges) == 2 && ranges[0].Addr().Is4() == ranges[1].Addr().Is4():
		return fmt.Errorf("demo: Service ranges %v and %v are of the same IP family, want one of each", ranges[0], ranges[1])
	}
	return nil
}

// bitmapKey returns the etcd key of the bitmap of the range at index i of
// --service-cluster-ip-range. kube-apiserver chooses it by flag order, not by family.
func bitmapKey(prefix string, i int) string {
	if i == 0 {
		return etcdstore.ServiceIPsKey(prefix)
	}
	return etcdstore.SecondaryServiceIPsKey(prefix)
}

// Run allocates Count addresses in each range through two bitmap allocators that share one etcd
// key, the key and encoding kube-apiserver uses, and reports what each saw. It returns an error
// if any address was handed out twice or the stored bitmap disagrees with what the callers were
// told.
func Run(ctx context.Context, opts Options) error {
	_, err := Measure(ctx, opts)
	return err
}

// Summary is what the demo saw, for --json: one RangeSummary per range, in flag order.
type Summary struct {
	Etcd   string         `json:"etcd"`
	Ranges []RangeSummary `json:"ranges"`
}

// RangeSummary is what the demo saw in one range.
type RangeSummary struct {
	Range      string  `json:"range"`
	Key        string  `json:"key"`
	Size       int     `json:"size"`
	StaticBand int     `json:"staticBand"`
	Workers    int     `json:"workersPerAllocator"`
	Allocated  int     `json:"allocated"`
	ByA        int     `json:"allocatedByA"`
	ByB        int     `json:"allocatedByB"`
	Duplicates int     `json:"duplicates"`
	Seconds    float64 `json:"seconds"`
	PerSecond  float64 `json:"perSecond"`
	StaticUsed int     `json:"staticBandUsed"`
	Released   int     `json:"releasedByB"`
	UsedAfter  uint64  `json:"usedAfter"`
	FreeAfter  uint64  `json:"freeAfter"`
}

// Measure runs the demo as [Run] does and also returns what it saw.
func Measure(ctx context.Context, opts Options) (*Summary, error) {
	opts.setDefaults()
	if err := checkRanges(opts.Ranges); err != nil {
		return nil, err
	}
	// In-memory bitmaps of the ranges validate them as the persisted ones will, and tell their
	// sizes and static bands.
	shapes := make([]*bitmap.Allocator, len(opts.Ranges))
	for i, r := range opts.Ranges {
		a, err := bitmap.New(r)
		if err != nil {
			return nil, err
		}
		shapes[i] = a
	}
	out := opts.Out
	endpoints := opts.EtcdEndpoints
	where := "etcd at " + fmt.Sprint(endpoints)
	if len(endpoints) == 0 {
		etcd, err := localcluster.StartEtcd(ctx, localcluster.EtcdOptions{})
		if err != nil {
			return nil, fmt.Errorf("start embedded etcd: %w", err)
		}
		defer etcd.Close()
		endpoints = etcd.Endpoints()
		where = "embedded etcd at " + endpoints[0]
	}
	if err := probe(ctx, endpoints); err != nil {
		return nil, err
	}
	sum := &Summary{Etcd: where}
	fmt.Fprintf(out, "clusterip demo: the bitmap allocator persisted in %s\n", where)
	for i, shape := range shapes {
		rs, err := runRange(ctx, opts, endpoints, shape, bitmapKey(opts.Prefix, i))
		if err != nil {
			return nil, err
		}
		sum.Ranges = append(sum.Ranges, rs)
	}
	return sum, nil
}

// runRange runs the demo on the range of shape, whose bitmap is stored at key.
func runRange(ctx context.Context, opts Options, endpoints []string, shape *bitmap.Allocator, key string) (RangeSummary, error) {
	out, cidr := opts.Out, shape.CIDR()
	var allocs [2]*bitmap.Persistent
	for i := range allocs {
		client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return RangeSummary{}, fmt.Errorf("etcd client: %w", err)
		}
		defer client.Close()
		p, err := bitmap.NewPersistent(ctx, cidr, etcdstore.New(client, key))
		if err != nil {
			return RangeSummary{}, err
		}
		defer p.Close()
		allocs[i] = p
	}
	size, band := shape.Size(), shape.StaticBand()
	fmt.Fprintf(out, "range %s: %d addresses, static band of %d; allocators A and B share key %s\n",
		cidr, size, band, key)

	count := min(opts.Count, size)
	got, elapsed, err := allocateConcurrently(ctx, allocs, opts.Workers, count)
	if err != nil {
		return RangeSummary{}, err
	}
	// The static band is the first band addresses after the network address.
	bandEnd := cidr.Addr().Next()
	for range band {
		bandEnd = bandEnd.Next()
	}
	inStatic := 0
	for ip := range got {
		if ip.Less(bandEnd) {
			inStatic++
		}
	}
	allocated, byA, byB := len(got), countOf(got, 0), countOf(got, 1)
	fmt.Fprintf(out, "allocated %d addresses with %d workers per allocator in %v (%.0f/s): A %d, B %d, duplicates 0\n",
		len(got), opts.Workers, elapsed.Round(time.Millisecond), float64(len(got))/elapsed.Seconds(),
		countOf(got, 0), countOf(got, 1))
	fmt.Fprintf(out, "static band used: %d of %d (AllocateNext takes the upper band first)\n", inStatic, band)

	// Release every other address through B and check what A reads back from etcd.
	seen, released := 0, 0
	for ip := range got {
		if seen++; seen%2 == 0 {
			continue
		}
		if err := allocs[1].Release(ctx, ip); err != nil {
			return RangeSummary{}, fmt.Errorf("release %v: %w", ip, err)
		}
		delete(got, ip)
		released++
	}
	if err := allocs[0].Refresh(ctx); err != nil {
		return RangeSummary{}, err
	}
	if err := verify(allocs[0], got); err != nil {
		return RangeSummary{}, err
	}
	fmt.Fprintf(out, "B released %d addresses; A reads the stored bitmap back: %d used, %d free, matching every caller's result\n",
		released, allocs[0].Used(), allocs[0].Free())
	return RangeSummary{
		Range: cidr.String(), Key: key, Size: size, StaticBand: band, Workers: opts.Workers,
		Allocated: allocated, ByA: byA, ByB: byB, Seconds: elapsed.Seconds(),
		PerSecond: float64(allocated) / elapsed.Seconds(), StaticUsed: inStatic,
		Released: released, UsedAfter: allocs[0].Used(), FreeAfter: allocs[0].Free(),
	}, nil
}

// allocateConcurrently fills count addresses through both allocators and returns which
// allocator got each address. It fails on the first duplicate or error.
func allocateConcurrently(ctx context.Context, allocs [2]*bitmap.Persistent, workers, count int) (map[netip.Addr]int, time.Duration, error) {
	var (
		mu   sync.Mutex
		got  = make(map[netip.Addr]int, count)
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	for i, a := range allocs {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					mu.Lock()
					done := len(got) >= count || len(errs) > 0
					mu.Unlock()
					if done {
						return
					}
					ip, err := a.AllocateNext(ctx, allocator.Owner{Resource: "services", Namespace: "demo", Name: fmt.Sprintf("svc-%c", 'A'+i)})
					mu.Lock()
					switch _, dup := got[ip]; {
					case err != nil:
						errs = append(errs, err)
					case dup:
						errs = append(errs, fmt.Errorf("demo: %v handed out twice", ip))
					default:
						got[ip] = i
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	// Workers may overshoot count by one each; release the surplus so the numbers add up.
	for ip, by := range got {
		if len(got) <= count {
			break
		}
		if err := allocs[by].Release(ctx, ip); err != nil {
			return nil, 0, err
		}
		delete(got, ip)
	}
	return got, time.Since(start), nil
}

func countOf(got map[netip.Addr]int, who int) int {
	n := 0
	for _, by := range got {
		if by == who {
			n++
		}
	}
	return n
}

// verify checks that a's state holds exactly the addresses in want.
func verify(a allocator.Interface, want map[netip.Addr]int) error {
	n := 0
	for ip := range a.All() {
		if _, ok := want[ip]; !ok {
			return fmt.Errorf("demo: stored bitmap holds %v, which no caller holds", ip)
		}
		n++
	}
	if n != len(want) {
		return fmt.Errorf("demo: stored bitmap holds %d addresses, callers hold %d", n, len(want))
	}
	return nil
}

// probe fails within 5 seconds if etcd at endpoints does not answer, where the allocators
// would wait for it for as long as ctx allows.
func probe(ctx context.Context, endpoints []string) error {
	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := client.Get(ctx, "/", clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("demo: etcd at %v unreachable: %w", endpoints, err)
	}
	return nil
}
