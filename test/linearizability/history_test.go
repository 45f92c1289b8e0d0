package linearizability

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/localcluster"
)

var (
	historyDuration = flag.Duration("history.duration", 36*time.Second,
		"how long each recorded history runs; faults are injected in turn for as long as it lasts")
	historyOut = flag.String("history.out", "",
		"directory for the histories and the timelines of failing ones; defaults to a new temporary directory, removed when every history passes")
	historyCheck = flag.String("history.check", "",
		"a history written by an earlier run (DIR/finish.json): check it again, with the current model, instead of recording one; what fails is explained beside it")
	historyStock = flag.String("history.stock", localcluster.KubeAPIServerVersion,
		"the release of the stock kube-apiserver the history of -history.check was recorded beside, to name it where it is blamed")
)

const (
	// historyRange is the --service-cluster-ip-range of the kube-apiserver and the range of every
	// allocator process: 126 addresses, small enough that processes contend for them.
	historyRange   = "10.96.0.0/25"
	opTimeout      = 2 * time.Second // of each allocator operation: shorter than every fault
	serviceTimeout = 4 * time.Second // of each Service create or delete through kube-apiserver
	workersPerProc = 2
	serviceWorkers = 2
	faultLength    = 3 * time.Second // how long a partition, a pause or a stopped etcd member lasts
	faultGap       = 750 * time.Millisecond
	checkTimeout   = 2 * time.Minute
	// partTimeout bounds the check of one address when the history is searched for the addresses
	// that fail; one that runs out counts as failing.
	partTimeout = 2 * time.Second
	// attributeTimeout bounds each check of one address's part when its failure is attributed
	// ([Attribute]), a dozen or more per address: an illegal part takes longer to check than a
	// linearizable one. One that runs out leaves the address undecided, which fails the history.
	attributeTimeout = time.Minute
)

// A window is the set of modes allocators run in side by side while a cluster moves between
// modes: Legacy beside DualWrite while the apiservers are upgraded, DualWrite beside
// IPAddressOnly while dual write is turned off. Legacy and IPAddressOnly never run side by side:
// they share no store, so they would hand out the same address by design.
type window struct {
	name  string
	modes []featuregate.Mode
}

var windows = []window{
	{name: "upgrade", modes: []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite, featuregate.Legacy}},
	{name: "finish", modes: []featuregate.Mode{featuregate.DualWrite, featuregate.IPAddressOnly, featuregate.DualWrite}},
}

// historyStats is what one history did, for the test log.
type historyStats struct {
	ops      int
	outcomes map[Outcome]int
	faults   map[string]int
	check    Result
	leftBits int // addresses where a refusal left a bit behind
	// reservations counts the reservation operations by kind (a Release that Retains as
	// "Retain"), and their outcomes.
	reservations map[string]map[Outcome]int
}

// countReservations returns the reservation operations of history by kind (a Release that
// Retains as "Retain") and outcome.
func countReservations(history []Op) map[string]map[Outcome]int {
	m := map[string]map[Outcome]int{}
	for _, op := range history {
		k := op.Kind.String()
		switch {
		case op.Kind == Release && op.Retains:
			k = "Retain"
		case op.Kind != Reserve && op.Kind != Unreserve && op.Kind != Claim:
			continue
		}
		if m[k] == nil {
			m[k] = map[Outcome]int{}
		}
		m[k][op.Outcome]++
	}
	return m
}

// reservationString writes counts as "Reserve=ok/refused/unknown ...", in a fixed order, or
// "none" when there are none (the upgrade window has no IPAddressOnly process).
func reservationString(m map[string]map[Outcome]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range []string{"Reserve", "Unreserve", "Claim", "Retain"} {
		c := m[k]
		parts = append(parts, fmt.Sprintf("%s=%d/%d/%d", k, c[OK], c[Refused], c[Unknown]))
	}
	return "{" + strings.Join(parts, " ") + "} (ok/refused/unknown)"
}

// TestHistoriesAreLinearizable records, for each window, a history of three allocator
// processes in the window's modes and kube-apiserver v1.33.13 (default gates: dual write)
// creating and deleting Services, on one range and a three-member etcd, while faults are
// injected in turn, each healed before the next: a process cut off from every etcd member, a
// process SIGKILLed and restarted, kube-apiserver SIGKILLed and restarted, etcd's leader stopped
// and restarted, a process (and every other round the Service workers) cut off from
// kube-apiserver, and a process stopped with SIGSTOP for longer than its deadlines. Every history
// must be linearizable (see Model) but where stock kube-apiserver's own answers make it not
// ([Attribute]): an address whose blamed answers are all stock's is logged as stock's defect,
// and the history fails on every other. The test logs the addresses where the history is
// linearizable only because a refusal left a bit set (see Op.RefusalLeavesBit).
// In the finish window the IPAddressOnly process runs with Config.Reservations and also reserves,
// claims, retains and releases addresses (reservations_test.go): no Service but the one a
// reservation is kept for may ever hold its address, and that one gets it (see Claim).
// Then one pass of the repair controller, in DualWrite mode with no leak hold-off, must find no
// address with two owners (a duplicate that lasts to the end, which the pass would otherwise
// fix as a wrong parent) and must leave the audit consistent.
//
// The audit runs in DualWrite mode because that is where the cluster stands at the end of each
// history: kube-apiserver runs dual write throughout, and DualWrite is the mode whose audit reads
// both stores, so it finds a leak whichever mode's process left it.
func TestHistoriesAreLinearizable(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	bin, err := localcluster.KubeAPIServerBinary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stock := stockRelease(bin)
	out := *historyOut
	if out == "" {
		if out, err = os.MkdirTemp("", "clusterip-history-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !t.Failed() {
				os.RemoveAll(out)
			}
		})
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	runs := 0
	totals := historyStats{outcomes: map[Outcome]int{}, faults: map[string]int{}, reservations: map[string]map[Outcome]int{}}
	for _, w := range windows {
		t.Run(w.name, func(t *testing.T) {
			s := runHistory(t, bin, stock, w, *historyDuration, out)
			totals.ops += s.ops
			for k, v := range s.outcomes {
				totals.outcomes[k] += v
			}
			for k, v := range s.faults {
				totals.faults[k] += v
			}
			totals.check.Elapsed += s.check.Elapsed
			totals.leftBits += s.leftBits
			for k, byOutcome := range s.reservations {
				if totals.reservations[k] == nil {
					totals.reservations[k] = map[Outcome]int{}
				}
				for o, n := range byOutcome {
					totals.reservations[k][o] += n
				}
			}
			runs++
		})
	}
	t.Logf("%d histories, %d operations checked (%d ok, %d refused, %d unknown), faults %s, checker %v; addresses where a refusal left a bit behind: %d; reservations %s",
		runs, totals.ops, totals.outcomes[OK], totals.outcomes[Refused], totals.outcomes[Unknown],
		faultString(totals.faults), totals.check.Elapsed.Round(time.Millisecond), totals.leftBits, reservationString(totals.reservations))
}

func faultString(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, " ") + "}"
}

// explainAll writes the attribution and [Explain] of each address of illegal to prefix-ADDR.txt
// and returns the pattern of their names.
func explainAll(t *testing.T, history []Op, illegal []Attribution, prefix string) string {
	for _, a := range illegal {
		path := fmt.Sprintf("%s-%s.txt", prefix, a.Addr)
		f, err := os.Create(path)
		if err != nil {
			t.Error(err)
			continue
		}
		if _, err := fmt.Fprintf(f, "%s\n\n", a); err != nil {
			t.Error(err)
		}
		if err := Explain(f, Model, history, a.Addr, partTimeout); err != nil {
			t.Error(err)
		}
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}
	return prefix + "-*.txt"
}

// report reports on history, named what, that j found not linearizable: it writes the attribution
// and the explanation of each address where it is not to prefix-ADDR.txt, logs each attribution,
// and fails t when the history counts against clusterip ([Judgement.Fails]). Addresses held
// against stock kube-apiserver alone are its defects: logged, they fail nothing.
func report(t *testing.T, what string, j Judgement, history []Op, prefix string) {
	explained := explainAll(t, history, j.Illegal, prefix)
	for _, a := range j.Illegal {
		t.Logf("%s (%d checks in %v)", a, a.Checks, a.Elapsed.Round(time.Millisecond))
	}
	if j.Fails() {
		t.Errorf("%s is %s, want linearizable but for stock kube-apiserver's defects; timeline: %s; counts against clusterip at %v, stock's defect alone at %v; explained in %s",
			what, j.Verdict, j.HTML, addrsOf(j.AgainstClusterIP()), addrsOf(j.StockDefects()), explained)
		return
	}
	t.Logf("%s is %s only at %v, each stock kube-apiserver's defect alone, which does not count against clusterip; timeline: %s; explained in %s",
		what, j.Verdict, addrsOf(j.StockDefects()), j.HTML, explained)
}

// stockRelease returns the release of the kube-apiserver binary bin, from its --version
// ("Kubernetes v1.33.13"), or, when that fails, localcluster.KubeAPIServerVersion, the release
// localcluster.KubeAPIServerBinary builds, and why it is presumed.
func stockRelease(bin string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if f := strings.Fields(string(out)); err == nil && len(f) > 0 {
		return f[len(f)-1]
	}
	return fmt.Sprintf("%s (presumed; %s --version: %v)", localcluster.KubeAPIServerVersion, bin, err)
}
