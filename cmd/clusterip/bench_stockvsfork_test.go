//go:build !clusterip_slim

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchStockVsForkDrawsTheRowsFile(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "chart.svg")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"bench", "stock-vs-fork", "internal/bench/testdata/stock-vs-fork-2026-11-25.json", "--svg", svg}, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit code %d, stderr %q; want 0", code, stderr.String())
	}
	if want := "wrote " + svg + ": 6 churn and 6 scale rows\n"; stdout.String() != want {
		t.Errorf("stdout = %q, want %q", stdout.String(), want)
	}
	if fi, err := os.Stat(svg); err != nil || fi.Size() == 0 {
		t.Errorf("chart file: %v, %v; want a chart", fi, err)
	}
}

func TestBenchStockVsForkRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"churn": [{"run": "1", "mode": "Legacy", "side": "fork"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	md := filepath.Join(dir, "rows.md")
	if err := os.WriteFile(md, []byte("| mode | side | pairs/s |\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	svg := filepath.Join(dir, "chart.svg")
	tests := []struct {
		name string
		args []string
		say  string
	}{
		{"no rows file", []string{"--svg", svg}, "accepts 1 arg(s), received 0"},
		{"no chart file", []string{bad}, "nothing to draw: give --svg or --png"},
		{"a chart file without an extension", []string{bad, "--png", filepath.Join(dir, "chart")}, "no extension"},
		{"a missing rows file", []string{filepath.Join(dir, "missing.json"), "--svg", svg}, "no such file"},
		{"a Markdown table", []string{md, "--svg", svg}, "forkbench: parse rows: invalid character"},
		{"a mode on one side", []string{bad, "--svg", svg}, `forkbench: parse rows: forkbench: invalid rows: churn run "1" mode Legacy has a fork row and no stock row`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"bench", "stock-vs-fork"}, tt.args...), &stdout, &stderr)
			if code != exitCouldNotRun || !strings.Contains(stderr.String(), tt.say) {
				t.Errorf("exit code %d, stderr %q; want %d and a line saying %q", code, stderr.String(), exitCouldNotRun, tt.say)
			}
			if _, err := os.Stat(svg); err == nil {
				t.Errorf("a chart was written")
			}
		})
	}
}
