package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// verbsOf returns the verbs that help lists under "Available Commands:".
func verbsOf(help string) []string {
	_, after, ok := strings.Cut(help, "Available Commands:\n")
	if !ok {
		return nil
	}
	var verbs []string
	for _, l := range strings.Split(after, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			break
		}
		verbs = append(verbs, f[0])
	}
	slices.Sort(verbs)
	return verbs
}

// TestSlimBuildHelpListsOnlyItsVerbs: the slim build (-tags clusterip_slim,grpcnotrace, the container
// image's binary) refuses nothing silently. Its help lists the verbs it has and names neither
// demo nor bench, which it lacks, not even in its examples; "demo" is an unknown command there,
// and the verbs the image runs work.
func TestSlimBuildHelpListsOnlyItsVerbs(t *testing.T) {
	slim := filepath.Join(t.TempDir(), "clusterip")
	if out, err := exec.Command("go", "build", "-tags", slimTags, "-o", slim, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the slim command: %v\n%s", err, out)
	}
	run := func(args ...string) result {
		t.Helper()
		return runBinary(t, slim, args...)
	}

	help := run("--help")
	if help.code != 0 {
		t.Fatalf("clusterip --help: exit %d, stderr %q; want 0", help.code, help.stderr)
	}
	want := []string{"check", "completion", "help", "repair", "reservations", "version"}
	if diff := cmp.Diff(want, verbsOf(help.stdout)); diff != "" {
		t.Errorf("the slim build's verbs (-want +got):\n%s", diff)
	}
	if m := regexp.MustCompile(`clusterip (demo|bench)\b`).FindString(help.stdout); m != "" {
		t.Errorf("the slim build's help shows %q, a verb it lacks:\n%s", m, help.stdout)
	}
	if full := verbsOf(clusterip(t, "--help").stdout); !slices.Contains(full, "demo") || !slices.Contains(full, "bench") {
		t.Errorf("the full build's verbs %v lack demo or bench", full)
	}

	checkUnknown := func(verb string) {
		t.Helper()
		r := run(verb)
		if want := `unknown command "` + verb + `" for "clusterip"`; r.code != exitCouldNotRun || !strings.Contains(r.stderr, want) {
			t.Errorf("slim clusterip %s: exit %d, stderr %q; want exit %d and %q", verb, r.code, r.stderr, exitCouldNotRun, want)
		}
	}
	checkUnknown("demo")
	checkUnknown("bench")

	for _, args := range [][]string{{"version"}, {"reservations", "webhook", "--help"}, {"check", "--help"}} {
		if r := run(args...); r.code != 0 {
			t.Errorf("slim clusterip %q: exit %d, stderr %q; want 0", args, r.code, r.stderr)
		}
	}
}
