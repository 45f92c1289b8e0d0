package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"runtime"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/cmd/clusterip/internal/embedetcd"
	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// The allocators bench knows, as they appear in Result.Allocator.
const (
	Bitmap     = "bitmap"         // bitmap.New, in memory
	Persistent = "bitmap+etcd"    // bitmap.NewPersistent over etcdstore on an embedded etcd
	IPAddress  = "ipaddress+fake" // ipaddress.New over the client-go fake clientset
	// IPAddressAPIServer is ipaddress.New through a real kube-apiserver.
	IPAddressAPIServer = "ipaddress+apiserver"
	// DualWriteAPIServer is clusterip.New in featuregate.DualWrite mode: the servicecidr
	// allocator's IPAddress objects through a real kube-apiserver, and a bitmap mirror in etcd.
	DualWriteAPIServer = "dualwrite+apiserver"
)

// Options says what to measure. The zero Options measures nothing.
type Options struct {
	// Bitmap lists the ranges of the in-memory bitmap allocator.
	Bitmap []netip.Prefix
	// Persistent lists the ranges of the etcd-backed bitmap allocator; an embedded etcd is
	// started when it is not empty.
	Persistent []netip.Prefix
	// IPAddress lists the ranges of the IPAddress-object allocator over the fake clientset.
	IPAddress []netip.Prefix
	// APIServer lists the ranges on which the IPAddress allocator and the DualWrite allocator
	// are measured through a real kube-apiserver: Run starts an embedded etcd and a kube-apiserver
	// on it when it is not empty and a binary is at hand. Filling them creates one IPAddress object per address through the
	// server, so keep them small (a /20 holds 4094 addresses).
	APIServer []netip.Prefix
	// KubeAPIServer is the kube-apiserver binary for the APIServer ranges. Defaults to the one
	// localcluster.CachedKubeAPIServerBinary finds, never building one; if there is none, the
	// APIServer ranges give Results with Skipped set instead of measurements.
	KubeAPIServer string
	// Fills are the fill levels, in percent of the range's usable addresses (0 to 100).
	Fills []float64
	// Duration is how long each measurement runs, after filling. Defaults to 200ms.
	Duration time.Duration
	// Progress receives one line per measurement as it finishes. Defaults to io.Discard.
	Progress io.Writer
}

// Result is one measurement: one allocator, one range, one fill level.
type Result struct {
	Allocator string  `json:"allocator"`
	Range     string  `json:"range"`
	Fill      float64 `json:"fill"` // the requested fill level, in percent
	Size      uint64  `json:"size"` // usable addresses of the range
	Used      uint64  `json:"used"` // addresses held while measuring
	// Op is what one operation is: "AllocateNext+Release", or "AllocateNext (full)" when the
	// range is full and every AllocateNext fails with ErrFull.
	Op          string  `json:"op"`
	Ops         int     `json:"ops"`
	NsPerOp     float64 `json:"nsPerOp"`
	AllocsPerOp float64 `json:"allocsPerOp"`
	BytesPerOp  float64 `json:"bytesPerOp"`
	// Skipped, if not empty, says why the allocator was not measured on the range; Fill and the
	// fields after it are then zero, and there is one such Result per allocator and range.
	Skipped string `json:"skipped,omitempty"`
}

// Series names the line a Result belongs to in a chart: its allocator and range.
func (r Result) Series() string { return r.Allocator + " " + r.Range }

// Run measures what opts asks for and returns one Result per allocator, range and fill level,
// in that order: the bitmap, bitmap+etcd, ipaddress+fake, ipaddress+apiserver and
// dualwrite+apiserver allocators.
func Run(ctx context.Context, opts Options) ([]Result, error) {
	if opts.Duration <= 0 {
		opts.Duration = 200 * time.Millisecond
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	for _, f := range opts.Fills {
		if math.IsNaN(f) || f < 0 || f > 100 {
			return nil, fmt.Errorf("bench: fill level %v%% is not between 0 and 100", f)
		}
	}
	for _, cidr := range opts.APIServer {
		if n := usable(cidr); n > maxAPIServerRange {
			return nil, fmt.Errorf("bench: kube-apiserver range %v holds %d addresses, more than %d: filling it would create one IPAddress object per address through the server",
				cidr, n, maxAPIServerRange)
		}
	}
	var results []Result
	say := func(r Result) {
		fmt.Fprintf(opts.Progress, "%-20s %-18s %6.1f%%  %12.0f ns/op\n", r.Allocator, r.Range, r.Fill, r.NsPerOp)
	}
	add := func(r Result) {
		if r.Skipped == "" {
			say(r)
		}
		results = append(results, r)
	}
	for _, cidr := range opts.Bitmap {
		for _, fill := range opts.Fills {
			r, err := benchBitmap(ctx, cidr, fill, opts.Duration)
			if err != nil {
				return nil, err
			}
			add(r)
		}
	}
	// The kube-apiserver rows need a binary; without one they are skipped, and need no etcd.
	apiServer := len(opts.APIServer) > 0
	var skipped string
	if apiServer && opts.KubeAPIServer == "" {
		bin, err := localcluster.CachedKubeAPIServerBinary()
		if err != nil {
			skipped = fmt.Sprintf("no kube-apiserver binary: %v; give one with --kube-apiserver PATH or $%s",
				err, localcluster.KubeAPIServerEnv)
			apiServer = false
		}
		opts.KubeAPIServer = bin
	}
	var etcd *localcluster.Etcd
	var client *clientv3.Client
	if len(opts.Persistent) > 0 || apiServer {
		var err error
		if etcd, err = embedetcd.StartEtcd(ctx, localcluster.EtcdOptions{}); err != nil {
			return nil, fmt.Errorf("bench: start embedded etcd: %w", err)
		}
		defer etcd.Close()
		client, err = clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("bench: etcd client: %w", err)
		}
		defer client.Close()
	}
	n := 0
	for _, cidr := range opts.Persistent {
		for _, fill := range opts.Fills {
			n++
			key := etcdstore.ServiceIPsKey(fmt.Sprintf("/clusterip-bench/%d", n))
			r, err := benchPersistent(ctx, client, key, cidr, fill, opts.Duration)
			if err != nil {
				return nil, err
			}
			add(r)
		}
	}
	for _, cidr := range opts.IPAddress {
		rs, err := benchIPAddressFake(ctx, cidr, opts.Fills, opts.Duration)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			add(r)
		}
	}
	switch {
	case apiServer:
		rs, err := runAPIServer(ctx, etcd, client, opts, say)
		if err != nil {
			return nil, err
		}
		results = append(results, rs...)
	case len(opts.APIServer) > 0:
		for _, name := range []string{IPAddressAPIServer, DualWriteAPIServer} {
			for _, cidr := range opts.APIServer {
				add(Result{Allocator: name, Range: cidr.String(), Size: usable(cidr), Skipped: skipped})
			}
		}
	}
	return results, nil
}

// target returns how many of size addresses a fill level holds: rounded down, and one short of
// full for any level below 100%, so that AllocateNext always has a free address to find.
func target(size uint64, fill float64) uint64 {
	n := uint64(float64(size) * fill / 100)
	if fill < 100 && n >= size && size > 0 {
		n = size - 1
	}
	return min(n, size)
}

// fillBitmap allocates n addresses of a.
func fillBitmap(ctx context.Context, a *bitmap.Allocator, n uint64) error {
	for range n {
		if _, err := a.AllocateNext(ctx, allocator.Owner{}); err != nil {
			return fmt.Errorf("bench: fill %v: %w", a.CIDR(), err)
		}
	}
	return nil
}

func benchBitmap(ctx context.Context, cidr netip.Prefix, fill float64, d time.Duration) (Result, error) {
	a, err := bitmap.New(cidr)
	if err != nil {
		return Result{}, err
	}
	size := a.Used() + a.Free()
	if err := fillBitmap(ctx, a, target(size, fill)); err != nil {
		return Result{}, err
	}
	return measure(ctx, Bitmap, cidr, a, fill, d, 1024)
}

func benchPersistent(ctx context.Context, client *clientv3.Client, key string, cidr netip.Prefix, fill float64, d time.Duration) (Result, error) {
	// Fill in memory and store the snapshot once: filling through etcd would take one
	// compare-and-swap per address.
	mem, err := bitmap.New(cidr)
	if err != nil {
		return Result{}, err
	}
	size := mem.Used() + mem.Free()
	if err := fillBitmap(ctx, mem, target(size, fill)); err != nil {
		return Result{}, err
	}
	store := etcdstore.New(client, key)
	if _, err := store.Update(ctx, 0, mem.Snapshot()); err != nil {
		return Result{}, fmt.Errorf("bench: store the filled bitmap at %s: %w", key, err)
	}
	p, err := bitmap.NewPersistent(ctx, cidr, store)
	if err != nil {
		return Result{}, err
	}
	defer p.Close()
	return measure(ctx, Persistent, cidr, p, fill, d, 8)
}

// measure runs AllocateNext+Release pairs on a, an allocator of cidr, for about d, in batches
// of batch pairs, and reports their mean cost. On a full range it measures the failing
// AllocateNext instead.
func measure(ctx context.Context, name string, cidr netip.Prefix, a allocator.Interface, fill float64, d time.Duration, batch int) (Result, error) {
	r := Result{Allocator: name, Range: cidr.String(), Fill: fill, Size: a.Used() + a.Free(), Used: a.Used(), Op: "AllocateNext+Release"}
	full := a.Free() == 0
	if full {
		r.Op = "AllocateNext (full)"
	}
	op := func() error {
		ip, err := a.AllocateNext(ctx, allocator.Owner{Resource: "services", Namespace: "bench", Name: "bench"})
		if full {
			if errors.Is(err, allocator.ErrFull) {
				return nil
			}
			return fmt.Errorf("bench: %s AllocateNext on a full %v: got %v, want ErrFull", name, cidr, err)
		}
		if err != nil {
			return fmt.Errorf("bench: %s AllocateNext in %v: %w", name, cidr, err)
		}
		if err := a.Release(ctx, ip); err != nil {
			return fmt.Errorf("bench: %s Release %v: %w", name, ip, err)
		}
		return nil
	}
	// One warm-up batch, then measure.
	for range batch {
		if err := op(); err != nil {
			return r, err
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	var elapsed time.Duration
	for elapsed < d {
		for range batch {
			if err := op(); err != nil {
				return r, err
			}
		}
		r.Ops += batch
		elapsed = time.Since(start)
		if err := ctx.Err(); err != nil {
			return r, err
		}
	}
	runtime.ReadMemStats(&after)
	r.NsPerOp = float64(elapsed.Nanoseconds()) / float64(r.Ops)
	r.AllocsPerOp = float64(after.Mallocs-before.Mallocs) / float64(r.Ops)
	r.BytesPerOp = float64(after.TotalAlloc-before.TotalAlloc) / float64(r.Ops)
	return r, nil
}

// WriteTable prints results as an aligned table. A skipped allocator and range gets a row that
// says so, and a line after the table says why; a table with kube-apiserver rows ends with a
// note on how their ranges were filled.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ALLOCATOR\tRANGE\tSIZE\tFILL\tUSED\tOP\tOPS\tNS/OP\tALLOCS/OP\tB/OP\t")
	type skip struct{ allocators, ranges []string }
	var reasons []string
	skipped := map[string]*skip{} // reason → the allocators and ranges skipped for it
	apiServer := false
	for _, r := range results {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\t%d\t-\t-\tskipped\t-\t-\t-\t-\t\n", r.Allocator, r.Range, r.Size)
			s := skipped[r.Skipped]
			if s == nil {
				s = &skip{}
				skipped[r.Skipped] = s
				reasons = append(reasons, r.Skipped)
			}
			if !slices.Contains(s.allocators, r.Allocator) {
				s.allocators = append(s.allocators, r.Allocator)
			}
			if !slices.Contains(s.ranges, r.Range) {
				s.ranges = append(s.ranges, r.Range)
			}
			continue
		}
		apiServer = apiServer || r.Allocator == IPAddressAPIServer || r.Allocator == DualWriteAPIServer
		fmt.Fprintf(tw, "%s\t%s\t%d\t%g%%\t%d\t%s\t%d\t%.0f\t%.1f\t%.0f\t\n",
			r.Allocator, r.Range, r.Size, r.Fill, r.Used, r.Op, r.Ops, r.NsPerOp, r.AllocsPerOp, r.BytesPerOp)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, why := range reasons {
		s := skipped[why]
		if _, err := fmt.Fprintf(w, "skipped %s on %s: %s\n", strings.Join(s.allocators, " and "), strings.Join(s.ranges, ", "), why); err != nil {
			return err
		}
	}
	if apiServer {
		_, err := fmt.Fprintf(w, "The +apiserver rows run through a real kube-apiserver %s on the embedded etcd; each fill level is\n"+
			"made of IPAddress objects created one per address through it, so their ranges are small.\n"+
			"Their allocs/op and B/op include the client's and informers' work.\n", localcluster.KubeAPIServerVersion)
		return err
	}
	return nil
}

// seriesOf groups results by Series, in first-seen order, each sorted by fill.
func seriesOf(results []Result) (names []string, by map[string][]Result) {
	by = make(map[string][]Result)
	for _, r := range results {
		s := r.Series()
		if _, ok := by[s]; !ok {
			names = append(names, s)
		}
		by[s] = append(by[s], r)
	}
	for _, rs := range by {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].Fill < rs[j].Fill })
	}
	return names, by
}
