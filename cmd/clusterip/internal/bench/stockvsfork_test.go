package bench

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-ipam/clusterip/internal/forkbench"
)

// readmeRows is the rows file of the 2026-11-25 stock-vs-fork tables in docs/benchmarks.md.
const readmeRows = "testdata/stock-vs-fork-2026-11-25.json"

// readmeChart is the chart of readmeRows that docs/benchmarks.md shows.
const readmeChart = "../../../../docs/stock-vs-fork.svg"

func parseRows(t *testing.T, file string) forkbench.Rows {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := forkbench.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestSaveStockVsForkChartDrawsTheREADMERows: docs/benchmarks.md's rows draw as SVG, naming every mode
// and the sides of every run, and as a PNG of the chart's size.
func TestSaveStockVsForkChartDrawsTheREADMERows(t *testing.T) {
	rows := parseRows(t, readmeRows)
	dir := t.TempDir()
	svg, pngFile := filepath.Join(dir, "chart.svg"), filepath.Join(dir, "chart.png")
	for _, file := range []string{svg, pngFile} {
		if err := SaveStockVsForkChart(file, rows); err != nil {
			t.Fatalf("SaveStockVsForkChart(%s) = %v", filepath.Base(file), err)
		}
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "Legacy", "DualWrite", "IPAddressOnly", ">stock<", ">fork<",
		"fork, last 1000", "creates/s over 15000 Service creates", ">1153<"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the SVG chart does not contain %q", want)
		}
	}
	f, err := os.Open(pngFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatalf("the PNG chart does not decode: %v", err)
	}
	if cfg.Width < 1000 || cfg.Height < 300 {
		t.Errorf("the PNG chart is %d×%d, want at least 1000×300", cfg.Width, cfg.Height)
	}
}

// TestREADMEChartIsDrawnFromTheREADMERows: each chart of docs/ is what the command draws from
// the committed rows it claims to show, so that the two cannot drift apart.
func TestREADMEChartIsDrawnFromTheREADMERows(t *testing.T) {
	for _, c := range []struct{ rows, chart string }{
		{readmeRows, readmeChart},
		{"testdata/stock-vs-fork-v1.37.2-2026-11-27.json", "../../../../docs/stock-vs-fork-v1.37.2.svg"},
	} {
		file := filepath.Join(t.TempDir(), "chart.svg")
		if err := SaveStockVsForkChart(file, parseRows(t, c.rows)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(c.chart)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not the chart of %s; redraw it from the repository's root with\n"+
				"  go run ./cmd/clusterip bench stock-vs-fork cmd/clusterip/internal/bench/%s --svg %s", c.chart, c.rows, c.rows, strings.TrimPrefix(c.chart, "../../../../"))
		}
	}
}

func TestSaveStockVsForkChartRefuses(t *testing.T) {
	rows := parseRows(t, readmeRows)
	tests := []struct {
		name string
		file string
		rows forkbench.Rows
		say  string
	}{
		{"a file without an extension", "chart", rows, "no extension"},
		{"a format gonum cannot write", "chart.txt", rows, "chart.txt"},
		{"no rows", "chart.svg", forkbench.Rows{Note: "nothing"}, "no stock-vs-fork rows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), tt.file)
			err := SaveStockVsForkChart(file, tt.rows)
			if err == nil || !strings.Contains(err.Error(), tt.say) {
				t.Errorf("SaveStockVsForkChart(%q) = %v, want an error saying %q", tt.file, err, tt.say)
			}
			if _, statErr := os.Stat(file); statErr == nil {
				t.Errorf("SaveStockVsForkChart(%q) failed and left the file behind", tt.file)
			}
		})
	}
}

// TestSaveStockVsForkChartDrawsOnePhase: rows of one phase draw, the other's panels saying there
// are no rows.
func TestSaveStockVsForkChartDrawsOnePhase(t *testing.T) {
	rows := parseRows(t, readmeRows)
	for _, tt := range []struct {
		name string
		rows forkbench.Rows
	}{
		{"churn only", forkbench.Rows{Churn: rows.Churn}},
		{"scale only", forkbench.Rows{Scale: rows.Scale}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "chart.svg")
			if err := SaveStockVsForkChart(file, tt.rows); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(b, []byte("no rows")) {
				t.Errorf("the chart of %s does not say a phase has no rows", tt.name)
			}
		})
	}
}

// TestStockVsForkChartNamesEachRunWhenThereAreSeveral: a rows file of several churn runs labels
// each bar by side and run; one run labels by side alone.
func TestStockVsForkChartNamesEachRunWhenThereAreSeveral(t *testing.T) {
	churn := func(run, side string, rate float64) forkbench.Churn {
		return forkbench.Churn{Run: run, Mode: "DualWrite", Side: side, PairsPerS: rate}
	}
	tests := []struct {
		name      string
		rows      forkbench.Rows
		want, not []string
	}{
		{"one run", forkbench.Rows{Churn: []forkbench.Churn{churn("a", "stock", 200), churn("a", "fork", 400)}},
			[]string{">stock<", ">fork<"}, []string{"(run "}},
		{"two runs", forkbench.Rows{Churn: []forkbench.Churn{churn("a", "stock", 200), churn("a", "fork", 400), churn("b", "stock", 210), churn("b", "fork", 420)}},
			[]string{">stock (run a)<", ">fork (run a)<", ">stock (run b)<", ">fork (run b)<"}, []string{">stock<", ">fork<"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svg := filepath.Join(t.TempDir(), "chart.svg")
			if err := SaveStockVsForkChart(svg, tt.rows); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(svg)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !bytes.Contains(b, []byte(w)) {
					t.Errorf("the chart does not contain %q", w)
				}
			}
			for _, n := range tt.not {
				if bytes.Contains(b, []byte(n)) {
					t.Errorf("the chart contains %q", n)
				}
			}
		})
	}
}
