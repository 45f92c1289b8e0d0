package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/kube-ipam/clusterip/internal/forkbench"
)

// The stock-vs-fork chart's size: three panels side by side.
const (
	svfWidth  = 14 * vg.Inch
	svfHeight = 5 * vg.Inch
	// svfGroup is the width the bars of one mode share in a panel.
	svfGroup = 0.9 * vg.Inch
)

// Bar colours: stock in greys, the fork in blues; darker for a later run (a fourth repeats the
// third), or for the last 1000 creates against the first.
var (
	stockShades = []color.Color{
		color.RGBA{R: 0xb4, G: 0xb4, B: 0xb4, A: 0xff}, color.RGBA{R: 0x78, G: 0x78, B: 0x78, A: 0xff}, color.RGBA{R: 0x3c, G: 0x3c, B: 0x3c, A: 0xff},
	}
	forkShades = []color.Color{
		color.RGBA{R: 0x9c, G: 0xc5, B: 0xec, A: 0xff}, color.RGBA{R: 0x3f, G: 0x86, B: 0xd0, A: 0xff}, color.RGBA{R: 0x15, G: 0x4a, B: 0x8c, A: 0xff},
	}
)

// series is one set of bars: one value per mode.
type series struct {
	label  string
	values plotter.Values
	color  color.Color
}

// SaveStockVsForkChart draws rows (package forkbench, as TestStockVsFork writes them) into file
// as grouped bars, stock against the fork in each mode: churn create+delete pairs/s, scale
// creates/s, and the scale p99 of the first and the last 1000 creates, one panel each (a phase
// without rows gets an empty panel that says so). A run of several is told apart in the legend.
// The file's extension (.svg, .png, .pdf, ...) picks the format.
func SaveStockVsForkChart(file string, rows forkbench.Rows) error {
	ext := strings.TrimPrefix(strings.ToLower(filepath.Ext(file)), ".")
	if ext == "" {
		return fmt.Errorf("bench: chart file %q has no extension to choose a format by (.svg, .png, .pdf)", file)
	}
	if len(rows.Churn)+len(rows.Scale) == 0 {
		return fmt.Errorf("bench: no stock-vs-fork rows to draw")
	}
	c, err := draw.NewFormattedCanvas(svfWidth, svfHeight, ext)
	if err != nil {
		return fmt.Errorf("bench: chart file %q: %w", file, err)
	}
	var panels []*plot.Plot
	for _, panel := range []func() (*plot.Plot, error){
		func() (*plot.Plot, error) { return churnPanel(rows.Churn) },
		func() (*plot.Plot, error) { return ratePanel(rows.Scale) },
		func() (*plot.Plot, error) { return p99Panel(rows.Scale) },
	} {
		p, err := panel()
		if err != nil {
			return err
		}
		panels = append(panels, p)
	}
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: 0.3 * vg.Inch, PadY: 0.2 * vg.Inch,
		PadTop: 0.1 * vg.Inch, PadBottom: 0.1 * vg.Inch, PadLeft: 0.1 * vg.Inch, PadRight: 0.2 * vg.Inch}
	canvases := plot.Align([][]*plot.Plot{panels}, tiles, draw.New(c))
	for i, p := range panels {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("bench: save chart: %w", err)
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("bench: save chart: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: save chart: %w", err)
	}
	return nil
}

// churnPanel draws churn pairs/s per mode, one bar per side and run.
func churnPanel(rows []forkbench.Churn) (*plot.Plot, error) {
	modes, runs := modesAndRuns(rows, func(r forkbench.Churn) (string, string) { return r.Mode, r.Run })
	var ss []series
	for i, run := range runs {
		for _, side := range []string{forkbench.Stock, forkbench.Fork} {
			s := series{label: runLabel(side, run, len(runs)), color: shade(side, i)}
			for _, m := range modes {
				s.values = append(s.values, valueOf(rows, func(r forkbench.Churn) bool { return r.Run == run && r.Mode == m && r.Side == side },
					func(r forkbench.Churn) float64 { return r.PairsPerS }))
			}
			ss = append(ss, s)
		}
	}
	return barPanel("churn: Service create+delete pairs/s", "pairs/s (higher is better)", modes, ss)
}

// ratePanel draws scale creates/s per mode, one bar per side and run.
func ratePanel(rows []forkbench.Scale) (*plot.Plot, error) {
	modes, runs := modesAndRuns(rows, func(r forkbench.Scale) (string, string) { return r.Mode, r.Run })
	var ss []series
	title := "scale: Service creates/s"
	for i, run := range runs {
		for _, side := range []string{forkbench.Stock, forkbench.Fork} {
			s := series{label: runLabel(side, run, len(runs)), color: shade(side, i)}
			for _, m := range modes {
				s.values = append(s.values, valueOf(rows, func(r forkbench.Scale) bool { return r.Run == run && r.Mode == m && r.Side == side },
					func(r forkbench.Scale) float64 { return r.CreatesPerS }))
			}
			ss = append(ss, s)
		}
	}
	if n := servicesOf(rows); n > 0 {
		title = fmt.Sprintf("scale: creates/s over %d Service creates", n)
	}
	return barPanel(title, "creates/s (higher is better)", modes, ss)
}

// p99Panel draws the scale p99 of the first and the last 1000 creates per mode and side.
func p99Panel(rows []forkbench.Scale) (*plot.Plot, error) {
	modes, runs := modesAndRuns(rows, func(r forkbench.Scale) (string, string) { return r.Mode, r.Run })
	var ss []series
	for _, run := range runs {
		for _, side := range []string{forkbench.Stock, forkbench.Fork} {
			for j, part := range []string{"first", "last"} {
				s := series{label: runLabel(side, run, len(runs)) + ", " + part + " 1000", color: shade(side, j)}
				for _, m := range modes {
					s.values = append(s.values, valueOf(rows, func(r forkbench.Scale) bool { return r.Run == run && r.Mode == m && r.Side == side },
						func(r forkbench.Scale) float64 {
							if part == "first" {
								return r.FirstP99Ms
							}
							return r.LastP99Ms
						}))
				}
				ss = append(ss, s)
			}
		}
	}
	return barPanel("scale: p99 of the first and last 1000 creates", "ms (lower is better)", modes, ss)
}

// barPanel draws ss as bars grouped by mode, or says that there are no rows.
func barPanel(title, yLabel string, modes []string, ss []series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = yLabel
	p.Y.Min = 0
	if len(modes) == 0 {
		p.Title.Text = title + ": no rows"
		p.HideX()
		return p, nil
	}
	p.NominalX(modes...)
	p.X.Min, p.X.Max = -0.6, float64(len(modes))-0.4
	p.Add(plotter.NewGrid())
	w := svfGroup / vg.Length(len(ss))
	top := 0.0
	for i, s := range ss {
		b, err := plotter.NewBarChart(s.values, w)
		if err != nil {
			return nil, fmt.Errorf("bench: draw %s: %s: %w", title, s.label, err)
		}
		b.Color = s.color
		b.LineStyle.Width = 0
		b.Offset = (vg.Length(i) - vg.Length(len(ss)-1)/2) * w
		p.Add(b)
		p.Legend.Add(s.label, b)
		// Each bar's value, written upwards from its top; a mode the run did not measure
		// has no bar and no value.
		var l plotter.XYLabels
		for j, v := range s.values {
			if v > 0 {
				l.XYs = append(l.XYs, plotter.XY{X: float64(j), Y: v})
				l.Labels = append(l.Labels, fmt.Sprintf("%.0f", v))
				top = max(top, v)
			}
		}
		if len(l.XYs) == 0 {
			continue
		}
		labels, err := plotter.NewLabels(l)
		if err != nil {
			return nil, fmt.Errorf("bench: draw %s: %s: %w", title, s.label, err)
		}
		for k := range labels.TextStyle {
			labels.TextStyle[k].Font.Size = vg.Points(7)
			labels.TextStyle[k].Rotation = math.Pi / 2
			labels.TextStyle[k].XAlign = text.XLeft
			labels.TextStyle[k].YAlign = text.YCenter
		}
		labels.Offset = vg.Point{X: b.Offset, Y: vg.Points(2)}
		p.Add(labels)
	}
	// Room above the bars for their values and for the legend, of one line per series.
	if top > 0 {
		room := (vg.Length(len(ss))*0.16*vg.Inch + 0.35*vg.Inch) / (svfHeight - 0.8*vg.Inch)
		p.Y.Max = top / (1 - float64(room))
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = 0.05 * vg.Inch
	return p, nil
}

// modesAndRuns returns the modes and runs of rows in the order they first appear.
func modesAndRuns[R any](rows []R, of func(R) (mode, run string)) (modes, runs []string) {
	for _, r := range rows {
		m, run := of(r)
		if !slices.Contains(modes, m) {
			modes = append(modes, m)
		}
		if !slices.Contains(runs, run) {
			runs = append(runs, run)
		}
	}
	return modes, runs
}

// valueOf returns the value of the row of rows that match takes, or 0 without one (a run that
// did not measure every mode).
func valueOf[R any](rows []R, match func(R) bool, value func(R) float64) float64 {
	for _, r := range rows {
		if match(r) {
			return value(r)
		}
	}
	return 0
}

// servicesOf returns the number of Services every scale row created, or 0 if they differ.
func servicesOf(rows []forkbench.Scale) int {
	n := 0
	for i, r := range rows {
		if i > 0 && r.Services != n {
			return 0
		}
		n = r.Services
	}
	return n
}

// runLabel names side, and run if there are several.
func runLabel(side, run string, runs int) string {
	if runs > 1 {
		return side + " (run " + run + ")"
	}
	return side
}

// shade returns side's i-th colour, repeating the last.
func shade(side string, i int) color.Color {
	shades := stockShades
	if side == forkbench.Fork {
		shades = forkShades
	}
	return shades[min(i, len(shades)-1)]
}
