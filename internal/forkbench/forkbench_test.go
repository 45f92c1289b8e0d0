package forkbench

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// sample is a valid Rows with every field set.
var sample = Rows{
	Note: "measured somewhere",
	Churn: []Churn{
		{Run: "1", Mode: "Legacy", Side: Stock, PairsPerS: 144.9, P50Ms: 73, P99Ms: 771},
		{Run: "1", Mode: "Legacy", Side: Fork, PairsPerS: 206.9, P50Ms: 44, P99Ms: 486, Errors: 1, Stale: 2},
	},
	Scale: []Scale{
		{Run: "1", Mode: "DualWrite", Side: Stock, Services: 15000, TotalS: 199.9, CreatesPerS: 75, FirstP50Ms: 63, FirstP99Ms: 200, LastP50Ms: 317, LastP99Ms: 1477},
		{Run: "1", Mode: "DualWrite", Side: Fork, Services: 15000, TotalS: 47.3, CreatesPerS: 317, FirstP50Ms: 42, FirstP99Ms: 770, LastP50Ms: 37, LastP99Ms: 160},
	},
}

func TestWriteThenParseRoundTrips(t *testing.T) {
	for _, rows := range []Rows{{}, sample} {
		var b bytes.Buffer
		if err := Write(&b, rows); err != nil {
			t.Fatal(err)
		}
		got, err := Parse(&b)
		if err != nil {
			t.Fatalf("Parse(Write(%+v)) = %v", rows, err)
		}
		if !reflect.DeepEqual(got, rows) {
			t.Errorf("Parse(Write(rows)) = %+v, want %+v", got, rows)
		}
	}
}

// churnRow is a valid churn row of run 1, as JSON, with the fields of patch replacing its own.
func churnRow(t *testing.T, side string, patch string) string {
	t.Helper()
	row := map[string]any{"run": "1", "mode": "Legacy", "side": side, "pairsPerSecond": 100, "p50Ms": 10, "p99Ms": 20, "errors": 0, "stale": 0}
	if patch != "" {
		if err := json.Unmarshal([]byte(patch), &row); err != nil {
			t.Fatal(err)
		}
	}
	b, err := json.Marshal(row)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseRefusesBadRowsWithAParseError(t *testing.T) {
	fork := churnRow(t, Fork, "")
	tests := []struct {
		name    string
		in      string
		row     string // ParseError.Row
		invalid bool   // wraps ErrInvalid
		say     string // in the message
	}{
		{name: "empty input", in: "", say: "EOF"},
		{name: "not JSON", in: "| mode | side |", say: "invalid character"},
		{name: "a list", in: "[]", say: "cannot unmarshal array"},
		{name: "unknown field", in: `{"churn": [], "runs": 3}`, say: `unknown field "runs"`},
		{name: "text for a figure", in: `{"churn": [` + churnRow(t, Stock, `{"pairsPerSecond": "fast"}`) + `]}`, say: "cannot unmarshal string"},
		{name: "fraction of an error", in: `{"churn": [` + churnRow(t, Stock, `{"errors": 0.5}`) + `]}`, say: "cannot unmarshal number 0.5"},
		{name: "number too large", in: `{"churn": [{"run": "1", "mode": "Legacy", "side": "stock", "p99Ms": 1e999}]}`, say: "cannot unmarshal number 1e999"},
		{name: "two objects", in: `{} {}`, invalid: true, say: "data after the rows object"},
		{name: "empty run", in: `{"churn": [` + churnRow(t, Stock, `{"run": ""}`) + `]}`, row: "churn[0]", invalid: true, say: "empty run"},
		{name: "empty mode", in: `{"churn": [` + fork + `, ` + churnRow(t, Stock, `{"mode": ""}`) + `]}`, row: "churn[1]", invalid: true, say: "empty mode"},
		{name: "unknown side", in: `{"churn": [` + churnRow(t, "both", "") + `]}`, row: "churn[0]", invalid: true, say: `side "both"`},
		{name: "negative rate", in: `{"churn": [` + churnRow(t, Stock, `{"pairsPerSecond": -1}`) + `]}`, row: "churn[0]", invalid: true, say: "pairsPerSecond is -1"},
		{name: "negative errors", in: `{"churn": [` + churnRow(t, Stock, `{"errors": -2}`) + `]}`, row: "churn[0]", invalid: true, say: "errors is -2"},
		{name: "negative scale latency", in: `{"scale": [{"run": "1", "mode": "Legacy", "side": "fork", "lastP99Ms": -3}]}`, row: "scale[0]", invalid: true, say: "lastP99Ms is -3"},
		{name: "a row twice", in: `{"churn": [` + fork + `, ` + churnRow(t, Stock, "") + `, ` + fork + `]}`, row: "churn[2]", invalid: true, say: "a second row"},
		{name: "one side only", in: `{"churn": [` + fork + `]}`, invalid: true, say: `churn run "1" mode Legacy has a fork row and no stock row`},
		{name: "one side only in scale", in: `{"scale": [{"run": "2", "mode": "DualWrite", "side": "stock"}]}`, invalid: true, say: `scale run "2" mode DualWrite has a stock row and no fork row`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := Parse(strings.NewReader(tt.in))
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse() = %+v, %v; want a *ParseError", rows, err)
			}
			if pe.Row != tt.row {
				t.Errorf("ParseError.Row = %q, want %q", pe.Row, tt.row)
			}
			if got := errors.Is(err, ErrInvalid); got != tt.invalid {
				t.Errorf("errors.Is(%v, ErrInvalid) = %v, want %v", err, got, tt.invalid)
			}
			if !strings.Contains(err.Error(), tt.say) {
				t.Errorf("Parse() error %q does not say %q", err, tt.say)
			}
			if !reflect.DeepEqual(rows, Rows{}) {
				t.Errorf("Parse() rows = %+v with an error, want the zero Rows", rows)
			}
		})
	}
}

func TestParseTakesTheZeroRows(t *testing.T) {
	for _, in := range []string{"{}", "null", `{"note": "nothing measured"}`} {
		if _, err := Parse(strings.NewReader(in)); err != nil {
			t.Errorf("Parse(%q) = %v, want no error", in, err)
		}
	}
}

// FuzzParse: Parse never panics; what it takes, Write writes so that Parse takes it again and
// gives the same rows; what it refuses, it refuses with a *ParseError.
func FuzzParse(f *testing.F) {
	var b bytes.Buffer
	if err := Write(&b, sample); err != nil {
		f.Fatal(err)
	}
	f.Add(b.String())
	f.Add(`{"churn": [{"run": "1", "mode": "Legacy", "side": "fork"}]}`)
	f.Add(`{"scale": [{"run": "", "mode": "x", "side": "stock", "errors": -1}]}`)
	f.Add("")
	f.Fuzz(func(t *testing.T, in string) {
		rows, err := Parse(strings.NewReader(in))
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse(%q) = %v, not a *ParseError", in, err)
			}
			return
		}
		var b bytes.Buffer
		if err := Write(&b, rows); err != nil {
			t.Fatalf("Write(Parse(%q)) = %v", in, err)
		}
		again, err := Parse(&b)
		if err != nil {
			t.Fatalf("Parse(Write(Parse(%q))) = %v", in, err)
		}
		if !reflect.DeepEqual(again, rows) {
			t.Fatalf("Parse(Write(rows)) = %+v, want %+v", again, rows)
		}
	})
}
