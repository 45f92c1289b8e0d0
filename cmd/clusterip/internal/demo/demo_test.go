package demo

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestBitmapKeyFollowsFlagOrder checks that the demo stores each range's bitmap where
// kube-apiserver does: the first --service-cluster-ip-range at ranges/serviceips even when it is
// IPv6, the second at ranges/secondaryserviceips.
func TestBitmapKeyFollowsFlagOrder(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.96.0.0/24"), netip.MustParsePrefix("fd00:96::/112")
	primary, secondary := etcdstore.ServiceIPsKey(""), etcdstore.SecondaryServiceIPsKey("")
	tests := []struct {
		name   string
		ranges []netip.Prefix
		want   map[string]string // etcd key → the range stored there ("" for none)
	}{
		{"IPv4 only", []netip.Prefix{v4}, map[string]string{primary: v4.String(), secondary: ""}},
		{"IPv6 only", []netip.Prefix{v6}, map[string]string{primary: v6.String(), secondary: ""}},
		{"IPv4 first", []netip.Prefix{v4, v6}, map[string]string{primary: v4.String(), secondary: v6.String()}},
		{"IPv6 first", []netip.Prefix{v6, v4}, map[string]string{primary: v6.String(), secondary: v4.String()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			etcd := testenv.NewEtcd(t)
			client := etcd.TestClient(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			var out bytes.Buffer
			err := Run(ctx, Options{Ranges: tt.ranges, Hold: 20, Workers: 1, PhaseDuration: 100 * time.Millisecond,
				EtcdEndpoints: etcd.Endpoints(), Out: &out})
			if err != nil {
				t.Fatalf("Run() = %v\n%s", err, out.String())
			}
			got := map[string]string{}
			for key := range tt.want {
				snap, _, err := etcdstore.New(client, key).Get(ctx) // the zero Snapshot if absent
				if err != nil {
					t.Fatalf("Get(%s) = %v", key, err)
				}
				got[key] = snap.Range
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ranges stored per etcd key (-want +got):\n%s", diff)
			}
			for i, r := range tt.ranges {
				if want := "range " + r.String() + ": "; !strings.Contains(out.String(), want) {
					t.Errorf("output lacks range #%d %q:\n%s", i, want, out.String())
				}
			}
		})
	}
}

func TestRunRejectsRangesKubeAPIServerRejects(t *testing.T) {
	tests := []struct {
		name   string
		ranges []string
		want   string
	}{
		{"two IPv4", []string{"10.96.0.0/24", "10.97.0.0/24"}, "same IP family"},
		{"two IPv6", []string{"fd00:1::/112", "fd00:2::/112"}, "same IP family"},
		{"three", []string{"10.96.0.0/24", "fd00:1::/112", "10.97.0.0/24"}, "3 Service ranges"},
		{"host bits", []string{"10.96.0.1/24"}, "host bits"},
		{"no room", []string{"10.96.0.1/32"}, "no usable addresses"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ranges []netip.Prefix
			for _, r := range tt.ranges {
				ranges = append(ranges, netip.MustParsePrefix(r))
			}
			// The etcd given is unreachable: a rejected range must fail before it is used.
			err := Run(context.Background(), Options{Ranges: ranges, EtcdEndpoints: []string{"http://127.0.0.1:1"}})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run(%v) = %v, want an error containing %q", tt.ranges, err, tt.want)
			}
		})
	}
}

// TestLedgerRefusesAnAddressHeldByAnotherService is the duplicate check the demo's numbers rest
// on: an address is held by one Service at a time, and free again once dropped.
func TestLedgerRefusesAnAddressHeldByAnotherService(t *testing.T) {
	a, b := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::10")
	type step struct {
		hold   string // the Service that takes ips, or "" to drop ips
		ips    []netip.Addr
		wantOK bool
	}
	tests := []struct {
		name     string
		steps    []step
		wantDups int
	}{
		{"distinct addresses", []step{{"s1", []netip.Addr{a}, true}, {"s2", []netip.Addr{b}, true}}, 0},
		{"the same address twice", []step{{"s1", []netip.Addr{a}, true}, {"s2", []netip.Addr{a}, false}}, 1},
		{"one of two taken", []step{{"s1", []netip.Addr{b}, true}, {"s2", []netip.Addr{a, b}, false}, {"s3", []netip.Addr{a}, true}}, 1},
		{"again after a drop", []step{{"s1", []netip.Addr{a}, true}, {"", []netip.Addr{a}, true}, {"s2", []netip.Addr{a}, true}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger()
			for i, s := range tt.steps {
				if s.hold == "" {
					l.drop(s.ips)
					continue
				}
				if got := l.hold(s.hold, s.ips); got != s.wantOK {
					t.Errorf("step %d: hold(%s, %v) = %v, want %v", i, s.hold, s.ips, got, s.wantOK)
				}
			}
			if got := l.duplicateList(); len(got) != tt.wantDups {
				t.Errorf("duplicates = %q, want %d", got, tt.wantDups)
			}
		})
	}
}

// TestFakeClientWatchKeepsUpWithoutAConsumer writes many more objects than a fake watcher holds
// while nobody reads its events; they all arrive, in order, once somebody does.
func TestFakeClientWatchKeepsUpWithoutAConsumer(t *testing.T) {
	client := localcluster.NewFakeClient()
	ctx := t.Context()
	w, err := client.CoreV1().Services("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	const n = 1000
	for i := range n {
		svc := newService(fmt.Sprintf("s%04d", i), corev1.IPv4Protocol)
		if _, err := client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", svc.Name, err)
		}
	}
	for i := range n {
		e := <-w.ResultChan()
		svc, ok := e.Object.(*corev1.Service)
		if want := fmt.Sprintf("s%04d", i); e.Type != watch.Added || !ok || svc.Name != want {
			t.Fatalf("event %d = %v %T, want Added of Service %s", i, e.Type, e.Object, want)
		}
	}
}

// TestCountingKVCountsFailedComparesPerFamily checks how the conflicts column is counted: a
// transaction on a bitmap key whose comparison fails is one conflict of that key's family; one
// that succeeds, or one on another key, is none.
func TestCountingKVCountsFailedComparesPerFamily(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	client := etcd.TestClient(t)
	ctx := t.Context()
	v4Key, v6Key := etcdstore.ServiceIPsKey(""), etcdstore.SecondaryServiceIPsKey("")
	if _, err := client.Put(ctx, v4Key, "x"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		key     string
		modRev  int64 // compared with the key's ModRevision
		want4   uint64
		want6   uint64
		succeed bool
	}{
		{"a compare-and-swap that wins", v4Key, -1, 0, 0, true},
		{"one that loses on the IPv4 key", v4Key, 1, 1, 0, false},
		{"one that loses on the IPv6 key", v6Key, 1, 0, 1, false},
		{"one that loses on another key", "/registry/other", 1, 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conflicts := map[corev1.IPFamily]*atomic.Uint64{corev1.IPv4Protocol: new(atomic.Uint64), corev1.IPv6Protocol: new(atomic.Uint64)}
			kv := &countingKV{KV: client.KV, conflicts: conflicts,
				keys: map[string]corev1.IPFamily{v4Key: corev1.IPv4Protocol, v6Key: corev1.IPv6Protocol}}
			rev := tt.modRev
			if rev < 0 {
				got, err := client.Get(ctx, tt.key)
				if err != nil || len(got.Kvs) != 1 {
					t.Fatalf("Get(%s) = %v, %v", tt.key, got, err)
				}
				rev = got.Kvs[0].ModRevision
			}
			resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(tt.key), "=", rev)).
				Then(clientv3.OpPut(tt.key, "y")).Commit()
			if err != nil || resp.Succeeded != tt.succeed {
				t.Fatalf("Txn on %s: succeeded %v, %v; want succeeded %v", tt.key, resp != nil && resp.Succeeded, err, tt.succeed)
			}
			if got4, got6 := conflicts[corev1.IPv4Protocol].Load(), conflicts[corev1.IPv6Protocol].Load(); got4 != tt.want4 || got6 != tt.want6 {
				t.Errorf("conflicts IPv4 %d, IPv6 %d; want %d, %d", got4, got6, tt.want4, tt.want6)
			}
		})
	}
}
