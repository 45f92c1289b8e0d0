package linearizability

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// countUnknown returns how many operations of history have an unknown outcome.
func countUnknown(history []Op) int {
	n := 0
	for _, op := range history {
		if op.Outcome == Unknown {
			n++
		}
	}
	return n
}

// storedServices returns the address of each Service in the default namespace, by
// "namespace/name", read once the history has ended; it retries for a minute while
// kube-apiserver does not answer.
func (h *harness) storedServices() (map[string]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var list *corev1.ServiceList
	for {
		l, err := h.currentAPI().Client.CoreV1().Services(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err == nil {
			list = l
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("list the Services after the history: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stored := make(map[string]netip.Addr, len(list.Items))
	for _, svc := range list.Items {
		ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil {
			return nil, fmt.Errorf("Service %s/%s: ClusterIP %q: %w", svc.Namespace, svc.Name, svc.Spec.ClusterIP, err)
		}
		stored[svc.Namespace+"/"+svc.Name] = ip
	}
	return stored, nil
}

// withStoredServices returns history with each Service create through kube-apiserver whose
// outcome is unknown and whose Service exists after the history (stored, by Op.Owner) recorded
// as taken effect: OK, at the Service's address, at some instant before the end of the
// history. Such a create stored its Service and only its answer was lost, so kube-apiserver's
// repair loop never frees its address (Op.RepairFrees keeps applying only to creates whose
// Service does not exist), and a lost AllocateNext that stored its Service is no longer merged
// with the others ([mergeLost]). Nothing deletes a Service whose create was not acknowledged,
// so a Service that does not exist was never stored. It fails if such a Service holds another
// address than the one its create asked for.
func withStoredServices(history []Op, stored map[string]netip.Addr) ([]Op, error) {
	out := make([]Op, 0, len(history))
	for _, op := range history {
		addr, ok := stored[op.Owner]
		if ok && op.Process == "kube-apiserver" && op.Outcome == Unknown && (op.Kind == Allocate || op.Kind == AllocateNext) {
			if op.Kind == Allocate && addr != op.Addr {
				return nil, fmt.Errorf("Service %s holds %v, but its create asked for %v", op.Owner, addr, op.Addr)
			}
			op.Addr, op.Outcome = addr, OK
			op.Err += " (its Service exists after the history)"
		}
		out = append(out, op)
	}
	return out, nil
}

// lostCreate is a Service create through kube-apiserver whose answer was lost, as the Service
// workers record it: an Allocate of addr, or with an invalid addr an AllocateNext, returning at
// the end of the history.
func lostCreate(client int, name string, addr netip.Addr, call, end int64) Op {
	op := Op{Client: client, Process: "kube-apiserver", Kind: Allocate, Addr: addr, Owner: "default/" + name,
		Call: call, Return: end, Outcome: Unknown, Err: "context deadline exceeded",
		Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true, FallsBackToObjects: true}
	if !addr.IsValid() {
		op.Kind = AllocateNext
	}
	return op
}

// ipAddressOnlyTakes is an IPAddressOnly process's Allocate of addr that is OK.
func ipAddressOnlyTakes(addr netip.Addr, owner string, call int64) Op {
	return Op{Client: 9, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addr, Owner: owner,
		Call: call, Return: call + 5*ms, Outcome: OK}
}

func TestLostCreatesWhoseServiceExistsTookEffect(t *testing.T) {
	end := 100_000 * ms
	tests := []struct {
		name    string
		history []Op
		stored  map[string]netip.Addr // the Services in namespace default after the history
		want    porcupine.CheckResult
	}{
		{
			name: "a lost create stored its Service, and an IPAddressOnly caller takes its address a minute on",
			history: []Op{
				lostCreate(1, "h-1-5", addrA, 1_000*ms, end),
				ipAddressOnlyTakes(addrA, "ipaddressonly-1-0-9-40", 70_000*ms),
			},
			stored: map[string]netip.Addr{"default/h-1-5": addrA},
			want:   porcupine.Illegal,
		},
		{
			name: "a lost create did not store its Service: repair may free the address a minute on",
			history: []Op{
				lostCreate(1, "h-1-5", addrA, 1_000*ms, end),
				ipAddressOnlyTakes(addrA, "ipaddressonly-1-0-9-40", 70_000*ms),
			},
			stored: map[string]netip.Addr{},
			want:   porcupine.Ok,
		},
		{
			name: "a lost AllocateNext stored its Service at the address an IPAddressOnly caller takes",
			history: []Op{
				lostCreate(1, "h-1-6", netip.Addr{}, 1_000*ms, end),
				lostCreate(2, "h-2-3", netip.Addr{}, 2_000*ms, end), // merged with it while lost
				ipAddressOnlyTakes(addrA, "ipaddressonly-1-0-9-40", 70_000*ms),
			},
			stored: map[string]netip.Addr{"default/h-1-6": addrA},
			want:   porcupine.Illegal,
		},
		{
			name: "a lost AllocateNext stored its Service at another address",
			history: []Op{
				lostCreate(1, "h-1-6", netip.Addr{}, 1_000*ms, end),
				lostCreate(2, "h-2-3", netip.Addr{}, 2_000*ms, end),
				ipAddressOnlyTakes(addrA, "ipaddressonly-1-0-9-40", 70_000*ms),
			},
			stored: map[string]netip.Addr{"default/h-1-6": addrB},
			want:   porcupine.Ok,
		},
		{
			name: "a lost create stored its Service, and its address stays held to the end",
			history: []Op{
				lostCreate(1, "h-1-5", addrA, 1_000*ms, end),
				{Client: 3, Process: "dualwrite-0#0", Kind: Allocate, Addr: addrA, Owner: "dualwrite-0-0-3-7", Call: 80_000 * ms, Return: 80_010 * ms,
					Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
			},
			stored: map[string]netip.Addr{"default/h-1-5": addrA},
			want:   porcupine.Ok,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			history, err := withStoredServices(WithUndos(tt.history), tt.stored)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Check(history, 0, filepath.Join(t.TempDir(), "history.html"))
			if err != nil {
				t.Fatal(err)
			}
			if res.Verdict != tt.want {
				t.Errorf("Check() = %v, want %v", res.Verdict, tt.want)
			}
		})
	}
}
