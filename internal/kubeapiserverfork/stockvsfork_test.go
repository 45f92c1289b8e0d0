package kubeapiserverfork_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/forkbench"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// benchEnv names the environment variable that turns TestStockVsFork on: "churn", "scale" or
// "churn,scale". It takes about 20 minutes for both on two busy cores, so it is never in CI.
const benchEnv = "CLUSTERIP_FORK_BENCH"

// benchScaleEnv optionally sets the number of Services the scale phase creates (15000 by default).
const benchScaleEnv = "CLUSTERIP_FORK_BENCH_SCALE"

// benchOutEnv optionally names a file the tables are written to, as Markdown.
const benchOutEnv = "CLUSTERIP_FORK_BENCH_OUT"

// benchRowsEnv optionally names a file the rows are written to as JSON (package forkbench), for
// `clusterip bench stock-vs-fork` to chart.
const benchRowsEnv = "CLUSTERIP_FORK_BENCH_ROWS"

// benchRangesEnv optionally names the --service-cluster-ip-range of the servers, or several
// separated by spaces, each measured in turn in the same run ("10.96.0.0/16 10.0.0.0/8"; a range
// wider than a /12 only where the release takes it, from v1.38). benchRange by default.
const benchRangesEnv = "CLUSTERIP_FORK_BENCH_RANGES"

const (
	benchRange   = "10.96.0.0/16"
	benchWorkers = 16
	churnPairs   = 60 // create+delete pairs per worker
)

// benchModes returns the modes measured, in this order, that the release under test has, each
// with the first of its gate combinations in releaseModes.
func benchModes(t *testing.T) []modeGate {
	t.Helper()
	var mgs []modeGate
	for _, mode := range []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite, featuregate.IPAddressOnly} {
		if mg, ok := modeOf(t, mode); ok {
			mgs = append(mgs, mg)
		}
	}
	return mgs
}

// churnResult is one churn row: benchWorkers workers each create and delete churnPairs Services.
type churnResult struct {
	side, mode, rng string // rng: the --service-cluster-ip-range
	pairs, errors   int
	elapsed         time.Duration
	p50, p99        time.Duration
	stale           int // Leaked and BitmapOnly findings of repair.Audit afterwards
	// CPU time used during the churn by the kube-apiserver process, the etcd process and the
	// test process (its clients); zero if it could not be read (see cpuNote).
	serverCPU, etcdCPU, selfCPU time.Duration
	cpuNote                     string
	audit                       map[string]int
	firstErr                    string
}

// scaleResult is one scale row: n Services created by benchWorkers workers, none deleted.
type scaleResult struct {
	side, mode, rng  string // rng: the --service-cluster-ip-range
	n, errors        int
	elapsed          time.Duration
	first50, first99 time.Duration // of the first 1000 creates, in the order they were handed out
	last50, last99   time.Duration // of the last 1000
	firstErr         string
}

// TestStockVsFork measures stock kube-apiserver of its release and the fork side by side, each in
// Legacy, DualWrite and IPAddressOnly (those of them the release has, see benchModes), each row on a fresh etcd and server with
// --service-cluster-ip-range=10.96.0.0/16 (or each range of $CLUSTERIP_FORK_BENCH_RANGES in turn, a
// row per range; the JSON names a row of another range by its run and the range): churn (16 workers × 60 create+delete pairs, then
// repair.Audit in the row's mode for stale bits and objects; and the CPU time each pair cost the
// kube-apiserver, the etcd and the test process (its clients), which depends far less than the
// rate on what else the machine runs) and scale (15 000 creates by 16
// workers; the p50/p99 of the first and last 1000). It asserts nothing about time: it logs the
// tables, and the load average before and after, since the figures depend on the machine. The
// tables go to $CLUSTERIP_FORK_BENCH_OUT as Markdown, the rows to $CLUSTERIP_FORK_BENCH_ROWS as
// JSON (one run, named by the time it started) for `clusterip bench stock-vs-fork` to chart.
// The fork writes its IPAddress objects through its loopback client, as stock does, unless
// CLUSTERIP_IPADDRESS_WRITES=registry is set for the test, which its servers inherit.
func TestStockVsFork(t *testing.T) {
	phases := os.Getenv(benchEnv)
	if phases == "" {
		t.Skipf("set %s=churn,scale to measure stock and the fork side by side (about 20 minutes)", benchEnv)
	}
	scaleN := 15000
	if s := os.Getenv(benchScaleEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 2000 {
			t.Fatalf("%s=%q: want a number of Services, at least 2000", benchScaleEnv, s)
		}
		scaleN = n
	}
	ranges := benchRanges(t)
	bins := []benchBinary{{"stock", stockBinary(t)}, {"fork", forkBinary(t)}}
	var out strings.Builder
	start := time.Now().UTC()
	run := start.Format(time.RFC3339)
	// runOf names the rows of rng in the JSON, whose rows are keyed by run, mode and side: the
	// run alone for the default range, as before ranges were measured.
	runOf := func(rng string) string {
		if rng == benchRange {
			return run
		}
		return run + " " + rng
	}
	// The fork's write path is the one CLUSTERIP_IPADDRESS_WRITES in this environment chooses,
	// which the servers inherit (stock ignores it).
	writes := os.Getenv("CLUSTERIP_IPADDRESS_WRITES")
	if writes == "" {
		writes = "loopback"
	}
	fmt.Fprintf(&out, "load before: %s; the fork's IPAddress writes: %s\n\n", loadAvg(), writes)
	var measured forkbench.Rows
	machine := []string{"TestStockVsFork " + run + ", " + phases + ", the fork's IPAddress writes: " + writes + "; load before: " + loadAvg()}
	if strings.Contains(phases, "churn") {
		var rows []churnResult
		eachModeAndSide(t, "churn", ranges, bins, func(t *testing.T, rng string, mode featuregate.Mode, side string, etcd *testenv.Etcd, s *testenv.KubeAPIServer) {
			r := churn(t, s.Client, s.Dir, etcd.Dir())
			r.side, r.mode, r.rng = side, mode.String(), rng
			r.audit, r.stale = benchAudit(t, etcd, s.Client, mode, rng)
			t.Logf("%+v", r)
			rows = append(rows, r)
		})
		fmt.Fprintf(&out, "churn: %d workers × %d create+delete pairs\n\n", benchWorkers, churnPairs)
		out.WriteString("| range | mode | side | pairs/s | p50 | p99 | CPU/pair: kube-apiserver | etcd | test process (clients) | errors | stale (leaked + bitmap-only) | audit counts |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, r := range rows {
			fmt.Fprintf(&out, "| %s | %s | %s | %.1f | %v | %v | %s | %s | %s | %d | %d | %v |\n", r.rng, r.mode, r.side,
				float64(r.pairs)/r.elapsed.Seconds(), ms(r.p50), ms(r.p99), perPair(r.serverCPU, r.pairs), perPair(r.etcdCPU, r.pairs), perPair(r.selfCPU, r.pairs),
				r.errors, r.stale, r.audit)
			measured.Churn = append(measured.Churn, forkbench.Churn{Run: runOf(r.rng), Mode: r.mode, Side: r.side,
				PairsPerS: float64(r.pairs) / r.elapsed.Seconds(), P50Ms: msOf(r.p50), P99Ms: msOf(r.p99), Errors: r.errors, Stale: r.stale})
		}
		for _, r := range rows {
			if r.cpuNote != "" {
				fmt.Fprintf(&out, "\n%s %s: CPU not measured: %s\n", r.mode, r.side, r.cpuNote)
			}
		}
		fmt.Fprintf(&out, "\nload after churn: %s\n\n", loadAvg())
		machine = append(machine, "after churn: "+loadAvg())
	}
	if strings.Contains(phases, "scale") {
		var rows []scaleResult
		eachModeAndSide(t, "scale", ranges, bins, func(t *testing.T, rng string, mode featuregate.Mode, side string, _ *testenv.Etcd, s *testenv.KubeAPIServer) {
			r := scale(t, s.Client, scaleN)
			r.side, r.mode, r.rng = side, mode.String(), rng
			t.Logf("%+v", r)
			rows = append(rows, r)
		})
		fmt.Fprintf(&out, "scale: %d creates by %d workers\n\n", scaleN, benchWorkers)
		out.WriteString("| range | mode | side | total | creates/s | first 1000 p50 | p99 | last 1000 p50 | p99 | last/first p99 | errors |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rows {
			fmt.Fprintf(&out, "| %s | %s | %s | %v | %.1f | %v | %v | %v | %v | %.2f | %d |\n", r.rng, r.mode, r.side,
				r.elapsed.Round(100*time.Millisecond), float64(r.n-r.errors)/r.elapsed.Seconds(),
				ms(r.first50), ms(r.first99), ms(r.last50), ms(r.last99), float64(r.last99)/float64(r.first99), r.errors)
			measured.Scale = append(measured.Scale, forkbench.Scale{Run: runOf(r.rng), Mode: r.mode, Side: r.side, Services: r.n,
				TotalS: r.elapsed.Seconds(), CreatesPerS: float64(r.n-r.errors) / r.elapsed.Seconds(),
				FirstP50Ms: msOf(r.first50), FirstP99Ms: msOf(r.first99), LastP50Ms: msOf(r.last50), LastP99Ms: msOf(r.last99), Errors: r.errors})
		}
		fmt.Fprintf(&out, "\nload after scale: %s\n", loadAvg())
		machine = append(machine, "after scale: "+loadAvg())
	}
	t.Log("\n" + out.String())
	if p := os.Getenv(benchOutEnv); p != "" {
		if err := os.WriteFile(p, []byte(out.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	if p := os.Getenv(benchRowsEnv); p != "" {
		measured.Note = strings.Join(machine, "; ")
		if err := writeRows(p, measured); err != nil {
			t.Error(err)
		}
	}
}

// benchBinary is one side of the comparison: "stock" or "fork", and its kube-apiserver binary.
type benchBinary struct{ side, bin string }

// eachModeAndSide runs measure as the subtest phase/mode/side (phase/range/mode/side with more
// than one range) for every range of ranges, every mode of benchModes and every binary of bins,
// in that order, each on a new etcd and a kube-apiserver of its own serving the range with the
// mode's gates.
func eachModeAndSide(t *testing.T, phase string, ranges []string, bins []benchBinary, measure func(t *testing.T, rng string, mode featuregate.Mode, side string, etcd *testenv.Etcd, s *testenv.KubeAPIServer)) {
	for _, rng := range ranges {
		for _, mg := range benchModes(t) {
			for _, b := range bins {
				name := phase + "/" + mg.mode.String() + "/" + b.side
				if len(ranges) > 1 {
					name = phase + "/" + rng + "/" + mg.mode.String() + "/" + b.side
				}
				t.Run(name, func(t *testing.T) {
					etcd := testenv.NewEtcd(t)
					s := testenv.NewKubeAPIServer(t, etcd, mg.options(b.bin, rng))
					measure(t, rng, mg.mode, b.side, etcd, s)
				})
			}
		}
	}
}

// benchRanges returns the ranges benchRangesEnv names, benchRange if it is unset, failing t if
// one does not parse or is named twice.
func benchRanges(t *testing.T) []string {
	t.Helper()
	env := os.Getenv(benchRangesEnv)
	if strings.TrimSpace(env) == "" {
		return []string{benchRange}
	}
	var ranges []string
	for _, r := range strings.Fields(env) {
		if _, err := clusterip.ParseRanges(r); err != nil {
			t.Fatalf("%s=%q: %v", benchRangesEnv, env, err)
		}
		if slices.Contains(ranges, r) {
			t.Fatalf("%s=%q names %s twice", benchRangesEnv, env, r)
		}
		ranges = append(ranges, r)
	}
	return ranges
}

// writeRows writes rows to the file named p as package forkbench's JSON.
func writeRows(p string, rows forkbench.Rows) error {
	var b bytes.Buffer
	if err := forkbench.Write(&b, rows); err != nil {
		return err
	}
	return os.WriteFile(p, b.Bytes(), 0o644)
}

// churn runs benchWorkers workers, each creating and deleting churnPairs Services in turn, and
// measures the CPU time used meanwhile by the test process, the kube-apiserver whose directory is
// serverDir and the etcd whose data directory is etcdDir.
func churn(t *testing.T, c kubernetes.Interface, serverDir, etcdDir string) churnResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	svcs := c.CoreV1().Services(metav1.NamespaceDefault)
	var mu sync.Mutex
	var r churnResult
	var lat []time.Duration
	var wg sync.WaitGroup
	server, err := processCPU("kube-apiserver", serverDir)
	var etcd func() (time.Duration, error)
	if err == nil {
		etcd, err = processCPU("etcd", etcdDir)
	}
	var server0, etcd0, self0 time.Duration
	if err == nil {
		server0, err = server()
	}
	if err == nil {
		etcd0, err = etcd()
	}
	if err == nil {
		self0, err = selfCPU()
	}
	start := time.Now()
	for w := range benchWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range churnPairs {
				name := fmt.Sprintf("churn-%d-%d", w, i)
				t0 := time.Now()
				_, err := svcs.Create(ctx, testenv.ClusterIPService(name, ""), metav1.CreateOptions{})
				if err == nil {
					err = svcs.Delete(ctx, name, metav1.DeleteOptions{})
				}
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					r.errors++
					if r.firstErr == "" {
						r.firstErr = err.Error()
					}
				} else {
					r.pairs++
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	r.p50, r.p99 = quantile(lat, 0.50), quantile(lat, 0.99)
	var server1, etcd1, self1 time.Duration
	if err == nil {
		server1, err = server()
	}
	if err == nil {
		etcd1, err = etcd()
	}
	if err == nil {
		self1, err = selfCPU()
	}
	if err != nil {
		r.cpuNote = err.Error()
		return r
	}
	r.serverCPU, r.etcdCPU, r.selfCPU = server1-server0, etcd1-etcd0, self1-self0
	return r
}

// perPair returns d per pair in milliseconds for the tables, "–" if there is none.
func perPair(d time.Duration, pairs int) string {
	if d <= 0 || pairs == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f ms", d.Seconds()*1000/float64(pairs))
}

// scale creates n Services with benchWorkers workers and times each create by its index.
func scale(t *testing.T, c kubernetes.Interface, n int) scaleResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	svcs := c.CoreV1().Services(metav1.NamespaceDefault)
	lat := make([]time.Duration, n)
	failed := make([]bool, n)
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range n {
			next <- i
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	r := scaleResult{n: n}
	start := time.Now()
	for range benchWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t0 := time.Now()
				_, err := svcs.Create(ctx, testenv.ClusterIPService(fmt.Sprintf("scale-%d", i), ""), metav1.CreateOptions{})
				lat[i] = time.Since(t0)
				if err != nil {
					failed[i] = true
					mu.Lock()
					r.errors++
					if r.firstErr == "" {
						r.firstErr = err.Error()
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	ok := func(from, to int) []time.Duration {
		var ds []time.Duration
		for i := from; i < to; i++ {
			if !failed[i] {
				ds = append(ds, lat[i])
			}
		}
		return ds
	}
	first, last := ok(0, 1000), ok(n-1000, n)
	r.first50, r.first99 = quantile(first, 0.50), quantile(first, 0.99)
	r.last50, r.last99 = quantile(last, 0.50), quantile(last, 0.99)
	return r
}

// benchAudit audits the cluster in mode as "clusterip check" does and returns the counts and
// the stale findings: IPAddress objects and bitmap bits no Service holds.
func benchAudit(t *testing.T, etcd *testenv.Etcd, c kubernetes.Interface, mode featuregate.Mode, flag string) (map[string]int, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rng, _ := clusterip.ParseRanges(flag)
	rep, err := repair.Audit(ctx, clusterip.Config{Mode: mode, Ranges: rng, Bitmaps: etcdstore.Stores{Client: etcd.TestClient(t)}, Client: c})
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	return rep.Counts, rep.Counts[string(repair.Leaked)] + rep.Counts[string(repair.BitmapOnly)]
}

// quantile returns the q quantile of ds (nearest rank), 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// ms rounds d for the tables: to 0.1 ms.
func ms(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }

// msOf is d in milliseconds, to 0.1 ms.
func msOf(d time.Duration) float64 { return float64(ms(d).Microseconds()) / 1000 }

// loadAvg returns the machine's load averages, as /proc/loadavg gives them, and its CPU count.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return strings.TrimSpace(string(data))
	}
	return fmt.Sprintf("%s %s %s (1, 5, 15 min) on %d CPUs", f[0], f[1], f[2], runtime.NumCPU())
}
