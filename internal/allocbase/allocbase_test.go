package allocbase_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/internal/allocbase"
)

func TestReleaseNotServedKeepsBadInputAndDropsTheRest(t *testing.T) {
	bad := &allocator.AddrError{Reason: "zoned address"}
	for _, tt := range []struct {
		name string
		err  error
		want error
	}{
		{"bad input", bad, bad},
		{"wrapped bad input", fmt.Errorf("x: %w", bad), bad},
		{"outside the range", &allocator.NotInRangeError{IP: netip.MustParseAddr("10.0.0.1")}, nil},
		{"nil", nil, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := allocbase.ReleaseNotServed(tt.err)
			if (got == nil) != (tt.want == nil) || (tt.want != nil && !errors.Is(got, tt.want)) {
				t.Errorf("ReleaseNotServed(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestDryRunViewForwardsReadsAndChangesNothing(t *testing.T) {
	ctx := context.Background()
	a, err := bitmap.New(netip.MustParsePrefix("10.0.0.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.0.0.3")
	if err := a.Allocate(ctx, ip, allocator.Owner{}); err != nil {
		t.Fatal(err)
	}
	v := allocbase.DryRunView{R: a}
	if !v.Has(ip) || v.CIDR() != a.CIDR() || v.Family() != a.Family() || v.Used() != 1 || v.Free() != 5 {
		t.Errorf("DryRunView reads = Has %v, CIDR %v, Family %v, Used %d, Free %d; want true, %v, %v, 1, 5",
			v.Has(ip), v.CIDR(), v.Family(), v.Used(), v.Free(), a.CIDR(), a.Family())
	}
	for got := range v.All() {
		if got != ip {
			t.Errorf("All() yields %v, want only %v", got, ip)
		}
	}
	if err := v.Release(ctx, ip); err != nil || !a.Has(ip) {
		t.Errorf("Release(%v) = %v, Has = %v; want nil, true (a dry run frees nothing)", ip, err, a.Has(ip))
	}
	var ae *allocator.AddrError
	if err := v.Release(ctx, netip.Addr{}); !errors.As(err, &ae) {
		t.Errorf("Release(zero Addr) = %v, want an *allocator.AddrError", err)
	}
	if err := v.Close(); err != nil || !a.Has(ip) {
		t.Errorf("Close() = %v, Has = %v; want nil, true", err, a.Has(ip))
	}
}
