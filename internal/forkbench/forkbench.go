// Package forkbench is the machine-readable form of the rows TestStockVsFork measures (stock
// kube-apiserver v1.33.13 against the fork whose ClusterIP allocators are clusterip's, per
// allocator mode): the test in internal/kubeapiserverfork writes it, and `clusterip bench
// stock-vs-fork` reads it to draw the chart. It uses the standard library only, so that neither
// module that shares it gains a dependency.
package forkbench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
)

// The sides of a row.
const (
	Stock = "stock"
	Fork  = "fork"
)

// Rows is one file of measured rows. The zero Rows is valid and empty.
type Rows struct {
	// Note says when, where and how the rows were measured.
	Note string `json:"note,omitempty"`
	// Churn rows: create+delete pairs of Services by concurrent workers.
	Churn []Churn `json:"churn,omitempty"`
	// Scale rows: Services created by concurrent workers, none deleted.
	Scale []Scale `json:"scale,omitempty"`
}

// Churn is one churn row of one side in one mode.
type Churn struct {
	// Run names the run the row belongs to ("1", "2", ...). Rows of one run were measured
	// together; a chart draws one bar per side and run.
	Run       string  `json:"run"`
	Mode      string  `json:"mode"` // Legacy, DualWrite or IPAddressOnly
	Side      string  `json:"side"` // Stock or Fork
	PairsPerS float64 `json:"pairsPerSecond"`
	P50Ms     float64 `json:"p50Ms"` // of one create+delete pair
	P99Ms     float64 `json:"p99Ms"`
	Errors    int     `json:"errors"`
	Stale     int     `json:"stale"` // leaked IPAddress objects and bitmap-only bits repair.Audit found after
}

// Scale is one scale row of one side in one mode.
type Scale struct {
	Run         string  `json:"run"`
	Mode        string  `json:"mode"`
	Side        string  `json:"side"`
	Services    int     `json:"services"` // created, errors included
	TotalS      float64 `json:"totalSeconds"`
	CreatesPerS float64 `json:"createsPerSecond"` // successful creates per second
	FirstP50Ms  float64 `json:"firstP50Ms"`       // of the first 1000 creates
	FirstP99Ms  float64 `json:"firstP99Ms"`
	LastP50Ms   float64 `json:"lastP50Ms"` // of the last 1000 creates
	LastP99Ms   float64 `json:"lastP99Ms"`
	Errors      int     `json:"errors"`
}

// ErrInvalid is wrapped by every error of Parse about the content of a rows file (as opposed to
// its JSON syntax).
var ErrInvalid = errors.New("forkbench: invalid rows")

// ParseError is the error of Parse: the rows file, or one row of it, is not what Write writes.
type ParseError struct {
	// Row names the row, as "churn[3]" or "scale[0]"; empty for the file as a whole.
	Row string
	// Err says what is wrong; it wraps ErrInvalid unless the file is not JSON.
	Err error
}

func (e *ParseError) Error() string {
	if e.Row == "" {
		return "forkbench: parse rows: " + e.Err.Error()
	}
	return "forkbench: parse rows: " + e.Row + ": " + e.Err.Error()
}

func (e *ParseError) Unwrap() error { return e.Err }

// Parse reads one JSON rows file from r, as Write writes it; a phase without rows is nil. It returns a *ParseError if r is not
// one JSON object of Rows' fields (unknown fields are refused), or if a row has an empty run or
// mode, a side other than Stock and Fork, a negative, infinite or NaN figure, or the same run,
// mode and side as an earlier row of its phase, or if a run measured a mode on one side only.
func Parse(r io.Reader) (Rows, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var rows Rows
	if err := dec.Decode(&rows); err != nil {
		return Rows{}, &ParseError{Err: err}
	}
	if _, err := dec.Token(); err != io.EOF {
		return Rows{}, &ParseError{Err: fmt.Errorf("%w: data after the rows object", ErrInvalid)}
	}
	if err := rows.validate(); err != nil {
		return Rows{}, err
	}
	if len(rows.Churn) == 0 {
		rows.Churn = nil
	}
	if len(rows.Scale) == 0 {
		rows.Scale = nil
	}
	return rows, nil
}

// Write writes rows to w as indented JSON that Parse reads.
func Write(w io.Writer, rows Rows) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rows); err != nil {
		return fmt.Errorf("forkbench: write rows: %w", err)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// key identifies a row within its phase.
type key struct{ run, mode, side string }

func (rows Rows) validate() error {
	churn := make([]key, len(rows.Churn))
	for i, c := range rows.Churn {
		name := fmt.Sprintf("churn[%d]", i)
		churn[i] = key{c.Run, c.Mode, c.Side}
		if err := checkRow(churn[i], churn[:i]); err != nil {
			return &ParseError{Row: name, Err: err}
		}
		for _, f := range []struct {
			name string
			v    float64
		}{{"pairsPerSecond", c.PairsPerS}, {"p50Ms", c.P50Ms}, {"p99Ms", c.P99Ms},
			{"errors", float64(c.Errors)}, {"stale", float64(c.Stale)}} {
			if err := checkFigure(f.name, f.v); err != nil {
				return &ParseError{Row: name, Err: err}
			}
		}
	}
	scale := make([]key, len(rows.Scale))
	for i, s := range rows.Scale {
		name := fmt.Sprintf("scale[%d]", i)
		scale[i] = key{s.Run, s.Mode, s.Side}
		if err := checkRow(scale[i], scale[:i]); err != nil {
			return &ParseError{Row: name, Err: err}
		}
		for _, f := range []struct {
			name string
			v    float64
		}{{"services", float64(s.Services)}, {"totalSeconds", s.TotalS}, {"createsPerSecond", s.CreatesPerS},
			{"firstP50Ms", s.FirstP50Ms}, {"firstP99Ms", s.FirstP99Ms}, {"lastP50Ms", s.LastP50Ms},
			{"lastP99Ms", s.LastP99Ms}, {"errors", float64(s.Errors)}} {
			if err := checkFigure(f.name, f.v); err != nil {
				return &ParseError{Row: name, Err: err}
			}
		}
	}
	for _, phase := range []struct {
		name string
		keys []key
	}{{"churn", churn}, {"scale", scale}} {
		for _, k := range phase.keys {
			other := k
			other.side = Stock
			if k.side == Stock {
				other.side = Fork
			}
			if !slices.Contains(phase.keys, other) {
				return &ParseError{Err: fmt.Errorf("%w: %s run %q mode %s has a %s row and no %s row", ErrInvalid, phase.name, k.run, k.mode, k.side, other.side)}
			}
		}
	}
	return nil
}

// checkRow checks k's fields and that no row of earlier has it.
func checkRow(k key, earlier []key) error {
	switch {
	case k.run == "":
		return fmt.Errorf("%w: empty run", ErrInvalid)
	case k.mode == "":
		return fmt.Errorf("%w: empty mode", ErrInvalid)
	case k.side != Stock && k.side != Fork:
		return fmt.Errorf("%w: side %q, want %q or %q", ErrInvalid, k.side, Stock, Fork)
	case slices.Contains(earlier, k):
		return fmt.Errorf("%w: a second row of run %q, mode %s, side %s", ErrInvalid, k.run, k.mode, k.side)
	}
	return nil
}

// checkFigure checks that the figure named name is finite and not negative.
func checkFigure(name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fmt.Errorf("%w: %s is %v, want a finite figure of 0 or more", ErrInvalid, name, v)
	}
	return nil
}
