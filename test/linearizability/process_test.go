package linearizability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/netip"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// An allocator process is this test binary run again with procSpecEnv set, which makes
// TestHistoryProcess (and nothing else) its body. It builds the Allocators of its spec against
// the etcd members and kube-apiserver it is given (each through a proxy of the parent's, which
// can cut it off), says procReady, waits until its stdin closes, and then runs random
// operations until the spec's deadline, writing each one on stdout twice: when it is called and
// when it returns. The parent, which may kill or pause it at any time, keeps the history.

const (
	procSpecEnv = "CLUSTERIP_TEST_HISTORY_PROC"
	procMarker  = "clusterip-history: "
	procReady   = procMarker + "ready"
	// testManagedBy labels the IPAddress objects of the allocator processes, so that
	// kube-apiserver's repair loop leaves those of addresses held for no Service alone.
	testManagedBy = "clusterip-history"
)

// procSpec is what an allocator process does, passed as JSON in procSpecEnv.
type procSpec struct {
	Name       string        `json:"name"`  // the process and its incarnation, such as "legacy-0#1"
	Owner      string        `json:"owner"` // prefix of its owners' names
	Mode       string        `json:"mode"`
	Range      string        `json:"range"`
	Etcd       []string      `json:"etcd"`
	APIHost    string        `json:"apiHost,omitempty"`
	APIToken   string        `json:"apiToken,omitempty"`
	ClientBase int           `json:"clientBase"` // the Op.Client of its first worker
	Workers    int           `json:"workers"`
	Deadline   time.Time     `json:"deadline"` // no operation starts after it
	OpTimeout  time.Duration `json:"opTimeout"`
	Seed       int64         `json:"seed"`
	// Dump is the file the process writes its goroutines to, before it exits with status 3, if
	// it has not finished 20 seconds after Deadline.
	Dump string `json:"dump"`
}

// procLine is one line an allocator process writes about an operation: Op as called (Return
// zero), then Op as returned, under the same ID.
type procLine struct {
	ID int `json:"id"`
	Op Op  `json:"op"`
}

// family returns the allocator of the one family an allocator process serves.
func family(a *clusterip.Allocators) allocator.Interface { return a.For(a.Families()[0]) }

// TestHistoryProcess is the body of an allocator process; it skips unless procSpecEnv is set.
func TestHistoryProcess(t *testing.T) {
	var spec procSpec
	if !testenv.ChildSpec(t, procSpecEnv, &spec) {
		t.Skip("an allocator process of the linearizability harness; runs only as its child")
	}
	if err := runProcess(spec); err != nil {
		t.Fatalf("%s: %v", spec.Name, err)
	}
}

func runProcess(spec procSpec) error {
	mode, err := featuregate.ParseMode(spec.Mode)
	if err != nil {
		return err
	}
	rg := netip.MustParsePrefix(spec.Range)
	ec, err := clientv3.New(clientv3.Config{
		Endpoints:            spec.Etcd,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return err
	}
	defer ec.Close()
	cfg := clusterip.Config{Mode: mode, Ranges: []netip.Prefix{rg}, Bitmaps: etcdstore.Stores{Client: ec}, ManagedBy: testManagedBy}
	var inf informers.SharedInformerFactory
	if mode != featuregate.Legacy {
		rc := &rest.Config{Host: spec.APIHost, BearerToken: spec.APIToken, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 1000, Burst: 2000}
		if cfg.Client, err = kubernetes.NewForConfig(rc); err != nil {
			return err
		}
		inf = informers.NewSharedInformerFactory(cfg.Client, 0)
		cfg.Informers = inf
	}
	// In IPAddressOnly mode, the one in which reservations work, the process also reserves and
	// releases addresses and creates the Services named in its reservations (reservations.go).
	var rc *reservation.Client
	if mode == featuregate.IPAddressOnly {
		cfg.Reservations = true
		if rc, err = reservation.New(cfg.Client); err != nil {
			return err
		}
		if err := optInServiceNamespace(cfg.Client); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	newCtx, newCancel := context.WithTimeout(ctx, time.Minute)
	allocs, err := clusterip.New(newCtx, cfg)
	newCancel()
	if err != nil {
		return err
	}
	defer allocs.Close()
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		allocs.Run(ctx)
	}()
	defer func() {
		cancel()
		<-ran
		if inf != nil {
			inf.Shutdown() // its informers stop with ctx
		}
	}()
	if inf != nil {
		inf.Start(ctx.Done())
		syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
		inf.WaitForCacheSync(syncCtx.Done())
		for syncCtx.Err() == nil && !allocs.ServiceCIDRs(allocs.Families()[0]).Ready() {
			time.Sleep(10 * time.Millisecond)
		}
		syncCancel()
	}
	fmt.Println(procReady)
	io.Copy(io.Discard, os.Stdin) // the parent closes stdin to start the process

	watchdog := time.AfterFunc(time.Until(spec.Deadline)+20*time.Second, func() {
		if f, err := os.Create(spec.Dump); err == nil {
			pprof.Lookup("goroutine").WriteTo(f, 2)
			f.Close()
		}
		os.Exit(3)
	})
	_ = watchdog // it also covers what the deferred calls do, so it is never stopped
	a := family(allocs)
	var out sync.Mutex // serialises lines on stdout
	var wg sync.WaitGroup
	for w := range spec.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wk := worker{spec: spec, a: a, rg: rg, client: spec.ClientBase + w, out: &out,
				rng: rand.New(rand.NewSource(spec.Seed + int64(w)))}
			if rc != nil {
				wk.rc, wk.svcs, wk.claimer = rc, allocs.Services(), allocs.Reservations()
			}
			wk.run()
		}()
	}
	wg.Wait()
	return nil
}

// worker is one sequential client of an allocator process.
type worker struct {
	spec   procSpec
	a      allocator.Interface
	rg     netip.Prefix
	client int
	out    *sync.Mutex
	rng    *rand.Rand
	// With reservations (IPAddressOnly mode): the client that reserves and releases, and the
	// allocator of Services, which claims them; nil otherwise.
	rc      *reservation.Client
	svcs    *service.Allocator
	claimer *reservation.Claimer
}

func (w worker) emit(id int, op Op) {
	line, _ := json.Marshal(procLine{ID: id, Op: op})
	w.out.Lock()
	defer w.out.Unlock()
	fmt.Println(procMarker + string(line))
}

func (w worker) run() {
	var held []netip.Addr
	var rs reservationState
	for seq := 0; time.Now().Before(w.spec.Deadline); seq++ {
		id := w.client*1_000_000 + seq
		if w.rc != nil && w.rng.Float64() < reservationShare {
			w.pause(w.reservationStep(id, seq, &rs))
			continue
		}
		op := Op{Client: w.client, Process: w.spec.Name, Bitmap: w.spec.Mode != featuregate.IPAddressOnly.String(),
			LeavesBit: w.spec.Mode == featuregate.DualWrite.String(), ClearsBitLast: w.spec.Mode == featuregate.DualWrite.String(),
			SetsBitFirst: w.spec.Mode == featuregate.DualWrite.String()}
		r := w.rng.Float64()
		switch {
		case len(held) >= 3 || (len(held) > 0 && r < 0.35):
			i := w.rng.Intn(len(held))
			op.Kind, op.Addr = Release, held[i]
			held = append(held[:i], held[i+1:]...)
		case r < 0.7:
			op.Kind, op.Range = AllocateNext, w.rg
		default:
			op.Kind, op.Addr = Allocate, pickAddr(w.rng, w.rg)
		}
		if op.Kind != Release {
			op.Owner = fmt.Sprintf("%s-%d-%d", w.spec.Owner, w.client, seq)
		}
		owner := allocator.Owner{Resource: "services", Namespace: "history", Name: op.Owner}
		op.Call = time.Now().UnixNano()
		w.emit(id, op)
		ctx, cancel := context.WithTimeout(context.Background(), w.spec.OpTimeout)
		var givenBack, kept givenBackBits
		var err error
		switch op.Kind {
		case Allocate:
			err = w.a.Allocate(ctx, op.Addr, owner)
		case AllocateNext:
			if w.spec.Mode == featuregate.DualWrite.String() {
				ctx = clusterip.WithDualWriteTrace(ctx, &clusterip.DualWriteTrace{BitGivenBack: givenBack.add, BitKept: kept.add})
			}
			op.Addr, err = w.a.AllocateNext(ctx, owner)
		case Release:
			err = w.a.Release(ctx, op.Addr)
		}
		cancel()
		op.Return = time.Now().UnixNano()
		op.Outcome = outcomeOf(op.Kind, err)
		if err != nil {
			op.Err = err.Error()
			if op.Kind == Allocate && op.Outcome == Refused && w.spec.Mode == featuregate.DualWrite.String() {
				op.TransientBit, op.RefusalLeavesBit = dualWriteRefusal(err)
			}
		}
		if op.Kind != AllocateNext || op.Outcome != OK {
			op.Addr = op.Addr.Unmap()
		}
		if op.Kind == AllocateNext && op.Outcome != OK {
			op.Addr = netip.Addr{}
		}
		w.emit(id, op)
		recorded := 0
		for kind, ips := range map[Kind][]netip.Addr{GiveBack: givenBack.addrs(), KeepBit: kept.addrs()} {
			for _, ip := range ips {
				recorded++
				gb := Op{Client: w.client, Process: w.spec.Name, Kind: kind, Addr: ip.Unmap(), Call: op.Call, Outcome: OK, Bitmap: true}
				gid := -(id*1000 + recorded) // apart from the IDs of called operations
				w.emit(gid, gb)
				gb.Return = op.Return
				w.emit(gid, gb)
			}
		}
		if op.Kind != Release && op.Outcome == OK {
			held = append(held, op.Addr)
		}
		w.pause(op.Outcome)
	}
}

// givenBackBits collects the addresses whose bits one DualWrite call gave back or kept
// (clusterip.DualWriteTrace), which the history records as GiveBack or KeepBit operations over
// the call's interval. The zero value is empty.
type givenBackBits struct {
	mu  sync.Mutex
	ips []netip.Addr
}

func (g *givenBackBits) add(ip netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ips = append(g.ips, ip)
}

func (g *givenBackBits) addrs() []netip.Addr {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.ips)
}

// pause waits before the next operation, longer after one whose outcome is unknown.
func (w worker) pause(o Outcome) {
	pause := time.Duration(5+w.rng.Intn(20)) * time.Millisecond
	if o == Unknown {
		pause = unknownBackoff // as a client backs off from a failing server
	}
	time.Sleep(pause)
}

// outcomeOf classifies the error of an allocator call: the refusals the model checks are
// ErrAllocated and ErrFull; every other error may have come after a write took effect.
func outcomeOf(k Kind, err error) Outcome {
	switch {
	case err == nil:
		return OK
	case k == Allocate && errors.Is(err, allocator.ErrAllocated):
		return Refused
	case k == AllocateNext && errors.Is(err, allocator.ErrFull):
		return Refused
	}
	return Unknown
}

// Texts of the errors of a DualWrite Allocate refused (dualwrite.go): bitmapRefusal because the
// bit was set already, before it reserved anything; keptBitRefusal because its IPAddress create
// lost its answer and a read then found the object held for another owner, after which it keeps
// the bit it set, since the create may still land (settle, outcomeOthers).
const (
	bitmapRefusal  = "is set in the bitmap"
	keptBitRefusal = "its IPAddress belongs to another owner"
)

// dualWriteRefusal classifies the ErrAllocated of a DualWrite Allocate: transient when it set
// the bit and cleared it again (Op.TransientBit), keepsBit when it set the bit and kept it
// (Op.RefusalLeavesBit, a bit no Release clears, since the holder of the object did not set
// it); neither when the bit was set already.
func dualWriteRefusal(err error) (transient, keepsBit bool) {
	switch {
	case strings.Contains(err.Error(), bitmapRefusal):
		return false, false
	case strings.Contains(err.Error(), keptBitRefusal):
		return false, true
	}
	return true, false
}

// unknownBackoff is how long a worker waits after an operation whose outcome is unknown.
const unknownBackoff = 300 * time.Millisecond

// hotAddrs is how many addresses at the bottom of the range half of the chosen addresses come
// from, so that processes often ask for the same one at once.
const hotAddrs = 8

// pickAddr returns a usable address of rg: half the time one of the hotAddrs lowest, else any.
func pickAddr(rng *rand.Rand, rg netip.Prefix) netip.Addr {
	usable := 1<<(rg.Addr().BitLen()-rg.Bits()) - 2
	n := 1 + rng.Intn(usable)
	if rng.Intn(2) == 0 {
		n = 2 + rng.Intn(hotAddrs) // 10.96.0.1 is the kubernetes Service's
	}
	a := rg.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}

func TestDualWriteRefusalSaysWhatHappenedToTheBit(t *testing.T) {
	tests := []struct {
		name                string
		err                 string
		transient, keepsBit bool
	}{
		{"bit set already", "clusterip: 10.96.0.2 is set in the bitmap of 10.96.0.0/25: allocator: address already allocated", false, false},
		{"create refused, bit cleared", `ipaddress: 10.96.0.2: allocator: address already allocated (ipaddresses.networking.k8s.io "10.96.0.2" already exists)`, true, false},
		{"create's answer lost, object another owner's, bit kept", "clusterip: 10.96.0.6: its IPAddress belongs to another owner (after ipaddress: create IPAddress 10.96.0.6: context deadline exceeded): allocator: address already allocated", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			transient, keepsBit := dualWriteRefusal(errors.New(tt.err))
			if transient != tt.transient || keepsBit != tt.keepsBit {
				t.Errorf("dualWriteRefusal(%q) = %v, %v; want %v, %v", tt.err, transient, keepsBit, tt.transient, tt.keepsBit)
			}
		})
	}
}
