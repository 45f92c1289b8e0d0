package ipaddress

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/allocatortest"
)

// A range is full when the API server holds an object for each of its addresses, not when the
// informer says so: another writer's delete the informer has not delivered yet leaves a free
// address that AllocateNext must find. These run on the fake clientset and on a real
// kube-apiserver, with the allocator's informer held back by an eventGate.
func TestAllocateNextIsFullOnlyWhenTheServerIsFull(t *testing.T) {
	type env struct {
		a      *Allocator
		client kubernetes.Interface // another writer's client
		gate   *eventGate
	}
	envs := []struct {
		name string
		new  func(t *testing.T, cidr netip.Prefix) env
	}{
		{"fake clientset", func(t *testing.T, cidr netip.Prefix) env {
			g := newEventGate(cidr)
			f := newFixture(t, cidr, fixtureOptions{gate: g})
			return env{f.a, f.client, g}
		}},
		{"kube-apiserver", func(t *testing.T, cidr netip.Prefix) env {
			s := apiServer(t)
			g := newEventGate(cidr)
			return env{realGatedAllocator(t, s, cidr, g), newClient(t, s), g}
		}},
	}
	tests := []struct {
		name string
		// freed are the addresses another writer deletes while the informer is held.
		freed    []string
		wantFull bool
	}{
		{name: "full on the server too", wantFull: true},
		{name: "one address freed behind the informer", freed: []string{"10.250.7.20"}},
		{name: "a static-band address freed behind the informer", freed: []string{"10.250.7.3"}},
		{name: "two freed, both found in turn", freed: []string{"10.250.7.5", "10.250.7.25"}},
	}
	for _, e := range envs {
		for _, tt := range tests {
			t.Run(e.name+"/"+tt.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				cidr := netip.MustParsePrefix("10.250.7.0/27")
				env := e.new(t, cidr)
				allocatortest.Fill(t, ctx, env.a, testOwner)
				env.gate.Hold()
				for _, ip := range tt.freed {
					if err := env.client.NetworkingV1().IPAddresses().Delete(ctx, ip, metav1.DeleteOptions{}); err != nil {
						t.Fatalf("another writer's delete of %s: %v", ip, err)
					}
				}
				want := map[netip.Addr]bool{}
				for _, ip := range tt.freed {
					want[netip.MustParseAddr(ip)] = true
				}
				for range tt.freed {
					ip, err := env.a.AllocateNext(ctx, testOwner)
					if err != nil {
						t.Fatalf("AllocateNext() with %v free on the server = %v", tt.freed, err)
					}
					if !want[ip] {
						t.Fatalf("AllocateNext() = %v, want one of the freed %v", ip, tt.freed)
					}
					delete(want, ip)
				}
				ip, err := env.a.AllocateNext(ctx, testOwner)
				if !errors.Is(err, allocator.ErrFull) {
					t.Fatalf("AllocateNext() with no address free on the server = %v, %v; want ErrFull", ip, err)
				}
				list, err := env.client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, o := range list.Items {
					if ip, err := netip.ParseAddr(o.Name); err == nil && cidr.Contains(ip) {
						n++
					}
				}
				if n != 30 {
					t.Errorf("the server holds %d IPAddresses of %v, want 30", n, cidr)
				}
				env.gate.Open()
			})
		}
	}
}

// The addresses tried once the index is full are those the List does not show, dynamic band
// first, found by walking the gaps between held offsets.
func TestUnseen(t *testing.T) {
	tests := []struct {
		name       string
		held       []uint64
		size, band uint64
		n          int
		want       []uint64
	}{
		{"all held", []uint64{0, 1, 2, 3}, 4, 1, 16, nil},
		{"a gap in each band, dynamic first", []uint64{0, 2, 3, 5}, 6, 2, 16, []uint64{4, 1}},
		{"nothing held", nil, 4, 2, 16, []uint64{2, 3, 0, 1}},
		{"at most n", nil, 1 << 40, 16, 3, []uint64{16, 17, 18}},
		{"no static band", []uint64{1}, 3, 0, 16, []uint64{0, 2}},
		{"held past the range ignored", []uint64{0, 1, 9}, 3, 0, 16, []uint64{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := unseen(tt.held, tt.size, tt.band, tt.n)
			if len(got) != len(tt.want) {
				t.Fatalf("unseen(%v, %d, %d, %d) = %v, want %v", tt.held, tt.size, tt.band, tt.n, got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("unseen(%v, %d, %d, %d) = %v, want %v", tt.held, tt.size, tt.band, tt.n, got, tt.want)
				}
			}
		})
	}
}
