package repair_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// The soak test (soak_test.go) runs each allocator in a process of its own: this test binary run
// again with soakSpecEnv set, which makes TestSoakProcess (and nothing else) the child. The child
// is a small Service registry, as a kube-apiserver that imports this library would be: it builds
// the Allocators of its mode with clusterip.New (the public API only), prints "ready", waits
// until its stdin closes (so that the parent starts every child at once), and then creates and
// deletes Services for a fixed number of operations. It stores the Services in etcd itself, where
// kube-apiserver keeps them, so that the kube-apiserver serves them (and the audit reads them)
// without allocating their ClusterIPs a second time. Every line it prints for the parent starts
// with soakMarker.

const (
	soakSpecEnv = "CLUSTERIP_TEST_SOAKPROC"
	soakMarker  = "clusterip-soak:"
)

// Lines a soak process prints, after soakMarker and a space:
//
//	hold <service> <ip> <unix ns>   its service.Allocator handed ip to the Service
//	free <service> <ip> <unix ns>   just before it gives ip back (deleted, or never stored)
//	created|deleted|taken           a Service stored and committed; deleted and released; a
//	                                create refused because its chosen address was taken (422)
//	fail <kind> <error>             any other failure: allocate, store (then reverted), revert,
//	                                delete, release, unknown (an etcd write whose outcome could
//	                                not be learnt)
//	op                              after each operation
//	paused <ip>                     the victim stopped for good between allocating ip and storing
//	                                its Service
//
// The times let the parent check that no two Services ever held one address at once: each
// [hold, free] interval lies inside the time the address was really reserved for its Service.
const (
	soakHold    = "hold"
	soakFree    = "free"
	soakCreated = "created"
	soakDeleted = "deleted"
	soakTaken   = "taken"
	soakFail    = "fail"
	soakOp      = "op"
	soakPaused  = "paused"
)

// soakSpec is what a soak process does, passed as JSON in soakSpecEnv.
type soakSpec struct {
	Name     string   `json:"name"` // also the prefix of its Services' names
	Mode     string   `json:"mode"` // featuregate.Mode.String()
	Range    string   `json:"range"`
	Etcd     []string `json:"etcd"`
	APIHost  string   `json:"apiHost"`
	APIToken string   `json:"apiToken"`
	Seed     uint64   `json:"seed"`
	Ops      int      `json:"ops"`     // operations in all
	Workers  int      `json:"workers"` // operations at a time
	MaxLive  int      `json:"maxLive"` // at most this many of its Services exist at once
	// Weights of the three ways a create asks for its ClusterIP: any free address (AllocateNext),
	// a chosen address of Low, a chosen address of High.
	Next, FromLow, FromHigh int
	Low, High               []string `json:",omitempty"`
	// KillAt, if positive, makes the process the victim: at its first successful allocation from
	// operation KillAt on, it prints "paused <ip>" and that worker stops for good, before the
	// Service is stored, for the parent to SIGKILL it there.
	KillAt int `json:"killAt,omitempty"`
}

// TestSoakProcess is the body of a soak process; it skips unless soakSpecEnv is set.
func TestSoakProcess(t *testing.T) {
	var spec soakSpec
	if !testenv.ChildSpec(t, soakSpecEnv, &spec) {
		t.Skip("the allocator process of TestSoakMixedModes; runs only as its child")
	}
	if err := runSoakProcess(spec); err != nil {
		t.Fatalf("%s: %v", spec.Name, err)
	}
}

// soakProcess is the state of a running soak process.
type soakProcess struct {
	spec     soakSpec
	services *service.Allocator
	store    *serviceStore
	next     atomic.Int64 // the next operation number
	paused   atomic.Bool  // the victim has stopped a worker

	outMu sync.Mutex // serialises lines on stdout

	mu   sync.Mutex // guards live
	live []*corev1.Service
}

// runSoakProcess builds the Allocators of spec, waits for the parent's start and runs spec.Ops
// operations, spec.Workers at a time.
func runSoakProcess(spec soakSpec) error {
	mode, err := featuregate.ParseMode(spec.Mode)
	if err != nil {
		return err
	}
	rg, err := netip.ParsePrefix(spec.Range)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ec, err := clientv3.New(clientv3.Config{Endpoints: spec.Etcd, DialTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer ec.Close()
	rc := &rest.Config{Host: spec.APIHost, BearerToken: spec.APIToken, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 1000, Burst: 2000}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	cfg := clusterip.Config{Mode: mode, Ranges: []netip.Prefix{rg}, Client: client}
	if mode != featuregate.IPAddressOnly {
		cfg.Bitmaps = etcdstore.Stores{Client: ec}
	}
	var inf informers.SharedInformerFactory
	if mode != featuregate.Legacy {
		inf = informers.NewSharedInformerFactory(client, 0)
		cfg.Informers = inf
	}
	allocs, err := clusterip.New(ctx, cfg)
	if err != nil {
		return err
	}
	if inf != nil {
		inf.Start(ctx.Done())
	}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		allocs.Run(ctx)
	}()
	defer func() {
		cancel()
		<-ran
		if inf != nil {
			inf.Shutdown()
		}
		allocs.Close()
	}()
	readyCtx, cancelReady := context.WithTimeout(ctx, time.Minute)
	err = allocs.WaitReady(readyCtx)
	cancelReady()
	if err != nil {
		return err
	}
	store, err := newServiceStore(ec)
	if err != nil {
		return err
	}
	p := &soakProcess{spec: spec, services: allocs.Services(), store: store}
	p.emit("ready")
	io.Copy(io.Discard, os.Stdin) // the parent closes stdin to start every process at once

	var wg sync.WaitGroup
	for w := range max(spec.Workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(spec.Seed, uint64(w)))
			for {
				i := int(p.next.Add(1) - 1)
				if i >= spec.Ops {
					return
				}
				p.operate(r, i)
				p.emit(soakOp)
			}
		}()
	}
	wg.Wait()
	return nil
}

// emit prints one line for the parent: soakMarker and the words.
func (p *soakProcess) emit(words ...string) {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	fmt.Println(soakMarker + " " + strings.Join(words, " "))
}

// emitIP prints a hold or free line for ip of svc, stamped now.
func (p *soakProcess) emitIP(kind string, svc *corev1.Service, ip string) {
	p.emit(kind, svc.Name, ip, strconv.FormatInt(time.Now().UnixNano(), 10))
}

// fail reports a failure of kind.
func (p *soakProcess) fail(kind string, err error) {
	p.emit(soakFail, kind, strings.ReplaceAll(err.Error(), "\n", " "))
}

// opTimeout bounds each call of an operation, so that a worker never hangs while etcd is down.
const opTimeout = 5 * time.Second

// operate runs operation i: it deletes one of the process's Services, or creates one.
func (p *soakProcess) operate(r *rand.Rand, i int) {
	p.mu.Lock()
	var victim *corev1.Service
	if n := len(p.live); n > 0 && (n >= p.spec.MaxLive || r.IntN(100) < 40) {
		j := r.IntN(n)
		victim = p.live[j]
		p.live[j] = p.live[n-1]
		p.live = p.live[:n-1]
	}
	p.mu.Unlock()
	if victim != nil {
		p.delete(victim)
		return
	}
	p.create(r, i)
}

// create allocates the ClusterIP of a new Service, as kube-apiserver's registry does, stores the
// Service in etcd, and commits, or reverts if the Service was not stored.
func (p *soakProcess) create(r *rand.Rand, i int) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: metav1.NamespaceDefault, Name: fmt.Sprintf("%s-%d", p.spec.Name, i),
			UID: uuid.NewUUID(), CreationTimestamp: metav1.Now(),
		},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}},
		},
	}
	switch k := r.IntN(p.spec.Next + p.spec.FromLow + p.spec.FromHigh); {
	case k < p.spec.Next:
	case k < p.spec.Next+p.spec.FromLow:
		svc.Spec.ClusterIP = p.spec.Low[r.IntN(len(p.spec.Low))]
	default:
		svc.Spec.ClusterIP = p.spec.High[r.IntN(len(p.spec.High))]
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	txn, err := p.services.Allocate(ctx, svc, false)
	switch {
	case apierrors.IsInvalid(err):
		p.emit(soakTaken)
		return
	case err != nil:
		p.fail("allocate", err)
		return
	}
	ip := svc.Spec.ClusterIP
	p.emitIP(soakHold, svc, ip)
	if p.spec.KillAt > 0 && i >= p.spec.KillAt && p.paused.CompareAndSwap(false, true) {
		p.emit(soakPaused, ip)
		select {} // stopped here, between the allocation and the Service, until SIGKILL
	}
	stored, err := p.store.create(ctx, svc)
	switch {
	case stored:
		if err := txn.Commit(ctx); err != nil {
			p.fail("commit", err)
		}
		p.emit(soakCreated)
		p.mu.Lock()
		p.live = append(p.live, svc)
		p.mu.Unlock()
	case errors.Is(err, errOutcomeUnknown):
		// The Service may exist: keep the allocation, at worst a leak for repair.
		p.fail("unknown", err)
	default:
		if err != nil {
			p.fail("store", err)
		}
		p.emitIP(soakFree, svc, ip)
		rctx, rcancel := context.WithTimeout(context.Background(), opTimeout)
		defer rcancel()
		if err := txn.Revert(rctx); err != nil {
			p.fail("revert", err) // a leak for repair
		}
	}
}

// delete deletes svc from etcd and then releases its ClusterIP, as kube-apiserver's registry does.
// If the delete fails, svc stays one of the process's Services.
func (p *soakProcess) delete(svc *corev1.Service) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	gone, err := p.store.delete(ctx, svc)
	switch {
	case !gone && errors.Is(err, errOutcomeUnknown):
		// The Service may be gone: keep its allocation, at worst a leak for repair.
		p.fail("unknown", err)
		return
	case !gone:
		if err != nil {
			p.fail("delete", err)
		}
		p.mu.Lock()
		p.live = append(p.live, svc)
		p.mu.Unlock()
		return
	}
	p.emitIP(soakFree, svc, svc.Spec.ClusterIP)
	if err := p.services.Release(ctx, svc); err != nil {
		p.fail("release", err) // a leak for repair
	}
	p.emit(soakDeleted)
}

// errOutcomeUnknown marks an etcd write whose outcome could not be learnt.
var errOutcomeUnknown = errors.New("outcome unknown")

// serviceStore keeps Services in etcd where kube-apiserver keeps them (/registry/services/specs/
// <namespace>/<name>), in its storage encoding (protobuf with the "k8s\x00" envelope), so that the
// kube-apiserver serves them as its own.
//
// A write that fails may still have been applied (a timeout while etcd restarts): the store then
// reads the key back until etcd answers, as a registry must before it reverts an allocation, or
// it could free an address a stored Service holds.
type serviceStore struct {
	etcd    *clientv3.Client
	encoder runtime.Encoder
}

// newServiceStore returns a serviceStore in the etcd of c.
func newServiceStore(c *clientv3.Client) (*serviceStore, error) {
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		return nil, errors.New("the client-go scheme has no protobuf serializer")
	}
	return &serviceStore{etcd: c, encoder: scheme.Codecs.WithoutConversion().EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)}, nil
}

// soakServicesPrefix is the etcd prefix under which kube-apiserver (with the default --etcd-prefix)
// keeps Services.
const soakServicesPrefix = "/registry/services/specs/"

// key returns the etcd key of svc.
func (s *serviceStore) key(svc *corev1.Service) string {
	return soakServicesPrefix + svc.Namespace + "/" + svc.Name
}

// create stores svc if no Service of its name exists, and reports whether it stored it. If the
// write fails, it learns the outcome from a read; if it cannot, the error wraps errOutcomeUnknown.
func (s *serviceStore) create(ctx context.Context, svc *corev1.Service) (bool, error) {
	var buf bytes.Buffer
	if err := s.encoder.Encode(svc, &buf); err != nil {
		return false, err
	}
	key, val := s.key(svc), buf.String()
	resp, err := s.etcd.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(clientv3.OpPut(key, val)).Commit()
	if err == nil {
		if !resp.Succeeded {
			return false, fmt.Errorf("service %s exists", key)
		}
		return true, nil
	}
	got, present, rerr := s.read(key)
	if rerr != nil {
		return false, fmt.Errorf("create %s: %w; then %w: %w", key, err, errOutcomeUnknown, rerr)
	}
	return present && got == val, fmt.Errorf("create %s: %w", key, err)
}

// delete deletes svc and reports whether it is gone. If the delete fails, it learns the outcome
// from a read; if it cannot, the error wraps errOutcomeUnknown.
func (s *serviceStore) delete(ctx context.Context, svc *corev1.Service) (bool, error) {
	key := s.key(svc)
	_, err := s.etcd.Delete(ctx, key)
	if err == nil {
		return true, nil
	}
	_, present, rerr := s.read(key)
	if rerr != nil {
		return false, fmt.Errorf("delete %s: %w; then %w: %w", key, err, errOutcomeUnknown, rerr)
	}
	return !present, fmt.Errorf("delete %s: %w", key, err)
}

// read reads key with a linearizable Get, retrying for up to a minute while etcd is away.
func (s *serviceStore) read(key string) (val string, present bool, err error) {
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := s.etcd.Get(ctx, key)
		cancel()
		if err == nil {
			if len(resp.Kvs) == 0 {
				return "", false, nil
			}
			return string(resp.Kvs[0].Value), true, nil
		}
		if time.Now().After(deadline) {
			return "", false, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// parseSoakLine parses a line a soak process printed, without soakMarker and the space after it:
// its kind and the rest of its fields; a fail line has two, its kind and the error.
func parseSoakLine(line string) (kind string, fields []string) {
	kind, rest, _ := strings.Cut(line, " ")
	if kind == soakFail {
		k, msg, _ := strings.Cut(rest, " ")
		return kind, []string{k, msg}
	}
	return kind, strings.Fields(rest)
}
