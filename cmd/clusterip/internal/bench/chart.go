package bench

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// SaveChart draws ns/op by fill level, one line per allocator and range measured (skipped ones
// are left out), on a logarithmic ns/op axis, into file; the file's extension (.svg, .png, .pdf,
// ...) picks the format. Fill levels are spaced evenly, since the interesting ones (99%, 99.9%,
// 100%) are close together.
func SaveChart(file string, results []Result) error {
	fills := fillLevels(results)
	if len(fills) == 0 {
		return fmt.Errorf("bench: no results to draw")
	}
	x := make(map[float64]float64, len(fills))
	ticks := make([]plot.Tick, len(fills))
	for i, f := range fills {
		x[f] = float64(i)
		ticks[i] = plot.Tick{Value: float64(i), Label: fmt.Sprintf("%g%%", f)}
	}

	p := plot.New()
	p.Title.Text = "clusterip: one AllocateNext+Release at steady fill (a failing AllocateNext at 100%)"
	p.X.Label.Text = "fill level"
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = -0.2, float64(len(fills)-1)+0.2
	p.Y.Label.Text = "ns/op (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	// The legend sits at the left, below the slow lines and above the fast ones.
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = 0.1 * vg.Inch
	p.Legend.YOffs = -1.9 * vg.Inch

	names, by := seriesOf(results)
	var lines []any
	for _, name := range names {
		var xys plotter.XYs
		for _, r := range by[name] {
			if r.NsPerOp > 0 {
				xys = append(xys, plotter.XY{X: x[r.Fill], Y: r.NsPerOp})
			}
		}
		if len(xys) > 0 {
			lines = append(lines, name, xys)
		}
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return fmt.Errorf("bench: draw chart: %w", err)
	}
	ext := strings.TrimPrefix(strings.ToLower(filepath.Ext(file)), ".")
	if ext == "" {
		return fmt.Errorf("bench: chart file %q has no extension to choose a format by (.svg, .png, .pdf)", file)
	}
	if err := p.Save(9*vg.Inch, 6*vg.Inch, file); err != nil {
		return fmt.Errorf("bench: save chart: %w", err)
	}
	return nil
}

func fillLevels(results []Result) []float64 {
	seen := map[float64]bool{}
	var fills []float64
	for _, r := range results {
		if r.Skipped == "" && !seen[r.Fill] {
			seen[r.Fill] = true
			fills = append(fills, r.Fill)
		}
	}
	sort.Float64s(fills)
	return fills
}
