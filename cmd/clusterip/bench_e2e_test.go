//go:build !clusterip_slim

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// noAPIServer leaves the kube-apiserver rows out of a bench run, for the tests that are not
// about them.
var noAPIServer = []string{"--apiserver-ranges", ""}

// benchResult is the part of a bench --json result the tests read.
type benchResult struct {
	Allocator, Range, Op, Skipped string
	Fill                          float64
	Ops                           int
	NsPerOp                       float64
}

// benchJSON runs bench with args and --json, and decodes its results.
func benchJSON(t *testing.T, args ...string) []benchResult {
	t.Helper()
	r := clusterip(t, append([]string{"bench", "--json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("bench: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	var results []benchResult
	if err := json.Unmarshal([]byte(r.stdout), &results); err != nil {
		t.Fatalf("decode %q: %v", r.stdout, err)
	}
	return results
}

// measured returns "allocator range fill op" for each result, and checks that each is a
// measurement.
func measured(t *testing.T, results []benchResult) []string {
	t.Helper()
	var got []string
	for _, res := range results {
		got = append(got, fmt.Sprintf("%s %s %g%% %s", res.Allocator, res.Range, res.Fill, res.Op))
		if res.Skipped != "" || res.Ops <= 0 || res.NsPerOp <= 0 {
			t.Errorf("%s %s at %g%%: %d ops at %v ns/op (skipped %q), want a measurement", res.Allocator, res.Range, res.Fill, res.Ops, res.NsPerOp, res.Skipped)
		}
	}
	return got
}

// wantRows returns the rows measured, in bench's order, for each "allocator range" series at
// fills 0%, 50% and 100%.
func wantRows(series ...string) []string {
	var want []string
	for _, s := range series {
		want = append(want, s+" 0% AllocateNext+Release", s+" 50% AllocateNext+Release", s+" 100% AllocateNext (full)")
	}
	return want
}

// checkChart checks that file starts as a file of its format does.
func checkChart(t *testing.T, file, magic string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("bench drew no chart: %v", err)
	}
	if !strings.Contains(string(b[:min(len(b), 512)]), magic) {
		t.Errorf("%s starts %q, want %q near the start", file, b[:min(len(b), 16)], magic)
	}
}

func TestBenchPrintsOneResultPerAllocatorRangeAndFillAndDrawsCharts(t *testing.T) {
	withoutEtcdBinary(t) // its bitmap+etcd rows run on the command's embedded etcd
	dir := t.TempDir()
	svg, png := filepath.Join(dir, "bench.svg"), filepath.Join(dir, "bench.png")
	results := benchJSON(t, append(noAPIServer, "--ranges", "10.0.0.0/24,fd00::/64", "--persistent-ranges", "10.0.0.0/28",
		"--ipaddress-ranges", "10.0.0.0/28", "--fills", "0,50,100", "--duration", "5ms", "--svg", svg, "--png", png)...)
	want := wantRows("bitmap 10.0.0.0/24", "bitmap fd00::/64", "bitmap+etcd 10.0.0.0/28", "ipaddress+fake 10.0.0.0/28")
	if diff := cmp.Diff(want, measured(t, results)); diff != "" {
		t.Errorf("bench results (-want +got):\n%s", diff)
	}
	checkChart(t, svg, "<svg")
	checkChart(t, png, "\x89PNG")
}

func TestBenchPrintsATable(t *testing.T) {
	r := clusterip(t, append([]string{"bench", "--ranges", "10.0.0.0/24", "--persistent-ranges", "", "--ipaddress-ranges", "", "--fills", "99.9", "--duration", "5ms"}, noAPIServer...)...)
	if r.code != 0 {
		t.Fatalf("bench: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"NS/OP", "ALLOCS/OP", "bitmap", "10.0.0.0/24", "99.9%"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("bench table lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestBenchSaysWhyItSkipsTheKubeAPIServerRows runs bench where no kube-apiserver binary is at
// hand: the table has a skipped row for each allocator and range, and a line that says why.
func TestBenchSaysWhyItSkipsTheKubeAPIServerRows(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "kube-apiserver")
	t.Setenv(localcluster.KubeAPIServerEnv, missing)
	r := clusterip(t, "bench", "--ranges", "", "--persistent-ranges", "", "--ipaddress-ranges", "10.0.0.0/28",
		"--apiserver-ranges", "10.0.0.0/28,10.0.1.0/28", "--fills", "0", "--duration", "1ms")
	if r.code != 0 {
		t.Fatalf("bench: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	var skipped []string
	for _, line := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[5] == "skipped" {
			skipped = append(skipped, f[0]+" "+f[1])
		}
	}
	want := []string{"ipaddress+apiserver 10.0.0.0/28", "ipaddress+apiserver 10.0.1.0/28", "dualwrite+apiserver 10.0.0.0/28", "dualwrite+apiserver 10.0.1.0/28"}
	if diff := cmp.Diff(want, skipped); diff != "" {
		t.Errorf("skipped rows (-want +got):\n%s\ntable:\n%s", diff, r.stdout)
	}
	why := "skipped ipaddress+apiserver and dualwrite+apiserver on 10.0.0.0/28, 10.0.1.0/28: no kube-apiserver binary"
	if !strings.Contains(r.stdout, why) || !strings.Contains(r.stdout, missing) {
		t.Errorf("bench table does not say why it skipped (want %q naming %s):\n%s", why, missing, r.stdout)
	}
}

// TestBenchMeasuresThroughKubeAPIServer runs the IPAddress and DualWrite allocators through a
// real kube-apiserver v1.33 on a small range, one batch per measurement.
func TestBenchMeasuresThroughKubeAPIServer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	bin, err := localcluster.KubeAPIServerBinary(t.Context())
	if err != nil {
		t.Fatalf("kube-apiserver binary: %v", err)
	}
	png := filepath.Join(t.TempDir(), "bench.png")
	results := benchJSON(t, "--ranges", "", "--persistent-ranges", "", "--ipaddress-ranges", "",
		"--apiserver-ranges", "10.0.0.0/28", "--kube-apiserver", bin, "--fills", "0,50,100", "--duration", "1ms", "--png", png)
	want := wantRows("ipaddress+apiserver 10.0.0.0/28", "dualwrite+apiserver 10.0.0.0/28")
	if diff := cmp.Diff(want, measured(t, results)); diff != "" {
		t.Errorf("bench results (-want +got):\n%s", diff)
	}
	checkChart(t, png, "\x89PNG")
}

// TestBenchCouldNotRunExitsTwoWithOneLine checks bench's flags against the "could not run"
// contract.
func TestBenchCouldNotRunExitsTwoWithOneLine(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"fill above 100", []string{"bench", "--fills", "101"}, "101% is not between 0 and 100"},
		{"bad range", []string{"bench", "--ranges", "10.0.0.0/33"}, "--ranges"},
		{"bad kube-apiserver range", []string{"bench", "--apiserver-ranges", "10.0.0.0/33"}, "--apiserver-ranges"},
		{"nothing to measure", []string{"bench", "--ranges", "", "--persistent-ranges", "", "--ipaddress-ranges", "", "--apiserver-ranges", ""}, "no range to measure"},
		{"missing kube-apiserver", []string{"bench", "--kube-apiserver", filepath.Join(t.TempDir(), "none")}, "--kube-apiserver"},
		{"kube-apiserver range too large", []string{"bench", "--ranges", "", "--persistent-ranges", "", "--ipaddress-ranges", "", "--apiserver-ranges", "10.0.0.0/15"}, "10.0.0.0/15 holds 131070 addresses"},
		{"chart without extension", []string{"bench", "--ranges", "10.0.0.0/28", "--persistent-ranges", "", "--ipaddress-ranges", "", "--apiserver-ranges", "", "--fills", "0", "--duration", "1ms", "--svg", filepath.Join(t.TempDir(), "chart")}, "no extension"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkCouldNotRun(t, tt.args, tt.want) })
	}
}

// TestBenchWithItsDefaultFlags runs README's bench command, `clusterip bench --png bench.png`,
// with every other flag at its default: every allocator, range and fill level. Every row must
// be measured (exit 0) but the kube-apiserver ones, which say why they are skipped when no
// kube-apiserver binary is at hand. It takes about a minute on a loaded 2-core machine, most of
// it filling the ranges; -short skips it.
func TestBenchWithItsDefaultFlags(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("skipping the default bench (about a minute) in -short mode")
	}
	png := filepath.Join(t.TempDir(), "bench.png")
	r := clusterip(t, "bench", "--png", png)
	if r.code != 0 {
		t.Fatalf("clusterip bench --png %s: exit %d, stderr:\n%s", png, r.code, r.stderr)
	}
	// The rows of each allocator and range but the kube-apiserver ones: those are measured, or
	// skipped with a reason, as TestBenchSaysWhyItSkipsTheKubeAPIServerRows checks.
	rows := map[string]int{}
	for _, line := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[0] != "bitmap" && f[0] != "bitmap+etcd" && f[0] != "ipaddress+fake" {
			continue
		}
		if f[5] == "skipped" {
			t.Errorf("row skipped: %s", line)
		}
		rows[f[0]+" "+f[1]]++
	}
	want := map[string]int{}
	for _, s := range []string{
		"bitmap 10.0.0.0/24", "bitmap 10.0.0.0/16", "bitmap 10.0.0.0/12", "bitmap fd00::/108", "bitmap fd00::/64",
		"bitmap+etcd 10.0.0.0/24", "bitmap+etcd 10.0.0.0/16",
		"ipaddress+fake 10.0.0.0/24", "ipaddress+fake 10.0.0.0/20",
	} {
		want[s] = 5 // fills 0, 50, 99, 99.9 and 100%
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("rows per allocator and range (-want +got):\n%s\ntable:\n%s", diff, r.stdout)
	}
	checkChart(t, png, "\x89PNG")
}
