package multiprocess

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// The skew, fault and fairness tests run allocators in separate OS processes: this test binary
// run again with procSpecEnv set, which makes TestAllocatorProcess (and nothing else) the child.
// The child builds the Allocators of its spec, prints procReady, waits until its stdin closes (so
// that the parent starts every child at once), runs its operation and writes a procResult as JSON
// to spec.Out.

const (
	procSpecEnv = "CLUSTERIP_TEST_ALLOCPROC"
	procMarker  = "clusterip-allocproc:"
	procReady   = procMarker + " ready"
	procPaused  = procMarker + " paused "
)

// Operations of an allocator process.
const (
	opAllocate = "allocate" // Allocate each of IPs, Workers at a time
	opNext     = "next"     // AllocateNext Count times, Workers at a time
	opSaturate = "saturate" // AllocateNext with Workers workers for Duration
	opPause    = "pause"    // DualWrite AllocateNext that stops for good after its bitmap write
	// DualWrite AllocateNext, then a Release that stops for good after deleting the IPAddress
	// object, before it clears the bit
	opPauseRelease = "pause-release"
)

// procSpec is what an allocator process does, passed as JSON in procSpecEnv.
type procSpec struct {
	Name       string        `json:"name"`
	Mode       string        `json:"mode"`
	Ranges     []string      `json:"ranges"`
	Etcd       []string      `json:"etcd"`
	EtcdPrefix string        `json:"etcdPrefix,omitempty"`
	ManagedBy  string        `json:"managedBy,omitempty"` // Config.ManagedBy
	APIHost    string        `json:"apiHost,omitempty"`
	APIToken   string        `json:"apiToken,omitempty"`
	Op         string        `json:"op"`
	IPs        []string      `json:"ips,omitempty"`
	Count      int           `json:"count,omitempty"`
	Workers    int           `json:"workers,omitempty"`
	Duration   time.Duration `json:"duration,omitempty"`
	Out        string        `json:"out"`
}

// procResult is what an allocator process did.
type procResult struct {
	Allocated []string       `json:"allocated"`
	Failures  map[string]int `json:"failures"` // by kind: "allocated", "full", or the error text
	P50       time.Duration  `json:"p50,omitempty"`
	P99       time.Duration  `json:"p99,omitempty"`
	Ops       int            `json:"ops"`
}

func (r procResult) failed() int {
	n := 0
	for _, v := range r.Failures {
		n += v
	}
	return n
}

// TestAllocatorProcess is the body of an allocator process; it skips unless procSpecEnv is set.
func TestAllocatorProcess(t *testing.T) {
	var spec procSpec
	if !testenv.ChildSpec(t, procSpecEnv, &spec) {
		t.Skip("the allocator process of the skew, fault and fairness tests; runs only as their child")
	}
	res, err := runProc(t, spec)
	if err != nil {
		t.Fatalf("%s: %v", spec.Name, err)
	}
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spec.Out, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func runProc(t *testing.T, spec procSpec) (*procResult, error) {
	mode, err := featuregate.ParseMode(spec.Mode)
	if err != nil {
		return nil, err
	}
	var ranges []netip.Prefix
	for _, r := range spec.Ranges {
		ranges = append(ranges, netip.MustParsePrefix(r))
	}
	ec, err := clientv3.New(clientv3.Config{Endpoints: spec.Etcd, DialTimeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	defer ec.Close()
	cfg := clusterip.Config{Mode: mode, Ranges: ranges, Bitmaps: etcdstore.Stores{Client: ec, Prefix: spec.EtcdPrefix}, ManagedBy: spec.ManagedBy}
	if spec.APIHost != "" {
		rc := &rest.Config{Host: spec.APIHost, BearerToken: spec.APIToken, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 1000, Burst: 2000}
		if cfg.Client, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, err
		}
	}
	allocs := clustertest.StartAllocators(t, cfg)
	family := allocs.Families()[0]
	a := allocs.For(family)
	switch spec.Op {
	case opPause, opPauseRelease:
		dw, err := clusterip.NewDualWrite(allocs.ServiceCIDRs(family), pausingMirror{Interface: allocs.Bitmap(family), onRelease: spec.Op == opPauseRelease})
		if err != nil {
			return nil, err
		}
		a = dw
	}
	fmt.Println(procReady)
	io.Copy(io.Discard, os.Stdin) // the parent closes stdin to start every process at once

	ctx := context.Background()
	res := &procResult{Failures: map[string]int{}}
	var mu sync.Mutex // guards res and lat
	var lat []time.Duration
	record := func(ip netip.Addr, err error, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		res.Ops++
		lat = append(lat, d)
		switch {
		case err == nil:
			res.Allocated = append(res.Allocated, ip.String())
		case errors.Is(err, allocator.ErrAllocated):
			res.Failures["allocated"]++
		case errors.Is(err, allocator.ErrFull):
			res.Failures["full"]++
		default:
			res.Failures[err.Error()]++
		}
	}
	owner := func(i int) allocator.Owner {
		return allocator.Owner{Resource: "services", Namespace: "skew", Name: fmt.Sprintf("%s-%d", spec.Name, i)}
	}
	work := make(chan int)
	var wg sync.WaitGroup
	deadline := time.Now().Add(spec.Duration)
	for range max(spec.Workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				start := time.Now()
				switch spec.Op {
				case opPauseRelease:
					ip, err := a.AllocateNext(ctx, owner(i))
					if err == nil {
						err = a.Release(ctx, ip)
					}
					record(ip, err, time.Since(start))
				case opAllocate:
					ip := netip.MustParseAddr(spec.IPs[i])
					err := a.Allocate(ctx, ip, owner(i))
					record(ip, err, time.Since(start))
				default:
					ip, err := a.AllocateNext(ctx, owner(i))
					record(ip, err, time.Since(start))
				}
			}
		}()
	}
	switch spec.Op {
	case opAllocate:
		for i := range spec.IPs {
			work <- i
		}
	case opNext, opPause, opPauseRelease:
		for i := range max(spec.Count, 1) {
			work <- i
		}
	case opSaturate:
		for i := 0; time.Now().Before(deadline); i++ {
			work <- i
		}
	default:
		return nil, fmt.Errorf("unknown op %q", spec.Op)
	}
	close(work)
	wg.Wait()
	slices.Sort(lat)
	if len(lat) > 0 {
		res.P50, res.P99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return res, nil
}

// pausingMirror is a bitmap mirror that announces an address on stdout and never returns, so
// that the process stops between the two writes of a dual write for its parent to kill: once it
// has set a bit, or, with onRelease, when it is asked to clear one (the IPAddress object is
// deleted by then).
type pausingMirror struct {
	allocator.Interface
	onRelease bool
}

func (m pausingMirror) Allocate(ctx context.Context, ip netip.Addr, owner allocator.Owner) error {
	if err := m.Interface.Allocate(ctx, ip, owner); err != nil {
		return err
	}
	if !m.onRelease {
		m.pause(ip)
	}
	return nil
}

func (m pausingMirror) AllocateNext(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
	ip, err := m.Interface.AllocateNext(ctx, owner)
	if err != nil {
		return ip, err
	}
	if !m.onRelease {
		m.pause(ip)
	}
	return ip, nil
}

func (m pausingMirror) Release(ctx context.Context, ip netip.Addr) error {
	if m.onRelease {
		m.pause(ip)
	}
	return m.Interface.Release(ctx, ip)
}

func (pausingMirror) pause(ip netip.Addr) {
	fmt.Println(procPaused + ip.String())
	select {}
}

// proc is a running allocator process.
type proc struct {
	t     testing.TB
	spec  procSpec
	child *testenv.Child
	lines chan string // stdout lines with procMarker; closed when stdout closes
}

// startProc starts an allocator process for spec and waits until it is ready. The Etcd endpoints
// and the kube-apiserver's address come from etcd and api (nil: none).
func startProc(t testing.TB, spec procSpec, etcd *testenv.Etcd, api *testenv.KubeAPIServer) *proc {
	t.Helper()
	spec.Etcd = etcd.Endpoints()
	if api != nil {
		spec.APIHost, spec.APIToken = api.Config.Host, api.Config.BearerToken
	}
	spec.Out = filepath.Join(t.TempDir(), spec.Name+".json")
	p := &proc{t: t, spec: spec, lines: make(chan string, 16)}
	p.child = testenv.StartChild(t, spec.Name, "TestAllocatorProcess", procSpecEnv, spec, func(line string) bool {
		if !strings.HasPrefix(line, procMarker) {
			return false
		}
		p.lines <- line
		return true
	})
	go func() {
		<-p.child.Done()
		close(p.lines)
	}()
	if line := p.next(); line != procReady {
		_ = p.child.Kill()
		t.Fatalf("%s: got %q, want %q; its output:\n%s", spec.Name, line, procReady, p.child.Output())
	}
	return p
}

// next returns the next marker line of the process, or "" once it has exited or after a minute.
func (p *proc) next() string {
	select {
	case line := <-p.lines:
		return line
	case <-time.After(time.Minute):
		return ""
	}
}

// start lets the process run its operation.
func (p *proc) start() { p.child.Start() }

// kill sends SIGKILL.
func (p *proc) kill() {
	if err := p.child.Kill(); err != nil {
		p.t.Fatalf("kill %s: %v", p.spec.Name, err)
	}
}

// wait waits for the process to finish and returns its result.
func (p *proc) wait() procResult {
	p.t.Helper()
	if err := p.child.Wait(); err != nil {
		p.t.Fatalf("%s: %v; its output:\n%s", p.spec.Name, err, p.child.Output())
	}
	data, err := os.ReadFile(p.spec.Out)
	if err != nil {
		p.t.Fatalf("%s: %v", p.spec.Name, err)
	}
	var r procResult
	if err := json.Unmarshal(data, &r); err != nil {
		p.t.Fatalf("%s: %v", p.spec.Name, err)
	}
	return r
}
