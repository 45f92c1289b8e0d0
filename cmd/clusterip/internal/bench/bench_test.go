package bench

import (
	"context"
	"math"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/internal/localcluster"
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

func TestUsableLeavesOutNetworkAndIPv4Broadcast(t *testing.T) {
	tests := []struct {
		cidr string
		want uint64
	}{
		{"10.0.0.0/24", 254},
		{"10.0.0.0/20", 4094},
		{"10.0.0.0/30", 2},
		{"fd00::/120", 255},
		{"fd00::/64", math.MaxUint64},
	}
	for _, tt := range tests {
		if got := usable(netip.MustParsePrefix(tt.cidr)); got != tt.want {
			t.Errorf("usable(%s) = %d, want %d", tt.cidr, got, tt.want)
		}
	}
}

func TestRunSkipsKubeAPIServerRowsWithoutABinaryAndSaysWhy(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "kube-apiserver")
	t.Setenv(localcluster.KubeAPIServerEnv, missing)
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("10.0.1.0/28")}
	results, err := Run(context.Background(), Options{APIServer: cidrs, Fills: []float64{0, 50}})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var got []string
	for _, r := range results {
		got = append(got, r.Series())
		if !strings.Contains(r.Skipped, missing) || r.Ops != 0 {
			t.Errorf("%s: skipped %q after %d ops, want skipped with a reason naming %s", r.Series(), r.Skipped, r.Ops, missing)
		}
	}
	want := []string{"ipaddress+apiserver 10.0.0.0/24", "ipaddress+apiserver 10.0.1.0/28", "dualwrite+apiserver 10.0.0.0/24", "dualwrite+apiserver 10.0.1.0/28"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Run results (-want +got):\n%s", diff)
	}
	var table strings.Builder
	if err := WriteTable(&table, results); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "skipped ipaddress+apiserver and dualwrite+apiserver on 10.0.0.0/24, 10.0.1.0/28: ") {
		t.Errorf("WriteTable does not say what it skipped:\n%s", table.String())
	}
	if err := SaveChart(filepath.Join(t.TempDir(), "chart.svg"), results); err == nil {
		t.Errorf("SaveChart of skipped results only = nil error, want one: there is nothing to draw")
	}
}

func TestRunRejectsKubeAPIServerRangesTooLargeToFill(t *testing.T) {
	cidr := netip.MustParsePrefix("10.0.0.0/15")
	if _, err := Run(context.Background(), Options{APIServer: []netip.Prefix{cidr}, Fills: []float64{0}}); err == nil {
		t.Errorf("Run with kube-apiserver range %v = nil error, want one", cidr)
	}
}
