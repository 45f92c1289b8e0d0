package examples

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEShowsTheExamplesRun checks that README.md's IPAddressOnly example is the function run
// of examples/ipaddressonly, which TestIPAddressOnlyExampleRunsBesideKubeAPIServer runs, so that the
// README shows a program that works.
func TestREADMEShowsTheExamplesRun(t *testing.T) {
	src, err := os.ReadFile("../../../examples/ipaddressonly/main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(src), "\nfunc run(")
	if start < 0 {
		t.Fatal("examples/ipaddressonly/main.go has no func run")
	}
	end := strings.Index(string(src)[start:], "\n}\n")
	if end < 0 {
		t.Fatal("examples/ipaddressonly/main.go: func run does not end")
	}
	run := string(src)[start+1 : start+end+3]
	if !strings.Contains(string(readme), run) {
		t.Errorf("README.md does not show func run of examples/ipaddressonly as it is:\n%s", run)
	}
}
