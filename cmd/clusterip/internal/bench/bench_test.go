package bench

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestTargetLeavesAFreeAddressBelowFullFill(t *testing.T) {
	tests := []struct {
		name string
		size uint64
		fill float64
		want uint64
	}{
		{"empty", 254, 0, 0},
		{"half rounds down", 254, 50, 127},
		{"99.9% of a /24 would be full", 254, 99.9, 253},
		{"99.9% of a /12", 1048574, 99.9, 1047525},
		{"full", 254, 100, 254},
		{"no addresses", 0, 50, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := target(tt.size, tt.fill); got != tt.want {
				t.Errorf("target(%d, %g) = %d, want %d", tt.size, tt.fill, got, tt.want)
			}
		})
	}
}

func TestRunMeasuresEveryFillAndHoldsTheFillWhileMeasuring(t *testing.T) {
	cidr := netip.MustParsePrefix("10.0.0.0/24")
	results, err := Run(context.Background(), Options{Bitmap: []netip.Prefix{cidr}, Fills: []float64{0, 50, 100}, Duration: time.Millisecond})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	type row struct {
		Fill       float64
		Used, Size uint64
		Op         string
	}
	var got []row
	for _, r := range results {
		got = append(got, row{r.Fill, r.Used, r.Size, r.Op})
		if r.Ops <= 0 || r.NsPerOp <= 0 {
			t.Errorf("at %g%%: %d ops, %v ns/op; want a measurement", r.Fill, r.Ops, r.NsPerOp)
		}
	}
	want := []row{
		{0, 0, 254, "AllocateNext+Release"},
		{50, 127, 254, "AllocateNext+Release"},
		{100, 254, 254, "AllocateNext (full)"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Run results (-want +got):\n%s", diff)
	}
	if err := SaveChart(filepath.Join(t.TempDir(), "chart.svg"), results); err != nil {
		t.Errorf("SaveChart: %v", err)
	}
}

func TestRunRejectsFillOutsideZeroToHundred(t *testing.T) {
	for _, fill := range []float64{-1, 100.1} {
		if _, err := Run(context.Background(), Options{Fills: []float64{fill}}); err == nil {
			t.Errorf("Run with fill %g%% = nil error, want one", fill)
		}
	}
}
