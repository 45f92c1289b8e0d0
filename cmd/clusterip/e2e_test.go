package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// binary is the clusterip command built by TestMain; the tests run it as a user would.
var binary string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "clusterip-cmd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "clusterip")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the clusterip command: %v\n%s", err, out)
		return 1
	}
	// testenv.Main builds kube-apiserver, if it is missing, before the tests start, so a first
	// build on a new machine counts against no test's deadline.
	return testenv.Main(m)
}

type result struct {
	code           int
	stdout, stderr string
}

// clusterip runs the built command with args.
func clusterip(t *testing.T, args ...string) result {
	t.Helper()
	return runBinary(t, binary, args...)
}

// runBinary runs the command built at path with args.
func runBinary(t *testing.T, path string, args ...string) result {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run clusterip %q: %v", args, err)
	}
	return r
}

func TestHelpShowsExamplesForEveryCommand(t *testing.T) {
	for _, cmd := range [][]string{{}, {"demo"}, {"bench"}, {"check"}, {"repair"}, {"version"}} {
		t.Run(strings.Join(append([]string{"clusterip"}, cmd...), " "), func(t *testing.T) {
			r := clusterip(t, append(cmd, "--help")...)
			if r.code != 0 {
				t.Fatalf("exit %d, want 0; stderr %q", r.code, r.stderr)
			}
			if !strings.Contains(r.stdout, "Examples:") {
				t.Errorf("--help printed no examples:\n%s", r.stdout)
			}
		})
	}
}

func TestCompletionPrintsAScriptForEveryShell(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		t.Run(shell, func(t *testing.T) {
			r := clusterip(t, "completion", shell)
			if r.code != 0 || !strings.Contains(r.stdout, "clusterip") {
				t.Errorf("clusterip completion %s: exit %d, %d bytes mentioning clusterip: %v; want exit 0 and a script",
					shell, r.code, len(r.stdout), strings.Contains(r.stdout, "clusterip"))
			}
		})
	}
}

func TestKlogVerbosityFlagIsAccepted(t *testing.T) {
	for _, args := range [][]string{{"-v", "4", "version"}, {"version", "--v=2"}} {
		if r := clusterip(t, args...); r.code != 0 {
			t.Errorf("clusterip %q: exit %d, stderr %q; want 0", args, r.code, r.stderr)
		}
	}
}

// TestCouldNotRunExitsTwoWithOneLine checks the "could not run" contract: exit code 2 and one
// line on stderr saying why.
func TestCouldNotRunExitsTwoWithOneLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "no command"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate" for "clusterip" (see 'clusterip --help')`},
		{"unknown flag", []string{"demo", "--frobnicate"}, "unknown flag: --frobnicate"},
		{"bad flag value", []string{"demo", "-n", "many"}, `invalid argument "many"`},
		{"IPv4-mapped range", []string{"demo", "--cidr", "::ffff:10.0.0.0/120"}, "IPv4-mapped"},
		{"a /32", []string{"demo", "--cidr", "10.0.0.1/32"}, "no usable addresses"},
		{"host bits", []string{"demo", "--cidr", "10.96.0.1/24"}, "host bits set"},
		{"two IPv4 ranges", []string{"demo", "--service-cluster-ip-range", "10.96.0.0/24,10.97.0.0/24"}, "same IP family"},
		{"a bad second range", []string{"demo", "--service-cluster-ip-range", "10.96.0.0/24,fd00::/200"}, "fd00::/200"},
		{"unreachable etcd", []string{"demo", "--etcd-servers", "http://127.0.0.1:1", "--cidr", "10.96.0.0/28"}, "127.0.0.1:1"},
		{"version takes no arguments", []string{"version", "now"}, `unknown command "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkCouldNotRun(t, tt.args, tt.want) })
	}
}

// TestMistypedVerbGetsASuggestion: a verb the command does not know exits 2 with one line, and
// names the verbs it is likely a typo of (Levenshtein distance 2 or less, ignoring case, or a
// prefix), as cobra and kubectl do.
func TestMistypedVerbGetsASuggestion(t *testing.T) {
	tests := []struct {
		typed string
		want  string // after `unknown command "<typed>" for "clusterip"`
	}{
		{"chek", "; Did you mean this? check"},          // a letter left out
		{"chekc", "; Did you mean this? check"},         // two letters swapped: distance 2
		{"CHECK", "; Did you mean this? check"},         // case
		{"repiar", "; Did you mean this? repair"},       // two letters swapped
		{"rep", "; Did you mean this? repair"},          // a prefix
		{"demoo", "; Did you mean this? demo"},          // a letter too many
		{"versoin", "; Did you mean this? version"},     // two letters swapped
		{"c", "; Did you mean this? check, completion"}, // a prefix of two
		{"audit", ""}, // too far from any verb
		{"frobnicate", ""},
	}
	for _, tt := range tests {
		t.Run(tt.typed, func(t *testing.T) {
			want := fmt.Sprintf("unknown command %q for \"clusterip\"%s (see 'clusterip --help')", tt.typed, tt.want)
			checkCouldNotRun(t, []string{tt.typed}, want)
			if tt.want == "" {
				if r := clusterip(t, tt.typed); strings.Contains(r.stderr, "Did you mean") {
					t.Errorf("clusterip %s: stderr %q suggests a verb, want none", tt.typed, r.stderr)
				}
			}
		})
	}
}

// writeKubeconfig writes a kubeconfig whose one context points at server, with a token of "t".
func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	return writeKubeconfigWithToken(t, server, "t")
}

// TestCheckAndRepairCouldNotRunExitTwoWithOneLine: check and repair take the same flags and
// refuse the same mistakes, before they contact anything.
func TestCheckAndRepairCouldNotRunExitTwoWithOneLine(t *testing.T) {
	t.Parallel()
	unreachable := writeKubeconfig(t, "https://127.0.0.1:1")
	tests := []struct {
		name string
		args []string // after the verb
		want string
	}{
		{"bad mode", []string{"--mode", "Hybrid"}, `--mode "Hybrid": want one of auto, Legacy, DualWrite, IPAddressOnly, in any case`},
		{"bad output", []string{"-o", "xml"}, `unable to match a printer suitable for the output format "xml", allowed formats are: json,table,yaml`},
		{"negative leak grace", []string{"--leak-grace", "-1s"}, "--leak-grace -1s: want 0 or more"},
		{"bad request timeout", []string{"--request-timeout", "soon"}, `--request-timeout "soon": want a duration with a unit (10s, 2m), whole seconds, or 0 for none`},
		{"negative request timeout", []string{"--request-timeout", "-1s"}, `--request-timeout "-1s"`},
		{"no repair timeout", []string{"--repair-timeout", "0"}, "--repair-timeout 0s: want more than 0"},
		{"cert without key", []string{"--etcd-servers", "http://127.0.0.1:1", "--etcd-certfile", "c.crt"}, "--etcd-certfile and --etcd-keyfile go together"},
		{"TLS without servers", []string{"--etcd-cafile", "ca.crt"}, "need --etcd-servers"},
		{"relative prefix", []string{"--etcd-prefix", "registry"}, "want an absolute key prefix"},
		{"a flag under both spellings", []string{"--etcd-servers", "http://127.0.0.1:1", "--etcd-endpoints", "http://127.0.0.1:2"},
			"--etcd-endpoints is the deprecated spelling of --etcd-servers: give one of them"},
		{"missing kubeconfig", []string{"--kubeconfig", filepath.Join(t.TempDir(), "absent")}, "kubeconfig:"},
		{"unknown context", []string{"--kubeconfig", unreachable, "--context", "nope"}, `context "nope" does not exist`},
		{"unreachable etcd", []string{"--kubeconfig", unreachable, "--etcd-servers", "http://127.0.0.1:1"}, "etcd at http://127.0.0.1:1 unreachable"},
		{"unreachable API server", []string{"--kubeconfig", unreachable}, "API server at https://127.0.0.1:1"},
	}
	for _, verb := range []string{"check", "repair"} {
		for _, tt := range tests {
			t.Run(verb+" "+tt.name, func(t *testing.T) { checkCouldNotRun(t, append([]string{verb}, tt.args...), tt.want) })
		}
	}
	t.Run("check has no --dry-run: it never writes", func(t *testing.T) {
		checkCouldNotRun(t, []string{"check", "--dry-run"}, "unknown flag: --dry-run")
	})
	t.Run("check has no --remove-stale-bitmaps: it never writes", func(t *testing.T) {
		checkCouldNotRun(t, []string{"check", "--remove-stale-bitmaps"}, "unknown flag: --remove-stale-bitmaps")
	})
	staleTests := []struct {
		name string
		args []string // after the verb
		want string
	}{
		{"--remove-stale-bitmaps without etcd", []string{"--remove-stale-bitmaps"}, "--remove-stale-bitmaps needs --etcd-servers: the bitmaps are in etcd"},
		{"--apiserver-endpoints alone", []string{"--etcd-servers", "http://127.0.0.1:1", "--apiserver-endpoints", "https://10.0.0.2:6443"},
			"--apiserver-endpoints goes with --remove-stale-bitmaps"},
		{"an endpoint that is no URL", []string{"--etcd-servers", "http://127.0.0.1:1", "--remove-stale-bitmaps", "--apiserver-endpoints", "https://10.0.0.2:6443,10.0.0.3:6443"},
			`--apiserver-endpoints "10.0.0.3:6443": want the URL of one kube-apiserver, such as https://10.0.0.2:6443`},
		{"an endpoint with a path", []string{"--etcd-servers", "http://127.0.0.1:1", "--remove-stale-bitmaps", "--apiserver-endpoints", "https://lb.example/k8s"},
			`--apiserver-endpoints "https://lb.example/k8s": want the URL of one kube-apiserver`},
	}
	for _, tt := range staleTests {
		t.Run("repair "+tt.name, func(t *testing.T) { checkCouldNotRun(t, append([]string{"repair"}, tt.args...), tt.want) })
	}
}

// TestPreviousSpellingsWarnAndStillWork runs the spellings this release replaced: each still
// does what it did, after a warning on stderr that names the new spelling, and the one line
// saying why the command could not run (the tests reach nothing) comes last.
func TestPreviousSpellingsWarnAndStillWork(t *testing.T) {
	t.Parallel()
	unreachable := writeKubeconfig(t, "https://127.0.0.1:1")
	warning := func(old, current string) string {
		return "clusterip: warning: " + old + " is deprecated and will be removed in the next release; use " + current
	}
	tests := []struct {
		name string
		args []string
		want []string // the lines on stderr
	}{
		{"--etcd-endpoints reaches etcd", []string{"check", "--kubeconfig", unreachable, "--etcd-endpoints", "http://127.0.0.1:1", "--request-timeout", "1s"},
			[]string{warning("--etcd-endpoints", "--etcd-servers"), "clusterip: etcd at http://127.0.0.1:1 unreachable"}},
		{"--etcd-cert needs --etcd-key", []string{"repair", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-cert", "c.crt"},
			[]string{warning("--etcd-cert", "--etcd-certfile"), warning("--etcd-endpoints", "--etcd-servers"), "clusterip: --etcd-certfile and --etcd-keyfile go together"}},
		{"--etcd-key needs --etcd-cert", []string{"check", "--etcd-cacert", "ca.crt", "--etcd-key", "c.key"},
			[]string{warning("--etcd-cacert", "--etcd-cafile"), warning("--etcd-key", "--etcd-keyfile"), "clusterip: --etcd-certfile and --etcd-keyfile go together"}},
		{"demo --etcd reaches etcd", []string{"demo", "--etcd", "http://127.0.0.1:1", "--cidr", "10.96.0.0/28"},
			[]string{warning("--etcd", "--etcd-servers"), "clusterip: demo: etcd at [http://127.0.0.1:1] unreachable"}},
		{"check --repair repairs", []string{"check", "--repair", "--kubeconfig", unreachable},
			[]string{warning(`"check --repair"`, `"clusterip repair", which takes the same flags`), "clusterip: API server at https://127.0.0.1:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := clusterip(t, tt.args...)
			if r.code != exitCouldNotRun {
				t.Errorf("clusterip %q: exit %d, want %d (stderr %q)", tt.args, r.code, exitCouldNotRun, r.stderr)
			}
			got := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if len(got) != len(tt.want) {
				t.Fatalf("clusterip %q: stderr %q, want %d lines starting %q", tt.args, r.stderr, len(tt.want), tt.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tt.want[i]) {
					t.Errorf("clusterip %q: stderr line %d is %q, want it to start %q", tt.args, i+1, got[i], tt.want[i])
				}
			}
		})
	}
}

// TestHelpNamesThisReleasesSpellings: --help shows the verbs and flags of this release, and
// hides the spellings it replaced, which still work for one release.
func TestHelpNamesThisReleasesSpellings(t *testing.T) {
	etcdFlags := []string{"--etcd-servers", "--etcd-cafile", "--etcd-certfile", "--etcd-keyfile", "--etcd-prefix"}
	oldFlags := []string{"--etcd-endpoints", "--etcd-cacert", "--etcd-cert ", "--etcd-key ", "--repair "}
	tests := []struct {
		args         []string
		want, absent []string
	}{
		{[]string{"--help"}, []string{"check        Audit a live cluster's Service IP allocation; read-only", "repair       Repair a live cluster's", "reservations List, create and delete reserved Service ClusterIPs"}, nil},
		{[]string{"check", "--help"}, slices.Concat(etcdFlags, []string{"--leak-grace", `run "clusterip repair" with the same flags`}), slices.Concat(oldFlags, []string{"--dry-run", "--repair-timeout"})},
		{[]string{"repair", "--help"}, slices.Concat(etcdFlags, []string{"--dry-run", "--leak-grace", "--repair-timeout"}), oldFlags},
		{[]string{"demo", "--help"}, []string{"--etcd-servers", "--etcd-prefix"}, []string{"--etcd "}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := clusterip(t, tt.args...)
			if r.code != exitOK {
				t.Fatalf("exit %d, want 0; stderr %q", r.code, r.stderr)
			}
			flags := r.stdout
			if i := strings.Index(flags, "Flags:"); i >= 0 {
				flags = flags[i:] // the old spellings are named in the long text, as deprecated
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("--help lacks %q:\n%s", w, r.stdout)
				}
			}
			for _, d := range tt.absent {
				if strings.Contains(flags, d) {
					t.Errorf("--help lists %q among its flags:\n%s", d, flags)
				}
			}
		})
	}
}

// checkCouldNotRun runs the command with args and checks that it exits with exitCouldNotRun and
// says why in exactly one stderr line "clusterip: ..." that contains want.
func checkCouldNotRun(t *testing.T, args []string, want string) {
	t.Helper()
	r := clusterip(t, args...)
	if r.code != exitCouldNotRun {
		t.Errorf("clusterip %q: exit %d, want %d (stderr %q)", args, r.code, exitCouldNotRun, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "clusterip: ") || !strings.Contains(lines[0], want) {
		t.Errorf("clusterip %q: stderr %q, want one line \"clusterip: ...\" containing %q", args, r.stderr, want)
	}
}
