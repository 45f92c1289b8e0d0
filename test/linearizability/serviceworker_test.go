package linearizability

import (
	"context"
	"fmt"
	"math/rand"
	"net/netip"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// serviceWorker creates and deletes Services through kube-apiserver until the deadline, as one
// sequential client: Services that name a ClusterIP are Allocates, the others AllocateNexts,
// deletes Releases.
func (h *harness) serviceWorker(client int, rng *rand.Rand) {
	rc := &rest.Config{Host: "https://" + h.svcProxy.Addr(), BearerToken: h.token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 1000, Burst: 2000}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		h.t.Error(err)
		return
	}
	type svc struct {
		name string
		ip   netip.Addr
	}
	var held []svc
	for seq := 0; time.Now().Before(h.deadline); seq++ {
		key := fmt.Sprintf("kube-apiserver/%d/%d", client, seq)
		op := Op{Client: client, Process: "kube-apiserver", Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true, FallsBackToObjects: true, SetsBitFirst: true}
		ctx, cancel := context.WithTimeout(context.Background(), serviceTimeout)
		r := rng.Float64()
		if len(held) >= 3 || (len(held) > 0 && r < 0.35) {
			i := rng.Intn(len(held))
			s := held[i]
			held = append(held[:i], held[i+1:]...)
			op.Kind, op.Addr = Release, s.ip
			op.Call = time.Now().UnixNano()
			h.rec.call(key, op)
			err := c.CoreV1().Services(metav1.NamespaceDefault).Delete(ctx, s.name, metav1.DeleteOptions{})
			op.Return = time.Now().UnixNano()
			op.Outcome = OK
			if err != nil {
				op.Outcome, op.Err = Unknown, err.Error()
			}
		} else {
			name := fmt.Sprintf("h-%d-%d", client, seq)
			op.Kind, op.Owner, op.Range = AllocateNext, metav1.NamespaceDefault+"/"+name, h.rg
			want := ""
			if r < 0.7 {
				op.Kind, op.Addr = Allocate, pickAddr(rng, h.rg)
				want = op.Addr.String()
			}
			op.Call = time.Now().UnixNano()
			h.rec.call(key, op)
			got, err := c.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(name, want), metav1.CreateOptions{})
			op.Return = time.Now().UnixNano()
			op.Outcome = serviceOutcome(op.Kind, err)
			if err != nil {
				op.Err = err.Error()
			} else if op.Addr, err = netip.ParseAddr(got.Spec.ClusterIP); err != nil {
				h.t.Errorf("Service %s created with ClusterIP %q: %v", name, got.Spec.ClusterIP, err)
			}
			if op.Kind == AllocateNext && op.Outcome != OK {
				op.Addr = netip.Addr{}
			}
			if op.Outcome == OK {
				held = append(held, svc{name: name, ip: op.Addr})
			}
		}
		cancel()
		h.rec.ret(key, op)
		pause := time.Duration(10+rng.Intn(30)) * time.Millisecond
		if op.Outcome == Unknown {
			pause = unknownBackoff
		}
		time.Sleep(pause)
	}
}

// serviceOutcome classifies kube-apiserver's answer to a Service create: refusals the model
// checks are its 422 for a ClusterIP already allocated and for a full range.
func serviceOutcome(k Kind, err error) Outcome {
	switch {
	case err == nil:
		return OK
	case !apierrors.IsInvalid(err):
		return Unknown
	case k == Allocate && strings.Contains(err.Error(), "provided IP is already allocated"):
		return Refused
	case k == AllocateNext && strings.Contains(err.Error(), "range is full"):
		return Refused
	}
	return Unknown
}
