package clusterip

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

// kubeAPIServerMismatch is the text of kube-apiserver v1.33's bitmap
// (pkg/registry/core/service/allocator.AllocationBitmap.Restore) when the stored bitmap is of
// another range than --service-cluster-ip-range.
const kubeAPIServerMismatch = "the provided range does not match the current range"

// A DualWrite mirror whose stored bitmap is of another range (the flag changed) is used as
// kube-apiserver v1.33's MetaAllocator uses it: AllocateNext, whose bitmap AllocateNext fails,
// takes an address from the ServiceCIDRs alone and writes no bit; Allocate of an address inside
// the flag range fails with the bitmap's error; Release deletes the IPAddress and ignores the
// bitmap. The stored bitmap is never written.
func TestDualWriteOverAMirrorOfAnotherRange(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/24", "10.1.0.0/24")
	foreign := bitmap.Snapshot{Range: "10.9.0.0/24", Data: []byte{0x01}}
	rev := f.store.Put(foreign)

	tests := []struct {
		name    string
		do      func() (netip.Addr, error)
		wantIn  netip.Prefix // the prefix the address must come from; zero if the call must fail
		wantErr error
	}{
		{name: "AllocateNext", do: func() (netip.Addr, error) { return f.dw.AllocateNext(f.ctx, testOwner) },
			wantIn: netip.MustParsePrefix("10.0.0.0/15")}, // either ServiceCIDR
		{name: "Allocate inside the flag range", do: func() (netip.Addr, error) {
			ip := netip.MustParseAddr("10.0.0.5")
			return ip, f.dw.Allocate(f.ctx, ip, testOwner)
		}, wantErr: allocator.ErrMismatchedNetwork},
		{name: "Allocate outside the flag range", do: func() (netip.Addr, error) {
			ip := netip.MustParseAddr("10.1.0.5")
			return ip, f.dw.Allocate(f.ctx, ip, testOwner)
		}, wantIn: netip.MustParsePrefix("10.1.0.5/32")},
	}
	var held []netip.Addr
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip, err := tt.do()
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.HasPrefix(err.Error(), kubeAPIServerMismatch) {
					t.Fatalf("%s = %v, want an error matching %v that begins with kube-apiserver's text", tt.name, err, tt.wantErr)
				}
				if slices.Contains(f.objects(), ip) {
					t.Errorf("%s failed but created the IPAddress of %s", tt.name, ip)
				}
				return
			}
			if err != nil || !tt.wantIn.Contains(ip) {
				t.Fatalf("%s = %v, %v; want an address of %s", tt.name, ip, err, tt.wantIn)
			}
			held = append(held, ip)
		})
	}
	slices.SortFunc(held, netip.Addr.Compare)
	if got := f.objects(); !slices.Equal(got, held) {
		t.Errorf("IPAddress objects = %v, want %v", got, held)
	}
	for _, ip := range held {
		if err := f.dw.Release(f.ctx, ip); err != nil {
			t.Errorf("Release(%s) = %v, want nil", ip, err)
		}
	}
	if got := f.objects(); len(got) != 0 {
		t.Errorf("IPAddress objects after Release = %v, want none", got)
	}
	got, gotRev, err := f.store.Get(context.Background())
	if err != nil || gotRev != rev || !cmp.Equal(got, foreign) {
		t.Errorf("stored bitmap = %+v at rev %d, %v; want %+v at rev %d, untouched", got, gotRev, err, foreign, rev)
	}
}
