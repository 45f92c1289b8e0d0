package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

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
	cmd := exec.CommandContext(t.Context(), binary, args...)
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

func TestVersionPrintsModuleGoAndKubeAPIServerVersions(t *testing.T) {
	r := clusterip(t, "version", "--json")
	if r.code != 0 {
		t.Fatalf("clusterip version --json: exit %d, stderr %q", r.code, r.stderr)
	}
	var got versionInfo
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("decode %q: %v", r.stdout, err)
	}
	want := versionInfo{Module: "(devel)", Go: runtime.Version(), KubeAPIServer: "v1.33.13"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("clusterip version --json (-want +got):\n%s", diff)
	}
	r = clusterip(t, "version")
	for _, line := range []string{"clusterip (devel)", "go " + runtime.Version(), "kube-apiserver v1.33.13"} {
		if !strings.Contains(r.stdout, line) {
			t.Errorf("clusterip version printed %q, want a line %q", r.stdout, line)
		}
	}
}

func TestHelpShowsExamplesForEveryCommand(t *testing.T) {
	for _, cmd := range [][]string{{}, {"demo"}, {"bench"}, {"check"}, {"version"}} {
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
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "no command"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", []string{"demo", "--frobnicate"}, "unknown flag: --frobnicate"},
		{"bad flag value", []string{"demo", "-n", "many"}, `invalid argument "many"`},
		{"IPv4-mapped range", []string{"demo", "--cidr", "::ffff:10.0.0.0/120"}, "IPv4-mapped"},
		{"a /32", []string{"demo", "--cidr", "10.0.0.1/32"}, "no usable addresses"},
		{"host bits", []string{"demo", "--cidr", "10.96.0.1/24"}, "host bits set"},
		{"two IPv4 ranges", []string{"demo", "--service-cluster-ip-range", "10.96.0.0/24,10.97.0.0/24"}, "same IP family"},
		{"a bad second range", []string{"demo", "--service-cluster-ip-range", "10.96.0.0/24,fd00::/200"}, "fd00::/200"},
		{"unreachable etcd", []string{"demo", "--etcd", "http://127.0.0.1:1", "--cidr", "10.96.0.0/28"}, "127.0.0.1:1"},
		{"version takes no arguments", []string{"version", "now"}, `unknown command "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkCouldNotRun(t, tt.args, tt.want) })
	}
}

// writeKubeconfig writes a kubeconfig whose one context points at server, with a token of "t".
func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	return writeKubeconfigWithToken(t, server, "t")
}

func TestCheckCouldNotRunExitsTwoWithOneLine(t *testing.T) {
	unreachable := writeKubeconfig(t, "https://127.0.0.1:1")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad mode", []string{"check", "--mode", "Hybrid"}, `--mode "Hybrid": want one of auto, Legacy, DualWrite, IPAddressOnly`},
		{"bad output", []string{"check", "-o", "xml"}, `-o "xml": want one of table, json, yaml`},
		{"negative leak grace", []string{"check", "--leak-grace", "-1s"}, "--leak-grace -1s: want 0 or more"},
		{"no request timeout", []string{"check", "--request-timeout", "0"}, "--request-timeout 0s: want more than 0"},
		{"no repair timeout", []string{"check", "--repair-timeout", "0"}, "--repair-timeout 0s: want more than 0"},
		{"cert without key", []string{"check", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-cert", "c.crt"}, "--etcd-cert and --etcd-key go together"},
		{"TLS without endpoints", []string{"check", "--etcd-cacert", "ca.crt"}, "need --etcd-endpoints"},
		{"relative prefix", []string{"check", "--etcd-prefix", "registry"}, "want an absolute key prefix"},
		{"missing kubeconfig", []string{"check", "--kubeconfig", filepath.Join(t.TempDir(), "absent")}, "kubeconfig:"},
		{"unknown context", []string{"check", "--kubeconfig", unreachable, "--context", "nope"}, `context "nope" does not exist`},
		{"unreachable etcd", []string{"check", "--kubeconfig", unreachable, "--etcd-endpoints", "http://127.0.0.1:1"}, "etcd at http://127.0.0.1:1 unreachable"},
		{"unreachable API server", []string{"check", "--kubeconfig", unreachable}, "API server at https://127.0.0.1:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkCouldNotRun(t, tt.args, tt.want) })
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
